"""One framework x batch size x capture pass, in its own process: ``python -m kernelmap.worker``.

The parent (``kernelmap run``) imports no framework; each worker imports exactly one. The worker
writes its result to ``<dir>/<pass>.json`` and nothing to stdout, so that stdout holds only what
libraries print there (oneDNN verbose lines in the ``libs`` pass on the CPU, captured by the
parent into ``onednn.log``). Progress and errors go to stderr.

Exit codes: 0 done; 1 an unexpected failure (traceback on stderr); 2 a ``KernelmapError`` (one
line); ``EXIT_OOM`` the device ran out of memory (one line naming the batch size).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kernelmap import contention, cpusampler, frameworks, heap, rundir, stall, timing
from kernelmap.atomic import atomic_file
from kernelmap.errors import KernelmapError
from kernelmap.frameworks import dataparallel
from kernelmap.frameworks.registry import NsysWindow
from kernelmap.gcpause import no_gc

# counters: kernelmap/run/counters.py; noreduce (dataparallel.NO_REDUCTION): the step without the gradients'
# reduction on N devices, timed as the clean pass is
FRAMEWORK_PASS = "framework"  # the framework profiler's pass (on the CPU, with kernelmap.cpusampler)
PASSES = ("clean", FRAMEWORK_PASS, "libs", "nsys", "counters", dataparallel.NO_REDUCTION)
TIMED_AS_CLEAN = ("clean", dataparallel.NO_REDUCTION)  # no capture, the clean pass's timing (kernelmap.timing)
EXIT_OOM = 75
OOM_MARKER = "kernelmap-worker: out of memory"


# What an allocation failure says on the CPU (measured under `ulimit -v`): torch's
# "DefaultCPUAllocator: can't allocate memory: ... Error code 12 (Cannot allocate memory)",
# MXNet's "Failed to allocate CPU Memory", C++'s std::bad_alloc.
_CPU_OOM = ("defaultcpuallocator: can't allocate memory", "defaultcpuallocator: not enough memory",
            "cannot allocate memory", "failed to allocate cpu memory", "bad_alloc")


def _oom_line(exc: BaseException) -> str:
    """The line of the message that says what failed (MXNet's message starts with a C++ stack)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = [line.lower() for line in lines]
    hit = next((i for i, t in enumerate(text) if "out of memory" in t or any(m in t for m in _CPU_OOM)), None)
    return lines[hit] if hit is not None else (lines[0] if lines else "")


def _is_oom(exc: BaseException) -> bool:
    """True for a device or host allocation failure (not for any error that mentions memory)."""
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):  # torch.OutOfMemoryError
        return True
    text = str(exc).lower()
    if "out of memory" in text and ("cuda" in text or "cudamalloc" in text or "gpu" in text):
        return True
    return any(marker in text for marker in _CPU_OOM)


def summarise(step_times: list[float], batch_size: int) -> dict[str, Any]:
    """Median, quartiles, IQR and images/s of per-step times (seconds)."""
    if not step_times:
        raise ValueError("no timed steps")
    arr = np.asarray(step_times, dtype=np.float64)
    q25, median, q75 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    return {
        "median_step_s": median,
        "q25_step_s": q25,
        "q75_step_s": q75,
        "iqr_step_s": q75 - q25,
        "mean_step_s": float(arr.mean()),
        "stdev_step_s": statistics.stdev(step_times) if len(step_times) > 1 else 0.0,
        "images_per_s": batch_size / median if median > 0 else None,
    }


# --- the timed loop -----------------------------------------------------------------------------
def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=not enabled, leave=False)


def _threads(workload) -> dict[str, Any]:
    """CPU thread settings this worker ran with: the environment the runner set, and the framework's own."""
    env = {k: os.environ.get(k) for k in (*timing.THREAD_ENV, *timing.WAIT_ENV, *timing.ALLOC_ENV)}
    return {"env": env, "framework": workload.threads(), timing.MMAP_THRESHOLD_SET: _MMAP_THRESHOLD[0]}


_MMAP_THRESHOLD: list[int | None] = [None]  # the mmap threshold raise_mmap_threshold set, else None


def raise_mmap_threshold(environ=os.environ) -> int | None:
    """Where the runner gave this worker ``timing.ALLOC_ENV``'s mmap threshold, raise it to
    ``timing.MMAP_THRESHOLD_RAISED`` with mallopt (``heap.set_mmap_threshold``); the threshold set, None where
    glibc refused it or the variable is another's (kept)."""
    name = timing.MMAP_THRESHOLD_ENV
    if environ.get(name) != timing.ALLOC_ENV[name] or not heap.set_mmap_threshold(timing.MMAP_THRESHOLD_RAISED):
        return None
    _MMAP_THRESHOLD[0] = timing.MMAP_THRESHOLD_RAISED
    return timing.MMAP_THRESHOLD_RAISED


