"""``kernelmap findings RUN``: a run's findings ranked by what they would save (``reports/analyses/findings.py``),
and with ``--check-remedies`` each top finding's remedy run by kernelmap (``kernelmap run`` of both cases,
fresh, into a run directory each) and its prediction judged (docs/diff.md). This module runs and prints."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from kernelmap.atomic import atomic_file
from kernelmap.errors import KernelmapError
from kernelmap.run.schedule import PROFILES

from .analyses import diff as D
from .analyses import findings as F
from .analyses.base import field_at, load_run

CAUSE_WIDTH = 110
NO_PAIR = ("no two cases to compare (one case per batch size and device count): findings set a run's cases against "
           "each other (another mode, math or framework); kernelmap diff A B compares two runs")
RUN_OPTIONS = ("warmup", "data", "data_dir", "threads", "lr", "seed")  # taken from the run being checked


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a normalised run directory (kernelmap run --profile ...)")
    p.add_argument("--batch-size", type=int, nargs="+", metavar="N", help="only these batch sizes")
    p.add_argument("--source", metavar="SOURCE", help="trace source to time from (default: the framework's "
                                                      "profiler trace, else nsys)")
    p.add_argument("--alpha", type=float, default=D.ALPHA, help=f"the U test's level (default {D.ALPHA})")
    p.add_argument("--top", type=int, default=10, metavar="N", help="print the N first of each kind (default 10; "
                                                                     "CSV: all)")
    p.add_argument("--csv", metavar="FILE", help="write every finding (and what was called noise) as CSV")
    add_check_arguments(p)


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check-remedies", type=int, nargs="?", const=3, metavar="N",
                   help="run the remedies of the N first findings of each kind that kernelmap can run (default 3): "
                        "`kernelmap run` of each finding's case and remedy case, fresh, then the same comparison")
    p.add_argument("--check-out", metavar="DIR", help="where the check's runs go (default RUN/../<RUN>-checks)")
    p.add_argument("--check-steps", type=int, metavar="N", help="steps of the check's runs (default: the run's)")
    p.add_argument("--check-trials", type=int, default=3, metavar="N", help="clean trials of each check run "
                                                                          "(default 3)")
    p.add_argument("--check-csv", metavar="FILE", help="write the checked findings as CSV")
    p.add_argument("--check-busy", action="store_true",
                   help="check findings called 'busy machine' too (beyond noise, a side measured on a busy machine); "
                        "the hit rate on a quiet machine leaves out every check whose fresh runs were busy")
    p.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH",
                   help="passed to the check's `kernelmap run` (a framework's own interpreter, as kernelmap run takes it)")


# --- printing ------------------------------------------------------------------------------------
def _f(x: Any, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and pd.isna(x)) else format(x, fmt)


def table(df: pd.DataFrame, cols: list[tuple[str, str, str]]) -> str:
    cells = [[h for _, h, _ in cols]]
    for _, r in df.iterrows():
        cells.append([(_f(r[c], fmt) if fmt != "s" else str(r[c]))[:CAUSE_WIDTH] for c, _, fmt in cols])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(t.ljust(w) for t, w in zip(r, widths, strict=True)).rstrip() for r in cells)


COLS = [("rank", "#", "d"), ("call", "call", "s"), ("batch_size", "bs", "s"), ("case", "case", "s"),
        ("remedy", "remedy", "s"), ("where", "where", "s"), ("direction", "dir", "s"),
        ("saving_ms", "saves ms/step", ".4f"), ("saving_lo_ms", "95% lo", ".4f"), ("saving_hi_ms", "95% hi", ".4f"),
        ("case_ms", "case ms", ".4f"), ("remedy_ms", "remedy ms", ".4f"), ("share_of_case", "share", ".1%"),
        ("busy", "busy", "s")]
CHECK_COLS = [("rank", "#", "d"), ("kind", "kind", "s"), ("case", "case", "s"), ("remedy", "remedy", "s"),
              ("where", "where", "s"), ("direction", "dir", "s"), ("saving_ms", "predicted ms", ".4f"),
              ("measured_saving_ms", "measured ms", ".4f"), ("measured_lo_ms", "95% lo", ".4f"),
              ("measured_hi_ms", "95% hi", ".4f"), ("measured_call", "measured call", "s"),
              ("error_pct", "error %", "+.1f"), ("hit", "hit", "s"), ("measured_busy", "busy (check)", "s")]


def write(found: pd.DataFrame, out: TextIO, top: int | None = 10) -> None:
    """Each kind's table (its kind of time said), the first ``top`` rows, each with its cause."""
    rules = found.attrs.get("rules", {})
    print(f"noise: {rules.get('noise', F.NOISE_RULE)}", file=out)
    for kind in F.Kind:
        rows = found[found["kind"] == str(kind)]
        n = int((rows["call"] == str(F.Call.FINDING)).sum())
        print(f"\n{kind} findings ({n} beyond noise, {len(rows) - n} noise or not judged); time: "
              f"{F.BASIS[kind].split(':')[0] if kind == F.Kind.STEP else 'per traced step at the place'}", file=out)
        if rows.empty:
            print("  none" + ("" if found.attrs.get("pairs", 1) else f": {NO_PAIR}"), file=out)
            continue
        shown = rows.head(top) if top else rows
        print(table(shown, COLS), file=out)
        for _, r in shown.iterrows():
            print(f"  #{r['rank']} cause: {r['cause']}" + (f" [{r['caveat']}]" if r.get("caveat") else ""), file=out)
        for basis in dict.fromkeys(shown["basis"]):  # each case's own trace source
            print(f"  basis: {basis}", file=out)
        print("  share: of the case's " + ("clean step" if kind == F.Kind.STEP
                                           else "traced time per step (the same kind of time)"), file=out)


