"""``kernelmap run``: train/benchmark one or both frameworks into a run directory.

Each framework x batch size x capture pass runs in its own worker subprocess
(``python -m kernelmap.worker``); this process imports no framework. Capture passes are separate
runs of the same steps, so one pass's overhead never shows in another's timings (the "leveled"
method of arXiv:1908.06869): ``clean`` (no profiler), ``framework`` (torch.profiler /
mx.profiler), ``libs`` (cuDNN/cuBLAS/cuBLASLt logs on the GPU, oneDNN verbose on the CPU) and
``nsys`` (Nsight Systems, where found). Workers run in rounds that interleave the frameworks
(``schedule``), so that a busy minute lands on every framework alike; each timed window records what
else used the machine (``kernelmap.contention``); a case whose trials ran under contention or disagree
gets extra clean trials within a budget (``repeat_reason``, ``run_repeats``), and its step figure
leaves contended trials out where a quiet one exists (``used_trials``). The run directory is built
under a temporary name and renamed when complete (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import contention, doctor, frameworks, gpuinfo, interrupt, manifest, rundir, timing
from .atomic import atomic_dir
from .errors import KernelmapError, MissingToolError
from .frameworks.registry import NsysWindow
from .frameworks.spec import MATH_DEFAULT, Math

FRAMEWORK_CHOICES = frameworks.FRAMEWORKS
PROFILES = {
    "none": ("clean",),
    "framework": ("clean", "framework"),
    "libs": ("clean", "libs"),
    "nsys": ("clean", "nsys"),
    "all": ("clean", "framework", "libs", "nsys"),
}
# Timed steps of each capture pass (at most the clean pass's): enough for its overhead to be judged
# against the clean pass's interval (kernelmap.timing).
PASS_STEPS = {"framework": timing.MIN_CAPTURE_STEPS, "libs": timing.MIN_CAPTURE_STEPS,
              "nsys": timing.MIN_CAPTURE_STEPS}
LIBS_WARMUP = 1
EXIT_OOM = 75  # kernelmap.worker.EXIT_OOM (not imported: the worker module imports numpy only, but stay lean)


# --- device decisions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    framework: str
    requested: str  # auto | cpu | gpu
    device: str | None  # cpu | gpu; None = this framework does not run
    note: str | None  # why the device differs from the request (or why it is skipped)
    explicit: bool = False  # skipped because --device gpu cannot be met

    def to_manifest(self) -> dict[str, Any]:
        return {"device_requested": self.requested, "device": self.device, "device_note": self.note}


def _parse_cc(cc: str | None) -> tuple[int, int] | None:
    if not cc:
        return None
    major, minor = cc.split(".")
    return int(major), int(minor)


def decide_device(framework: str, requested: str, probe: dict[str, Any], compute_capability: str | None,
                  gpu_problem: str | None = None) -> Decision:
    """Where ``framework`` runs, given what its probe found and the GPU's compute capability: the
    framework's own ``gpu_verdict`` (frameworks/<name>/descriptor.py) decides whether it can use the GPU."""
    if not probe.get("installed"):
        return Decision(framework, requested, None, f"{framework} is not installed ({probe.get('error')}); "
                        f"fix: {probe.get('fix')}")
    if requested == "cpu":
        return Decision(framework, requested, "cpu", None)
    v = frameworks.get(framework).gpu_verdict(probe, _parse_cc(compute_capability), gpu_problem)
    if v.usable:
        return Decision(framework, requested, "gpu", None)
    if v.cpu_regardless:  # no code for this GPU at all: the CPU, labelled, whatever was asked
        return Decision(framework, requested, "cpu", v.why)
    if requested == "auto":
        return Decision(framework, requested, "cpu", f"{v.why}; running on the CPU")
    return Decision(framework, requested, None, f"--device gpu: {v.why}; fix: {v.fix}", explicit=True)


# --- workers -------------------------------------------------------------------------------------
# a line that states an error: a Python exception's (``torch._dynamo.exc.InternalTorchDynamoError: ...``) or ours
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)|kernelmap-worker: error)\b.*:")


def error_line(text: str) -> str:
    """The line of a worker's stderr tail that says what went wrong: the last exception or error line
    (torch.compile prints advice after its traceback: "Set TORCHDYNAMO_VERBOSE=1 ..."), else the last line."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    return errors[-1] if errors else (lines[-1] if lines else "")


class _StderrTee(threading.Thread):
    """Copy a worker's stderr into its log file (and to ours where asked) as it arrives, keeping a tail."""

    def __init__(self, stream, forward: bool, log=None):
        super().__init__(daemon=True)
        self.stream = stream
        self.forward = forward
        self.log = log
        self.tail: collections.deque[bytes] = collections.deque(maxlen=64)

    def run(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.tail.append(chunk)
            if self.log is not None:
                self.log.write(chunk)
            if self.forward:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))

    def last_line(self) -> str:
        return error_line(b"".join(self.tail).decode(errors="replace"))


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group led by ``proc``, then SIGKILL it if it is not gone in ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the leader is gone; stragglers of its group are not
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_worker(cmd: list[str], *, label: str, batch_size: int, env: dict[str, str] | None = None,
               stdout_path: Path | None = None, forward_stderr: bool = True, log_path: Path | None = None) -> None:
    """Run one worker command; raise ``KernelmapError`` (one line) when it fails.

    The worker's stdout goes to ``stdout_path`` (library verbose lines), else to ``log_path``, else
    to our stderr, so that our stdout stays clean for ``--json``. Its stderr (third-party warnings,
    library chatter) goes to ``log_path`` and, with ``forward_stderr``, to our stderr too.
    """
    log_fh = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = open(log_path, "ab")  # noqa: SIM115
    stdout_fh = open(stdout_path, "wb") if stdout_path else None  # noqa: SIM115
    try:
        # Its own process group: a terminal's Ctrl-C reaches only this process, which then stops the
        # worker (and nsys with its target) as a group. A worker that got the SIGINT itself could be
        # mid-import and print Python's startup traceback.
        proc = None
        try:
            with interrupt.deferred():  # a signal here is raised once ``proc`` is known, below
                proc = subprocess.Popen(cmd, env=env, stdout=stdout_fh or log_fh or sys.stderr.fileno(),
                                        stderr=subprocess.PIPE, process_group=0)
                tee = _StderrTee(proc.stderr, forward_stderr, log_fh)
                tee.start()
            rc = proc.wait()
        except BaseException:  # Ctrl-C: the worker must be gone before the run dir is removed
            if proc is not None:
                tee.forward = False
                stop_group(proc)
            raise
        tee.join(timeout=10)
    finally:
        if stdout_fh:
            stdout_fh.close()
        if log_fh:
            log_fh.close()
    if rc == EXIT_OOM:
        raise KernelmapError(f"{label}: out of memory at batch size {batch_size}; "
                             f"try a smaller --batch-size ({tee.last_line()})")
    if rc != 0:
        raise KernelmapError(f"{label}: worker exited {rc}: {tee.last_line() or '(no message)'}")


