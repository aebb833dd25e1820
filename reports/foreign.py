"""``kernelmap report TRACE... -o DIR`` on traces that are not a kernelmap run (other people's
Kineto, nsys or XLA traces, files or directories of them): a page per set of traces, per step.

``analyse`` returns the tables (DataFrames; computing only); ``render`` makes the page of them and
``build`` writes ``report.html`` and ``tables/<name>.csv`` atomically. What each table measures:

* overview: per file (and rank): events read by kind, steps, GPU kernel time (the sum of kernel
  durations on every stream, so it may exceed wall time).
* steps: per file x iteration (a kernel's iteration is its launching call's CPU step): the CPU
  step's wall time, kernels, kernel time, GPU busy time (union of kernel intervals), collective
  (NCCL) kernel time, compute (every other kernel) busy time, and the time both ran at once.
* by launching op: per file, kernel time per step by the framework op that launched each kernel
  (its innermost enclosing op; "(no launching op)" where the trace links none), with its
  canonical op and direction.
* by kernel: per file, time per step by kernel name.
* library mix: per file, kernel time per step by library (NCCL, cuDNN, cuBLASLt, native; unknown
  where neither the name nor the launching op says).

A file with framework ops and no kernels (a CPU trace) gets the CPU tables instead (``cpu_tables``), on the
host clock (wall time of each op as the profiler recorded it):

* CPU steps: per file x step, the step's wall time, its ops, their self time summed over threads, and
  the time of the step's thread outside any op.
* CPU time by op: per op name, calls and self time per step (its own time, its children's taken out),
  so that the rows of a file sum to the ops' time; and the outermost ops (those no other op encloses)
  with their whole time per step and share of the step.
* CPU library mix: self time per step by the library of the nearest enclosing op that enters one (the
  framework's ``cpu_library_entry_ops``: oneDNN, BLAS), native otherwise.

Per step figures are means over the steps the file holds (the steps column says how many). The
CNN-specific sections of a run's report (layers, library logs, parity) are not on this page.
"""

from __future__ import annotations

import html as _html
from pathlib import Path

import numpy as np
import pandas as pd

from kernelmap import adapters, frameworks, schema
from kernelmap.adapters import canonical
from kernelmap.atomic import atomic_dir, atomic_file
from kernelmap.errors import KernelmapError

from . import html as H

NO_OP = "(no launching op)"
REPLAY_MARK = " [CUDA/HIP graph replay]"  # after the launcher of a kernel replayed from a graph
UNKNOWN_LIB = "unknown"
NATIVE_LIB = "native"  # a CPU op no library entry op encloses: the framework's own code
TOP = 25  # rows of the by-op and by-kernel tables per file (the CSVs hold every row)
TRACE_SUFFIXES = (".json", ".json.gz", ".json.xz", ".sqlite", ".sqlite.gz", ".sqlite.xz", ".nsys-rep")


def trace_files(paths: list[str | Path]) -> list[Path]:
    """The trace files named: each file as given, a directory's files with a trace suffix (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise KernelmapError(f"{p}: neither a kernelmap run directory (no manifest.json) nor a directory of "
                                     "trace files (*.json[.gz], *.sqlite[.gz], *.nsys-rep)")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise KernelmapError(f"{p}: no such file or directory")
    return out


def read_all(files: list[Path]) -> pd.DataFrame:
    """Every file's records (adapters.read: ParseError names a file it cannot read exactly)."""
    frames = []
    for f in files:
        df = adapters.read(f)
        df["source_file"] = pd.array([str(f)] * len(df), dtype=schema.DTYPES["source_file"])
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(schema.COLUMNS))