def write_check(checked: pd.DataFrame, out: TextIO) -> None:
    hits, n = checked.attrs.get("hit_rate", (0, 0))
    qh, qn = checked.attrs.get("quiet_hit_rate", (0, 0))
    print(f"\nremedies checked: {n}; predictions that came true: {hits}/{n}" + (f" ({hits / n:.0%})" if n else "")
          + f"; of the {qn} checked on a quiet machine: {qh}/{qn}. {F.HIT_RULE}", file=out)
    if n:
        print(table(checked, CHECK_COLS), file=out)


def write_csv(df: pd.DataFrame, path: str) -> None:
    with atomic_file(path) as fh:
        df.to_csv(fh, index=False)


# --- running the remedies ---------------------------------------------------------------------------
def run_command(group: dict[str, Any], cli: dict[str, Any], out: Path, steps: int | None, trials: int,
                python: list[str]) -> list[str]:
    """The ``kernelmap run`` of one framework's cases (its modes and batch sizes: their trials interleaved, so both
    sides of a mode's finding meet the same machine) as the checked run ran them (its warm-up, data, threads,
    seed, lr), with the capture pass that records the checked run's trace source."""
    cmd = [sys.executable, "-m", "kernelmap.cli", "run", "--framework", group["framework"], "--mode", *group["modes"],
           "--math", group["math"], "--batch-size", *map(str, group["batch_sizes"]), "--device", group["device"],
           "--profile", group["profile"], "--trials", str(trials), "--max-repeats", "0",
           "--steps", str(steps or cli.get("steps") or 20), "--out", str(out)]
    for opt in RUN_OPTIONS:
        if cli.get(opt) is not None:
            cmd += [f"--{opt.replace('_', '-')}", str(cli[opt])]
    for p in [*(cli.get("python") or []), *python]:
        cmd += ["--python", p]
    return cmd