def _plan(workload, steps: int | None, epochs: int | None, warmup: int) -> tuple[int, np.ndarray]:
    """The pass's step count (warm-up included) and its images in order: every step a full batch, each
    epoch's partial batch dropped (spec.PARTIAL_BATCH_NOTE; kernelmap/options.py refuses what leaves no
    step to time before any worker starts)."""
    from kernelmap.frameworks import spec

    bs, info = workload.config.batch_size, workload.data_info
    total = stall.worker_steps(bs, warmup, steps, epochs, info.n_train)
    if total <= warmup:
        raise KernelmapError(f"{total} steps of {bs} images, no more than the {warmup} warm-up steps: nothing to time")
    return total, spec.training_batches(info.n_train, workload.config.seed, bs, total).ravel()


def _capture(workload, pass_name: str, out_dir: Path, framework: str) -> contextlib.AbstractContextManager:
    """What records the timed steps of ``pass_name``: nothing for the clean pass."""
    if pass_name == "counters":  # ncu --profile-from-start off: the framework's own profiler window, else the driver's
        if frameworks.get(framework).nsys_window(os.environ) is NsysWindow.PROFILER_API:
            return workload.nsys_window()
        from kernelmap import cudaprofiler

        return cudaprofiler.window(workload.synchronize)
    if pass_name == FRAMEWORK_PASS:
        return workload.profile(out_dir)  # writes out_dir/trace.json.gz (+ companions)
    if pass_name == "nsys":
        return workload.nsys_window()
    if pass_name == "libs":
        return workload.libs_trace(out_dir / rundir.LIBS_TRACE_DIR)  # the logs' own kernels (calllink)
    return contextlib.nullcontext()


class _Clocks:
    """The timed loop's figures: per timed block its wall seconds per step, the process's and the main
    thread's CPU seconds per step (timing.CPU_METHOD), its steps; per batch fetched its loader seconds;
    the CPU windows of contention.CpuWindow and the GPU states."""

    def __init__(self, workload):
        self.workload = workload
        self.samples: list[float] = []
        self.cpu_samples: list[float] = []
        self.main_samples: list[float] = []
        self.fault_samples: list[float] = []  # minor page faults of the process a step
        self.sample_steps: list[int] = []
        self.loader_times: list[float] = []
        self.cpu_windows: list[dict[str, Any]] = []
        self.gpu_states: list[dict[str, Any] | None] = []
        self.e2e_wall = 0.0  # the windows' wall time: fetching their batches (clean pass) and their steps
        self.loss = None  # the last step's loss
        self.sampler: cpusampler.Sampler | None = None  # the CPU framework pass's per-op CPU time

    def fetch(self, batches, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            out.append(next(batches))
            self.workload.synchronize()  # the host-to-device copy is the loader's, not the step's
            self.loader_times.append(time.perf_counter() - t0)
        return out

    def block(self, fetched: list[Any], k: int, i: int, block: int) -> None:
        """Train ``block`` steps from ``fetched[k:]`` (steps ``i``...) between one read of each clock."""
        w = self.workload
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, m0 = time.process_time(), time.thread_time()  # outside the wall clock's reads
        s0 = time.monotonic_ns() if self.sampler is not None else 0  # a capture pass: one step a block
        t0 = time.perf_counter()
        for j in range(block):
            images, labels = fetched[k + j]
            with w.region(f"kernelmap:step#{i + j}"):
                self.loss = w.train_step(images, labels)
        w.synchronize()
        self.samples.append((time.perf_counter() - t0) / block)
        if self.sampler is not None:
            self.sampler.mark(i, s0, time.monotonic_ns())
        self.cpu_samples.append((time.process_time() - c0) / block)
        self.main_samples.append((time.thread_time() - m0) / block)
        self.fault_samples.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / block)
        self.sample_steps.append(block)


def _warm_up(workload, batches, warmup: int, bar) -> Any:
    loss = None
    for i in range(warmup):
        images, labels = next(batches)
        with workload.region(f"kernelmap:step#{i}"):
            loss = workload.train_step(images, labels)
        workload.synchronize()
        bar.update()
    return loss


