"""``kernelmap compare``: saved step benchmarks compared like with like.

**Identity.** A benchmark is identified by its test function (the name before ``[``) and its key
(``keys.BenchKey``: framework x mode x device x batch size). Files saved before keys existed are read
from params and ``extra_info`` where those hold all four fields; a benchmark that records some of
them but not all (the old ``test_train_step[cpu-64]`` has no mode) cannot be paired and is listed as
such, never guessed. A benchmark that records none of the four is not a framework benchmark (e.g.
``benches/bench_adapters.py``) and is identified by its full name.

**Pairing.** Only benchmarks with the same identity are compared:

- ``kernelmap compare`` (no runs given): for each identity saved on the machine that saved the
  latest run, NEW is the latest saved run holding it and BASE the one before it that holds it.
  After two bench jobs (0001, 0002) that is every key of 0001 against the same key of 0002; in an
  older storage of one file per framework (0001 PyTorch, 0002 MXNet, 0003 PyTorch, 0004 MXNet) it
  pairs PyTorch 0001 -> 0003 and MXNet 0002 -> 0004. Where every key is saved in one run only (right
  after the first bench job) there is nothing earlier yet: ``main`` says so, naming the saved job,
  and exits 0.
- ``kernelmap compare BASE``: each benchmark of BASE against the latest later run of the same
  machine that holds its identity.
- ``kernelmap compare BASE NEW``: BASE and NEW are each a run number, a ``.json`` file, or several
  of these joined by commas (``0001,0002``: both files of one older bench job); within one side an
  identity may occur once.

When runs named as BASE and NEW pair nothing, ``main`` exits 2 with one line naming what each side
holds. Computing (``compare_runs``, ``compare_latest``) returns a ``Comparison``; printing is
``format_comparison``, which also names each side measured under contention (``extra_info``'s
``contention``, ``kernelmap.contention.summarise``) and each pair whose sides ran with other malloc settings
(``extra_info``'s ``malloc``, ``timing.ALLOC_ENV``; a side saved before they were recorded says "not recorded").
``main`` exits 1 when a benchmark got slower
than a threshold given as ``--fail mean:5%`` (relative) or ``--fail min:0.001`` (absolute seconds),
the grammar of pytest-benchmark's ``--benchmark-compare-fail``.

A change is called only where the two sides' saved samples differ beyond their noise (``NOISE_ALPHA``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import KernelmapError
from .keys import STATS, Entry, SavedRun, Unpaired, flagged, malloc_differs, run_entries
from .storage import default_storage, list_runs, pick_runs

# stats where larger is better; a rise there is not a slowdown
_HIGHER_IS_BETTER = {"ops"}


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
# per pair: whether each side was measured under contention (None: not recorded) and the measured figure
_CONTENTION_COLS = ["contended_base", "contended_new", "contention_base", "contention_new"]


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
    single_runs: list[SavedRun] = field(default_factory=list)  # the runs holding ``single``'s benchmarks
    # past a threshold, but the samples do not differ beyond their noise (NOISE_ALPHA): not failures
    within_noise: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def nothing_earlier(self) -> bool:
        """The default selection paired nothing because every key is saved in one run only (right
        after the first bench job): nothing earlier to compare yet, which is not an error."""
        return self.table.empty and bool(self.single)

    def earlier_message(self) -> str:
        """One line naming the saved job(s) that hold the only run of each key."""
        runs = self.single_runs
        held = (f"its {len(self.single)} benchmark(s) are saved in one job only, {runs[0].job_text}"
                if len(runs) == 1 else
                f"each of its {len(self.single)} benchmark(s) is saved in one run only "
                f"({', '.join(r.job_text for r in runs)})")
        text = (f"nothing earlier to compare yet ({self.selection}): {held}; the next bench job will be "
                "compared against it")
        if self.thresholds:
            text += f"; {', '.join(map(str, self.thresholds))} not applied"
        return text + (f"; cannot be paired: {_unpaired_text(self.unpaired)}" if self.unpaired else "")

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
            "within_noise": self.within_noise,
            "failed": self.failed,
            "nothing_earlier": self.earlier_message() if self.nothing_earlier else None,
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


# A change is called only where the two runs' samples differ beyond their noise: a two-sided
# Mann-Whitney U test at this level (as google/benchmark's compare.py does before it reports a change).
NOISE_ALPHA = 0.05
MIN_SAMPLES = 5  # per side; with fewer the test cannot reach NOISE_ALPHA reliably: noise not judged


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test of samples ``a`` and ``b`` (normal approximation
    with tie and continuity corrections; samples of MIN_SAMPLES or more)."""
    import math

    n1, n2 = len(a), len(b)
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ((counts ** 3 - counts).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u1 - mean) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def noise_verdict(base: Entry, new: Entry) -> tuple[float | None, str]:
    """(p-value, why) of the pair's samples: p None where either side has fewer than MIN_SAMPLES."""
    a, b = base.samples, new.samples
    if a is None or b is None or min(len(a), len(b)) < MIN_SAMPLES:
        have = "no samples saved" if a is None or b is None else f"{len(a)} and {len(b)} samples"
        return None, f"noise not judged ({have}; needs {MIN_SAMPLES} a side)"
    p = mann_whitney_p(a, b)
    return p, f"Mann-Whitney U p={p:.3g}, {len(a)} and {len(b)} samples"


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
               "base_run": b.run.number, "new_run": n.run.number, "label": n.label,
               "base_job": b.run.job, "new_job": n.run.job}
        for side, e in (("base", b), ("new", n)):
            c = e.contention
            row[f"contended_{side}"] = bool(c["contended"]) if c and c.get("contended") is not None else None
            row[f"contention_{side}"] = c.get("text") if c else None
        row["malloc"] = malloc_differs(b.malloc, n.malloc)  # None: the same settings, or neither recorded any
        row["p_value"], row["noise"] = noise_verdict(b, n)
        for s in STATS:
            bs, ns = _num(b.stats.get(s)), _num(n.stats.get(s))
            row.update({f"{s}_base": bs, f"{s}_new": ns, f"{s}_delta": ns - bs,
                        f"{s}_rel": (ns - bs) / bs if bs else float("nan")})
        rows.append(row)
    cols = [*_ROW_ID, "label", "base_job", "new_job", *_CONTENTION_COLS, "malloc", "p_value", "noise",
            *(f"{s}_{w}" for s in STATS for w in ("base", "new", "delta", "rel"))]
    table = pd.DataFrame(rows, columns=cols)
    failures, within_noise = [], []
    for t in thresholds:
        for _, r in table.iterrows():
            delta = r[f"{t.stat}_rel" if t.relative else f"{t.stat}_delta"]
            if pd.notna(delta) and delta > t.value:
                got = f"{delta * 100:+.2f}%" if t.relative else f"{delta:+.6g}s"
                if pd.notna(r["p_value"]) and r["p_value"] >= NOISE_ALPHA:  # the samples overlap: no change called
                    within_noise.append(f"{r['label']} ({r['base_run']} -> {r['new_run']}): {t.stat} {got} past {t}, "
                                        f"within the samples' noise ({r['noise']})")
                    continue
                failures.append(f"{r['label']} ({r['base_run']} -> {r['new_run']}): {t.stat} {got} exceeds {t}"
                                + ("" if pd.notna(r["p_value"]) else f"; {r['noise']}")
                                + "".join(f"; {side.upper()} measured under contention ({r[f'contention_{side}']})"
                                          for side in ("base", "new") if flagged(r[f"contended_{side}"]))
                                + (f"; {r['malloc']}" if isinstance(r["malloc"], str) else ""))
    if base_runs is None:
        base_runs = sorted({b.run for b, _ in pairs} | {e.run for e in only_base}, key=_run_order)
    if new_runs is None:
        new_runs = sorted({n.run for _, n in pairs} | {e.run for e in only_new}, key=_run_order)
    return Comparison(base_runs, new_runs, table,
                      [e.label for e in sorted(only_base, key=_sort_key)],
                      [e.label for e in sorted(only_new, key=_sort_key)],
                      sorted(unpaired, key=lambda u: (_run_order(u.run), u.name)), thresholds, failures, selection,
                      [f"{e.label} in {e.run.number}" for e in sorted(single, key=_sort_key)],
                      sorted({e.run for e in single}, key=_run_order), within_noise)


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
    contended = [f"  {r['label']}: " + "; ".join(f"{side.upper()} {r[f'{side}_run']}: {r[f'contention_{side}']}"
                                                  for side in ("base", "new") if flagged(r[f"contended_{side}"]))
                 for _, r in cmp.table.iterrows() if flagged(r["contended_base"]) or flagged(r["contended_new"])]
    if contended:
        lines.append("\nmeasured under contention (other work on the machine; its change is not the code's alone):")
        lines.extend(contended)
    malloc = [f"  {r['label']} ({r['base_run']} -> {r['new_run']}): {r['malloc']}"
              for _, r in cmp.table.iterrows() if isinstance(r["malloc"], str)]
    if malloc:
        lines.append("\nmalloc settings differ between the two sides (docs/timing.md \"Memory\": CPU steps faulted fresh "
                     "pages without them; the change is not the code's alone):")
        lines.extend(malloc)
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
        if cmp.within_noise:
            lines.append("not called a change (past the threshold, within the samples' noise):")
            lines.extend(f"  {f}" for f in cmp.within_noise)
    return "\n".join(lines)


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
    if cmp.nothing_earlier:  # the first bench job: nothing before it, which is not a failure
        print(json.dumps(cmp.to_dict(), indent=2) if args.json else cmp.earlier_message())
        return 0
    if cmp.table.empty:
        raise NothingToCompare(cmp.nothing_message())
    print(json.dumps(cmp.to_dict(), indent=2) if args.json else format_comparison(cmp))
    return 1 if cmp.failed else 0
