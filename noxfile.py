"""Sessions for kernelmap: tests, the benchmark job, history comparison and lint."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

# MXNet 1.9.1 (the last release) needs numpy < 1.24, which has no wheels past Python 3.11.
PYTHON = "3.11"
PYTHON_FIX = "pip install 'nox[uv]'"  # then nox downloads a missing interpreter with uv (--default-venv-backend uv)


def python_missing(which=shutil.which, find_spec=importlib.util.find_spec) -> str | None:
    """Why the sessions cannot get Python ``PYTHON``, with the one command that fixes it; None where
    nox can find it (on PATH) or obtain it (uv, or nox's [pbs] extra, downloads it)."""
    if which(f"python{PYTHON}") or which("uv") or find_spec("uv") or find_spec("pbs_installer"):
        return None
    return (f"kernelmap's nox sessions need Python {PYTHON} (MXNet 1.9.1 needs numpy < 1.24: no wheels past "
            f"{PYTHON}); python{PYTHON} is not on PATH and nox cannot download it here. Fix: {PYTHON_FIX} "
            f"and run `nox --default-venv-backend uv -s bench`")


if __name__ != "_kernelmap_noxfile" and (_missing := python_missing()):
    print(f"nox: {_missing}", file=sys.stderr)  # nox's own error ("interpreter not found") follows


def _gpu_compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability from nvidia-smi, or None where there is no GPU."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        major, minor = out.splitlines()[0].strip().split(".")
        return int(major), int(minor)
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def _mxnet_gpu_verdict(cc: tuple[int, int]) -> tuple[bool, str]:
    """``frameworks/mxnet/cuda11.gpu_verdict``, loaded from its file: nox runs outside the project's
    environment, and that module needs only the standard library."""
    path = Path(__file__).resolve().parent / "frameworks" / "mxnet" / "cuda11.py"
    spec = importlib.util.spec_from_file_location("_kernelmap_mxnet_cuda11", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.gpu_verdict(cc)


def _mxnet_extra() -> str:
    """`mxnet-gpu` (mxnet-cu112 + CUDA 11 wheels) where its machine code runs, else CPU `mxnet`."""
    cc = _gpu_compute_capability()
    if cc is not None and _mxnet_gpu_verdict(cc)[0]:
        return "mxnet-gpu"
    return "mxnet"


FRAMEWORKS_DIR = Path(__file__).resolve().parent / "frameworks"


def _own_env_pythons(session: nox.Session) -> None:
    """A framework whose dependencies clash with the others' lists its own in
    ``frameworks/<name>/own-env.txt``: make ``.nox/<name>-workers`` from it (plus kernelmap) once, and
    point ``KERNELMAP_PYTHON_<NAME>`` at its python, which that framework's workers then use. A variable
    already set (a machine whose own Python has the framework) is kept."""
    for req in sorted(FRAMEWORKS_DIR.glob("*/own-env.txt")):
        name = req.parent.name
        var = f"KERNELMAP_PYTHON_{name.upper()}"
        if var in os.environ:
            continue
        env = Path(".nox") / f"{name}-workers"
        python = env / "bin" / "python"
        if not python.exists():
            session.run(sys.executable, "-m", "venv", str(env), external=True)
            session.run(str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools>=77",
                        external=True)
        session.run(str(python), "-m", "pip", "install", "-q", "-e", ".", "-r", str(req), external=True)
        session.env[var] = str(python.absolute())  # not resolve(): the venv's python is a symlink


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (CPU; GPU tests skip without a GPU)."""
    session.install("-e", ".[pytorch,mxnet,dev]")
    _own_env_pythons(session)
    session.run("pytest", *session.posargs)


BENCH_DEFAULTS = ("--steps", "100", "--profile", "all", "--batch-size", "64", "256")


def merge_options(defaults: tuple[str, ...] | list[str], given: list[str]) -> list[str]:
    """``defaults`` with the options named in ``given`` replaced by ``given``'s (posargs add to the
    defaults, they do not replace them): each option is a ``--flag`` and the values up to the next."""

    def groups(argv) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        flag = None
        for a in argv:
            if a.startswith("--"):
                name, eq, value = a.partition("=")
                flag = name
                out[flag] = [value] if eq else []
            elif flag is None:
                raise ValueError(f"{a!r}: expected an option (--name) first")
            else:
                out[flag].append(a)
        return out

    merged = {**groups(defaults), **groups(given)}
    return [x for flag, values in merged.items() for x in (flag, *values)]


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The main job: both frameworks on the best device, all capture passes, step benchmarks, the report."""
    session.install("-e", f".[pytorch,{_mxnet_extra()},dev]")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = os.path.join("runs", stamp)
    args = merge_options(BENCH_DEFAULTS, session.posargs)
    _own_env_pythons(session)
    session.run("kernelmap", "doctor")
    session.run("kernelmap", "run", "--framework", "all", "--device", "auto", "--out", run_dir, *args)
    _step_benchmarks(session, "--benchmark-max-time=0.5")
    session.run("kernelmap", "report", run_dir, "-o", os.path.join(run_dir, "report"),
                "--storage", ".benchmarks")
    session.log(f"report: {os.path.join(run_dir, 'report', 'report.html')}")


@nox.session(python=PYTHON)
def benchmarks(session: nox.Session) -> None:
    """pytest-benchmark of one training step per framework x mode x device x batch size (autosaved to
    .benchmarks/, one file per framework)."""
    session.install("-e", f".[pytorch,{_mxnet_extra()},dev]")
    _own_env_pythons(session)
    _step_benchmarks(session, *session.posargs)


@nox.session(python=PYTHON)
def adapter_speed(session: nox.Session) -> None:
    """Adapter events/s and peak memory on >= 1M-event traces, beside Holistic Trace Analysis 0.5.0."""
    session.install("-e", ".[dev]", "holistictraceanalysis==0.5.0")
    session.run("pytest", "benches/bench_adapters.py", "--benchmark-only", "--benchmark-autosave",
                "--benchmark-columns=mean,rounds", "-p", "no:cacheprovider", *session.posargs)


# Every framework folder with a descriptor (frameworks/<name>/descriptor.py; the registry lists them).
STEP_BENCH_FRAMEWORKS = tuple(sorted(p.parent.name for p in FRAMEWORKS_DIR.glob("*/descriptor.py")))


def step_benchmark_argv(framework: str, *args: str) -> list[str]:
    """The pytest command line of one framework's step benchmarks (tests/test_history.py runs it too).
    Each saves one numbered file whose benchmarks are named by their key, e.g.
    ``test_train_step[pytorch-eager-cpu-64]``, so ``kernelmap compare`` pairs like with like."""
    return ["pytest", "benches/bench_train_step.py", f"--framework={framework}", "--benchmark-autosave",
            "-p", "no:cacheprovider", *args]


def _step_benchmarks(session: nox.Session, *args: str) -> None:
    """Per-framework pytest-benchmark runs, saved to .benchmarks/ (never overwritten: numbered)."""
    for framework in STEP_BENCH_FRAMEWORKS:
        # One pytest process per framework: their CUDA runtimes must never share a process. A framework
        # with an environment of its own (KERNELMAP_PYTHON_<NAME>) is benchmarked by that interpreter.
        python = session.env.get(f"KERNELMAP_PYTHON_{framework.upper()}") or os.environ.get(
            f"KERNELMAP_PYTHON_{framework.upper()}")
        if python:
            session.run(python, "-m", *step_benchmark_argv(framework, *args), external=True)
        else:
            session.run(*step_benchmark_argv(framework, *args))


@nox.session(python=PYTHON)
def compare(session: nox.Session) -> None:
    """Compare saved benchmark runs like with like (by default, per framework x mode x device x batch
    size, the latest two runs holding it; see kernelmap/history.py) and fail past a threshold."""
    session.install("-e", ".")
    session.run("kernelmap", "compare", *(session.posargs or ["--fail", "mean:5%"]))


@nox.session(python=PYTHON)
def reference_loop(session: nox.Session) -> None:
    """GPU: the bare step loop beside the clean pass, three repeated runs and their spread."""
    if _gpu_compute_capability() is None:
        session.skip("no NVIDIA GPU found (nvidia-smi)")
    session.install("-e", ".[pytorch,dev]")
    session.run("bash", "benches/gpu_timing_check.sh", *session.posargs, external=True)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Run ruff."""
    session.install("ruff>=0.4")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """GPU-only tests; skipped where there is no GPU."""
    if _gpu_compute_capability() is None:
        session.skip("no NVIDIA GPU found (nvidia-smi)")
    session.install("-e", f".[pytorch,{_mxnet_extra()},dev]")
    session.run("pytest", "-m", "gpu", *session.posargs)