def union_ns(start: np.ndarray, end: np.ndarray) -> list[tuple[int, int]]:
    """The intervals [start, end) merged into disjoint ones, in order."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(zip(start.tolist(), end.tolist(), strict=True)):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length_ns(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def overlap_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Total length of the intersection of two merged interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _launchers(df: pd.DataFrame) -> pd.Series:
    """Per row, the op_name of its launching op (the row whose event_id is op_event_id, in the same file: an op,
    or for a kernel replayed from a CUDA/HIP graph the annotation span around its graph launch, such as
    torch.compile's CompiledFunction), marked ``REPLAY_MARK`` where the row was replayed from a graph."""
    from kernelmap.adapters import graph_replay

    ops = df[df["kind"].isin(["op", "annotation"])][["source_file", "event_id", "op_name"]]
    key = pd.MultiIndex.from_arrays([ops["source_file"].astype(object), ops["event_id"].astype("int64")])
    table = pd.Series(ops["op_name"].astype(object).to_numpy(), index=key)
    table = table[~table.index.duplicated()]
    have = df["op_event_id"].notna()
    out = pd.Series(NO_OP, index=df.index, dtype=object)
    if have.any():
        q = pd.MultiIndex.from_arrays([df.loc[have, "source_file"].astype(object),
                                       df.loc[have, "op_event_id"].astype("int64")])
        got = table.reindex(q).to_numpy()
        out[have] = np.where(pd.isna(got), NO_OP, got)
    for _, rows in df.groupby(df["source_file"].astype(object), sort=False).indices.items():
        replayed = rows[graph_replay.replayed_rows(df.iloc[rows])[0]]
        out.iloc[replayed] = out.iloc[replayed] + REPLAY_MARK
    return out


# --- CPU traces: ops on the host clock, no kernels -------------------------------------------------
def self_and_library(ops: pd.DataFrame, entry: dict[str, str], any_op: str | None) -> pd.DataFrame:
    """Per op row (index kept): ``self_ns`` (its duration less its direct children's, clipped to it),
    ``outermost`` (no op encloses it on its thread) and ``library`` (the library of the nearest enclosing
    op, itself included, named in ``entry``: op name -> library; ``any_op``: every op is that library's
    where the framework's ops are flat; else ``NATIVE_LIB``). The nesting is the adapters' own
    (``canonical.nest``, threads told apart by pid and tid)."""
    n = len(ops)
    thread = pd.factorize(pd.MultiIndex.from_arrays([ops["pid"].fillna(-1), ops["tid"].fillna(-1)]))[0]
    start = ops["start_ns"].to_numpy("int64")
    dur = ops["dur_ns"].to_numpy("int64")
    end = start + dur
    parent = canonical.nest(thread.astype("int64"), start, end)
    child = np.flatnonzero(parent >= 0)
    self_ns = dur.copy()
    np.subtract.at(self_ns, parent[child], np.minimum(end[child], end[parent[child]]) - start[child])
    own = np.array([any_op or entry.get(name) for name in ops["op_name"].astype(object)] + [None], dtype=object)[:n]
    lib = np.where(pd.isna(own), NATIVE_LIB, own).astype(object)
    depth = canonical.tree_depth(parent)
    for d in range(1, int(depth.max()) + 1 if n else 0):  # parents first: by depth
        idx = np.flatnonzero(depth == d)
        lib[idx] = np.where(pd.isna(own[idx]), lib[parent[idx]], own[idx])
    return pd.DataFrame({"self_ns": np.clip(self_ns, 0, None), "outermost": parent < 0, "library": lib},
                        index=ops.index)


def _entry_ops(fw: str) -> tuple[dict[str, str], str | None]:
    """(op name -> library, the library of every op or None) from the framework's registry entry."""
    if fw not in frameworks.REGISTRY:
        return {}, None
    entry: dict[str, str] = {}
    for library, names in frameworks.get(fw).cpu_library_entry_ops.items():
        if tuple(names) == frameworks.ANY_OP:
            return {}, UNKNOWN_LIB  # flat ops: each runs its own calls, the trace does not say of which library
        entry.update(dict.fromkeys(names, library))
    return entry, None


def cpu_tables(df: pd.DataFrame, f: str) -> dict[str, list[dict]]:
    """The CPU tables' rows of file ``f`` (see the module docstring): ops of the file's steps only."""
    d = df[df["source_file"] == f]
    steps = d[(d["kind"] == "step") & d["iteration"].notna()]
    ops = d[(d["kind"] == "op") & d["iteration"].isin(steps["iteration"]) & d["dur_ns"].notna()]
    out: dict[str, list[dict]] = {"cpu_steps": [], "cpu_by_op": [], "cpu_top_ops": [], "cpu_library_mix": []}
    if ops.empty:
        return out
    fws = d["framework"].dropna().unique()
    entry, any_op = _entry_ops(str(fws[0])) if len(fws) == 1 else ({}, None)
    ops = ops.drop(columns="library").join(self_and_library(ops, entry, any_op))
    name = Path(f).name
    its = sorted(int(i) for i in ops["iteration"].unique())
    n = len(its)
    for it in its:
        st = steps[steps["iteration"] == it].sort_values("dur_ns", ascending=False).iloc[0]
        o = ops[ops["iteration"] == it]
        mine = o[(o["tid"] == st["tid"]) & o["outermost"]]
        lo, hi = int(st["start_ns"]), int(st["start_ns"] + st["dur_ns"])
        covered = length_ns(union_ns(mine["start_ns"].to_numpy("int64").clip(lo, hi),
                                     (mine["start_ns"] + mine["dur_ns"]).to_numpy("int64").clip(lo, hi)))
        out["cpu_steps"].append({"file": name, "iteration": it, "step_ms": st["dur_ns"] / 1e6, "ops": len(o),
                                 "threads": int(o["tid"].nunique()), "op_self_ms": o["self_ns"].sum() / 1e6,
                                 "outside_ops_ms": (hi - lo - covered) / 1e6})
    total = ops["self_ns"].sum()
    step_total = sum(r["step_ms"] for r in out["cpu_steps"]) * 1e6
    filled = ops.assign(**{c: ops[c].astype(object).where(ops[c].notna(), "–")
                           for c in ("op_name", "canonical_op", "direction")})
    for keys, rows, col, top in ((["op_name", "canonical_op", "direction"], out["cpu_by_op"], "self_ns", False),
                                 (["op_name", "canonical_op", "direction"], out["cpu_top_ops"], "dur_ns", True),
                                 (["library"], out["cpu_library_mix"], "self_ns", False)):
        src = filled[filled["outermost"]] if top else filled
        g = src.groupby(keys, sort=False)[col].agg(["size", "sum"]).reset_index()
        for r in g.sort_values("sum", ascending=False, kind="stable").to_dict("records"):
            rows.append({"file": name, **{c: r[c] for c in keys}, "calls_per_step": r["size"] / n,
                         "ms_per_step": r["sum"] / n / 1e6,
                         "share": r["sum"] / (step_total if top else total) if (step_total if top else total) else None})
    return out


def analyse(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The page's tables (see the module docstring)."""
    df = df.copy()
    files = list(dict.fromkeys(df["source_file"].astype(object)))
    k = df[df["kind"] == "kernel"].copy()
    k["launcher"] = _launchers(df)[k.index]
    k["library"] = k["library"].astype(object).where(k["library"].notna(), UNKNOWN_LIB)
    k["end_ns"] = k["start_ns"] + k["dur_ns"]
    k["is_coll"] = (k["canonical_op"] == "collective").fillna(False).astype(bool)
    steps = df[df["kind"] == "step"]
    overview, per_step, by_op, by_kernel, mix = [], [], [], [], []
    cpu_rows: dict[str, list[dict]] = {name: [] for name in CPU_TABLES}
    for f in files:
        d = df[df["source_file"] == f]
        kf = k[k["source_file"] == f]
        sf = steps[steps["source_file"] == f]
        its = sorted(int(i) for i in kf["iteration"].dropna().unique())
        n_steps = max(len(its), 1)
        if kf.empty:  # a CPU trace: its ops on the host clock
            for name, rows in cpu_tables(df, f).items():
                cpu_rows[name] += rows
            its = sorted({r["iteration"] for r in cpu_rows["cpu_steps"] if r["file"] == Path(f).name})
        rank = d["rank"].dropna().unique()
        counts = d["kind"].value_counts()
        overview.append({
            "file": Path(f).name, "format": d.attrs.get("format", d["source"].iloc[0] if len(d) else ""),
            "framework": ", ".join(sorted(map(str, d["framework"].dropna().unique()))),
            "rank": int(rank[0]) if len(rank) == 1 else None,
            "gpus": ", ".join(map(str, sorted(int(x) for x in kf["device_index"].dropna().unique()))),
            "steps": len(its), "kernels": int(counts.get("kernel", 0)),
            "kernel_ms": kf["dur_ns"].sum() / 1e6, "ops": int(counts.get("op", 0)),
            "runtime": int(counts.get("runtime", 0)), "memcpy": int(counts.get("memcpy", 0)),
            "memset": int(counts.get("memset", 0)),
            "kernels_without_step": int(kf["iteration"].isna().sum()),
            "ops_without_step": int((d["kind"].eq("op") & d["iteration"].isna()).sum()),
        })
        if kf.empty:
            continue
        for it in its:
            ks = kf[kf["iteration"] == it]
            cpu = sf[(sf["iteration"] == it)]
            coll = union_ns(ks.loc[ks["is_coll"], "start_ns"].to_numpy("int64"), ks.loc[ks["is_coll"], "end_ns"].to_numpy("int64"))
            comp = union_ns(ks.loc[~ks["is_coll"], "start_ns"].to_numpy("int64"), ks.loc[~ks["is_coll"], "end_ns"].to_numpy("int64"))
            busy = union_ns(ks["start_ns"].to_numpy("int64"), ks["end_ns"].to_numpy("int64"))
            per_step.append({
                "file": Path(f).name, "iteration": it,
                "cpu_step_ms": cpu["dur_ns"].max() / 1e6 if len(cpu) else None,
                "kernels": len(ks), "kernel_ms": ks["dur_ns"].sum() / 1e6, "gpu_busy_ms": length_ns(busy) / 1e6,
                "collective_kernels": int(ks["is_coll"].sum()),
                "collective_ms": ks.loc[ks["is_coll"], "dur_ns"].sum() / 1e6,
                "compute_busy_ms": length_ns(comp) / 1e6, "collective_busy_ms": length_ns(coll) / 1e6,
                "overlap_ms": overlap_ns(coll, comp) / 1e6,
            })
        ks = kf[kf["iteration"].notna()] if its else kf
        total = ks["dur_ns"].sum()
        for keys, out in ((["launcher", "canonical_op", "direction"], by_op),
                          (["kernel_name", "library", "canonical_op"], by_kernel),
                          (["library"], mix)):
            g = ks.assign(**{c: ks[c].astype(object).where(ks[c].notna(), "–") for c in keys}) \
                .groupby(keys, sort=False)["dur_ns"].agg(["size", "sum"]).reset_index()
            g = g.sort_values("sum", ascending=False, kind="stable")
            for r in g.to_dict("records"):
                out.append({"file": Path(f).name, **{c: r[c] for c in keys},
                            "kernels_per_step": r["size"] / n_steps, "ms_per_step": r["sum"] / n_steps / 1e6,
                            "share": r["sum"] / total if total else None})
    cols = {"by_op": ["file", "launcher", "canonical_op", "direction", "kernels_per_step", "ms_per_step", "share"],
            "by_kernel": ["file", "kernel_name", "library", "canonical_op", "kernels_per_step", "ms_per_step", "share"],
            "library_mix": ["file", "library", "kernels_per_step", "ms_per_step", "share"]}
    return {"overview": pd.DataFrame(overview), "steps": pd.DataFrame(per_step),
            "by_op": pd.DataFrame(by_op, columns=cols["by_op"]), "by_kernel": pd.DataFrame(by_kernel, columns=cols["by_kernel"]),
            "library_mix": pd.DataFrame(mix, columns=cols["library_mix"]),
            **{name: pd.DataFrame(cpu_rows[name], columns=list(CPU_HEADERS[name])) for name in CPU_TABLES}}


HEADERS = {
    "overview": {"file": "file", "format": "format", "framework": "framework", "rank": "rank", "gpus": "GPU index",
                 "steps": "steps", "kernels": "kernels", "kernel_ms": "kernel time (ms, summed)", "ops": "ops",
                 "runtime": "runtime calls", "memcpy": "memcpy", "memset": "memset",
                 "kernels_without_step": "kernels outside any step", "ops_without_step": "ops outside any step"},
    "steps": {"file": "file", "iteration": "step", "cpu_step_ms": "CPU step (ms, wall)", "kernels": "kernels",
              "kernel_ms": "kernel time (ms, summed)", "gpu_busy_ms": "GPU busy (ms, union)",
              "collective_kernels": "collective kernels", "collective_ms": "collective time (ms, summed)",
              "compute_busy_ms": "compute busy (ms, union)", "collective_busy_ms": "collective busy (ms, union)",
              "overlap_ms": "collective ∩ compute (ms)"},
    "by_op": {"file": "file", "launcher": "launching op", "canonical_op": "canonical op", "direction": "direction",
              "kernels_per_step": "kernels/step", "ms_per_step": "kernel time/step (ms)", "share": "share"},
    "by_kernel": {"file": "file", "kernel_name": "kernel", "library": "library", "canonical_op": "canonical op",
                  "kernels_per_step": "kernels/step", "ms_per_step": "kernel time/step (ms)", "share": "share"},
    "library_mix": {"file": "file", "library": "library", "kernels_per_step": "kernels/step",
                    "ms_per_step": "kernel time/step (ms)", "share": "share"},
}
CPU_HEADERS = {
    "cpu_steps": {"file": "file", "iteration": "step", "step_ms": "step (ms, wall)", "ops": "ops",
                  "threads": "threads with ops", "op_self_ms": "op time (ms, self times summed over threads)",
                  "outside_ops_ms": "step's thread outside any op (ms)"},
    "cpu_by_op": {"file": "file", "op_name": "op", "canonical_op": "canonical op", "direction": "direction",
                  "calls_per_step": "calls/step", "ms_per_step": "self time/step (ms)", "share": "share of op time"},
    "cpu_top_ops": {"file": "file", "op_name": "outermost op", "canonical_op": "canonical op",
                    "direction": "direction", "calls_per_step": "calls/step", "ms_per_step": "time/step (ms)",
                    "share": "share of step"},
    "cpu_library_mix": {"file": "file", "library": "library", "calls_per_step": "ops/step",
                        "ms_per_step": "self time/step (ms)", "share": "share of op time"},
}
CPU_TABLES = tuple(CPU_HEADERS)
CPU_TITLES = {
    "cpu_steps": ("Per step: CPU ops", "A CPU trace (no kernels): its framework ops on the host clock, each op's "
                  "wall time as the profiler recorded it. Op time sums each op's self time (its children's taken "
                  "out) over every thread; the last column is the step's own thread outside any op (Python, "
                  "the profiler). One trace, no trials: no spread."),
    "cpu_by_op": ("CPU time by op (self)", f"Mean per step of each op name's self time; a file's rows sum to its op "
                  f"time. Top {TOP} per file on the page; every row in tables/cpu_by_op.csv."),
    "cpu_top_ops": ("CPU time by outermost op", f"Ops no other op encloses on their thread, with their whole time "
                    f"(children included), mean per step, and their share of the step's wall time. Top {TOP} per "
                    "file on the page."),
    "cpu_library_mix": ("CPU library mix", "Self time per step by the library of the nearest enclosing op that "
                        "enters one (the CPU-library entry ops of the framework's registry entry, e.g. "
                        "aten::mkldnn_convolution for oneDNN, aten::addmm for BLAS); native: the framework's own "
                        "code; unknown: a framework "
                        "whose trace does not say. From the op names alone: no library log was read."),
}
TITLES = {
    "overview": ("Traces read", "Every event of each file is a record (or the file is refused with the reason). "
                 "Kernel time is the sum of kernel durations over all streams (it may exceed wall time)."),
    "steps": ("Per step: compute and collectives", "A kernel's step is its launching call's CPU ProfilerStep. "
              "Busy = union of kernel intervals on the GPU clock; collective = NCCL/RCCL kernels; "
              "overlap = time a collective and a compute kernel ran at once. One trace, no trials: no spread."),
    "by_op": ("Kernel time by launching op", f"Mean per step; the op that launched each kernel (innermost "
              f"enclosing op of its launch). Top {TOP} per file on the page; every row in tables/by_op.csv."),
    "by_kernel": ("Kernel time by kernel", f"Mean per step; top {TOP} per file on the page; every row in "
                  "tables/by_kernel.csv."),
    "library_mix": ("Library mix", "Kernel time per step by library: NCCL for collective kernels; cuDNN/cuBLASLt by "
                    "kernel name or cuDNN launching op; native for the framework's own kernels; unknown otherwise."),
}


def nothing_timed(tables: dict[str, pd.DataFrame]) -> list[str]:
    """A line per file with no per-step figure at all (no kernel and no op inside a step), saying why."""
    ov = tables["overview"]
    timed = set(tables["steps"].get("file", ())) | set(tables["cpu_steps"].get("file", ()))
    return [f"{r['file']}: nothing per step: {r['kernels']} kernels and {r['ops']} ops, "
            f"{'none of them inside a step (no ProfilerStep#N around them)' if r['kernels'] + r['ops'] else 'none'}"
            for _, r in ov.iterrows() if r["file"] not in timed]


def render(tables: dict[str, pd.DataFrame], sources: list[str]) -> str:
    """The page (one HTML string) of ``analyse``'s tables."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>kernelmap: traces</title>",
             "<style>body{font-family:sans-serif;margin:1.5em;max-width:110em}table{border-collapse:collapse;"
             "font-size:13px;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;"
             "max-width:50em;overflow-wrap:anywhere}th{background:#eee}p.note{color:#444;max-width:80em}</style>",
             "</head><body><h1>kernelmap report: traces (not a kernelmap run)</h1>",
             "<p class='note'>Read from: " + ", ".join(_html.escape(s) for s in sources) + "</p>"]
    for name, (title, note) in {**TITLES, **CPU_TITLES}.items():
        t = tables[name]
        if t.empty:
            continue  # a section with nothing to show is left out (nothing_timed says where a file has none)
        if name in ("by_op", "by_kernel", "cpu_by_op", "cpu_top_ops"):
            t = t.groupby("file", sort=False, group_keys=False).head(TOP)
        parts.append(f"<h2>{_html.escape(title)}</h2><p class='note'>{_html.escape(note)}</p>")
        parts.append(H.table(t, {**HEADERS, **CPU_HEADERS}[name]))
        if name == "overview":
            parts += [f"<p class='note'><b>{_html.escape(line)}</b></p>" for line in nothing_timed(tables)]
    parts.append("</body></html>")
    return "\n".join(parts)


def build(paths: list[str], out: Path, replace: bool = False) -> Path:
    files = trace_files(paths)
    df = read_all(files)
    tables = analyse(df)
    with atomic_dir(out, replace=replace) as tmp:
        (tmp / "tables").mkdir()
        for name, t in tables.items():
            with atomic_file(tmp / "tables" / f"{name}.csv") as fh:
                t.to_csv(fh, index=False)
        with atomic_file(tmp / "report.html") as fh:
            fh.write(render(tables, [str(p) for p in paths]))
    return Path(out)


RUN_MARKERS = ("manifest.json", "results.json", "records.parquet", "attribution.json")


def is_run_dir(path: str | Path) -> bool:
    """A kernelmap run directory, complete or not (one of its own files is there): the run's
    report, which says what is missing, not a page of the traces inside it."""
    return any((Path(path) / m).is_file() for m in RUN_MARKERS)