def libs_env(device: str, log_dir: Path, framework: str = frameworks.REFERENCE,
             worker_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes the math libraries log their calls into ``log_dir``; the framework's
    descriptor names its cuDNN's log variable (MXNet's cuDNN 8 wheel logs under the older one)."""
    if device == "gpu":
        return {
            **frameworks.get(framework).cudnn_log_env(worker_env),
            "CUDNN_LOGDEST_DBG": str(log_dir / "cudnn.log"),
            "CUBLAS_LOGINFO_DBG": "1",
            "CUBLAS_LOGDEST_DBG": str(log_dir / "cublas.log"),
            "CUBLASLT_LOG_LEVEL": "5",  # API trace
            "CUBLASLT_LOG_FILE": str(log_dir / "cublaslt.log"),
        }
    # oneDNN (PyTorch's and MXNet's MKL-DNN) print verbose lines on stdout: captured to onednn.log.
    # oneMKL (torch's CPU BLAS: linear's sgemm) writes its own verbose lines to blas.log.
    return {"DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "MKLDNN_VERBOSE": "1",
            "MKL_VERBOSE": "1", "MKL_VERBOSE_OUTPUT_FILE": str(log_dir / "blas.log")}


def _nsys_commands(nsys: str, out_dir: Path, worker_cmd: list[str],
                   window: NsysWindow) -> tuple[list[str], list[str]]:
    # Only the timed steps: the worker brackets them with cudaProfilerStart/Stop (nsys records only
    # those) or a kernelmap:capture NVTX range (the adapter cuts the capture to it), so warm-up kernels
    # (which no op range covers) never enter the records.
    profile = [nsys, "profile", "--trace=cuda,nvtx", *window.nsys_flags(),
               "-o", str(out_dir / "nsys"), "--force-overwrite", "true", *worker_cmd]
    export = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out_dir / "nsys.sqlite")]
    return profile, export


def _nsys_skip_reason(nsys: str | None, device: str, window: NsysWindow | None, label: str) -> str | None:
    """Why the nsys pass cannot record anything here, or None where it runs. On the CPU that is the
    reason whether or not nsys is installed (installing it would not change it)."""
    if device != "gpu":
        return "the CPU run launches no CUDA work for nsys to record"
    if nsys is None:
        return f"nsys not found; {doctor.FIX['nsys']}"
    if window is None:
        return f"{label}'s workload opens no nsys capture window (cudaProfilerStart/Stop or an NVTX range)"
    return None


def worker_own_env(framework: str, device: str) -> dict[str, str]:
    """The environment a framework's workers add on the GPU: its own (an MXNet built for this GPU: its
    tree first on PYTHONPATH), set before the framework loads its libraries; {} on the CPU."""
    if device != "gpu":
        return {}
    return frameworks.get(framework).own_env()


def worker_environ(device: str, math: str, *layers: Mapping[str, str]) -> dict[str, str]:
    """A worker's whole environment: this process's, then ``layers`` in order; on the GPU the math
    mode's rule last (``spec.Math.apply``: fp32 sets NVIDIA_TF32_OVERRIDE=0, tf32 removes one inherited
    from here). The CPU has no TF32: its environment keeps what it inherits."""
    env = dict(os.environ)
    for layer in layers:
        env.update(layer)
    return Math(math).apply(env) if device == "gpu" else env


def nsys_skips(decisions: dict[str, Decision], nsys: str | None) -> dict[str, str]:
    """Why the nsys pass of each framework that runs records nothing here ({framework: reason}; a
    framework whose nsys pass runs is left out)."""
    out = {}
    for fw, d in decisions.items():
        if d.device is None:
            continue
        descriptor = frameworks.get(fw)
        why = _nsys_skip_reason(nsys, d.device, descriptor.nsys_window(worker_own_env(fw, d.device)),
                                descriptor.label)
        if why is not None:
            out[fw] = why
    return out


# nsys traces a CUDA graph's replay as one launch unless told otherwise, and even per node it has no
# reference step to give replayed kernels the ops that launched them at capture: the framework pass does
REPLAY_NSYS_SKIP = ("{label} replays CUDA graphs ({why}): nsys would record each replay's kernels without "
                    "the ops that launched them at capture; the framework pass attributes them "
                    "(adapters/graph_replay.py)")


def case_nsys_skips(keys: dict[str, tuple[str, str]], skips: dict[str, str]) -> dict[str, str]:
    """Why each case's nsys pass records nothing ({case key: reason}): its framework's reason
    (``nsys_skips``), else, for a mode that replays CUDA graphs (``Framework.replay_modes``), that."""
    out = {}
    for key, (fw, _mode) in keys.items():
        why = skips.get(fw)
        if why is None and frameworks.replay_reason(key):
            why = REPLAY_NSYS_SKIP.format(label=frameworks.key_label(key), why=frameworks.replay_reason(key))
        if why is not None:
            out[key] = why
    return out


def said_once(skips: dict[str, str], what: str) -> list[str]:
    """One line per distinct reason of ``skips`` ({framework: reason}), naming the frameworks it
    holds for: a reason every framework shares (no GPU) is said once, not per framework x batch size."""
    by_reason: dict[str, list[str]] = {}
    for fw, why in skips.items():
        by_reason.setdefault(why, []).append(fw)
    return [f"{what} ({', '.join(fws)}): {why}" for why, fws in by_reason.items()]


def _nsys_report(out_dir: Path) -> Path:
    for name in ("nsys.nsys-rep", "nsys.qdrep"):
        if (out_dir / name).is_file():
            return out_dir / name
    raise KernelmapError(f"{out_dir}: nsys wrote no report (nsys.nsys-rep)")


# --- the run --------------------------------------------------------------------------------------
class RunProgress:
    """The overall progress of a run: one plain line on stderr per worker process (pass n of N,
    elapsed, an ETA from the mean time of the workers done so far). Plain lines, so that a log
    without a terminal shows them too."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()

    @staticmethod
    def _clock(seconds: float) -> str:
        m, s = divmod(int(round(seconds)), 60)
        return f"{m}m{s:02d}s" if m else f"{s}s"

    def line(self, label: str) -> str:
        elapsed = time.monotonic() - self.t0
        eta = (f", ETA ~{self._clock(elapsed / self.done * (self.total - self.done))}" if self.done
               else "")
        return f"kernelmap run: [{self.done + 1}/{self.total}] {label} (elapsed {self._clock(elapsed)}{eta})"

    def start(self, label: str) -> None:
        if self.enabled:
            print(self.line(label), file=self.stream, flush=True)

    def finish(self) -> None:
        self.done += 1


def libs_warmup(descriptor: frameworks.Framework, mode: str, warmup_steps: int) -> int:
    """The libs pass's warm-up: LIBS_WARMUP (its logs stay short), or fewer where the run asked for fewer,
    but never below what the mode needs (``min_warmup``: a CUDA graph is captured at its last warm-up step)."""
    return max(min(LIBS_WARMUP, warmup_steps), descriptor.min_warmup.get(mode, 0))


