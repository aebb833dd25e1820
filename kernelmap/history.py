"""``kernelmap compare``: compare two saved pytest-benchmark runs.

pytest-benchmark's storage (``--benchmark-autosave``) is a folder per machine,
``.benchmarks/<machine_id>/NNNN_<commit>_<date>[_uncommitted-changes].json``; a saved run is never
overwritten, so the run number ``NNNN`` names it. This module reads that storage, computes
per-benchmark deltas between a BASE and a NEW run (``compare_runs``), prints them
(``format_comparison``) and exits non-zero when a benchmark got slower than a threshold given as
``--fail mean:5%`` (relative) or ``--fail min:0.001`` (absolute seconds), the same grammar as
pytest-benchmark's ``--benchmark-compare-fail``.

``load_history`` returns every saved run as one tidy table; ``reports.figures.trend_figure``
draws the step-time trend from it.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import KernelmapError

STATS = ("min", "max", "mean", "stddev", "median", "iqr", "ops", "rounds")
# stats where larger is better; a rise there is not a slowdown
_HIGHER_IS_BETTER = {"ops"}
_NAME_RE = re.compile(r"^(?P<num>\d{4})_(?P<rest>.+)\.json$")


@dataclass(frozen=True)
class SavedRun:
    """One saved pytest-benchmark file."""

    number: str  # "0001"
    machine: str  # the storage subfolder, pytest-benchmark's machine id
    path: Path
    data: dict = field(repr=False, compare=False, hash=False)

    @property
    def label(self) -> str:
        commit = (self.data.get("commit_info") or {}).get("id") or "?"
        return f"{self.number} ({str(commit)[:10]}, {self.data.get('datetime', '?')})"


@dataclass(frozen=True)
class Threshold:
    stat: str
    value: float
    relative: bool  # True: value is a fraction (0.05 for 5%); False: seconds

    @classmethod
    def parse(cls, text: str) -> Threshold:
        m = re.fullmatch(r"\s*(\w+)\s*:\s*([0-9.]+)\s*(%?)\s*", text)
        if not m:
            raise KernelmapError(f"--fail {text!r}: expected STAT:N% or STAT:SECONDS, e.g. mean:5%")
        stat, num, pct = m.groups()
        if stat not in STATS or stat in _HIGHER_IS_BETTER or stat == "rounds":
            raise KernelmapError(f"--fail {text!r}: stat must be one of min, max, mean, stddev, median, iqr")
        try:
            value = float(num)
        except ValueError:
            raise KernelmapError(f"--fail {text!r}: {num!r} is not a number") from None
        return cls(stat, value / 100 if pct else value, bool(pct))

    def __str__(self) -> str:
        return f"{self.stat}:{self.value * 100:g}%" if self.relative else f"{self.stat}:{self.value:g}s"


@dataclass
class Comparison:
    base: SavedRun
    new: SavedRun
    table: pd.DataFrame  # one row per benchmark: <stat>_base, <stat>_new, <stat>_delta, <stat>_rel
    only_base: list[str]
    only_new: list[str]
    thresholds: list[Threshold]
    failures: list[str]  # human-readable, one per (benchmark, threshold) exceeded

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def to_dict(self) -> dict:
        return {
            "base": {"number": self.base.number, "path": str(self.base.path), "label": self.base.label},
            "new": {"number": self.new.number, "path": str(self.new.path), "label": self.new.label},
            "thresholds": [str(t) for t in self.thresholds],
            "benchmarks": json.loads(self.table.to_json(orient="records")),
            "only_base": self.only_base,
            "only_new": self.only_new,
            "failures": self.failures,
            "failed": self.failed,
        }


def default_storage() -> Path:
    return Path(".benchmarks")


def list_runs(storage: str | Path) -> list[SavedRun]:
    """Every saved run under ``storage``, ordered by (machine, number)."""
    storage = Path(storage)
    if not storage.is_dir():
        raise KernelmapError(f"{storage}: no pytest-benchmark storage here (run pytest with --benchmark-autosave)")
    runs = []
    for path in sorted(storage.glob("*/*.json")):
        m = _NAME_RE.match(path.name)
        if not m:
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or "benchmarks" not in data:
            raise KernelmapError(f"{path}: not a pytest-benchmark file (no 'benchmarks' key)")
        runs.append(SavedRun(m["num"], path.parent.name, path, data))
    if not runs:
        raise KernelmapError(f"{storage}: no saved runs (NNNN_*.json) found")
    return runs


def _pick(runs: list[SavedRun], ref: str) -> SavedRun:
    p = Path(ref)
    if p.suffix == ".json" and p.is_file():
        for r in runs:
            if r.path.resolve() == p.resolve():
                return r
        m = _NAME_RE.match(p.name)
        return SavedRun(m["num"] if m else p.stem, p.parent.name, p, json.loads(p.read_text()))
    if not ref.isdigit():
        raise KernelmapError(f"{ref!r}: expected a run number such as 0001, or a .json file")
    num = f"{int(ref):04d}"
    hits = [r for r in runs if r.number == num]
    if not hits:
        raise KernelmapError(f"run {num} not found; saved runs: {', '.join(r.number for r in runs)}")
    if len(hits) > 1:
        raise KernelmapError(
            f"run {num} exists for several machines ({', '.join(r.machine for r in hits)}); "
            "point --storage at one machine's folder's parent with only that machine, or pass the .json path")
    return hits[0]


def select_runs(storage: str | Path, base: str | None, new: str | None) -> tuple[SavedRun, SavedRun]:
    """BASE and NEW; by default the two latest runs of the machine that saved the latest run."""
    runs = list_runs(storage)
    if base is None and new is None:
        latest = max(runs, key=lambda r: (r.data.get("datetime", ""), r.number))
        same = sorted((r for r in runs if r.machine == latest.machine), key=lambda r: r.number)
        if len(same) < 2:
            raise KernelmapError(f"{storage}: only one saved run for {latest.machine}; nothing to compare")
        return same[-2], same[-1]
    if new is None:
        b = _pick(runs, base)
        same = sorted((r for r in runs if r.machine == b.machine), key=lambda r: r.number)
        if same[-1] == b:
            raise KernelmapError(f"run {b.number} is the latest; give NEW explicitly")
        return b, same[-1]
    return _pick(runs, base), _pick(runs, new)


def _bench_table(run: SavedRun) -> pd.DataFrame:
    rows = []
    for b in run.data["benchmarks"]:
        stats = b.get("stats") or {}
        row = {"name": b.get("fullname") or b["name"]}
        for s in STATS:
            row[s] = stats.get(s)
        rows.append(row)
    df = pd.DataFrame(rows, columns=["name", *STATS])
    dup = df["name"][df["name"].duplicated()]
    if len(dup):
        raise KernelmapError(f"{run.path}: benchmark names repeat: {sorted(set(dup))[:3]}")
    return df.set_index("name")


def compare_runs(base: SavedRun, new: SavedRun, thresholds: list[Threshold] | None = None) -> Comparison:
    """Per-benchmark deltas of every stat; ``failures`` lists the thresholds exceeded."""
    thresholds = list(thresholds or [])
    b, n = _bench_table(base), _bench_table(new)
    common = [name for name in n.index if name in b.index]
    table = pd.DataFrame(index=pd.Index(common, name="name"))
    for s in STATS:
        bs = pd.to_numeric(b.loc[common, s], errors="coerce").astype(float)
        ns = pd.to_numeric(n.loc[common, s], errors="coerce").astype(float)
        table[f"{s}_base"] = bs
        table[f"{s}_new"] = ns
        table[f"{s}_delta"] = ns - bs
        table[f"{s}_rel"] = (ns - bs) / bs
    failures = []
    for t in thresholds:
        for name in common:
            delta = table.at[name, f"{t.stat}_rel" if t.relative else f"{t.stat}_delta"]
            if pd.notna(delta) and delta > t.value:
                got = f"{delta * 100:+.2f}%" if t.relative else f"{delta:+.6g}s"
                failures.append(f"{name}: {t.stat} {got} exceeds {t}")
    return Comparison(base, new, table.reset_index(), [x for x in b.index if x not in n.index],
                      [x for x in n.index if x not in b.index], thresholds, failures)


def _fmt_s(x: float) -> str:
    if pd.isna(x):
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x:.3g} s"


def format_comparison(cmp: Comparison, stats: tuple[str, ...] = ("min", "mean", "median", "max")) -> str:
    """A plain-text table: one row per benchmark, base -> new and the change per stat."""
    lines = [f"BASE {cmp.base.label}  {cmp.base.path}", f"NEW  {cmp.new.label}  {cmp.new.path}", ""]
    header = ["benchmark"] + [f"{s} base -> new (change)" for s in stats]
    rows = []
    for _, r in cmp.table.iterrows():
        cells = [r["name"]]
        for s in stats:
            rel = r[f"{s}_rel"]
            cells.append(f"{_fmt_s(r[f'{s}_base'])} -> {_fmt_s(r[f'{s}_new'])} "
                         f"({'-' if pd.isna(rel) else f'{rel * 100:+.1f}%'})")
        rows.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for cells in [header, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    if cmp.only_base:
        lines.append(f"\nonly in BASE: {', '.join(cmp.only_base)}")
    if cmp.only_new:
        lines.append(f"\nonly in NEW: {', '.join(cmp.only_new)}")
    if cmp.thresholds:
        lines.append("")
        if cmp.failures:
            lines.append(f"FAILED: {len(cmp.failures)} regression(s) beyond {', '.join(map(str, cmp.thresholds))}")
            lines.extend(f"  {f}" for f in cmp.failures)
        else:
            lines.append(f"ok: no benchmark beyond {', '.join(map(str, cmp.thresholds))}")
    return "\n".join(lines)


def _param(b: dict, *keys: str):
    for src in (b.get("params") or {}, b.get("extra_info") or {}):
        for k in keys:
            if src.get(k) is not None:
                return src[k]
    return None


def load_history(storage: str | Path) -> pd.DataFrame:
    """Every benchmark of every saved run: run number, machine, datetime, commit, name,
    framework, batch_size and device (from the benchmark's params or extra_info, where given) and stats."""
    rows = []
    for run in list_runs(storage):
        for b in run.data["benchmarks"]:
            stats = b.get("stats") or {}
            rows.append({
                "run": run.number, "machine": run.machine, "datetime": run.data.get("datetime"),
                "commit": (run.data.get("commit_info") or {}).get("id"),
                "name": b.get("fullname") or b["name"],
                "framework": _param(b, "framework"),
                "batch_size": _param(b, "batch_size", "bs"),
                "device": _param(b, "device"),
                **{s: stats.get(s) for s in STATS},
            })
    return pd.DataFrame(rows)


# --- CLI -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", nargs="?", metavar="BASE", help="run number (e.g. 0001) or .json; default: second latest")
    parser.add_argument("new", nargs="?", metavar="NEW", help="run number or .json; default: latest")
    parser.add_argument("--storage", default=str(default_storage()),
                        help="pytest-benchmark storage folder (default: .benchmarks)")
    parser.add_argument("--fail", action="append", default=[], metavar="STAT:N%",
                        help="exit 1 when NEW is slower than BASE by more than this, e.g. mean:5%% or "
                             "median:10%% or min:0.001 (seconds); may be repeated")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def main(args: argparse.Namespace) -> int:
    thresholds = [Threshold.parse(t) for t in args.fail]
    base, new = select_runs(args.storage, args.base, args.new)
    cmp = compare_runs(base, new, thresholds)
    print(json.dumps(cmp.to_dict(), indent=2) if args.json else format_comparison(cmp))
    return 1 if cmp.failed else 0
