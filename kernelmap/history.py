"""``kernelmap compare``: compare saved pytest-benchmark runs, like with like.

pytest-benchmark's storage (``--benchmark-autosave``) is a folder per machine,
``.benchmarks/<machine_id>/NNNN_<commit>_<date>[_uncommitted-changes].json``; a saved run is never
overwritten, so the run number ``NNNN`` names it. ``nox -s bench`` and ``nox -s benchmarks`` run one
pytest process per framework, so one bench job saves one file per framework.

**Keys.** Every framework benchmark is keyed by framework x mode x device x batch size
(``BenchKey``; ``Mode`` lists the modes: ``eager`` for PyTorch, ``imperative`` and ``hybridized``
for Gluon). ``benches/bench_train_step.py`` writes the key into the benchmark's name
(``test_train_step[pytorch-eager-cpu-64]``), its params and its ``extra_info``. A benchmark is
identified by its test function (the name before ``[``) and its key. Files saved before keys
existed are read from params and ``extra_info`` where those hold all four fields; a benchmark that
records some of them but not all (the old ``test_train_step[cpu-64]`` has no mode) cannot be paired
and is listed as such, never guessed. A benchmark that records none of the four is not a framework
benchmark (e.g. ``benches/bench_adapters.py``) and is identified by its full name.

**Pairing.** Only benchmarks with the same identity are compared:

- ``kernelmap compare`` (no runs given): for each identity saved on the machine that saved the
  latest run, NEW is the latest saved run holding it and BASE the one before it that holds it.
  After two ``nox -s bench`` jobs (0001 PyTorch, 0002 MXNet, 0003 PyTorch, 0004 MXNet) that pairs
  PyTorch 0001 -> 0003 and MXNet 0002 -> 0004.
- ``kernelmap compare BASE``: each benchmark of BASE against the latest later run of the same
  machine that holds its identity.
- ``kernelmap compare BASE NEW``: BASE and NEW are each a run number, a ``.json`` file, or several
  of these joined by commas (``0001,0002``: both files of one bench job); within one side an
  identity may occur once.

When nothing pairs, ``main`` exits 2 with one line naming what each side holds. Computing
(``compare_runs``, ``compare_latest``) returns a ``Comparison``; printing is ``format_comparison``.
``main`` exits 1 when a benchmark got slower than a threshold given as ``--fail mean:5%``
(relative) or ``--fail min:0.001`` (absolute seconds), the grammar of pytest-benchmark's
``--benchmark-compare-fail``.

``load_history`` returns every saved benchmark as one tidy table with its key;
``trend_series`` cuts it into one series per key, which ``reports.figures.trend_figure`` draws.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import frameworks
from .errors import KernelmapError

TIME_STATS = ("min", "max", "mean", "stddev", "median", "iqr")  # seconds, as pytest-benchmark saves them
STATS = (*TIME_STATS, "ops", "rounds")
# stats where larger is better; a rise there is not a slowdown
_HIGHER_IS_BETTER = {"ops"}
_NAME_RE = re.compile(r"^(?P<num>\d{4})_(?P<rest>.+)\.json$")


class Mode(enum.StrEnum):
    """How a framework executes the benchmarked step. Add a member for a new mode (a JAX ``jit``)."""

    EAGER = "eager"  # PyTorch, op by op
    IMPERATIVE = "imperative"  # Gluon, not hybridized
    HYBRIDIZED = "hybridized"  # Gluon after ``net.hybridize()``
    JIT = "jit"  # JAX: one jitted step


# the modes each framework's benchmark runs, in order
FRAMEWORK_MODES: dict[str, tuple[Mode, ...]] = {
    name: tuple(Mode(m) for m in d.modes) for name, d in frameworks.REGISTRY.items()
}
KEY_FIELDS = ("framework", "mode", "device", "batch_size")


@dataclass(frozen=True, order=True)
class BenchKey:
    """What a framework benchmark measures: framework x mode x device x batch size."""

    framework: str
    mode: str
    device: str
    batch_size: int

    @property
    def id(self) -> str:
        """The pytest parameter id: ``pytorch-eager-cpu-64``."""
        return f"{self.framework}-{self.mode}-{self.device}-{self.batch_size}"

    @property
    def label(self) -> str:
        return f"{self.framework} {self.mode} {self.device} bs{self.batch_size}"

    def extra_info(self) -> dict:
        """The fields a benchmark records in ``extra_info`` (``key`` is the id, for readers)."""
        return {"framework": self.framework, "mode": Mode(self.mode).value, "device": self.device,
                "batch_size": self.batch_size, "key": self.id}


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
class Entry:
    """One benchmark of one saved run, with its identity."""

    run: SavedRun
    name: str  # as saved: test_train_step[pytorch-eager-cpu-64]
    bench: str  # the test function (keyed) or the full name (a plain benchmark)
    key: BenchKey | None  # None: not a framework benchmark
    stats: dict = field(repr=False, compare=False, hash=False)

    @property
    def ident(self) -> tuple[str, BenchKey | None]:
        return self.bench, self.key

    @property
    def label(self) -> str:
        return f"{self.bench}[{self.key.id}]" if self.key else self.bench


@dataclass(frozen=True)
class Unpaired:
    """A saved benchmark that cannot be paired, and why."""

    run: SavedRun
    name: str
    reason: str


def _field(b: dict, name: str, path: Path):
    aliases = ("batch_size", "bs") if name == "batch_size" else (name,)
    found = {}
    for where in ("params", "extra_info"):
        src = b.get(where) or {}
        for a in aliases:
            if src.get(a) is not None:
                found[where] = src[a]
                break
    if len(found) == 2 and str(found["params"]) != str(found["extra_info"]):
        raise KernelmapError(f"{path}: benchmark {b.get('name')!r}: {name} is {found['params']!r} in params "
                             f"but {found['extra_info']!r} in extra_info")
    return next(iter(found.values()), None)


def benchmark_identity(b: dict, path: Path) -> tuple[str, BenchKey | None] | str:
    """(test function, key) of one saved benchmark; (full name, None) for a benchmark that records
    no key field; a string saying why for one that records some key fields but not all."""
    name = b.get("name") or b.get("fullname")
    if not name:
        raise KernelmapError(f"{path}: a benchmark has no name")
    values = {f: _field(b, f, path) for f in KEY_FIELDS}
    missing = [f for f, v in values.items() if v is None]
    if len(missing) == len(KEY_FIELDS):
        return b.get("fullname") or name, None
    if missing:
        return f"records no {', '.join(missing)}"
    try:
        bs = int(values["batch_size"])
    except (TypeError, ValueError):
        return f"batch size {values['batch_size']!r} is not an integer"
    return name.split("[", 1)[0], BenchKey(str(values["framework"]), str(values["mode"]), str(values["device"]), bs)


def run_entries(run: SavedRun) -> tuple[list[Entry], list[Unpaired]]:
    """The benchmarks of one saved run that can be paired, and those that cannot."""
    entries, unpaired = [], []
    benches = run.data.get("benchmarks")
    if not isinstance(benches, list):
        raise KernelmapError(f"{run.path}: 'benchmarks' is not a list")
    for b in benches:
        got = benchmark_identity(b, run.path)
        if isinstance(got, str):
            unpaired.append(Unpaired(run, b.get("name") or b.get("fullname"), got))
        else:
            entries.append(Entry(run, b.get("name") or b["fullname"], *got, stats=b.get("stats") or {}))
    seen: dict = {}
    for e in entries:
        if e.ident in seen:
            raise KernelmapError(f"{run.path}: benchmarks {seen[e.ident]!r} and {e.name!r} have the same key "
                                 f"{e.label}")
        seen[e.ident] = e.name
    return entries, unpaired


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


class NothingToCompare(KernelmapError):
    """No benchmark of BASE has a match in NEW (exit 2)."""


_ROW_ID = ["benchmark", "framework", "mode", "device", "batch_size", "base_run", "new_run"]


@dataclass
class Comparison:
    base: list[SavedRun]  # the runs BASE's benchmarks came from
    new: list[SavedRun]
    table: pd.DataFrame  # one row per pair: _ROW_ID, then <stat>_base, <stat>_new, <stat>_delta, <stat>_rel
    only_base: list[str]  # benchmark labels without a match on the other side
    only_new: list[str]
    unpaired: list[Unpaired]
    thresholds: list[Threshold]
    failures: list[str]  # human-readable, one per (benchmark, threshold) exceeded
    selection: str  # how BASE and NEW were chosen, one line
    single: list[str] = field(default_factory=list)  # default selection: "label in NNNN" saved in one run only

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def nothing_message(self) -> str:
        """One line: what each side holds, when nothing pairs."""
        if self.single or not (self.base or self.new):  # the default selection: name each key's one run
            held = f"no key is saved in two runs; saved once: {_list_text(self.single)}"
        else:
            held = (f"BASE {_runs_text(self.base)} holds {_list_text(self.only_base)}; "
                    f"NEW {_runs_text(self.new)} holds {_list_text(self.only_new)}")
        return (f"nothing to compare ({self.selection}): {held}"
                + (f"; cannot be paired: {_unpaired_text(self.unpaired)}" if self.unpaired else ""))

    def to_dict(self) -> dict:
        def run(r: SavedRun) -> dict:
            return {"number": r.number, "machine": r.machine, "path": str(r.path), "label": r.label}

        return {
            "selection": self.selection,
            "base": [run(r) for r in self.base],
            "new": [run(r) for r in self.new],
            "thresholds": [str(t) for t in self.thresholds],
            "benchmarks": json.loads(self.table.to_json(orient="records")),
            "only_base": self.only_base,
            "only_new": self.only_new,
            "single": self.single,
            "unpaired": [{"run": u.run.number, "path": str(u.run.path), "name": u.name, "reason": u.reason}
                         for u in self.unpaired],
            "failures": self.failures,
            "failed": self.failed,
        }


def _runs_text(runs: Sequence[SavedRun]) -> str:
    return ",".join(r.number for r in runs) if runs else "(no run)"


def _list_text(labels: Sequence[str], most: int = 12) -> str:
    if not labels:
        return "nothing pairable"
    shown = list(labels[:most])
    return ", ".join(shown) + (f" and {len(labels) - most} more" if len(labels) > most else "")


def _unpaired_text(unpaired: Sequence[Unpaired]) -> str:
    by_reason: dict[str, list[Unpaired]] = {}
    for u in unpaired:
        by_reason.setdefault(u.reason, []).append(u)
    return "; ".join(f"{len(us)} benchmark(s) in {_runs_text(sorted({u.run for u in us}, key=_run_order))} "
                     f"{reason}" for reason, us in by_reason.items())


def _run_order(r: SavedRun) -> tuple[str, str]:
    return r.machine, r.number


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
        if m:
            runs.append(_load(path, m["num"], path.parent.name))
    if not runs:
        raise KernelmapError(f"{storage}: no saved runs (NNNN_*.json) found")
    return runs


def _load(path: Path, number: str, machine: str) -> SavedRun:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise KernelmapError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise KernelmapError(f"{path}: not a pytest-benchmark file (no 'benchmarks' key)")
    return SavedRun(number, machine, path, data)


def _pick(runs: list[SavedRun], ref: str) -> SavedRun:
    p = Path(ref)
    if p.suffix == ".json":
        if not p.is_file():
            raise KernelmapError(f"{ref}: no such file")
        for r in runs:
            if r.path.resolve() == p.resolve():
                return r
        m = _NAME_RE.match(p.name)
        return _load(p, m["num"] if m else p.stem, p.parent.name)
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


def pick_runs(runs: list[SavedRun], spec: str) -> list[SavedRun]:
    """``0001``, ``path.json`` or several joined by commas: the saved runs of one side."""
    picked = [_pick(runs, part.strip()) for part in spec.split(",") if part.strip()]
    if not picked:
        raise KernelmapError(f"{spec!r}: no run named")
    return list(dict.fromkeys(picked))


def _side(runs: list[SavedRun], which: str) -> tuple[dict, list[Unpaired]]:
    """identity -> Entry over one side's runs; an identity held by two of them is an error."""
    out: dict = {}
    unpaired: list[Unpaired] = []
    for r in runs:
        entries, bad = run_entries(r)
        unpaired += bad
        for e in entries:
            if e.ident in out:
                raise KernelmapError(f"{which} holds {e.label} twice ({out[e.ident].run.path} and {r.path}); "
                                     "name one of those runs")
            out[e.ident] = e
    return out, unpaired