def _timed(clocks: _Clocks, batches, *, clean: bool, reuse: bool, warmup: int, n_timed: int,
           capture, bar, on_gpu: bool, gpu_state) -> list[Any] | None:
    """The timed steps, window by window; the batches reused (``reuse``), else None.

    A capture pass records training steps, not the loader: all its batches are fetched before the
    capture starts. The clean pass fetches a window at a time (``reuse``: one window's once)."""
    windows = timing.blocks(n_timed, timing.WINDOW_STEPS if clean else max(n_timed, 1))
    block_steps = timing.BLOCK_STEPS if clean else 1
    prefetched = (None if clean and not reuse
                  else clocks.fetch(batches, min(n_timed, timing.WINDOW_STEPS) if reuse else n_timed))
    i = warmup
    if on_gpu:
        clocks.gpu_states.append(gpu_state())
    with capture:
        whole = None if clean else contention.CpuWindow.start()
        if clocks.sampler is not None:  # a thread of this process: its CPU time is the worker's own
            clocks.sampler.start()
        for window in windows:
            # timing.GC_RULE: a full collection before each window, outside every clock; the
            # collector off within it, so that cyclic garbage lives for one window at most.
            with no_gc(collect=True):
                cpu = contention.CpuWindow.start() if clean else None
                w0 = time.perf_counter()
                if reuse:
                    fetched = [prefetched[(i - warmup + j) % len(prefetched)] for j in range(window)]
                elif clean:
                    fetched = clocks.fetch(batches, window)
                else:
                    fetched = prefetched[i - warmup : i - warmup + window]
                k = 0
                for block in timing.blocks(window, block_steps):
                    clocks.block(fetched, k, i, block)
                    k += block
                    i += block
                    bar.update(block)
                del fetched
                clocks.e2e_wall += time.perf_counter() - w0
                if cpu is not None:
                    clocks.cpu_windows.append(cpu.stop())
        if clocks.sampler is not None:
            clocks.sampler.stop()
        if whole is not None:
            clocks.cpu_windows.append(whole.stop())
    if on_gpu:
        clocks.gpu_states.append(gpu_state())
    return prefetched if reuse else None


def _result(clocks: _Clocks, workload, *, framework: str, pass_name: str, warmup: int, n_timed: int,
            reused: list[Any] | None) -> dict[str, Any]:
    clean = pass_name in TIMED_AS_CLEAN
    bs = workload.config.batch_size
    result = {"pass": pass_name, "warmup_steps": warmup, "steps": n_timed,
              "block_steps": timing.BLOCK_STEPS if clean else 1,
              "step_times_s": clocks.samples, "sample_steps": clocks.sample_steps,
              "timing": timing.STEP_METHOD if clean else timing.CAPTURE_METHOD,
              timing.CPU_SAMPLES: clocks.cpu_samples, timing.MAIN_THREAD_SAMPLES: clocks.main_samples,
              timing.FAULT_SAMPLES: clocks.fault_samples,
              "cpu_timing": timing.CPU_METHOD,
              **summarise(clocks.samples, bs)}
    if clocks.loader_times:
        result["loader_batch_s"] = float(np.median(clocks.loader_times))
    if reused is not None:
        result["batches_reused"] = len(reused)
        result["e2e_step_s"] = None
        result["e2e_timing"] = timing.REUSE_METHOD
    elif clean:
        result["e2e_step_s"] = clocks.e2e_wall / n_timed
        result["e2e_timing"] = timing.E2E_METHOD
    result["contention_windows"] = clocks.cpu_windows
    result["contention_gpu"] = [g for g in clocks.gpu_states if g is not None]
    result["contention"] = contention.summarise(clocks.cpu_windows, result["contention_gpu"])
    loss = clocks.loss
    result["final_loss"] = workload.to_float(loss) if loss is not None else None
    result["threads"] = _threads(workload)
    if clocks.sampler is not None:
        result[cpusampler.RESULT_KEY] = clocks.sampler.figures  # its samples: cpusampler.SAMPLES_FILE
    if loss is not None and not np.isfinite(result["final_loss"]):
        raise KernelmapError(f"{framework} bs {bs}: the loss is {result['final_loss']} after training")
    return result


