"""The option sweep (issue 37): every mode of every framework x batch sizes 1, 64, 1000, 1024 and one that does not
fit in memory x steps within one epoch, steps past it, --epochs 1 x synthetic and real data, each combination one
`kernelmap run` in its own process (one clean trial, no capture pass).

Each combination must either run (exit 0, or 3 where a framework ran on another device than asked; every case it
asked for in results.json, in its mode, with the timed steps the options make) or be refused before any work (a
non-zero exit with one `error:` line, no worker started, no run directory left). Anything else fails the sweep
(exit 1): a traceback anywhere in the output, a worker that failed, a refusal after work began, a combination that
ran where it should have been refused (or the reverse: a batch size the estimate says fits, a mode this device
has), a wrong number of timed steps.

What is expected to fit comes from the device's capacity (options.Memory.capacity: a GPU's memory.free +
memory.used, the host's MemTotal), not from what other processes leave free at the moment. A combination expected
to run that `kernelmap run` refuses for memory (options.MEMORY_NEED) is **blocked**: other processes held the
memory it fits in (the row names the device, what was free of its capacity and who held it). Blocked is no
result: it fails the sweep (exit 1), and a sweep that goes on runs it again.

    python benches/option_sweep.py --device cpu|gpu [--quick] [--out DIR] [--framework NAME] [--shard K/N]
                                   [--kernelmap "python -m kernelmap.cli"] [--python jax=PATH] [--real-dir DIR]
                                   [--run-arg=--stall-limit=150 ...] [--only PATTERN,...]
    python benches/option_sweep.py --table DIR...   # the markdown table of the rows DIR/sweep.jsonl holds (shards merged)

--budget SECONDS: start no combination after that long (exit 2); SIGTERM or Ctrl-C stops the running one (kernelmap
run keeps nothing partial) and records no row for it.

Rows are appended to OUT/sweep.jsonl as each combination finishes, and a combination already there is not run
again: a sweep cut off (a 10-minute command limit) goes on where it stopped when run again with the same --out.
Each combination's stderr is kept under OUT/logs/. The batch size that does not fit is twice the largest the
estimate of kernelmap/options.py fits in the device's capacity read at the start (per framework). --only: the
combinations whose name (framework-mode-bsN-length-data, the batch that does not fit as bsnofit) matches one of the
comma-separated shell patterns, e.g. mxnet-hybridized-bs1024-*-real."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernelmap.frameworks import data as kdata

from kernelmap import frameworks, options

BATCH_SIZES = (1, 64, 1000, 1024)
NOFIT = "nofit"
LENGTHS = ("within", "beyond", "epochs")  # --steps within epoch 0, --steps past it, --epochs 1
DATA = ("synthetic", "real")
WARMUP = 5  # `kernelmap run`'s default --warmup
WITHIN_STEPS = 20
# --quick, per mode: (batch size, data, length). Batch 1 within epoch 0 (past it is 60,000 steps on the real data
# unless --real-subset); 64 and 1024 past an epoch and --epochs 1 on real data, 1024 within on synthetic; the batch
# that does not fit once (it is refused whatever the length)
QUICK = ((1, "synthetic", "within"), (64, "real", "beyond"), (64, "real", "epochs"), (1024, "synthetic", "within"),
         (1024, "real", "beyond"), (1024, "real", "epochs"), (NOFIT, "synthetic", "within"))
BLOCKED = "blocked"  # refused for memory that other processes held: no result, fails the sweep, run again
OUTCOMES = ("ran", "refused", BLOCKED, "FAIL", "not run")
FAILING = ("FAIL", BLOCKED)


def length_args(length: str, bs: int, n_train: int) -> tuple[list[str], int | None]:
    """(the `kernelmap run` arguments of ``length`` at ``bs``, the timed steps they make: None where there is no
    full batch in ``n_train`` images, or --epochs 1 leaves nothing after the warm-up)."""
    per = n_train // bs  # steps an epoch (spec.steps_per_epoch); 0: no full batch, refused whatever the length
    if length == "epochs":
        return ["--epochs", "1"], (per - WARMUP if per > WARMUP else None)
    if length == "within":
        steps = max(min(WITHIN_STEPS, per - WARMUP), 1)
    else:  # past epoch 0: the warm-up and the steps end in epoch 1
        steps = per + 1 if per else n_train + 1
    return ["--steps", str(steps)], (steps if per else None)


def combos(device: str, quick: bool, only: str | None, nofit: dict[str, int]) -> list[dict]:
    """Every combination (``QUICK``'s with --quick), in order: framework, mode, batch size, data, length."""
    every = [(bs, data, length) for bs in (*BATCH_SIZES, NOFIT) for data in DATA for length in LENGTHS]
    return [{"framework": fw, "mode": mode, "nofit": bs == NOFIT, "length": length,
             "batch_size": nofit[fw] if bs == NOFIT else bs, "data": data, "device": device}
            for fw, d in frameworks.REGISTRY.items() if not only or fw == only
            for mode in d.modes for bs, data, length in (QUICK if quick else every)]


def real_subset(source: Path, n: int, dest: Path) -> Path:
    """The first ``n`` training and ``min(n, 1000)`` test images of the IDX files in ``source``, as IDX files in
    ``dest``: real images, epochs short enough for the CPU."""
    import gzip
    import struct

    import numpy as np

    info = kdata.resolve_data(argparse.Namespace(data=str(source), data_dir=None, seed=0))
    dest.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n), ("test", min(n, 1000))):
        for base in kdata.SPLIT_FILES[split]:
            path = source / info.files[base]
            with (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")) as fh:
                head = kdata.read_idx_header(path)
                size = 16 if head[0] == kdata.IMAGE_MAGIC else 8
                fh.read(size)
                per_item = 28 * 28 if head[0] == kdata.IMAGE_MAGIC else 1
                body = np.frombuffer(fh.read(count * per_item), dtype=np.uint8)
            with gzip.open(dest / f"{base}.gz", "wb") as out:
                out.write(struct.pack(">II", head[0], count) + (struct.pack(">II", 28, 28) if size == 16 else b""))
                out.write(body.tobytes())
    return dest


def key(c: dict) -> str:
    return f"{c['framework']}-{c['mode']}-bs{c['batch_size']}-{c['length']}-{c['data']}"


def slot(c: dict) -> str:
    """The combination's name whatever the device: ``key`` with the batch that does not fit as bsnofit (--only)."""
    return key({**c, "batch_size": NOFIT}) if c["nofit"] else key(c)


def only(todo: list[dict], patterns: str | None) -> list[dict]:
    """The combinations of ``todo`` whose ``slot`` matches one of the comma-separated ``patterns`` (all without);
    ValueError naming a pattern that matches none of the sweep's combinations."""
    if not patterns:
        return todo
    wanted = [x.strip() for x in patterns.split(",") if x.strip()]
    idle = [w for w in wanted if not any(fnmatch.fnmatchcase(slot(c), w) for c in todo)]
    if idle:
        raise ValueError(f"--only {', '.join(idle)}: no combination of this sweep (e.g. {slot(todo[0])})"
                         if todo else f"--only {patterns}: this sweep has no combination")
    return [c for c in todo if any(fnmatch.fnmatchcase(slot(c), w) for w in wanted)]


def expectation(c: dict, n_train: int, memory: options.Memory | None) -> str:
    """``run`` or ``refuse``: what the combination should do here. ``memory``: the device's capacity
    (options.Memory.capacity), not what others leave free of it."""
    if c["mode"] not in frameworks.get(c["framework"]).modes_on(c["device"]):
        return "refuse"
    bs = c["batch_size"]
    if bs > n_train or (memory and options.memory_problem(bs, [c["framework"]], memory)):
        return "refuse"
    return "run" if length_args(c["length"], bs, n_train)[1] else "refuse"


def classify(c: dict, n_train: int, rc: int, stderr: str, stdout: str, out: Path) -> tuple[str, str]:
    """(outcome, what it says) of one finished combination."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    errors = [x for x in lines if " error: " in x]
    first_error = errors[0] if errors else next((x for x in lines if "error" in x.lower()), "")
    if "Traceback" in stderr + stdout:
        return "FAIL", "traceback: " + (first_error or (lines[-1] if lines else ""))
    if rc in (0, 3) and (out / "results.json").is_file():
        results = json.loads((out / "results.json").read_text())
        timed = length_args(c["length"], c["batch_size"], n_train)[1]
        got = [(r["mode"], r["batch_size"], r["steps"]) for r in results]
        if got != [(c["mode"], c["batch_size"], timed)]:
            return "FAIL", f"results {got}, expected {[(c['mode'], c['batch_size'], timed)]}"
        dev = results[0]["device"]
        return "ran", f"{timed} steps timed on the {dev.upper()}" + (f" (exit {rc}: asked {c['device']})" if rc else "")
    worker_started = any(x.startswith("kernelmap run: [") for x in lines)
    if rc != 0 and len(errors) == 1 and not worker_started and not out.exists():
        return "refused", errors[0].removeprefix("kernelmap run: error: ")
    return "FAIL", f"exit {rc}: {first_error or (lines[-1] if lines else '(no output)')}"


def run_one(c: dict, n_train: int, kernelmap: list[str], python: list[str], out_dir: Path, real: Path,
            timeout: float, extra: tuple[str, ...] = ()) -> dict:
    run_out = out_dir / "runs" / key(c)
    data = ["--data", "synthetic"] if c["data"] == "synthetic" else ["--data", str(real)]
    argv = [*kernelmap, "run", "--framework", c["framework"], "--mode", c["mode"], "--device", c["device"],
            "--batch-size", str(c["batch_size"]), *length_args(c["length"], c["batch_size"], n_train)[0], *data,
            "--trials", "1", "--max-repeats", "0", "--profile", "none", "--out", str(run_out), *python, *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.terminate()  # kernelmap run stops its workers and keeps nothing partial
        stdout, stderr = proc.communicate()
        rc = None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (main): the run stops with the sweep, no row
        proc.terminate()
        proc.communicate(timeout=120)
        raise
    wall = time.monotonic() - t0
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs" / f"{key(c)}.stderr").write_text(stderr)
    if rc is None:
        outcome, said = "FAIL", f"timed out after {timeout:.0f} s"
    else:
        outcome, said = classify(c, n_train, rc, stderr, stdout, run_out)
    if outcome == "ran":
        shutil.rmtree(run_out, ignore_errors=True)  # the figures are not the sweep's point
    return {**c, "n_train": n_train, "argv": shlex.join(argv), "exit": rc, "outcome": outcome, "said": said,
            "wall_s": round(wall, 1)}


def read_memory(device: str) -> options.Memory | None:
    """What ``kernelmap run --device DEVICE`` reads: the memory free, the device's capacity, who holds it."""
    return options.free_memory(device, has_gpu=device == "gpu")


def nofit_sizes(memory: options.Memory | None) -> dict[str, int]:
    """Per framework, twice the largest batch the estimate fits in the device's capacity (``memory.capacity()``:
    what is free where the capacity was not read)."""
    if memory is None:
        return {fw: 10**9 for fw in frameworks.FRAMEWORKS}
    return {fw: 2 * max(options.largest_fitting(fw, memory.capacity()), 1) for fw in frameworks.FRAMEWORKS}


def held_said(memory: options.Memory | None) -> str:
    """"GPU 1 held by other processes, 0.5 of 139.8 GiB free (pid 8715 python3.12 holds 105.0 GiB)"."""
    if memory is None:
        return "memory held by other processes"
    cap = "" if memory.capacity_bytes is None else f" of {memory.capacity_bytes / options.GIB:.1f}"
    return (f"{memory.unit} held by other processes, {memory.free_bytes / options.GIB:.1f}{cap} GiB free"
            + options.holders_said(memory))


def verdict(row: dict, memory: options.Memory | None) -> dict:
    """The row against its expectation: a refusal for memory of a combination expected to run (a batch that fits
    the device's capacity) is ``BLOCKED``, named with what is free now and who holds it (``memory``: read again,
    now); any other mismatch is a FAIL."""
    if row["outcome"] == "refused" and row["expected"] == "run" and options.MEMORY_NEED in row["said"]:
        return {**row, "outcome": BLOCKED, "said": f"{BLOCKED}: {held_said(memory)}: {row['said']}"}
    if row["outcome"] not in ("FAIL", {"run": "ran", "refuse": "refused"}[row["expected"]]):
        return {**row, "outcome": "FAIL", "said": f"expected to {row['expected']}: {row['said']}"}
    return row


def table(rows: list[dict]) -> str:
    head = "| framework | mode | batch | length | data | expected | outcome | exit | s | what it said |"
    lines = [head, "|" + " --- |" * 10]
    for r in rows:
        bs = f"{r['batch_size']:,}" + (" (no fit)" if r["nofit"] else "")
        said = r["said"].replace("|", "\\|")
        lines.append(f"| {r['framework']} | {r['mode']} | {bs} | {r['length']} | {r['data']} | {r['expected']} | "
                     f"**{r['outcome']}** | {r['exit']} | {r['wall_s']} | {said} |")
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    lines.append("")
    lines.append(", ".join(f"{n} {o}" for o, n in counts.items()) + f" of {len(rows)} combinations"
                 + (f" ({counts[BLOCKED]} blocked: a batch that fits the device refused because other processes held "
                    "its memory; no result, run them again)" if counts[BLOCKED] else ""))
    return "\n".join(lines)


def read_rows(out: Path) -> list[dict]:
    path = out / "sweep.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def latest(rows: list[dict]) -> list[dict]:
    """The rows less each blocked row that a later row of its combination follows (it was run again)."""
    last = {key(r): i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if r["outcome"] != BLOCKED or last[key(r)] == i]


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the running combination is stopped, not left behind


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--quick", action="store_true", help="per mode: " + "; ".join(" ".join(map(str, q)) for q in QUICK))
    p.add_argument("--out", default="option-sweep", help="rows (sweep.jsonl), logs; a sweep there goes on")
    p.add_argument("--framework", choices=frameworks.FRAMEWORKS, help="this framework's combinations only")
    p.add_argument("--shard", default="1/1", help="K/N: every N-th combination from the K-th")
    p.add_argument("--kernelmap", default=f"{shlex.quote(sys.executable)} -m kernelmap.cli",
                   help="the command that is `kernelmap`")
    p.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH", help="passed to kernelmap run")
    p.add_argument("--real-dir", help="the real data's IDX directory (default: Fashion-MNIST where kernelmap finds it)")
    p.add_argument("--real-subset", type=int, metavar="N", help="real data: its first N training images (OUT/real-N)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one combination may take")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no combination after this many seconds (exit 2; the same command goes on)")
    p.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for every kernelmap run (--run-arg=--stall-limit=150)")
    p.add_argument("--only", metavar="PATTERN,...",
                   help="only the combinations named so (framework-mode-bsN-length-data, bsnofit; shell patterns)")
    p.add_argument("--table", metavar="DIR", nargs="+",
                   help="print the table of DIR/sweep.jsonl (several: the shards of one sweep, merged; a blocked "
                        "row gives way to a later row of its combination) and exit")
    a = p.parse_args(argv)
    if a.table:
        rows = latest([r for d in a.table for r in read_rows(Path(d))])
        print(table(rows))
        return 1 if any(r["outcome"] in FAILING for r in rows) else 0
    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    k, n = (int(x) for x in a.shard.split("/"))
    memory = read_memory(a.device)
    nofit = nofit_sizes(memory)
    capacity = memory.capacity() if memory else None
    real = Path(a.real_dir or kdata.DEFAULT_DIRS["fashion-mnist"])
    real_missing = None if real.is_dir() else f"no real data at {real} ({kdata.FIX})"
    if a.real_subset and not real_missing:
        real = real_subset(real, a.real_subset, out / f"real-{a.real_subset}")
    n_train = {"synthetic": kdata.SYNTHETIC_SIZES[0],
               "real": None if real_missing else kdata.resolve_data(argparse.Namespace(data=str(real), data_dir=None,
                                                                                       seed=0)).n_train}
    done = {key(r) for r in read_rows(out) if r["outcome"] != BLOCKED}
    try:
        chosen = only(combos(a.device, a.quick, a.framework, nofit), a.only)
    except ValueError as exc:
        p.error(str(exc))
    todo = [c for i, c in enumerate(chosen) if i % n == k - 1]
    print(f"option sweep on the {a.device.upper()}: {len(todo)} combinations ({len(done)} already in {out}); memory "
          f"read: {memory.to_dict() if memory else 'none'}; expected from: {capacity.where if capacity else 'none'}; "
          f"training images {n_train}; no-fit batch sizes {nofit}", file=sys.stderr)
    if memory and memory.capacity_bytes and memory.free_bytes < memory.capacity_bytes / 2:
        print(f"option sweep: {held_said(memory)}: combinations that need more will be blocked", file=sys.stderr)
    python = [x for item in a.python for x in ("--python", item)]
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    left = [c for c in todo if key(c) not in done]
    for i, c in enumerate(left):
        if a.budget is not None and time.monotonic() - t0 > a.budget:
            print(f"--budget {a.budget:g} s spent: {len(left) - i} combinations left; run again with --out {out}",
                  file=sys.stderr)
            return 2
        if c["data"] == "real" and real_missing:
            row = {**c, "expected": "run", "argv": "", "exit": None, "outcome": "not run", "said": real_missing,
                   "wall_s": 0.0}
        else:
            c["expected"] = expectation(c, n_train[c["data"]], capacity)
            row = run_one(c, n_train[c["data"]], shlex.split(a.kernelmap), python, out, real, a.timeout,
                         tuple(a.run_arg))
            row = verdict(row, (read_memory(a.device) if row["outcome"] == "refused" else None) or memory)
        with open(out / "sweep.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{row['outcome']:8} {row['wall_s']:7.1f} s  {key(c)}: {row['said'][:160]}", file=sys.stderr)
    rows = latest([r for r in read_rows(out) if r["device"] == a.device])
    print(table(rows))
    return 1 if any(r["outcome"] in FAILING for r in rows) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("option sweep: interrupted; the rows so far are kept (the same command goes on)", file=sys.stderr)
        sys.exit(130)
