"""kernelmap's clean pass against a bare loop of the same model, process by process, and the verdict on issue 38's
goal (the clean step within 5% of a bare mixed-precision loop at bs 1024, for each framework).

    python benches/harness_vs_bare.py run OUT [--math bf16] [--n 3] [--batch-size 1024 ...] [--device gpu]
                                              [--modes pytorch jax mxnet] [--steps 200] [--warmup 5] [--trials 3]
                                              [--mxnet-tree TREE] [--python NAME=PATH ...] [--cpus 0-3]
    python benches/harness_vs_bare.py OUT     the summary of OUT again (a mixed run: OUT/processes.jsonl; an fp32
                                              run of the GPU job's harness phase: OUT/bare.jsonl + run-*.json)

``run``: N rounds; in each, per mode and batch size, one process of benches/bare_mixed_loop.py (kernelmap's recipe
written again: bit-identical steps, tests/test_bare_mixed_loop.py) and one ``kernelmap run --profile none --trials
T --max-repeats 0`` (T worker processes), the order of the two swapped every round (drift in the host falls on both
sides). Same batch size, warm-up, timed steps (``--steps``: the bare loop's blocks of 10), synthetic data on the
device, the same clock (blocks of 10 steps between syncs), the same CPU thread environment (kernelmap run's
``thread_env``: OMP/MKL/OpenBLAS threads = the physical cores, OMP_WAIT_POLICY=PASSIVE). The math: ``--math`` for PyTorch and JAX; MXNet at fp16 on
the GPU (no bf16 there), bf16 on the CPU. One line per process into OUT/processes.jsonl (a kernelmap run: a line per
trial, each trial its own process), failures included (a line with ``error``: counted, never dropped).

The comparison, per mode x batch size: each side's per-process medians (ms/step) -> their median, range and spread
((max - min) / median); kernelmap / bare of the medians; and a Mann-Whitney U test (two-sided, kernelmap/utest.py)
of kernelmap's per-process medians against the bare loop's: whether the two differ beyond the spread between
processes of each. ``verdict``:
  pass          |kernelmap / bare - 1| <= 5% and each side's half-range <= 5% (the medians known to the goal's width)
  FAIL          beyond 5% (slower, or faster: then they do not run the same step) and the U test says the
                processes differ (p < 0.05)
  not resolved  beyond 5% but not beyond noise (U p >= 0.05, or too few processes for the test to reach 0.05:
                its smallest p is 2 / C(n1 + n2, n1), so 3 bare processes and 9 kernelmap trials at least),
                or within 5% with a side spread wider than the goal
  not measured  a side has no process that ran
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kernelmap import utest
from kernelmap.run.devices import physical_cores, thread_env


# --- the GPU job's fp32 harness (bare probes of .gpu/probes, one kernelmap trial a process) -------------------
def collect(out: Path) -> dict[tuple[str, int], dict[str, list[float]]]:
    """{(mode, batch size): {"bare": [ms per process], "kernelmap": [ms per process]}}."""
    table: dict[tuple[str, int], dict[str, list[float]]] = {}
    for line in (out / "bare.jsonl").read_text().splitlines() if (out / "bare.jsonl").is_file() else []:
        d = json.loads(line)
        table.setdefault((d["mode"], int(d["bs"])), {"bare": [], "kernelmap": []})["bare"].append(d["median_ms"])
    for f in sorted(out.glob("run-*.json")):
        mode = f.stem[len("run-"):].rsplit("-", 1)[0]
        text = f.read_text()
        if not text.strip():
            continue
        for r in json.loads(text)["results"]:
            table.setdefault((mode, int(r["batch_size"])), {"bare": [], "kernelmap": []})["kernelmap"].append(
                r["median_step_s"] * 1e3)
    return table


def summarise(table: dict[tuple[str, int], dict[str, list[float]]]) -> list[dict]:
    rows = []
    for (mode, bs), d in sorted(table.items()):
        b, k = d["bare"], d["kernelmap"]
        row = {"mode": mode, "batch_size": bs, "bare_n": len(b), "kernelmap_n": len(k)}
        for name, xs in (("bare", b), ("kernelmap", k)):
            row[f"{name}_ms"] = statistics.median(xs) if xs else None
            row[f"{name}_range_ms"] = (min(xs), max(xs)) if xs else None
        if b and k:
            row["ratio"] = row["kernelmap_ms"] / row["bare_ms"]
            row["bare_spread"] = (max(b) - min(b)) / row["bare_ms"]
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    out = ["mode bs | bare ms median [min-max] (n) | kernelmap clean ms median [min-max] (n) | kernelmap/bare | "
           "bare spread between processes"]
    def cell(r: dict, name: str) -> str:
        if r[f"{name}_ms"] is None:
            return "-"
        lo, hi = r[f"{name}_range_ms"]
        return f"{r[f'{name}_ms']:.3f} [{lo:.3f}-{hi:.3f}] ({r[f'{name}_n']})"

    for r in rows:
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        spread = f"{r['bare_spread']:.1%}" if "bare_spread" in r else "-"
        out.append(f"{r['mode']} {r['batch_size']} | {cell(r, 'bare')} | {cell(r, 'kernelmap')} | {ratio} | {spread}")
    return "\n".join(out)



# --- the mixed-precision comparison (``run``) ------------------------------------------------------------------
GOAL = 0.05  # issue 38: within 5%
ALPHA = 0.05  # the U test's level
PASS, FAIL, UNRESOLVED, NOT_MEASURED = "pass", "FAIL", "not resolved", "not measured"
BARE, KERNELMAP = "bare", "kernelmap"
PROCESSES = "processes.jsonl"
BARE_LOOP = Path(__file__).resolve().parent / "bare_mixed_loop.py"
BLOCK = 10  # steps between syncs: the bare loop's BLOCK, kernelmap.timing.BLOCK_STEPS


def framework_of(mode: str) -> str:
    return mode.split("-", 1)[0]


def math_of(mode: str, math: str, device: str) -> str:
    """The math a mode runs when ``math`` is asked: MXNet's AMP is fp16 on the GPU and bf16 on the CPU only."""
    if framework_of(mode) == "mxnet":
        return "fp16" if device == "gpu" else "bf16"
    return math


