"""``kernelmap run``: train/benchmark one or both frameworks into a run directory.

Each framework x batch size x capture pass runs in its own worker subprocess
(``python -m kernelmap.worker``); this process imports no framework. Capture passes are separate
runs of the same steps, so one pass's overhead never shows in another's timings (the "leveled"
method of arXiv:1908.06869): ``clean`` (no profiler), ``framework`` (torch.profiler /
mx.profiler), ``libs`` (cuDNN/cuBLAS/cuBLASLt logs on the GPU, oneDNN verbose on the CPU) and
``nsys`` (Nsight Systems, where found). The run directory is built under a temporary name and
renamed when complete (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import doctor, gpuinfo, manifest
from .atomic import atomic_dir, atomic_file
from .errors import KernelmapError, MissingToolError

FRAMEWORK_CHOICES = ("pytorch", "mxnet")
PROFILES = {
    "none": ("clean",),
    "framework": ("clean", "framework"),
    "libs": ("clean", "libs"),
    "nsys": ("clean", "nsys"),
    "all": ("clean", "framework", "libs", "nsys"),
}
# Timed steps of each capture pass (at most the clean pass's). Library logs grow fast.
PASS_STEPS = {"framework": 5, "libs": 3, "nsys": 10}
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
                  gpu_problem: str | None = None, verdict=None) -> Decision:
    """Where ``framework`` runs, given what its probe found and the GPU's compute capability.

    ``verdict(cc_tuple) -> (ok, message)`` defaults to ``frameworks.mxnet.built.gpu_verdict`` (an MXNet
    built for this GPU by ``kernelmap build-mxnet``, else the cu11x wheel's verdict).
    """
    if not probe.get("installed"):
        return Decision(framework, requested, None, f"{framework} is not installed ({probe.get('error')}); "
                        f"fix: {probe.get('fix')}")
    if requested == "cpu":
        return Decision(framework, requested, "cpu", None)
    no_gpu = f"no NVIDIA GPU found ({gpu_problem})" if gpu_problem else "no NVIDIA GPU found"

    def unusable(why: str, fix: str) -> Decision:
        if requested == "auto":
            return Decision(framework, requested, "cpu", f"{why}; running on the CPU")
        return Decision(framework, requested, None, f"--device gpu: {why}; fix: {fix}", explicit=True)

    if framework == "pytorch":
        if probe.get("cuda_available"):
            return Decision(framework, requested, "gpu", None)
        if not probe.get("cuda_build"):
            return unusable(f"torch {probe.get('version')} is a CPU-only build", doctor.FIX["torch-cuda"])
        if compute_capability is None:
            return unusable(no_gpu, "run on a machine with an NVIDIA GPU and driver")
        return unusable(
            f"torch {probe.get('version')} (CUDA {probe.get('cuda_build')}) sees no usable GPU "
            "(torch.cuda.is_available() is False; is the driver new enough?)",
            "update the NVIDIA driver, or install a torch build for the driver's CUDA version",
        )
    # mxnet
    cc = _parse_cc(compute_capability)
    if cc is None:
        return unusable(no_gpu, "run on a machine with an NVIDIA GPU and driver")
    if verdict is None:
        from kernelmap.frameworks.mxnet.built import gpu_verdict as verdict
    ok, message = verdict(cc)
    if not ok:
        # The wheel has no code for this GPU at all: MXNet runs on the CPU, labelled, whatever was asked.
        return Decision(framework, requested, "cpu", f"{message} (GPU sm {compute_capability})")
    if not probe.get("cuda_build"):
        return unusable(f"mxnet {probe.get('version')} is the CPU build", doctor.FIX["mxnet"])
    if not probe.get("num_gpus"):
        return unusable("MXNet sees no GPU (mx.context.num_gpus() == 0)",
                        "check the driver and the nvidia-*-cu11 wheels (kernelmap doctor)")
    return Decision(framework, requested, "gpu", None)


# --- workers -------------------------------------------------------------------------------------
class _StderrTee(threading.Thread):
    """Forward a worker's stderr to ours as it arrives (progress bars included), keeping a tail."""

    def __init__(self, stream, forward: bool):
        super().__init__(daemon=True)
        self.stream = stream
        self.forward = forward
        self.tail: collections.deque[bytes] = collections.deque(maxlen=64)

    def run(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.tail.append(chunk)
            if self.forward:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))

    def last_line(self) -> str:
        text = b"".join(self.tail).decode(errors="replace")
        lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return lines[-1] if lines else ""


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
               stdout_path: Path | None = None, forward_stderr: bool = True) -> None:
    """Run one worker command; raise ``KernelmapError`` (one line) when it fails.

    The worker's stdout goes to ``stdout_path`` (library verbose lines) or else to our stderr, so
    that our stdout stays clean for ``--json``.
    """
    stdout_fh = open(stdout_path, "wb") if stdout_path else None  # noqa: SIM115
    try:
        # Its own process group: a terminal's Ctrl-C reaches only this process, which then stops the
        # worker (and nsys with its target) as a group. A worker that got the SIGINT itself could be
        # mid-import and print Python's startup traceback.
        proc = subprocess.Popen(cmd, env=env, stdout=stdout_fh or sys.stderr.fileno(), stderr=subprocess.PIPE,
                                process_group=0)
        tee = _StderrTee(proc.stderr, forward_stderr)
        tee.start()
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C: the worker must be gone before the run dir is removed
            tee.forward = False
            stop_group(proc)
            raise
        tee.join(timeout=10)
    finally:
        if stdout_fh:
            stdout_fh.close()
    if rc == EXIT_OOM:
        raise KernelmapError(f"{label}: out of memory at batch size {batch_size}; "
                             f"try a smaller --batch-size ({tee.last_line()})")
    if rc != 0:
        raise KernelmapError(f"{label}: worker exited {rc}: {tee.last_line() or '(no message)'}")