def _sort_key(e: Entry):
    k = e.key
    return (e.bench, k is not None, *((k.framework, k.mode, k.device, k.batch_size) if k else ()))


def _build(pairs: list[tuple[Entry, Entry]], only_base: list[Entry], only_new: list[Entry],
           unpaired: list[Unpaired], thresholds: list[Threshold], selection: str,
           base_runs: list[SavedRun] | None = None, new_runs: list[SavedRun] | None = None,
           single: Sequence[Entry] = ()) -> Comparison:
    pairs = sorted(pairs, key=lambda p: _sort_key(p[1]))
    rows = []
    for b, n in pairs:
        k = n.key
        row = {"benchmark": n.bench, "framework": k.framework if k else None, "mode": k.mode if k else None,
               "device": k.device if k else None, "batch_size": k.batch_size if k else None,
               "base_run": b.run.number, "new_run": n.run.number, "label": n.label}
        for s in STATS:
            bs, ns = _num(b.stats.get(s)), _num(n.stats.get(s))
            row.update({f"{s}_base": bs, f"{s}_new": ns, f"{s}_delta": ns - bs,
                        f"{s}_rel": (ns - bs) / bs if bs else float("nan")})
        rows.append(row)
    cols = [*_ROW_ID, "label", *(f"{s}_{w}" for s in STATS for w in ("base", "new", "delta", "rel"))]
    table = pd.DataFrame(rows, columns=cols)
    failures = []
    for t in thresholds:
        for _, r in table.iterrows():
            delta = r[f"{t.stat}_rel" if t.relative else f"{t.stat}_delta"]
            if pd.notna(delta) and delta > t.value:
                got = f"{delta * 100:+.2f}%" if t.relative else f"{delta:+.6g}s"
                failures.append(f"{r['label']} ({r['base_run']} -> {r['new_run']}): {t.stat} {got} exceeds {t}")
    if base_runs is None:
        base_runs = sorted({b.run for b, _ in pairs} | {e.run for e in only_base}, key=_run_order)
    if new_runs is None:
        new_runs = sorted({n.run for _, n in pairs} | {e.run for e in only_new}, key=_run_order)
    return Comparison(base_runs, new_runs, table,
                      [e.label for e in sorted(only_base, key=_sort_key)],
                      [e.label for e in sorted(only_new, key=_sort_key)],
                      sorted(unpaired, key=lambda u: (_run_order(u.run), u.name)), thresholds, failures, selection,
                      [f"{e.label} in {e.run.number}" for e in sorted(single, key=_sort_key)])


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def compare_runs(base: SavedRun | Sequence[SavedRun], new: SavedRun | Sequence[SavedRun],
                 thresholds: list[Threshold] | None = None) -> Comparison:
    """BASE's and NEW's benchmarks paired by identity (test function x framework x mode x device x
    batch size); per pair, the deltas of every stat; ``failures`` lists the thresholds exceeded."""
    base = [base] if isinstance(base, SavedRun) else list(base)
    new = [new] if isinstance(new, SavedRun) else list(new)
    b, ub = _side(base, "BASE")
    n, un = _side(new, "NEW")
    pairs = [(b[i], n[i]) for i in n if i in b]
    return _build(pairs, [e for i, e in b.items() if i not in n], [e for i, e in n.items() if i not in b],
                  ub + [u for u in un if u not in ub], list(thresholds or []),
                  f"BASE {_runs_text(base)}, NEW {_runs_text(new)}", base, new)


