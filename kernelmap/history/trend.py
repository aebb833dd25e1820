"""The step benchmarks' history: ``load_history`` returns every saved benchmark as one tidy table
with its key, job and contention; ``trend_series`` cuts it into one series per key over jobs (in time
order), which ``reports.figures.trend_figure`` draws.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..contention import path_free_summary
from .keys import (
    CONTENTION,
    KEY_FIELDS,
    MALLOC_INFO,
    STATS,
    STEPS_PER_ROUND,
    BenchKey,
    malloc_text,
    parse_when,
    run_entries,
)
from .storage import list_runs

HISTORY_COLUMNS = ["run", "machine", "job", "datetime", "commit", "name", "bench", "framework", "mode", "device",
                   "batch_size", "key", "unpaired", "steps_per_round", "contended", "contention_text", "malloc",
                   *STATS]


def _steps_per_round(b: dict) -> int:
    """Training steps per round: the step benchmark's ``extra_info`` (its device synchronised once per
    round); else pytest-benchmark's ``iterations`` (calls per round; before blocks, every call
    synchronised), else 1. The stats are per call, i.e. per step, either way."""
    for v in ((b.get("extra_info") or {}).get(STEPS_PER_ROUND), (b.get("stats") or {}).get("iterations")):
        if v is not None:
            return int(v)
    return 1


def load_history(storage: str | Path) -> pd.DataFrame:
    """Every benchmark of every saved run: run number, machine, ``job`` (the bench job's id; None for
    a run saved before jobs), datetime, commit, name, its identity (bench, framework, mode, device,
    batch_size; ``key`` is the BenchKey id, None for a plain benchmark), ``unpaired`` (why it cannot
    be paired, else None), ``steps_per_round`` (int; ``_steps_per_round``), ``contended`` (bool; None
    where the benchmark recorded no contention) and ``contention_text`` (the measured figure, e.g.
    "other processes used 1.7 of 2 cores"), ``malloc`` (``keys.malloc_text``: the glibc malloc settings its process
    ran with, or "not recorded"), then its stats (times in seconds per training step)."""
    rows = []
    for run in list_runs(storage):
        entries, unpaired = run_entries(run)
        meta = {"run": run.number, "machine": run.machine, "job": run.job, "datetime": run.data.get("datetime"),
                "commit": (run.data.get("commit_info") or {}).get("id")}
        raw = {b.get("name") or b.get("fullname"): b for b in run.data["benchmarks"]}

        def per_bench(b: dict) -> dict:
            c = (b.get("extra_info") or {}).get(CONTENTION)
            c = path_free_summary(c) if isinstance(c, dict) else {}  # one saved with its processes' paths too
            return {"steps_per_round": _steps_per_round(b),
                    "contended": bool(c["contended"]) if c.get("contended") is not None else None,
                    "contention_text": c.get("text"), "malloc": malloc_text((b.get("extra_info") or {}).get(MALLOC_INFO)),
                    **{s: (b.get("stats") or {}).get(s) for s in STATS}}

        for e in entries:
            k = e.key
            rows.append({**meta, "name": e.name, "bench": e.bench,
                         **{f: (getattr(k, f) if k else None) for f in KEY_FIELDS},
                         "key": k.id if k else None, "unpaired": None, **per_bench(raw[e.name])})
        for u in unpaired:
            rows.append({**meta, "name": u.name, "bench": None, **dict.fromkeys(KEY_FIELDS), "key": None,
                         "unpaired": u.reason, **per_bench(raw[u.name])})
    df = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    df["batch_size"] = df["batch_size"].astype("Int64")
    df["steps_per_round"] = df["steps_per_round"].astype("int64")
    df["contended"] = df["contended"].astype(object).where(df["contended"].notna(), None)
    return df


def job_axis(history: pd.DataFrame) -> pd.DataFrame:
    """The points of the trend's time axis: one per job (a run saved before jobs is a job of its own)
    per machine, in time order (earliest datetime, then machine and run number). Columns: machine,
    point (the job id, or ``run NNNN``), x (0, 1, ...), datetime (the job's earliest)."""
    h = history.assign(point=[j if isinstance(j, str) and j else f"run {r}"
                              for j, r in zip(history["job"], history["run"], strict=True)],
                       when=[parse_when(d) for d in history["datetime"]], num=history["run"].astype(int))
    pts = []
    for (machine, point), g in h.groupby(["machine", "point"], sort=False):
        whens = [w for w in g["when"] if w is not None]
        pts.append({"machine": machine, "point": point, "datetime": min(whens) if whens else None,
                    "_order": (min(whens).timestamp() if whens else float("inf"), machine, g["num"].min())})
    pts.sort(key=lambda p: p["_order"])
    return pd.DataFrame([{**{k: v for k, v in p.items() if k != "_order"}, "x": i} for i, p in enumerate(pts)],
                        columns=["machine", "point", "x", "datetime"])


def trend_series(history: pd.DataFrame, stat: str = "median") -> dict[str, pd.DataFrame]:
    """One series per key (framework benchmarks only) over jobs: label -> rows (machine, job, run,
    datetime, the key's fields, ``value``: the stat in seconds per step, ``contended``, ``point`` and
    ``x``: the job's place on ``job_axis``) in time order, one row per job (a job's key saved twice:
    its latest run; ``malloc`` its malloc settings and ``malloc_changed`` True where they differ from the key's
    previous point's: a step there may be theirs). The label is the key's (``pytorch eager cpu bs64``), prefixed by the test
    function when the history holds several, suffixed by the machine when it holds several."""
    h = history[history["key"].notna()]
    if h.empty:
        return {}
    axis = job_axis(h)
    h = h.assign(point=[j if isinstance(j, str) and j else f"run {r}" for j, r in zip(h["job"], h["run"], strict=True)])
    h = h.merge(axis[["machine", "point", "x"]], on=["machine", "point"], how="left")
    several_benches = h["bench"].nunique() > 1
    several_machines = h["machine"].nunique() > 1
    out = {}
    for (bench, machine, *_), g in h.groupby(["bench", "machine", *KEY_FIELDS], sort=True):
        r = g.iloc[0]
        label = BenchKey(r["framework"], r["mode"], r["device"], int(r["batch_size"])).label
        if several_benches:
            label = f"{bench} {label}"
        if several_machines:
            label = f"{label} ({machine})"
        g = (g.assign(value=pd.to_numeric(g[stat], errors="coerce"), num=g["run"].astype(int))
             .sort_values(["x", "num"]).drop_duplicates("x", keep="last"))
        before = g["malloc"].shift(1)
        g = g.assign(malloc_changed=[isinstance(b, str) and m != b for m, b in zip(g["malloc"], before, strict=True)])
        out[label] = g[["machine", "job", "run", "datetime", *KEY_FIELDS, "value", "contended", "malloc",
                        "malloc_changed", "point", "x"]].reset_index(drop=True)
    return out


# --- CLI -------------------------------------------------------------------------------------