MXNET_PROFILE_ENV = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0"}


def libs_env(device: str, log_dir: Path, framework: str = "pytorch", cudnn9: bool = False) -> dict[str, str]:
    """Environment that makes the math libraries log their calls into ``log_dir``."""
    if device == "gpu":
        # cuDNN 9 (PyTorch, and MXNet built by build-mxnet: ``cudnn9``) takes CUDNN_LOGLEVEL_DBG (3 = info);
        # cuDNN 8 (MXNet's CUDA 11 wheel) the older CUDNN_LOGINFO_DBG, which cuDNN 9 only tolerates as deprecated.
        cudnn8 = framework == "mxnet" and not cudnn9
        cudnn_level = {"CUDNN_LOGINFO_DBG": "1"} if cudnn8 else {"CUDNN_LOGLEVEL_DBG": "3"}
        return {
            **cudnn_level,
            "CUDNN_LOGDEST_DBG": str(log_dir / "cudnn.log"),
            "CUBLAS_LOGINFO_DBG": "1",
            "CUBLAS_LOGDEST_DBG": str(log_dir / "cublas.log"),
            "CUBLASLT_LOG_LEVEL": "5",  # API trace
            "CUBLASLT_LOG_FILE": str(log_dir / "cublaslt.log"),
        }
    # oneDNN (PyTorch's and MXNet's MKL-DNN) print verbose lines on stdout: captured to onednn.log.
    return {"DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "MKLDNN_VERBOSE": "1"}


def _nsys_commands(nsys: str, out_dir: Path, worker_cmd: list[str]) -> tuple[list[str], list[str]]:
    # Record only the timed steps: the worker brackets them with cudaProfilerStart/Stop, so warm-up
    # kernels (which no op range covers) never enter the capture.
    profile = [nsys, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi",
               "--capture-range-end=stop", "-o", str(out_dir / "nsys"), "--force-overwrite", "true",
               *worker_cmd]
    export = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out_dir / "nsys.sqlite")]
    return profile, export