def compare_latest(runs: list[SavedRun], thresholds: list[Threshold] | None = None,
                   base: Sequence[SavedRun] | None = None) -> Comparison:
    """Without ``base``: per identity, the latest two saved runs of the machine that saved the latest
    run. With ``base``: each of BASE's benchmarks against the latest later run of its machine that
    holds the same identity."""
    if base is None:
        latest = max(runs, key=lambda r: (str(r.data.get("datetime", "")), r.number))
        machines = {latest.machine}
        selection = f"latest two saved runs per key on {latest.machine}"
    else:
        machines = {r.machine for r in base}
        selection = f"BASE {_runs_text(base)} against the latest later run per key"
    pool = sorted((r for r in runs if r.machine in machines), key=lambda r: int(r.number))
    held: dict = {}  # identity -> [Entry] in run order
    unpaired: list[Unpaired] = []
    for r in pool:
        entries, bad = run_entries(r)
        unpaired += bad
        for e in entries:
            held.setdefault((r.machine, e.ident), []).append(e)
    pairs, only_base, single = [], [], []
    if base is None:
        for es in held.values():
            if len(es) >= 2:
                pairs.append((es[-2], es[-1]))
            else:
                single.append(es[-1])
        return _build(pairs, [], [], unpaired, list(thresholds or []), selection, single=single)
    b, ub = _side(list(base), "BASE")
    for ident, e in b.items():
        later = [x for x in held.get((e.run.machine, ident), []) if int(x.run.number) > int(e.run.number)]
        if later:
            pairs.append((e, later[-1]))
        else:
            only_base.append(e)
    return _build(pairs, only_base, [], ub, list(thresholds or []), selection, list(base))