def plan(modes: list[str], n: int, batch_sizes: list[int]) -> list[tuple[int, str, int, str]]:
    """(round, mode, batch size, side) in the order they run: round by round, each mode and batch size a pair,
    the bare loop first in odd rounds and kernelmap first in even ones."""
    out = []
    for r in range(1, n + 1):
        for mode in modes:
            for bs in batch_sizes:
                sides = (BARE, KERNELMAP) if r % 2 else (KERNELMAP, BARE)
                out.extend((r, mode, bs, side) for side in sides)
    return out


def bare_argv(python: str, mode: str, math: str, bs: int, a: argparse.Namespace) -> list[str]:
    return [python, str(BARE_LOOP), mode, math, str(bs), "--device", a.device, "--warmup", str(a.warmup),
            "--blocks", str(a.steps // BLOCK)]


def kernelmap_argv(mode: str, math: str, bs: int, run_dir: Path, a: argparse.Namespace) -> list[str]:
    fw = framework_of(mode)
    argv = [sys.executable, "-m", "kernelmap.cli", "run", "--framework", fw, "--device", a.device, "--profile", "none",
            "--trials", str(a.trials), "--max-repeats", "0", "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--batch-size", str(bs), "--math", math, "--data", "synthetic", "--out", str(run_dir), "--replace", "--json"]
    if mode != fw:
        argv += ["--mode", mode.split("-", 1)[1]]
    for spec in a.python:
        argv += ["--python", spec]
    return argv


def trial_lines(results: list[dict], mode: str, math: str, bs: int) -> list[dict]:
    """One line per clean trial (a worker process) of the case in a run's results.json."""
    fw = framework_of(mode)
    want = mode.split("-", 1)[1] if mode != fw else None
    for entry in results:
        if (entry["framework"], int(entry["batch_size"]), entry.get("math")) != (fw, bs, math):
            continue
        if want is not None and entry.get("mode") != want:
            continue
        main = (entry.get("cpu_time") or {}).get("main_thread_median_step_s")  # the case's, over its trials
        return [{"trial": t["trial"], "median_ms": t["median_step_s"] * 1e3, "contended": t.get("contended"),
                 "used": t.get("used"), "main_cpu_ms": main * 1e3 if main is not None else None}
                for t in entry["trials"]]
    raise ValueError(f"no case {mode} {math} bs {bs} in the run's results.json")


CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")  # taskset -c's list: 0-3,8,10-11


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    """``argv`` run on the CPUs of ``cpus`` (taskset -c), both sides alike; unchanged without. A process's children
    (kernelmap run's workers) inherit its CPUs: the placement between processes is then not a source of their spread."""
    return ["taskset", "-c", cpus, *argv] if cpus else list(argv)


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def run_one(out: Path, r: int, mode: str, bs: int, side: str, a: argparse.Namespace) -> list[dict]:
    """One process (a kernelmap run: its trials), its lines for processes.jsonl."""
    math = math_of(mode, a.math, a.device)
    base = {"side": side, "mode": mode, "math": math, "bs": bs, "round": r, **({"cpus": a.cpus} if a.cpus else {})}
    fw, env = framework_of(mode), dict(os.environ)
    if side == BARE:
        python = dict(x.split("=", 1) for x in a.python).get(fw, sys.executable)
        env.update(thread_env(physical_cores()))  # the CPU threads and wait policy kernelmap run gives its workers
        if fw == "mxnet" and a.mxnet_tree:
            env.update(PYTHONPATH=f"{a.mxnet_tree}/python", MXTREE=a.mxnet_tree, KERNELMAP_MXNET_TREE=a.mxnet_tree)
        argv, log = bare_argv(python, mode, math, bs, a), out / "bare.err"
    else:
        run_dir = out / "runs" / f"{mode}-bs{bs}-{r}"
        argv, log = kernelmap_argv(mode, math, bs, run_dir, a), out / "kernelmap.err"
    argv = pinned(argv, a.cpus)
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=out, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return [{**base, "error": f"no result in {a.timeout} s (killed)"}]
    with open(log, "a") as fh:
        fh.write(f"--- round {r} {mode} bs {bs}: {' '.join(argv)} (exit {p.returncode})\n{p.stderr}")
    if p.returncode != 0:
        return [{**base, "error": f"exit {p.returncode}: {_last_line(p.stderr)}"}]
    if side == BARE:
        d = json.loads(_last_line(p.stdout))
        return [{**base, "median_ms": d["median_ms"], "iqr_ms": d["iqr_ms"], "version": d["version"],
                 "main_cpu_ms": d.get("main_cpu_ms")}]
    (out / f"km-{mode}-bs{bs}-{r}.json").write_text(p.stdout)
    try:
        trials = trial_lines(json.loads((run_dir / "results.json").read_text()), mode, math, bs)
    except (OSError, ValueError, KeyError) as exc:
        return [{**base, "error": f"{run_dir}/results.json: {exc}"}]
    return [{**base, **t} for t in trials]


def run(a: argparse.Namespace) -> int:
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if (out / PROCESSES).exists():
        raise SystemExit(f"{out / PROCESSES} exists: give a new OUT (the runs of one sitting are compared)")
    t0, failed = time.monotonic(), 0
    for r, mode, bs, side in plan(a.modes, a.n, a.batch_size):
        lines = run_one(out, r, mode, bs, side, a)
        with open(out / PROCESSES, "a") as fh:
            fh.writelines(json.dumps(x) + "\n" for x in lines)
        failed += sum("error" in x for x in lines)
        shown = ", ".join(x["error"] if "error" in x else f"{x['median_ms']:.3f}" for x in lines)
        print(f"[{time.monotonic() - t0:.0f} s] round {r} {mode} {lines[0]['math']} bs {bs} {side}: {shown}", flush=True)
    rows = summarise_processes(read_processes(out))
    (out / "verdict.json").write_text(json.dumps(rows, indent=1))
    print(format_verdicts(rows))
    return 1 if failed else 0


def read_processes(out: Path) -> list[dict]:
    path = out / PROCESSES
    lines = []
    for k, text in enumerate(path.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(text))
        except ValueError as exc:
            raise SystemExit(f"{path}:{k}: not a JSON line ({exc})") from exc
    return lines


def verdict(bare: list[float], km: list[float]) -> dict:
    """The call on kernelmap's per-process medians ``km`` against the bare loop's ``bare`` (the module's rule)."""
    if not bare or not km:
        return {"verdict": NOT_MEASURED, "why": f"{len(bare)} bare processes and {len(km)} kernelmap trials ran"}
    mb, mk = statistics.median(bare), statistics.median(km)
    ratio = mk / mb
    spread = {BARE: (max(bare) - min(bare)) / mb, KERNELMAP: (max(km) - min(km)) / mk}
    p, floor = utest.p_value(km, bare), utest.min_p(len(km), len(bare))
    out = {"ratio": ratio, "spread": spread, "u_p": p, "u_min_p": floor}
    word = "slower" if ratio > 1 else "faster"
    diff = f"kernelmap {abs(ratio - 1):.1%} {word} than the bare loop"
    if abs(ratio - 1) <= GOAL + 1e-12:  # 5.0% is within 5% (2.1 / 2.0 - 1 is 0.05 + 4e-17 in floats)
        wide = max(spread.values()) / 2
        if wide <= GOAL:
            return {**out, "verdict": PASS, "why": f"{diff}: within {GOAL:.0%}"}
        return {**out, "verdict": UNRESOLVED, "why": f"{diff}, but the processes spread ±{wide:.1%}, wider than the goal"}
    if floor >= ALPHA:
        return {**out, "verdict": UNRESOLVED, "why": f"{diff}; too few processes to test ({len(bare)} bare, "
                f"{len(km)} kernelmap: the U test's smallest p is {floor:.3f} >= {ALPHA})"}
    if p >= ALPHA:
        return {**out, "verdict": UNRESOLVED, "why": f"{diff}, within the noise between processes (U p = {p:.3f})"}
    what = "" if ratio > 1 else ": they do not run the same step"
    return {**out, "verdict": FAIL, "why": f"{diff}, beyond the noise between processes (U p = {p:.4f}){what}"}


def summarise_processes(lines: list[dict]) -> list[dict]:
    """A row per mode x math x batch size: each side's per-process medians, failures, kernelmap's contended trials
    and the verdict."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for x in lines:
        groups.setdefault((x["mode"], x["math"], int(x["bs"])), {BARE: [], KERNELMAP: []})[x["side"]].append(x)
    rows = []
    for (mode, math, bs), sides in sorted(groups.items()):
        row = {"mode": mode, "math": math, "batch_size": bs}
        for side, xs in sides.items():
            ok = [x["median_ms"] for x in xs if "error" not in x]
            row[side] = {"n": len(ok), "failed": [x["error"] for x in xs if "error" in x],
                         "median_ms": statistics.median(ok) if ok else None,
                         "range_ms": [min(ok), max(ok)] if ok else None, "per_process_ms": ok,
                         "main_cpu_ms": _median_of(x.get("main_cpu_ms") for x in xs if "error" not in x)}
        row[KERNELMAP]["contended"] = sum(1 for x in sides[KERNELMAP] if x.get("contended"))
        row[KERNELMAP]["runs"] = len({x["round"] for x in sides[KERNELMAP]})
        row["cpus"] = sorted({x["cpus"] for xs in sides.values() for x in xs if x.get("cpus")})
        rows.append({**row, **verdict(row[BARE]["per_process_ms"], row[KERNELMAP]["per_process_ms"])})
    return rows


def _median_of(xs) -> float | None:
    """The median of the figures given, None where none is."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def format_verdicts(rows: list[dict]) -> str:
    out = [f"issue 38: kernelmap's clean step against a bare loop of the same recipe; per-process medians (ms/step), "
           f"median [min-max] (processes); verdict: within {GOAL:.0%}, beyond the noise (U test at {ALPHA})",
           "mode math bs | bare | kernelmap clean | kernelmap/bare | spread bare, kernelmap | U p | verdict"]

    def cell(s: dict, extra: str = "") -> str:
        failed = f", {len(s['failed'])} failed" if s["failed"] else ""
        if s["median_ms"] is None:
            return f"- (0{failed})"
        lo, hi = s["range_ms"]
        return f"{s['median_ms']:.3f} [{lo:.3f}-{hi:.3f}] ({s['n']}{extra}{failed})"

    for r in rows:
        k = r[KERNELMAP]
        extra = f" trials of {k['runs']} runs" + (f", {k['contended']} contended" if k.get("contended") else "")
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        spread = f"{r['spread'][BARE]:.1%}, {r['spread'][KERNELMAP]:.1%}" if "spread" in r else "-"
        p = f"{r['u_p']:.4f}" if "u_p" in r else "-"
        out.append(f"{r['mode']} {r['math']} {r['batch_size']} | {cell(r[BARE])} | {cell(k, extra)} | {ratio} | "
                   f"{spread} | {p} | {r['verdict']}: {r['why']}")
        if r.get("cpus"):
            out.append(f"    every process on CPUs {' and '.join(r['cpus'])} (taskset -c)")
        mains = [r[side].get("main_cpu_ms") for side in (BARE, KERNELMAP)]
        if None not in mains:  # where the host's time went: the main thread's work, or waiting
            out.append(f"    main thread's CPU ms a step (median): bare {mains[0]:.3f}, kernelmap {mains[1]:.3f}")
        for side in (BARE, KERNELMAP):
            out.extend(f"    {side} failed: {e}" for e in r[side]["failed"])
    return "\n".join(out)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="harness_vs_bare.py run", description="interleaved bare loop vs kernelmap run")
    p.add_argument("out")
    p.add_argument("--math", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--n", type=int, default=3, help="rounds: bare processes per mode (default 3)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1024])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--modes", nargs="+", default=["pytorch", "jax", "mxnet"],
                   choices=["pytorch", "jax", "mxnet", "mxnet-hybridized"])
    p.add_argument("--steps", type=int, default=200, help=f"timed steps, a multiple of {BLOCK} (default 200)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--trials", type=int, default=3, help="kernelmap run --trials (default 3)")
    p.add_argument("--mxnet-tree", help="the sm_90 MXNet tree for the bare MXNet loop (kernelmap run finds its own)")
    p.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                   help="a framework's interpreter: the bare loop's, and kernelmap run's --python")
    p.add_argument("--timeout", type=int, default=600, help="seconds a process may take (default 600)")
    p.add_argument("--cpus", help="taskset -c list (e.g. 0-3): every process of both sides on these CPUs")
    a = p.parse_args(argv)
    if a.steps < BLOCK or a.steps % BLOCK or a.n < 1 or a.trials < 1:
        p.error(f"--steps must be a positive multiple of {BLOCK}; --n and --trials >= 1")
    if a.cpus is not None and not CPU_LIST.match(a.cpus):
        p.error(f"--cpus {a.cpus}: not a CPU list (taskset -c's form: 0-3,8)")
    if a.cpus is not None and shutil.which("taskset") is None:
        p.error("--cpus needs taskset (util-linux), not found on PATH")
    if any("=" not in x for x in a.python):
        p.error("--python takes NAME=PATH")
    if a.device == "cpu" and a.math == "fp16" and "pytorch" in a.modes:
        p.error("pytorch fp16 runs on the GPU only (kernelmap refuses it on the CPU)")
    return a


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return run(parse(argv[1:]))
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    if (out / PROCESSES).is_file():
        print(format_verdicts(summarise_processes(read_processes(out))))
    else:
        print(format_rows(summarise(collect(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