def _nsys_report(out_dir: Path) -> Path:
    for name in ("nsys.nsys-rep", "nsys.qdrep"):
        if (out_dir / name).is_file():
            return out_dir / name
    raise KernelmapError(f"{out_dir}: nsys wrote no report (nsys.nsys-rep)")


# --- the run --------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def _run_one(fw: str, decision: Decision, bs: int, passes: tuple[str, ...], train: dict[str, Any],
             data_json: str, run_tmp: Path, progress: bool, nsys: str | None,
             notes: list[str]) -> dict[str, Any]:
    """All capture passes of one framework x batch size; returns its results.json entry."""
    rel = Path(fw) / f"bs{bs}"
    out_dir = run_tmp / rel
    out_dir.mkdir(parents=True)
    config = dict(train, batch_size=bs, device=decision.device)
    base = [sys.executable, "-m", "kernelmap.worker", "--framework", fw, "--dir", str(out_dir),
            "--config", json.dumps(config), "--data-info", data_json]
    if progress:
        base.append("--progress")
    pass_results: dict[str, dict[str, Any]] = {}
    # MXNet built for this GPU (kernelmap build-mxnet): its tree first on the worker's PYTHONPATH
    mx_env = doctor.mxnet_env() if fw == "mxnet" and decision.device == "gpu" else None
    for p in passes:
        label = f"{fw} bs {bs} ({p} pass, {decision.device})"
        cmd = [*base, "--pass", p]
        env = None
        stdout_path = None
        if p != "clean":
            steps = PASS_STEPS[p] if train["steps"] is None else min(PASS_STEPS[p], train["steps"])
            cmd += ["--steps", str(steps), "--no-evaluate"]
        if p in ("framework", "nsys") and fw == "mxnet":
            # MXNet runs backward ops as one ImperativeBulk segment unless bulking is off; the
            # profiler (and its NVTX ranges, nsys pass) then shows no _backward_* operator. Read at
            # `import mxnet`, hence the env.
            env = {**os.environ, **MXNET_PROFILE_ENV}
        if p == "libs":
            cmd += ["--warmup", str(min(LIBS_WARMUP, train["warmup_steps"]))]
            env = {**os.environ, **libs_env(decision.device, out_dir, fw, cudnn9=mx_env is not None)}
            if decision.device == "cpu":
                stdout_path = out_dir / "onednn.log"
        if mx_env is not None:
            env = {**(env or os.environ), **mx_env}
        if p == "nsys":
            if nsys is None:
                msg = f"{fw} bs {bs}: nsys pass skipped: nsys not found; {doctor.FIX['nsys']}"
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
                pass_results[p] = {"skipped": "nsys not found"}
                continue
            cmd, export = _nsys_commands(nsys, out_dir, cmd)
            run_worker(cmd, label=label, batch_size=bs, env=env)
            run_worker([*export, str(_nsys_report(out_dir))], label=f"{label}: nsys export", batch_size=bs)
        else:
            run_worker(cmd, label=label, batch_size=bs, env=env, stdout_path=stdout_path)
        pass_results[p] = _read_json(out_dir / f"{p}.json")

    clean = pass_results["clean"]
    clean_median = clean["median_step_s"]
    passes_summary: dict[str, Any] = {}
    for p, r in pass_results.items():
        if "skipped" in r:
            passes_summary[p] = r
            continue
        entry = {"median_step_s": r["median_step_s"], "steps": r["steps"], "warmup_steps": r["warmup_steps"]}
        if p != "clean":
            entry["overhead"] = r["median_step_s"] / clean_median - 1.0
        passes_summary[p] = entry
    files = sorted(str(rel / f.name) for f in out_dir.iterdir() if f.is_file())
    keys = ("steps", "warmup_steps", "step_times_s", "median_step_s", "q25_step_s", "q75_step_s", "iqr_step_s",
            "mean_step_s", "stdev_step_s", "images_per_s", "test_accuracy", "final_loss", "train_wall_s")
    return {
        "framework": fw,
        "batch_size": bs,
        "device": decision.device,
        "device_requested": decision.requested,
        "device_note": decision.note,
        **{k: clean[k] for k in keys},
        "passes": passes_summary,
        "dir": str(rel),
        "files": files,
        "versions": clean["versions"],
    }