def compare_storage(storage: str | Path, base: str | None = None, new: str | None = None,
                    thresholds: list[Threshold] | None = None) -> Comparison:
    """``kernelmap compare [BASE] [NEW]`` on a storage folder (see the module docstring)."""
    runs = list_runs(storage)
    if base is None and new is None:
        return compare_latest(runs, thresholds)
    if base is None:
        raise KernelmapError("NEW given without BASE")
    if new is None:
        return compare_latest(runs, thresholds, pick_runs(runs, base))
    return compare_runs(pick_runs(runs, base), pick_runs(runs, new), thresholds)


def _fmt_s(x: float) -> str:
    if pd.isna(x):
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x:.3g} s"


def format_comparison(cmp: Comparison, stats: tuple[str, ...] = ("min", "mean", "median", "max")) -> str:
    """A plain-text table: one row per pair, naming framework, mode, device and batch size, then
    base -> new and the change per stat."""
    lines = [f"selection: {cmp.selection}"]
    lines += [f"BASE {r.label}  {r.path}" for r in cmp.base]
    lines += [f"NEW  {r.label}  {r.path}" for r in cmp.new]
    lines.append("")
    header = ["benchmark", "framework", "mode", "device", "bs", "runs"] + [f"{s} base -> new (change)" for s in stats]
    rows = []
    for _, r in cmp.table.iterrows():
        keyed = pd.notna(r["framework"])
        cells = [r["benchmark"], *((r["framework"], r["mode"], r["device"], str(int(r["batch_size"])))
                                   if keyed else ("-", "-", "-", "-")),
                 f"{r['base_run']} -> {r['new_run']}"]
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
    if cmp.single:
        lines.append(f"\nsaved in one run only: {', '.join(cmp.single)}")
    if cmp.unpaired:
        lines.append(f"\ncannot be paired: {_unpaired_text(cmp.unpaired)}")
    if cmp.thresholds:
        lines.append("")
        if cmp.failures:
            lines.append(f"FAILED: {len(cmp.failures)} regression(s) beyond {', '.join(map(str, cmp.thresholds))}")
            lines.extend(f"  {f}" for f in cmp.failures)
        else:
            lines.append(f"ok: no benchmark beyond {', '.join(map(str, cmp.thresholds))}")
    return "\n".join(lines)