def check_warmup(warmup_steps: int, cases) -> None:
    """Refuse a --warmup below what a chosen mode needs, before anything runs (its worker would fail)."""
    short = [f"{frameworks.get(fw).label}'s {mode} mode needs at least {frameworks.get(fw).min_warmup[mode]}"
             for fw, mode in cases if warmup_steps < frameworks.get(fw).min_warmup.get(mode, 0)]
    if short:
        raise KernelmapError(f"--warmup {warmup_steps}: too few warm-up steps: " + "; ".join(dict.fromkeys(short))
                             + " (a CUDA graph is captured at the last warm-up step)")


def planned_workers(runnable: list[str], n_batch_sizes: int, trials: int, passes: tuple[str, ...],
                    nsys_skipped: dict[str, str]) -> int:
    """How many worker processes the run starts (the progress line's N): per framework x batch size, the
    clean pass's trials and each capture pass, less an nsys pass that is skipped (``nsys_skips``)."""
    per_fw = {fw: trials + sum(1 for p in passes if p != "clean" and not (p == "nsys" and fw in nsys_skipped))
              for fw in runnable}
    return n_batch_sizes * sum(per_fw.values())


def physical_cores() -> int:
    """Physical CPU cores of this machine (distinct physical id x core id in /proc/cpuinfo), else
    the logical count: the default thread setting of every framework."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    """The same CPU thread settings for every framework's worker."""
    return {k: str(threads) for k in timing.THREAD_ENV}


# --- the schedule: rounds that interleave frameworks ----------------------------------------------
REPEAT_BUDGET_SHARE = 0.30  # default --repeat-budget: this share of the run's wall time before the repeats
DEFAULT_MAX_REPEATS = 2


@dataclass(frozen=True)
class Job:
    """One worker process of the run: a clean-pass trial (``trial``) or a capture pass (``trial`` None)."""

    framework: str
    batch_size: int
    pass_name: str
    trial: int | None
    round: int

    @property
    def case(self) -> tuple[str, int]:
        return self.framework, self.batch_size


def round_order(cases: list[tuple[str, int]], r: int) -> list[tuple[str, int]]:
    """The cases of round ``r`` in the order they run: batch size after batch size, the frameworks
    alternating within each, their order rotated by one place each round (each framework takes each
    place in turn, so none always runs first or last)."""
    fws = list(dict.fromkeys(fw for fw, _ in cases))
    bss = list(dict.fromkeys(bs for _, bs in cases))
    k = r % len(fws) if fws else 0
    rotated = fws[k:] + fws[:k]
    present = set(cases)
    return [(fw, bs) for bs in bss for fw in rotated if (fw, bs) in present]


def schedule(cases: list[tuple[str, int]], trials: int, capture_passes: tuple[str, ...]) -> list[Job]:
    """Every planned worker of the run, in the order they run: ``max(trials, len(capture_passes))``
    rounds; round r holds clean trial r + 1 of every case (framework x batch size), then capture pass
    r of every case (``round_order``), so that a busy minute falls on every framework alike rather than
    on one framework's clean pass."""
    jobs: list[Job] = []
    for r in range(max(trials, len(capture_passes))):
        order = round_order(cases, r)
        if r < trials:
            jobs += [Job(fw, bs, "clean", r + 1, r) for fw, bs in order]
        if r < len(capture_passes):
            jobs += [Job(fw, bs, capture_passes[r], None, r) for fw, bs in order]
    return jobs


def trial_contended(trial: dict[str, Any]) -> bool | None:
    """Whether a clean trial (its worker's result) ran under contention (``kernelmap.contention``)."""
    return (trial.get("contention") or {}).get("contended")