def _default_out() -> Path:
    return Path("runs") / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _resolve_data(train: dict[str, Any]):
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.data import prepare_dir, resolve_data

    info = resolve_data(spec.TrainConfig(**train))
    if not info.synthetic:
        prepare_dir(info)  # once here, so that workers never race to lay the files out
    return info


PARITY_STEPS = 20


def _parity(train: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """``kernelmap parity`` figures (CPU, fp32, both frameworks in their own subprocesses)."""
    from .parity import compute_parity

    steps = PARITY_STEPS if train["steps"] is None else min(PARITY_STEPS, train["steps"])
    return compute_parity(data=train["data"], data_dir=train["data_dir"], steps=steps, batch_size=batch_size,
                          lr=train["lr"], momentum=train["momentum"], seed=train["seed"],
                          hybridize=train["hybridize"])


def _normalise(run_tmp: Path) -> None:
    from kernelmap.normalise import normalise_run_dir  # lands in parallel; imported only when needed

    normalise_run_dir(run_tmp)


def execute(args: argparse.Namespace) -> dict[str, Any]:
    """Do the run; return the summary (also what ``--json`` prints)."""
    frameworks = list(FRAMEWORK_CHOICES) if args.framework == "all" else [args.framework]
    passes = PROFILES[args.profile]
    out = Path(args.out) if args.out else _default_out()
    if out.exists() and not args.replace:
        raise KernelmapError(f"{out}: already exists; choose another --out or pass --replace")
    train = {
        "lr": args.lr,
        "momentum": 0.9,
        "steps": None if args.epochs is not None else args.steps,
        "epochs": args.epochs,
        "warmup_steps": args.warmup,
        "seed": args.seed,
        "data": args.data,
        "data_dir": args.data_dir,
        "hybridize": args.hybridize,
    }
    if train["steps"] is not None and train["steps"] < 1:
        raise KernelmapError("--steps must be at least 1")
    if train["epochs"] is not None and train["epochs"] < 1:
        raise KernelmapError("--epochs must be at least 1")

    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    # Decide devices before any work, so that every downgrade is said first.
    gpus = gpuinfo.query()
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    decisions: dict[str, Decision] = {}
    for fw in frameworks:
        # Only a GPU question needs the framework imported (in a subprocess); the CPU needs it installed.
        probe = doctor.find_framework(fw) if args.device == "cpu" else doctor.probe_framework(fw)
        d = decide_device(fw, args.device, probe, cc, gpus.problem)
        decisions[fw] = d
        if d.device is None:
            print(f"kernelmap run: {fw} will not run: {d.note}", file=sys.stderr)
        elif d.note:
            print(f"kernelmap run: {fw} runs on the {d.device.upper()}: {d.note}", file=sys.stderr)
    runnable = [fw for fw in frameworks if decisions[fw].device is not None]
    if not runnable:
        notes_ = list(dict.fromkeys(d.note or "" for d in decisions.values()))  # same reason once
        raise MissingToolError(f"nothing can run ({', '.join(frameworks)}): " + "; ".join(notes_))

    data_info = _resolve_data(train)
    data_json = json.dumps(data_info.to_dict())
    nsys = doctor.find_tool("nsys") if "nsys" in passes else None
    progress = sys.stderr.isatty() and not args.json
    notes: list[str] = []
    results: list[dict[str, Any]] = []
    normalise_error: KernelmapError | None = None
    with atomic_dir(out, replace=args.replace) as tmp:
        failed: list[str] = []
        for fw in runnable:
            for bs in args.batch_size:
                try:
                    results.append(_run_one(fw, decisions[fw], bs, passes, train, data_json, tmp, progress, nsys,
                                            notes))
                except KernelmapError as exc:  # OOM at this batch size, a broken install: the rest still runs
                    msg = f"{exc}; {fw} bs {bs} left out of the run"
                    if "ImportError" in str(exc) or "ModuleNotFoundError" in str(exc):
                        msg += f"; fix: {doctor.FIX[fw]}"
                    print(f"kernelmap run: {msg}", file=sys.stderr)
                    notes.append(msg)
                    failed.append(str(exc))
                    shutil.rmtree(tmp / fw / f"bs{bs}", ignore_errors=True)
                    if (tmp / fw).is_dir() and not any((tmp / fw).iterdir()):
                        (tmp / fw).rmdir()
        if not results:
            raise KernelmapError("nothing ran: " + "; ".join(dict.fromkeys(failed)))
        ran = {r["framework"] for r in results}
        parity = _parity(train, args.batch_size[0]) if len(ran) == 2 else None
        if parity is not None:
            with atomic_file(tmp / "parity.json") as fh:
                json.dump(parity, fh, indent=2)
            if not parity["passed"]:
                msg = f"parity: the frameworks differ beyond tolerance: {'; '.join(parity['failures'])}"
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
        fw_entries = {}
        for fw, d in decisions.items():
            versions = next((r["versions"] for r in results if r["framework"] == fw), None)
            fw_entries[fw] = {**d.to_manifest(), "versions": versions, "skipped": d.device is None}
        config = {"cli": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                  "train": train, "passes": list(passes), "pass_steps": PASS_STEPS, "libs_warmup": LIBS_WARMUP,
                  "out": str(out)}
        man = manifest.build(config=config, gpus=gpus, frameworks=fw_entries, data=data_info.to_dict())
        man["host"]["load_average_start"] = load_start
        man["notes"] = notes
        man["parity"] = None if parity is None else {"passed": parity["passed"], "file": "parity.json"}
        with atomic_file(tmp / "manifest.json") as fh:
            json.dump(man, fh, indent=2)
        with atomic_file(tmp / "results.json") as fh:
            json.dump(results, fh, indent=2)
        if any(p != "clean" for p in passes):
            try:
                _normalise(tmp)
            except KernelmapError as exc:  # keep the captures; report the failure after the rename
                normalise_error = exc
    summary = {
        "run_dir": str(out),
        "results": [
            {k: r[k] for k in ("framework", "batch_size", "device", "device_note", "median_step_s", "iqr_step_s",
                               "images_per_s", "test_accuracy")}
            | {"overheads": {p: v.get("overhead") for p, v in r["passes"].items() if p != "clean"}}
            for r in results
        ],
        "skipped": {fw: d.note for fw, d in decisions.items() if d.device is None},
        "notes": notes,
        "parity_passed": parity["passed"] if parity is not None else None,
    }
    if normalise_error is not None:
        raise KernelmapError(f"{out}: the run is complete but normalising its captures failed: {normalise_error}; "
                             f"fix and rerun `kernelmap normalise {out}`")
    # An explicit --device gpu that a framework cannot meet fails the run (after keeping what ran).
    summary["exit_code"] = 3 if any(d.explicit for d in decisions.values()) or failed else 0
    return summary


def _print_table(summary: dict[str, Any]) -> None:
    rows = summary["results"]
    head = f"{'framework':<10} {'bs':>5} {'device':<6} {'median ms':>10} {'IQR ms':>8} {'img/s':>10} {'acc':>7}  overhead"
    print(head)
    for r in rows:
        over = ", ".join(f"{p} {v:+.0%}" if v is not None else f"{p} skipped" for p, v in r["overheads"].items())
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "-"
        print(f"{r['framework']:<10} {r['batch_size']:>5} {r['device']:<6} {r['median_step_s'] * 1e3:>10.3f} "
              f"{r['iqr_step_s'] * 1e3:>8.3f} {r['images_per_s']:>10.1f} {acc:>7}  {over}")
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
    parser.add_argument("--hybridize", action="store_true", help="Gluon: hybridize the network")
    parser.add_argument("--replace", action="store_true", help="replace an existing --out")
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