HISTORY_COLUMNS = ["run", "machine", "datetime", "commit", "name", "bench", "framework", "mode", "device",
                   "batch_size", "key", "unpaired", *STATS]


def load_history(storage: str | Path) -> pd.DataFrame:
    """Every benchmark of every saved run: run number, machine, datetime, commit, name, its
    identity (bench, framework, mode, device, batch_size; ``key`` is the BenchKey id, None for a
    plain benchmark), ``unpaired`` (why it cannot be paired, else None) and its stats."""
    rows = []
    for run in list_runs(storage):
        entries, unpaired = run_entries(run)
        meta = {"run": run.number, "machine": run.machine, "datetime": run.data.get("datetime"),
                "commit": (run.data.get("commit_info") or {}).get("id")}
        for e in entries:
            k = e.key
            rows.append({**meta, "name": e.name, "bench": e.bench,
                         **{f: (getattr(k, f) if k else None) for f in KEY_FIELDS},
                         "key": k.id if k else None, "unpaired": None, **{s: e.stats.get(s) for s in STATS}})
        stats = {b.get("name") or b.get("fullname"): b.get("stats") or {} for b in run.data["benchmarks"]}
        for u in unpaired:
            rows.append({**meta, "name": u.name, "bench": None, **dict.fromkeys(KEY_FIELDS), "key": None,
                         "unpaired": u.reason, **{s: stats[u.name].get(s) for s in STATS}})
    df = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    df["batch_size"] = df["batch_size"].astype("Int64")
    return df