def used_trials(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials the clean figure is computed from: those not run under contention where there is at
    least one, else all of them (the figure is then flagged contended)."""
    quiet = [t for t in trials if trial_contended(t) is not True]
    return quiet or list(trials)


def repeat_reason(trials: list[dict[str, Any]], wanted: int, repeats: int, max_repeats: int) -> str | None:
    """Why a case gets one more clean trial, or None: fewer than ``wanted`` of its trials ran without
    contention, or the trials its figure uses disagree (``timing.trials_disagree``); never more than
    ``max_repeats`` extra trials."""
    if repeats >= max_repeats:
        return None
    busy = [t["trial"] for t in trials if trial_contended(t) is True]
    if len(trials) - len(busy) < wanted:
        return f"trial{'s' if len(busy) > 1 else ''} {', '.join(str(b) for b in busy)} ran under contention"
    if timing.trials_disagree([t["step_times_s"] for t in used_trials(trials)]):
        return "its trials disagree beyond noise"
    return None


def repeat_budget_s(spent_s: float, budget_s: float | None) -> float:
    """Seconds the repeats may take: ``--repeat-budget``, else ``REPEAT_BUDGET_SHARE`` of the run so far."""
    return REPEAT_BUDGET_SHARE * spent_s if budget_s is None else budget_s


# --- one framework x batch size -----------------------------------------------------------------
class Case:
    """One framework x mode x batch size: its workers' commands, what they returned, its results.json entry.
    ``key``: ``frameworks.case_key`` of the framework and mode, which names its folder and logs."""

    def __init__(self, fw: str, decision: Decision, bs: int, train: dict[str, Any], data_json: str, run_tmp: Path,
                 nsys: str | None, nsys_skip: str | None, threads: int, python: dict[str, str],
                 mode: str | None = None):
        self.fw, self.decision, self.bs, self.train = fw, decision, bs, train
        self.mode = mode or frameworks.get(fw).default_mode
        self.key = frameworks.case_key(fw, self.mode)
        self.nsys, self.nsys_skip = nsys, nsys_skip
        self.rd = rundir.RunDir(run_tmp)
        self.out_dir = self.rd.case(self.key, bs)
        config = dict(train, batch_size=bs, device=decision.device, mode=self.mode,
                      options=(train.get("options") or {}).get(fw, {}))
        self.descriptor = frameworks.get(fw)
        self.base = [self.descriptor.python(python) or sys.executable, "-m", "kernelmap.worker", "--framework", fw,
                     "--dir", str(self.out_dir), "--config", json.dumps(config), "--data-info", data_json]
        self.threads_env = thread_env(threads)
        self.own_env = worker_own_env(fw, decision.device)
        self.clean_trials: list[dict[str, Any]] = []
        self.trial_walls: list[float] = []
        self.pass_results: dict[str, dict[str, Any]] = {}
        self.repeat_trials: list[int] = []  # trial numbers of the extra trials (run_repeats)
        self.repeats_over = False  # a repeat failed: no more for this case
        self.failed = False

    @property
    def name(self) -> str:
        return f"{self.key} bs {self.bs}"

    def starts_worker(self, job: Job) -> bool:
        """Whether ``job`` starts a worker here (an nsys pass that records nothing here does not)."""
        return not (job.pass_name == "nsys" and self.nsys_skip is not None)

    def _env(self) -> dict[str, str]:
        shared = self.descriptor.shared_algorithms_env(str(self.rd.algorithm_file(self.key, self.bs)), self.own_env)
        return worker_environ(self.decision.device, self.train["math"], self.threads_env, self.own_env, shared)

    def run_clean(self, trial: int, label: str, progress: RunProgress, repeat: bool = False) -> None:
        """One clean trial in its own process; the first measures accuracy and times the loader, the
        others reuse their batches (``--reuse-batches``: the loader dominated MXNet's clean pass)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        extra = ["--pass", "clean", "--trial", str(trial)] + (["--no-evaluate", "--reuse-batches"] if trial > 1 else [])
        progress.start(label)
        t0 = time.monotonic()
        try:
            run_worker([*self.base, *extra], label=label, batch_size=self.bs, env=self._env(), forward_stderr=False,
                       log_path=self.rd.log(self.key, self.bs, "clean", trial))
        finally:
            progress.finish()
        self.trial_walls.append(time.monotonic() - t0)
        self.clean_trials.append(rundir.read_json(self.rd.pass_result(self.key, self.bs, "clean", trial)))
        if repeat:
            self.repeat_trials.append(trial)

    def run_capture(self, p: str, progress: RunProgress, notes: list[str]) -> None:
        """One capture pass in its own process (an nsys pass that records nothing here: a note)."""
        fw, key, bs, out_dir = self.fw, self.key, self.bs, self.out_dir
        if p == "nsys" and self.nsys_skip is not None:  # printed once for the run; a note per case
            notes.append(f"{key} bs {bs}: nsys pass skipped: {self.nsys_skip}")
            self.pass_results[p] = {"skipped": self.nsys_skip}
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        label = f"{key} bs {bs} ({p} pass, {self.decision.device})"
        steps = PASS_STEPS[p] if self.train["steps"] is None else min(PASS_STEPS[p], self.train["steps"])
        cmd = [*self.base, "--pass", p, "--steps", str(steps), "--no-evaluate"]
        env = self._env()
        env.update(self.descriptor.pass_env.get(p, {}))
        stdout_path = None
        if p == "libs":
            cmd += ["--warmup", str(libs_warmup(self.descriptor, self.mode, self.train["warmup_steps"]))]
            env.update(libs_env(self.decision.device, out_dir, fw, self.own_env))
            if self.decision.device == "cpu":
                stdout_path = out_dir / "onednn.log"
        log_path = self.rd.log(key, bs, p)
        progress.start(label)
        try:
            window = self.descriptor.nsys_window(self.own_env)
            if p == "libs" and self.descriptor.libs_under_nsys and self.nsys_skip is None and window is not None:
                # the libs pass's own kernels (kernelmap/calllink.py), recorded by nsys in the same process
                libs_dir = out_dir / rundir.LIBS_TRACE_DIR
                libs_dir.mkdir(parents=True, exist_ok=True)
                cmd, export = _nsys_commands(self.nsys, libs_dir, cmd, window)
                run_worker(cmd, label=label, batch_size=bs, env=env, forward_stderr=False, log_path=log_path)
                run_worker([*export, str(_nsys_report(libs_dir))], label=f"{label}: nsys export", batch_size=bs,
                           forward_stderr=False, log_path=log_path)
            elif p == "nsys":
                cmd, export = _nsys_commands(self.nsys, out_dir, cmd, window)
                run_worker(cmd, label=label, batch_size=bs, env=env, forward_stderr=False, log_path=log_path)
                run_worker([*export, str(_nsys_report(out_dir))], label=f"{label}: nsys export", batch_size=bs,
                           forward_stderr=False, log_path=log_path)
            else:
                run_worker(cmd, label=label, batch_size=bs, env=env, stdout_path=stdout_path, forward_stderr=False,
                           log_path=log_path)
        finally:
            progress.finish()
        self.pass_results[p] = rundir.read_json(self.rd.pass_result(key, bs, p))

    def drop(self) -> None:
        """Leave this case out of the run: its folder goes (and its framework's, once empty)."""
        self.failed = True
        shutil.rmtree(self.out_dir, ignore_errors=True)
        fw_dir = self.out_dir.parent
        if fw_dir.is_dir() and not any(fw_dir.iterdir()):
            fw_dir.rmdir()

    def entry(self, notes: list[str]) -> dict[str, Any]:
        """This case's results.json entry (and its notes: trials left out, disagreement, contention)."""
        return case_entry(self.fw, self.bs, self.decision, self.clean_trials, self.pass_results, self.repeat_trials,
                          self.out_dir, rundir.case_dir(self.key, self.bs), notes)


def _trial_ids(trials: list[dict[str, Any]]) -> str:
    return ", ".join(str(t["trial"]) for t in trials)


def _clean_summary(trials: list[dict[str, Any]], used: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """The clean pass's figures: the step figure over the ``used`` trials (``kernelmap.timing``); the
    end-to-end and loader figures over the trials that fetched their own batches (the first), used
    ones where any."""
    stats = timing.step_stats([t["step_times_s"] for t in used])
    fetched = [t for t in trials if not t.get("batches_reused")]
    fetched = [t for t in fetched if t in used] or fetched
    e2e = [t["e2e_step_s"] for t in fetched if t.get("e2e_step_s")]
    loader = [t["loader_batch_s"] for t in fetched if t.get("loader_batch_s")]
    e2e_step = float(statistics.median(e2e)) if e2e else None
    e2e_timing = trials[0].get("e2e_timing")
    if len(fetched) < len(trials):
        e2e_timing = (f"{e2e_timing}; from trial{'s' if len(fetched) > 1 else ''} {_trial_ids(fetched)} only "
                      f"(the other trials reused {timing.WINDOW_STEPS} batches)")
    return {
        **stats.to_dict(),
        "images_per_s": batch_size / stats.median_s if stats.median_s > 0 else None,
        "e2e_step_s": e2e_step,
        "e2e_images_per_s": batch_size / e2e_step if e2e_step else None,
        "loader_batch_s": float(statistics.median(loader)) if loader else None,
        "e2e_trials": [t["trial"] for t in fetched],
        "timing": trials[0]["timing"], "e2e_timing": e2e_timing,
        "block_steps": trials[0]["block_steps"],
    }


def _ci_fields(samples: list[float]) -> dict[str, float | None]:
    ci = timing.capture_ci(samples)
    return {"ci95_low_s": None if ci is None else ci[0], "ci95_high_s": None if ci is None else ci[1]}


def case_entry(fw: str, bs: int, decision: Decision, clean_trials: list[dict[str, Any]],
               pass_results: dict[str, dict[str, Any]], repeat_trials: list[int], out_dir: Path, rel: Path,
               notes: list[str]) -> dict[str, Any]:
    """The results.json entry of one framework x batch size from its workers' results (trials in the
    order they ran; ``repeat_trials``: the numbers of the extra ones). Trials run under contention are left out of the step figure where a quiet one
    exists (``used_trials``), kept in ``trials`` and marked; ``notes`` gets a line for each."""
    used = used_trials(clean_trials)
    busy = [t for t in clean_trials if trial_contended(t) is True]
    clean = _clean_summary(clean_trials, used, bs)
    disagree = timing.trials_disagree([t["step_times_s"] for t in used])
    cont = {**contention.summarise([w for t in used for w in t.get("contention_windows", ())],
                                   [g for t in used for g in t.get("contention_gpu", ())]),
            "trials": len(clean_trials), "trials_contended": len(busy), "trials_used": [t["trial"] for t in used]}
    if busy and len(used) < len(clean_trials):
        notes.append(f"{fw} bs {bs}: clean trial{'s' if len(busy) > 1 else ''} {_trial_ids(busy)} ran under "
                     f"contention ({'; '.join(t['contention']['text'] for t in busy)}); left out of the step figure "
                     "(kept in results.json's trials)")
    elif busy:
        notes.append(f"{fw} bs {bs}: every clean trial ran under contention ({cont['text']}); its step figure "
                     "is flagged contended")
    repeats = len(repeat_trials)
    if disagree:
        meds = ", ".join(f"{t['median_step_s'] * 1e3:.3f}" for t in used)
        notes.append(f"{fw} bs {bs}: its clean trials disagree beyond noise (medians {meds} ms) after "
                     f"{repeats} repeat{'s' if repeats != 1 else ''}")
    first = clean_trials[0]
    passes_summary: dict[str, Any] = {
        "clean": {"median_step_s": clean["median_step_s"], "ci95_low_s": clean["ci95_low_s"],
                  "ci95_high_s": clean["ci95_high_s"], "steps": first["steps"],
                  "warmup_steps": first["warmup_steps"], "trials": len(clean_trials), "trials_used": len(used),
                  "timing": clean["timing"], "contention": cont},
    }
    for p, r in pass_results.items():
        if "skipped" in r:
            passes_summary[p] = r
            continue
        pc = r.get("contention")
        if pc and pc.get("contended"):
            notes.append(f"{fw} bs {bs}: the {p} pass ran under contention ({pc['text']})")
        passes_summary[p] = {
            "median_step_s": r["median_step_s"], **_ci_fields(r["step_times_s"]), "steps": r["steps"],
            "warmup_steps": r["warmup_steps"], "step_times_s": r["step_times_s"], "timing": r["timing"],
            "overhead": r["median_step_s"] / clean["median_step_s"] - 1.0,
            "overhead_verdict": str(timing.overhead_verdict(r["median_step_s"], r["steps"], clean,
                                                             between_processes=not cont.get("contended"))),
            "contention": pc,
        }
    used_ids = {t["trial"] for t in used}
    files = sorted(str(rel / f.name) for f in out_dir.iterdir() if f.is_file())
    return {
        "framework": fw,
        "mode": first["mode"],
        "batch_size": bs,
        "device": decision.device,
        "device_requested": decision.requested,
        "device_note": decision.note,
        # what the GPU's convs and matmuls were allowed (spec.Math), and the environment that held them to it
        "math": first["math"], "tf32_override": first["tf32_override"],
        "steps": first["steps"],
        "warmup_steps": first["warmup_steps"],
        # the samples of the trials the figure uses, trial after trial (``trials`` says which are whose)
        "step_times_s": [x for t in used for x in t["step_times_s"]],
        **clean,
        "trials": [{"trial": t["trial"], "pid": t["pid"], "median_step_s": t["median_step_s"],
                    **_ci_fields(t["step_times_s"]), "e2e_step_s": t.get("e2e_step_s"),
                    "samples": len(t["step_times_s"]), "train_wall_s": t["train_wall_s"],
                    "batches_reused": t.get("batches_reused"), "repeat": t["trial"] in repeat_trials,
                    "used": t["trial"] in used_ids, "contended": trial_contended(t), "contention": t.get("contention")}
                   for t in clean_trials],
        "trials_disagree": disagree,
        "repeats": repeats,
        "contention": cont,
        "threads": first["threads"],
        "test_accuracy": first["test_accuracy"],
        "final_loss": first["final_loss"],
        "train_wall_s": first["train_wall_s"],
        "passes": passes_summary,
        "dir": str(rel),
        "files": files,
        "versions": first["versions"],
    }


def _fail_case(case: Case, exc: KernelmapError, notes: list[str], failed: list[str]) -> None:
    """A worker of ``case`` failed (OOM at this batch size, a broken install): it is left out, the rest runs."""
    msg = f"{exc}; {case.name} left out of the run"
    if "ImportError" in str(exc) or "ModuleNotFoundError" in str(exc):
        msg += f"; fix: {doctor.FIX[case.fw]}"
    print(f"kernelmap run: {msg}", file=sys.stderr)
    notes.append(msg)
    failed.append(str(exc))
    case.drop()


def run_schedule(cases: dict[tuple[str, int], Case], jobs: list[Job], trials: int, progress: RunProgress,
                 notes: list[str], failed: list[str]) -> None:
    """Run ``jobs`` in order; a case whose worker fails drops its remaining jobs (and the progress line's
    count drops them too)."""
    for n, job in enumerate(jobs):
        case = cases[job.case]
        if case.failed:
            continue
        try:
            if job.pass_name == "clean":
                label = f"{case.name} (clean pass trial {job.trial}/{trials}, {case.decision.device})"
                case.run_clean(job.trial, label, progress)
            else:
                case.run_capture(job.pass_name, progress, notes)
        except KernelmapError as exc:
            _fail_case(case, exc, notes, failed)
            progress.total -= sum(1 for j in jobs[n + 1:] if j.case == job.case and case.starts_worker(j))


def run_repeats(cases: dict[tuple[str, int], Case], trials: int, max_repeats: int, budget_s: float,
                budget_said: str, progress: RunProgress, notes: list[str]) -> None:
    """Extra clean trials, one per case and round, for the cases that want one (``repeat_reason``),
    interleaved as the rounds are, until none wants one or the next would overrun ``budget_s`` seconds
    (its expected time: the median of the case's trials so far); a note says when the budget stopped them."""
    spent = 0.0
    r = trials
    while True:
        live = [c for c in cases.values() if not c.failed]
        order = round_order([(c.key, c.bs) for c in live], r)
        want = [(cases[k], why) for k in order
                if not cases[k].repeats_over
                and (why := repeat_reason(cases[k].clean_trials, trials, len(cases[k].repeat_trials), max_repeats))]
        if not want:
            return
        progress.total += len(want)
        for i, (case, why) in enumerate(want):
            expected = statistics.median(case.trial_walls)
            if spent + expected > budget_s:
                progress.total -= len(want) - i
                left = ", ".join(f"{c.name} ({w})" for c, w in want[i:])
                msg = (f"repeats stopped by the repeat budget ({budget_said}, {spent:.0f} s spent; the next trial "
                       f"takes ~{expected:.0f} s): not repeated further: {left}")
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
                return
            trial = len(case.clean_trials) + 1
            label = (f"{case.name} (clean pass trial {trial}, repeat {len(case.repeat_trials) + 1}/{max_repeats}: "
                     f"{why}, {case.decision.device})")
            t0 = time.monotonic()
            try:
                case.run_clean(trial, label, progress, repeat=True)
            except KernelmapError as exc:  # the case keeps the trials it has
                msg = f"{exc}; {case.name} keeps its {len(case.clean_trials)} trials"
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
                case.repeats_over = True
            finally:
                spent += time.monotonic() - t0
        r += 1


def _default_out() -> Path:
    return Path("runs") / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _resolve_data(train: dict[str, Any]):
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.data import prepare_dir, resolve_data

    info = resolve_data(spec.TrainConfig(**{**train, "options": {}}))
    if not info.synthetic:
        prepare_dir(info)  # once here, so that workers never race to lay the files out
    return info


PARITY_STEPS = 20


def _parity(train: dict[str, Any], batch_size: int, ran: dict[str, str],
            python: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``kernelmap parity`` figures of every framework that ran against the reference (fp32, each
    framework in its own subprocess), on the GPU where both ran there (TF32 off), else on the CPU:
    {framework: figures}; {} where the reference did not run. ``ran``: framework -> its device."""
    from .parity import compute_parity

    if frameworks.REFERENCE not in ran:
        return {}
    steps = PARITY_STEPS if train["steps"] is None else min(PARITY_STEPS, train["steps"])
    return {fw: compute_parity(data=train["data"], data_dir=train["data_dir"], steps=steps, batch_size=batch_size,
                               lr=train["lr"], momentum=train["momentum"], seed=train["seed"],
                               hybridize=train["hybridize"], frameworks=(frameworks.REFERENCE, fw), python=python,
                               device="gpu" if ran[fw] == ran[frameworks.REFERENCE] == "gpu" else "cpu")
            for fw in frameworks.FRAMEWORKS if fw in ran and fw != frameworks.REFERENCE}


def _normalise(run_tmp: Path) -> None:
    from kernelmap.normalise import normalise_run_dir  # lands in parallel; imported only when needed

    normalise_run_dir(run_tmp)


def _train_config(args: argparse.Namespace, chosen: list[str]) -> dict[str, Any]:
    """The workers' training configuration from the command line (its bad values refused)."""
    train = {
        "lr": args.lr,
        "momentum": 0.9,
        "steps": None if args.epochs is not None else args.steps,
        "epochs": args.epochs,
        "warmup_steps": args.warmup,
        "seed": args.seed,
        "data": args.data,
        "data_dir": args.data_dir,
        "hybridize": False,  # the modes of every framework: Case.mode (--mode, and the descriptors' mode_flags)
        "math": args.math,
        # each framework's own options (registry.Option) that were given: {framework: {name: value}}
        "options": {fw: vals for fw, d in frameworks.REGISTRY.items()
                    if (vals := {o.name: getattr(args, o.name) for o in d.options
                                 if getattr(args, o.name, None) is not None})},
    }
    for fw in set(train["options"]) - set(chosen):
        flags = ", ".join(o.flag for o in frameworks.get(fw).options if o.name in train["options"][fw])
        raise KernelmapError(f"{flags} is {frameworks.get(fw).label}'s option, and {fw} does not run "
                             f"(--framework {args.framework})")
    if train["steps"] is not None and train["steps"] < 1:
        raise KernelmapError("--steps must be at least 1")
    if train["epochs"] is not None and train["epochs"] < 1:
        raise KernelmapError("--epochs must be at least 1")
    return train


def _decide_devices(chosen: list[str], device: str, python: dict[str, str],
                    gpus: gpuinfo.GpuReport) -> dict[str, Decision]:
    """Each framework's device, decided before any work, every downgrade said on stderr."""
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    decisions: dict[str, Decision] = {}
    no_gpu_said = False
    for fw in chosen:
        # Only a GPU question needs the framework imported (in a subprocess); the CPU needs it installed.
        probe = (doctor.find_framework(fw, python) if device == "cpu"
                 else doctor.probe_framework(fw, python=python))
        d = decide_device(fw, device, probe, cc, gpus.problem)
        decisions[fw] = d
        if d.device is None:
            print(f"kernelmap run: {fw} will not run: {d.note}", file=sys.stderr)
        elif d.note and not gpus.gpus and d.device == "cpu" and device == "auto":
            if not no_gpu_said:  # the same reason for every framework: said once
                print(f"kernelmap run: no NVIDIA GPU here ({gpus.problem}): every framework runs on the CPU",
                      file=sys.stderr)
                no_gpu_said = True
        elif d.note:
            print(f"kernelmap run: {fw} runs on the {d.device.upper()}: {d.note}", file=sys.stderr)
    return decisions


def _modes(runnable: list[str], asked: list[str] | None, decisions: dict[str, Decision]
           ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({framework: its modes that run here}, {case key: why that mode does not run here})."""
    modes: dict[str, list[str]] = {}
    mode_skips: dict[str, str] = {}
    for fw in runnable:
        try:
            modes[fw], skipped_modes = frameworks.modes_to_run(fw, asked, decisions[fw].device)
        except ValueError as exc:
            raise KernelmapError(str(exc)) from None
        mode_skips.update({frameworks.case_key(fw, m): why for m, why in skipped_modes.items()})
    for line in said_once(mode_skips, "mode skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    return modes, mode_skips


def _write_parity(tmp: Path, train: dict[str, Any], batch_size: int, ran: dict[str, str],
                  python: dict[str, str], notes: list[str]) -> tuple[dict[str, dict], str | None]:
    """Parity of each framework that ran against the reference, written into the run; (figures, why it
    could not be computed or None). A failure keeps the run, said in ``notes``."""
    parity_failed: str | None = None
    try:
        parities = _parity(train, batch_size, ran, python)
    except KernelmapError as exc:  # MissingToolError included: the finished run is kept, the failure said
        parities, parity_failed = {}, str(exc)
        msg = f"parity failed: {parity_failed}; the run is kept without parity figures"
        print(f"kernelmap run: {msg}", file=sys.stderr)
        notes.append(msg)
    for fw, parity in parities.items():
        rundir.RunDir(tmp).write_json(rundir.RunDir(tmp).parity(fw), parity)
        if not parity["passed"]:
            msg = (f"parity: {fw} differs from {frameworks.REFERENCE} beyond tolerance: "
                   f"{'; '.join(parity['failures'])}")
            print(f"kernelmap run: {msg}", file=sys.stderr)
            notes.append(msg)
    return parities, parity_failed


def _timing_config(args: argparse.Namespace, budget: float, budget_said: str) -> dict[str, Any]:
    """The manifest's record of how every figure of the run is timed and judged."""
    return {"step": timing.STEP_METHOD, "end_to_end": timing.E2E_METHOD,
            "capture": timing.CAPTURE_METHOD, "block_steps": timing.BLOCK_STEPS,
            "window_steps": timing.WINDOW_STEPS, "confidence": timing.CONFIDENCE,
            "noise_threshold": timing.NOISE_THRESHOLD,
            "min_capture_steps": timing.MIN_CAPTURE_STEPS,
            "contention": contention.RULE, "trials_disagree": timing.TRIALS_DISAGREE_RULE,
            "max_repeats": args.max_repeats, "repeat_budget_s": budget,
            "repeat_budget": budget_said}


def _summary(out: Path, results: list[dict[str, Any]], decisions: dict[str, Decision], notes: list[str],
             parities: dict[str, dict], parity_failed: str | None) -> dict[str, Any]:
    """What ``--json`` prints (exit code aside)."""
    return {
        "run_dir": str(out),
        "results": [
            {k: r[k] for k in ("framework", "mode", "batch_size", "device", "device_note", "median_step_s", "ci95_low_s",
                               "ci95_high_s", "ci95_half_width_rel", "noisy", "n_trials", "iqr_step_s",
                               "images_per_s", "e2e_step_s", "e2e_images_per_s", "test_accuracy", "contention",
                               "trials_disagree", "repeats")}
            | {"overheads": {p: {"overhead": v.get("overhead"), "verdict": v.get("overhead_verdict"),
                                 "skipped": v.get("skipped"), "contention": v.get("contention")}
                             for p, v in r["passes"].items() if p != "clean"}}
            for r in results
        ],
        "skipped": {fw: d.note for fw, d in decisions.items() if d.device is None},
        "notes": notes,
        "parity_passed": {fw: p["passed"] for fw, p in parities.items()} or None,
        "parity_failed": parity_failed,
    }


def execute(args: argparse.Namespace) -> dict[str, Any]:
    """Do the run; return the summary (also what ``--json`` prints)."""
    chosen = list(FRAMEWORK_CHOICES) if args.framework == "all" else [args.framework]
    try:
        python = frameworks.parse_python(args.python)
    except ValueError as exc:
        raise KernelmapError(str(exc)) from None
    passes = PROFILES[args.profile]
    out = Path(args.out) if args.out else _default_out()
    if out.exists() and not args.replace:
        raise KernelmapError(f"{out}: already exists; choose another --out or pass --replace")
    train = _train_config(args, chosen)

    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    gpus = gpuinfo.query()
    decisions = _decide_devices(chosen, args.device, python, gpus)
    runnable = [fw for fw in chosen if decisions[fw].device is not None]
    if not runnable:
        notes_ = list(dict.fromkeys(d.note or "" for d in decisions.values()))  # same reason once
        raise MissingToolError(f"nothing can run ({', '.join(chosen)}): " + "; ".join(notes_))
    nsys = doctor.find_tool("nsys") if "nsys" in passes else None
    skips = nsys_skips(decisions, nsys) if "nsys" in passes else {}
    for line in said_once(skips, "nsys pass skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)

    if args.trials < 1:
        raise KernelmapError("--trials must be at least 1")
    threads = args.threads if args.threads is not None else physical_cores()
    if threads < 1:
        raise KernelmapError("--threads must be at least 1")
    data_info = _resolve_data(train)
    data_json = json.dumps(data_info.to_dict())
    if args.max_repeats < 0:
        raise KernelmapError("--max-repeats must be at least 0")
    if args.repeat_budget is not None and args.repeat_budget < 0:
        raise KernelmapError("--repeat-budget must be at least 0 seconds")
    modes, mode_skips = _modes(runnable, args.mode, decisions)
    mode_notes = [f"{key}: mode skipped: {why}" for key, why in mode_skips.items()]
    keys = {frameworks.case_key(fw, m): (fw, m) for fw in runnable for m in modes[fw]}
    if not keys:
        raise KernelmapError(f"no mode of {', '.join(runnable)} can run here: " + "; ".join(mode_notes))
    check_warmup(train["warmup_steps"], keys.values())
    case_skips = case_nsys_skips(keys, skips) if "nsys" in passes else {}
    for line in said_once({k: v for k, v in case_skips.items() if keys[k][0] not in skips}, "nsys pass skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    progress = RunProgress(planned_workers(list(keys), len(args.batch_size), args.trials, passes, case_skips))
    notes: list[str] = list(mode_notes)
    results: list[dict[str, Any]] = []
    normalise_error: KernelmapError | None = None
    with atomic_dir(out, replace=args.replace) as tmp:
        failed: list[str] = []
        cases = {(key, bs): Case(fw, decisions[fw], bs, train, data_json, tmp, nsys, case_skips.get(key), threads,
                                 python, mode=mode)
                 for key, (fw, mode) in keys.items() for bs in args.batch_size}
        # Interleaved rounds (``schedule``), then extra clean trials where trials were contended or disagree.
        run_schedule(cases, schedule(list(cases), args.trials, tuple(p for p in passes if p != "clean")),
                     args.trials, progress, notes, failed)
        budget = repeat_budget_s(time.monotonic() - progress.t0, args.repeat_budget)
        budget_said = (f"--repeat-budget {args.repeat_budget:g} s" if args.repeat_budget is not None else
                       f"{budget:.0f} s, {REPEAT_BUDGET_SHARE:.0%} of the run so far")
        run_repeats(cases, args.trials, args.max_repeats, budget, budget_said, progress, notes)
        results = [c.entry(notes) for c in cases.values() if not c.failed]
        if not results:
            raise KernelmapError("nothing ran: " + "; ".join(dict.fromkeys(failed)))
        ran = {r["framework"]: r["device"] for r in results}
        parities, parity_failed = _write_parity(tmp, train, args.batch_size[0], ran, python, notes)
        fw_entries = {}
        for fw, d in decisions.items():
            versions = next((r["versions"] for r in results if r["framework"] == fw), None)
            fw_entries[fw] = {**d.to_manifest(), "versions": versions, "skipped": d.device is None}
        config = {"cli": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                  "train": train, "modes": {fw: modes[fw] for fw in runnable}, "modes_skipped": mode_skips,
                  "passes": list(passes), "pass_steps": PASS_STEPS, "libs_warmup": LIBS_WARMUP,
                  "out": str(out), "trials": args.trials, "threads": threads,
                  "timing": _timing_config(args, budget, budget_said)}
        man = manifest.build(config=config, gpus=gpus, frameworks=fw_entries, data=data_info.to_dict(),
                             job=manifest.job_id(out))
        man["host"]["load_average_start"] = load_start
        man["notes"] = notes
        man["parity"] = {fw: {"reference": frameworks.REFERENCE, "passed": p["passed"], "file": rundir.parity_name(fw)}
                         for fw, p in parities.items()} or None
        man["parity_failed"] = parity_failed
        run_dir = rundir.RunDir(tmp)
        run_dir.write_json(run_dir.manifest, man)
        run_dir.write_json(run_dir.results, results)
        if any(p != "clean" for p in passes):
            try:
                _normalise(tmp)
            except KernelmapError as exc:  # keep the captures; report the failure after the rename
                normalise_error = exc
            except Exception as exc:  # noqa: BLE001 - a parser defect must not cost the captures either
                # (on the H100 a ValueError in the cuDNN log adapter discarded a whole GPU run's captures)
                traceback.print_exc(file=sys.stderr)
                normalise_error = KernelmapError(f"{type(exc).__name__}: {exc} (a kernelmap defect: traceback above)")
    summary = _summary(out, results, decisions, notes, parities, parity_failed)
    if normalise_error is not None:
        raise KernelmapError(f"{out}: the run is complete but normalising its captures failed: {normalise_error}; "
                             f"fix and rerun `kernelmap normalise {out}`")
    # An explicit --device gpu that a framework cannot meet fails the run (after keeping what ran).
    summary["exit_code"] = 3 if any(d.explicit for d in decisions.values()) or failed else 0
    return summary


def contention_cell(c: dict[str, Any] | None) -> str:
    """The console's contention column of a figure (``contention.summarise``, with ``trials`` and
    ``trials_contended`` for the clean pass): "quiet", "BUSY: <what was measured> (k/n trials)", or why
    there is no figure."""
    if not c:
        return "not recorded"
    if c.get("contended") is None:
        return c.get("text") or "not measured"
    n, k = c.get("trials"), c.get("trials_contended")
    if c["contended"]:
        return f"BUSY: {c['text']}" + (f" ({k}/{n} trials)" if n else "")
    return "quiet" + (f" ({k}/{n} trials busy, left out)" if k else "")


def _overhead_text(name: str, o: dict[str, Any]) -> str:
    if o.get("skipped"):
        return f"{name} skipped"
    busy = " BUSY" if (o.get("contention") or {}).get("contended") else ""
    if o.get("verdict") == str(timing.OverheadVerdict.ABOVE):
        return f"{name} {o['overhead']:+.0%}{busy}"
    return f"{name} {o.get('verdict')}{busy}"


def _print_table(summary: dict[str, Any]) -> None:
    rows = summary["results"]
    print("step: training step only, batches on the device; median of all trials' samples, 95% CI;"
          " e2e: with the loader")
    head = (f"{'framework':<10} {'mode':<14} {'bs':>5} {'device':<6} {'step ms':>9} {'95% CI ms':>17} {'trials':>6} "
            f"{'img/s step':>11} {'e2e ms':>8} {'img/s e2e':>10} {'acc':>7}  {'contention':<10}  capture overhead")
    print(head)
    for r in rows:
        over = ", ".join(_overhead_text(p, o) for p, o in r["overheads"].items())
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "-"
        ci = (f"{r['ci95_low_s'] * 1e3:.3f}-{r['ci95_high_s'] * 1e3:.3f}" if r["ci95_low_s"] is not None else "-")
        if r["noisy"]:
            ci += " noisy"
        if r.get("trials_disagree"):
            ci += " disagree"
        e2e = f"{r['e2e_step_s'] * 1e3:8.3f}" if r["e2e_step_s"] else f"{'-':>8}"
        e2e_ips = f"{r['e2e_images_per_s']:10.1f}" if r["e2e_images_per_s"] else f"{'-':>10}"
        print(f"{r['framework']:<10} {r['mode']:<14} {r['batch_size']:>5} {r['device']:<6} {r['median_step_s'] * 1e3:>9.3f} "
              f"{ci:>17} {r['n_trials']:>6} {r['images_per_s']:>11.1f} {e2e} {e2e_ips} {acc:>7}  "
              f"{contention_cell(r.get('contention')):<10}  {over}")
    busy = [(r, p, o) for r in rows for p, o in r["overheads"].items() if (o.get("contention") or {}).get("contended")]
    for r, p, o in busy:
        print(f"{r['framework']} {r['mode']} bs {r['batch_size']} {p} pass: BUSY: {o['contention']['text']}")
    for fw, note in summary["skipped"].items():
        print(f"{fw}: not run: {note}")
    print(summary["run_dir"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=(*FRAMEWORK_CHOICES, "all"), default="all")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the GPU where the framework can use it, else the CPU")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64], metavar="N")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=100, help="timed training steps (default 100)")
    length.add_argument("--epochs", type=int, help="train whole epochs instead of --steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps (default 5)")
    parser.add_argument("--data", default="auto", metavar="auto|fashion-mnist|mnist|synthetic|DIR")
    parser.add_argument("--data-dir", help="directory of the IDX files for --data mnist/fashion-mnist")
    parser.add_argument("--out", help="run directory (default runs/<UTC timestamp>)")
    parser.add_argument("--profile", choices=tuple(PROFILES), default="none", help="capture passes after the clean one")
    parser.add_argument("--mode", action="extend", nargs="+", choices=frameworks.mode_choices(), metavar="MODE",
                        help="execution modes to run, each in the frameworks that have it (a framework with none of "
                             "them runs its default, the first); all: every mode of every framework; modes that need "
                             "a GPU are skipped on the CPU with a note. Modes: " + "; ".join(
                                 f"{d.name} {m}" + (f" ({d.mode_help[m]})" if m in d.mode_help else "")
                                 for d in frameworks.REGISTRY.values() for m in d.modes))
    for d in frameworks.REGISTRY.values():  # older switches that name one mode (--hybridize)
        for flag, mode in d.mode_flags.items():
            parser.add_argument(flag, dest="mode", action="append_const", const=mode, help=f"the same as --mode {mode}")
    for d in frameworks.REGISTRY.values():  # each framework's own options (registry.Option)
        for o in d.options:
            parser.add_argument(o.flag, dest=o.name, choices=o.choices, help=f"{d.label}: {o.help}")
    parser.add_argument("--math", choices=[m.value for m in Math], default=MATH_DEFAULT.value,
                        help="GPU convs and matmuls of every framework: fp32 (TF32 off everywhere, the default: "
                             "like with like) or tf32 (TF32 allowed everywhere)")
    parser.add_argument("--replace", action="store_true", help="replace an existing --out")
    parser.add_argument("--trials", type=int, default=timing.DEFAULT_TRIALS,
                        help=f"independent clean-pass processes per framework x batch size (default {timing.DEFAULT_TRIALS})")
    parser.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS, metavar="N",
                        help="extra clean trials of a framework x batch size whose trials ran under contention or "
                             f"disagree beyond noise (default {DEFAULT_MAX_REPEATS})")
    parser.add_argument("--repeat-budget", type=float, metavar="SECONDS",
                        help="wall time the extra trials may take (default: "
                             f"{REPEAT_BUDGET_SHARE * 100:.0f}%% of the run's time before them)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads of every framework (OMP/MKL); default: the physical cores")
    parser.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH",
                        help="interpreter of that framework's workers (else $KERNELMAP_PYTHON_<FRAMEWORK>, else this "
                             "one): frameworks whose dependencies clash live in environments of their own")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    for bs in args.batch_size:
        if bs < 1:
            raise KernelmapError(f"--batch-size {bs}: must be at least 1")
    summary = execute(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_table(summary)
    return summary["exit_code"]