def run_groups(sides: list[D.Side], checked_profile: str | None = None) -> dict[tuple, dict[str, Any]]:
    """The check's ``kernelmap run`` invocations: one per framework x math x device x capture pass. Each with the
    checked run's ``--profile`` (``checked_profile``) where that records the side's source, so that the fresh
    runs place kernels as it did (a kernel's layer and direction may come from its library call, which the libs
    pass logs: on an H200, session 13, PyTorch fp32's conv2 bwd_data FFT kernels had a place only through the
    cuDNN log, and a fresh run of the framework pass alone had no such place); else the pass of the source alone."""
    groups: dict[tuple, dict[str, Any]] = {}
    for s in sides:
        f = F.case_fields(s)
        profile = D.source_pass(s.source)
        if profile is None:
            raise KernelmapError(f"{s.label}: its source {s.source} is recorded by no kernelmap capture pass")
        if checked_profile in PROFILES and profile in PROFILES[checked_profile]:
            profile = checked_profile
        key = (str(f["framework"]), str(f["math"]), str(s.entry.get("device")), profile)
        g = groups.setdefault(key, {"framework": key[0], "math": key[1], "device": key[2], "profile": profile,
                                    "modes": [], "batch_sizes": []})
        g["modes"] += [str(f["mode"])] if str(f["mode"]) not in g["modes"] else []
        g["batch_sizes"] += [int(f["batch_size"])] if int(f["batch_size"]) not in g["batch_sizes"] else []
    return groups


def check_remedies(run_dir: Path, found: pd.DataFrame, sides: list[D.Side], n: int, out: Path,
                   steps: int | None, trials: int, python: list[str], alpha: float,
                   source: str | None, busy: bool = False) -> pd.DataFrame:
    """Run the cases of the ``n`` first runnable findings of each kind (``busy``: findings called busy machine
    too), fresh (``run_groups``), then judge them."""
    calls = {str(F.Call.FINDING), *([str(F.Call.BUSY)] if busy else [])}
    todo = found[found["call"].isin(calls) & found["runnable"].astype(bool)]
    todo = todo.groupby("kind", sort=False).head(n)
    by_label = {s.label: s for s in sides}
    cli = field_at(load_run(run_dir).manifest, "config.cli", default={})
    fresh: dict[str, D.Side] = {}
    needed = [by_label[x] for x in dict.fromkeys([*todo["case"], *todo["remedy_case"]])]
    for i, g in enumerate(run_groups(needed, cli.get("profile")).values()):
        where = out / f"{i + 1}-{g['framework']}"
        cmd = run_command(g, cli, where, steps, trials, python)
        print("kernelmap findings: " + " ".join(cmd[1:]), file=sys.stderr)
        done = subprocess.run(cmd, stdout=sys.stderr, check=False)
        if done.returncode != 0:
            raise KernelmapError(f"the check's run failed (exit {done.returncode}): {' '.join(cmd[1:])}")
        fresh.update({s.label: s for s in F.run_sides(load_run(where), None, source)})
    missing = [s.label for s in needed if s.label not in fresh]
    if missing:
        raise KernelmapError(f"{out}: the check's runs hold no timed {', '.join(missing)}")
    pairs = {(c, r): (fresh[c], fresh[r]) for c, r in zip(todo["case"], todo["remedy_case"], strict=True)}
    return F.check(todo, pairs, alpha)


def main(args: argparse.Namespace) -> int:
    if not 0 < args.alpha < 1:
        raise KernelmapError(f"--alpha {args.alpha}: a level between 0 and 1")
    run_dir = Path(args.run)
    run = load_run(run_dir)
    if run.records is None:
        raise KernelmapError(f"{run_dir}: no records.parquet (a run with capture passes, normalised)")
    sides = F.run_sides(run, set(args.batch_size or []), args.source)
    if not sides:
        raise KernelmapError(f"{run_dir}: no case with timed kernels or ops"
                             + (f" at batch size {args.batch_size}" if args.batch_size else ""))
    found = F.findings(sides, args.alpha)
    if args.csv:
        write_csv(found, args.csv)
    write(found, sys.stdout, args.top)
    if args.check_remedies:
        out = Path(args.check_out) if args.check_out else run_dir.parent / f"{run_dir.name}-checks"
        checked = check_remedies(run_dir, found, sides, args.check_remedies, out, args.check_steps,
                                 args.check_trials, args.python, args.alpha, args.source, args.check_busy)
        if args.check_csv:
            write_csv(checked, args.check_csv)
        write_check(checked, sys.stdout)
    return 0