def run_pass(workload, *, framework: str, pass_name: str, out_dir: Path, steps: int | None,
             epochs: int | None, warmup: int, progress: bool, reuse_batches: bool = False,
             gpu_state=contention.gpu_state) -> dict[str, Any]:
    """Train ``warmup`` untimed steps then ``steps`` timed ones (or ``epochs`` epochs, the first
    ``warmup`` steps untimed); the capture of ``pass_name`` covers the timed steps only.

    Timing follows ``kernelmap.timing``: batches are fetched onto the device before the steps
    that use them (the loader is timed on its own); the clean pass synchronises every
    ``timing.BLOCK_STEPS`` steps, a capture pass after every step. ``reuse_batches`` (clean pass):
    fetch at most ``timing.WINDOW_STEPS`` batches once, before the timed steps, and cycle through
    them (``timing.REUSE_METHOD``): no end-to-end figure then.

    Contention (``kernelmap.contention``): a CPU window around each timed window of the clean pass
    (around the whole capture of a capture pass), started and stopped outside every clock; on the GPU
    ``gpu_state`` before and after the timed steps. Stages: _plan, _warm_up, _timed, _result."""
    # Per-step profiler ranges (workload.region) cost the clean pass: only capture passes trace them.
    workload.trace_regions = pass_name not in TIMED_AS_CLEAN
    bs = workload.config.batch_size
    total, order = _plan(workload, steps, epochs, warmup)
    clean = pass_name in TIMED_AS_CLEAN
    clocks = _Clocks(workload)
    capture = _capture(workload, pass_name, out_dir, framework)
    if pass_name == FRAMEWORK_PASS and workload.config.device == "cpu":
        clocks.sampler = cpusampler.Sampler(out_dir)
    batches = iter(workload.batches("train", bs, order))
    n_timed = total - warmup
    with _progress(total, progress, f"{framework} bs{bs} {pass_name}") as bar:
        clocks.loss = _warm_up(workload, batches, warmup, bar)
        reused = _timed(clocks, batches, clean=clean, reuse=clean and reuse_batches, warmup=warmup,
                        n_timed=n_timed, capture=capture, bar=bar,
                        on_gpu=workload.config.device == "gpu", gpu_state=gpu_state)
    if sum(clocks.sample_steps) != n_timed:
        raise RuntimeError(f"timed {sum(clocks.sample_steps)} steps, expected {n_timed}")
    return _result(clocks, workload, framework=framework, pass_name=pass_name, warmup=warmup,
                   n_timed=n_timed, reused=reused)


def peaks_of(workload, framework: str) -> dict[str, Any]:
    """The GPU's peaks as the framework reaches them (a large GEMM per precision through its BLAS, a
    device-to-device copy), for the roofline (reports/analyses/roofline.py); a workload without
    ``measure_peaks`` says so, and so does one whose measurement raised (its type and message: the counters
    pass's kernels are kept, the roofline says it has no roofs; a measurement runs after ncu's window closed)."""
    measure = getattr(workload, "measure_peaks", None)
    if measure is None:
        return {"not_measured": f"{frameworks.get(framework).label}'s workload measures no peaks"}
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed: results.json's counters.peaks says it
        return {"not_measured": f"the peaks' measurement failed: {type(exc).__name__}: {exc}"}


def _spread(framework: str, config, argv: list[str] | None, case_dir: Path) -> int | None:
    """A case on ``config.devices`` devices: its framework's environment for them set here, before the
    framework is imported (XLA's host device count); where it runs one process per device and this is not
    yet one of them, the ranks launched (``dataparallel.launch``) and their exit status returned; else None
    (this process trains)."""
    d = frameworks.get(framework)
    why = dataparallel.refusal(d, config.mode or d.default_mode, config.devices)
    if why:
        raise KernelmapError(why)
    dp = d.data_parallel
    dataparallel.check_divides(config.batch_size, config.devices)
    os.environ.update(dataparallel.case_env(os.environ, dp, config.devices, config.device))
    if dp.processes and not dataparallel.is_rank():
        cmd = [sys.executable, "-m", __spec__.name, *(sys.argv[1:] if argv is None else argv)]
        for r in range(1, config.devices):  # each rank's own folder, for its captures and library logs
            dataparallel.rank_dir(case_dir, r).mkdir(parents=True, exist_ok=True)
        envs = [dataparallel.rank_paths(os.environ, case_dir, r) for r in range(config.devices)]
        return dataparallel.launch([cmd] * config.devices, rank_envs=envs)
    return None