def trend_series(history: pd.DataFrame, stat: str = "median") -> dict[str, pd.DataFrame]:
    """One series per key (framework benchmarks only): label -> rows (machine, run, datetime, the
    key's fields, ``value``: the stat in seconds) in run order. The label is the key's (``pytorch eager cpu bs64``), prefixed by the
    test function when the history holds several, suffixed by the machine when it holds several."""
    h = history[history["key"].notna()]
    if h.empty:
        return {}
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
        out[label] = (g.assign(value=pd.to_numeric(g[stat], errors="coerce"))
                      .sort_values("run", key=lambda s: s.astype(int))[["machine", "run", "datetime", *KEY_FIELDS, "value"]]
                      .reset_index(drop=True))
    return out


# --- CLI -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", nargs="?", metavar="BASE",
                        help="run number (e.g. 0001), .json, or several joined by commas (0001,0002); "
                             "default: per key, the second latest run holding it")
    parser.add_argument("new", nargs="?", metavar="NEW",
                        help="as BASE; default: per key, the latest run holding it")
    parser.add_argument("--storage", default=str(default_storage()),
                        help="pytest-benchmark storage folder (default: .benchmarks)")
    parser.add_argument("--fail", action="append", default=[], metavar="STAT:N%",
                        help="exit 1 when NEW is slower than BASE by more than this, e.g. mean:5%% or "
                             "median:10%% or min:0.001 (seconds); may be repeated")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def main(args: argparse.Namespace) -> int:
    thresholds = [Threshold.parse(t) for t in args.fail]
    cmp = compare_storage(args.storage, args.base, args.new, thresholds)
    if cmp.table.empty:
        raise NothingToCompare(cmp.nothing_message())
    print(json.dumps(cmp.to_dict(), indent=2) if args.json else format_comparison(cmp))
    return 1 if cmp.failed else 0