def main(argv: list[str] | None = None) -> int:
    dataparallel.die_with_launcher()  # a rank of a case run one process per device: not past its launcher
    stall.dump_stacks_on_signal()  # the runner's stall guard asks for every thread's stack (into our log)
    raise_mmap_threshold()  # before any framework allocates
    p = argparse.ArgumentParser(prog="python -m kernelmap.worker", description=__doc__.splitlines()[0])
    p.add_argument("--framework", required=True, choices=frameworks.FRAMEWORKS)
    p.add_argument("--pass", dest="pass_name", required=True, choices=PASSES)
    p.add_argument("--dir", required=True, help="the framework x batch size folder of the run")
    p.add_argument("--config", required=True, help="TrainConfig as JSON (device = the one to use)")
    p.add_argument("--data-info", required=True, help="data.DataInfo as JSON, resolved by the parent")
    p.add_argument("--steps", type=int, help="timed steps of this pass (default: the config's)")
    p.add_argument("--warmup", type=int, help="untimed warm-up steps of this pass (default: the config's)")
    p.add_argument("--no-evaluate", action="store_true", help="skip the test-set accuracy")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.add_argument("--cache-dir", help="where data.prepare_dir lays the files out")
    p.add_argument("--trial", type=int, help="trial number of a repeated pass (names its result file)")
    p.add_argument("--reuse-batches", action="store_true",
                   help=f"clean pass: fetch at most {timing.WINDOW_STEPS} batches once and cycle through them "
                        "(a repeat trial: the loader was timed by the first)")
    args = p.parse_args(argv)

    from kernelmap.frameworks import load_workload, spec
    from kernelmap.frameworks.data import DataInfo


    config = spec.TrainConfig(**json.loads(args.config))
    data_info = DataInfo(**json.loads(args.data_info))
    stall.hang_for_test(args.framework, args.pass_name, config.batch_size)
    try:
        if config.devices > 1 and (launched := _spread(args.framework, config, argv, Path(args.dir))) is not None:
            return launched  # the ranks ran (one process per device) and wrote their results
    except KernelmapError as exc:
        print(f"kernelmap-worker: error: {exc}", file=sys.stderr)
        return 2
    out_dir = dataparallel.rank_dir(Path(args.dir), dataparallel.rank())
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = args.steps if args.steps is not None else config.steps
    epochs = None if args.steps is not None else config.epochs
    if steps is None and epochs is None:
        raise KernelmapError("neither steps nor epochs given")
    try:
        Workload = load_workload(args.framework)
        workload = Workload(config, data_info, args.cache_dir)
        if args.pass_name == dataparallel.NO_REDUCTION:  # before the first step (DDP's hook must be)
            if config.devices < 2:
                raise KernelmapError(f"the {args.pass_name} pass removes the reduction over several devices: "
                                     "this case trains on one")
            frameworks.load_parallel(args.framework).drop_reduction(workload)
        t0 = time.perf_counter()
        result = run_pass(workload, framework=args.framework, pass_name=args.pass_name, out_dir=out_dir,
                          steps=None if epochs is not None else steps, epochs=epochs,
                          warmup=config.warmup_steps if args.warmup is None else args.warmup,
                          progress=args.progress, reuse_batches=args.reuse_batches)
        result["train_wall_s"] = time.perf_counter() - t0
        if args.pass_name == "counters":  # after the window closed: ncu profiles none of these kernels
            result["peaks"] = peaks_of(workload, args.framework)
        evaluate = not args.no_evaluate and dataparallel.rank() == 0  # the ranks hold the same weights
        result["test_accuracy"] = float(workload.evaluate()) if evaluate else None
        result.update(framework=args.framework, mode=workload.mode, batch_size=config.batch_size,
                      devices=config.devices, rank=dataparallel.rank(),
                      device=config.device, versions=workload.versions(), math_notes=workload.math_notes(),
                      pid=os.getpid(),
                      math=config.math,  # tf32 on the CPU is refused before (frameworks.math_refusal)
                      tf32_override=os.environ.get(spec.TF32_OVERRIDE))
    except KernelmapError as exc:
        print(f"kernelmap-worker: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if _is_oom(exc):
            print(f"{OOM_MARKER} at batch size {config.batch_size} ({type(exc).__name__}: {_oom_line(exc)})",
                  file=sys.stderr)
            return EXIT_OOM
        raise
    if args.trial is not None:
        result["trial"] = args.trial
    with atomic_file(out_dir / rundir.pass_result_name(args.pass_name, args.trial)) as fh:
        json.dump(result, fh, indent=1)
    leave_group(args.framework)
    return 0


def leave_group(framework: str) -> None:
    """A rank of a case run one process per device leaves its process group once its pass is done and written
    (rank 0 of PyTorch's DDP x2 on the H200s: "destroy_process_group() was not called before program exit").
    Not on a failed pass: destroying may wait on collectives its peers never join (launch stops them)."""
    if dataparallel.is_rank():
        frameworks.load_parallel(framework).leave()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the parent says "interrupted" once; no traceback from here
        sys.exit(130)
