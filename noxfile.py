"""Sessions for kernelmap: tests, the benchmark job, history comparison and lint."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import nox
from packaging.requirements import Requirement  # nox's own dependency
from packaging.version import InvalidVersion, Version

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


def own_env(name: str) -> Path:
    """The environment of framework ``name`` whose dependencies clash with the others' (its own-env.txt)."""
    return Path(".nox") / f"{name}-workers"


def run_every_mode(session: nox.Session, *args: str, **kwargs) -> None:
    """``session.run`` of a command that makes or fills an environment the session needs, whatever nox's flags:
    ``nox --install-only`` skips ``session.run`` (it returns None, running nothing), so there the command runs as
    ``session.run_install``, which --install-only runs. Without that flag (``--no-install`` included) it is
    ``session.run``, as before: a fresh clone's ``nox -s tests --install-only`` made no ``.nox/frameworks`` and then
    ran its missing python (FileNotFoundError)."""
    if session.run(*args, **kwargs) is None:
        session.run_install(*args, **kwargs)


def _own_env_pythons(session: nox.Session) -> None:
    """A framework whose dependencies clash with the others' lists its own in
    ``frameworks/<name>/own-env.txt``: make ``.nox/<name>-workers`` from it (plus kernelmap) once, and
    point ``KERNELMAP_PYTHON_<NAME>`` at its python, which that framework's workers then use. A variable
    already set (a machine whose own Python has the framework) is kept."""
    gpu = _gpu_compute_capability() is not None
    for req in sorted(FRAMEWORKS_DIR.glob("*/own-env.txt")):
        name = req.parent.name
        if gpu and (req.parent / "own-env-gpu.txt").is_file():  # its GPU build (jax[cuda13]) on a GPU machine
            req = req.parent / "own-env-gpu.txt"
        var = f"KERNELMAP_PYTHON_{name.upper()}"
        if var in os.environ:
            continue
        env = own_env(name)
        python = env / "bin" / "python"
        if not python.exists():
            run_every_mode(session, sys.executable, "-m", "venv", str(env), external=True)
            run_every_mode(session, str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools>=77",
                           external=True)
        run_every_mode(session, str(python), "-m", "pip", "install", "-q", "-e", ".", "-r", str(req), external=True)
        session.env[var] = str(python.absolute())  # not resolve(): the venv's python is a symlink


# One environment for every session that runs the frameworks (tests, bench, benchmarks, gpu,
# reference_loop): they install the same packages, so they share .nox/frameworks instead of holding a
# copy each. nox still makes each session's own (small) environment; that one supplies the Python.
FRAMEWORKS_ENV = Path(".nox") / "frameworks"
# PyPI's Linux torch is the CUDA build (with about 5 GB of nvidia-* wheels and triton); PyTorch's own
# index serves CPU-only builds of torch and torchvision (local version label +cpu).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _frameworks_extras() -> str:
    """The extras every framework session installs: the same on one machine, so one environment."""
    return f"pytorch,{_mxnet_extra()},dev"


def _pytorch_specs() -> dict[str, Requirement]:
    """The pytorch extra's requirements from pyproject.toml, by name (torch, torchvision)."""
    project = tomllib.loads((Path(__file__).resolve().parent / "pyproject.toml").read_text())["project"]
    return {(r := Requirement(req)).name: r for req in project["optional-dependencies"]["pytorch"]}


def _reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether ``url`` answers within ``timeout`` seconds (an unreachable extra index makes pip retry)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def is_cpu_build(version: str) -> bool:
    """Whether ``version`` is a CPU-only build of PyTorch's (local label ``+cpu``)."""
    try:
        return Version(version).local == "cpu"
    except InvalidVersion:
        return False


def newest_cpu_builds(versions: list[str]) -> list[str]:
    """The CPU-only builds (local label ``+cpu``) among ``versions``, newest first."""
    return [str(v) for v in sorted((Version(v) for v in versions if is_cpu_build(v)), reverse=True)]


def _pip_json(python: str, *args: str) -> dict | None:
    """pip's JSON answer (``--report -`` of a dry run), or None where pip fails."""
    proc = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return None


def _torch_versions(python: str, index: list[str]) -> list[str]:
    """Every torch version pip can see here (its indexes, find-links, ``index``)."""
    proc = subprocess.run([python, "-m", "pip", "index", "versions", "torch", *index],
                          capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
    return []


def _installed(python: str, *names: str) -> dict[str, str]:
    """The installed versions of ``names`` in the environment of ``python`` (absent ones left out)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    proc = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def torch_cpu_args(python: str) -> tuple[list[str], str]:
    """pip arguments that install PyTorch's CPU build on a machine without an NVIDIA GPU, and why.

    A CPU build is used only as a pair: torch ``X+cpu`` and a torchvision built for it (PyPI's
    torchvision links the CUDA libraries of PyPI's torch and does not import beside a CPU torch). Where
    PyTorch's CPU index is reachable it is added; otherwise only what pip's own indexes and find-links
    offer counts. Where no pair resolves, [] (the default build) and the reason.

    With a GPU, a CPU build already in the environment (made without a GPU, or copied) is replaced by
    the default (CUDA) build of the same versions: pip counts ``torch==X`` as met by ``X+cpu``, so
    each ``+cpu`` package is asked for as ``==X,!=X+cpu``, which only another build of X meets."""
    have = _installed(python, "torch", "torchvision")
    if _gpu_compute_capability() is not None:
        cpu = {n: v for n, v in have.items() if is_cpu_build(v)}
        if not cpu:
            return [], "an NVIDIA GPU is present: the default (CUDA) build of torch"
        return ([f"{n}=={Version(v).public},!={v}" for n, v in cpu.items()],
                f"an NVIDIA GPU is present, but the environment holds PyTorch's CPU build "
                f"({', '.join(f'{n} {v}' for n, v in cpu.items())}), which pip counts as installed and "
                f"which runs on the CPU only: replaced by the default (CUDA) build of the same versions")
    if all(is_cpu_build(have.get(n, "")) for n in ("torch", "torchvision")):
        return [], f"CPU build of torch already installed (torch {have['torch']}, torchvision {have['torchvision']})"
    index = ["--extra-index-url", TORCH_CPU_INDEX] if _reachable(TORCH_CPU_INDEX) else []
    specs = _pytorch_specs()
    for version in newest_cpu_builds(_torch_versions(python, index)):
        if not specs["torch"].specifier.contains(version):
            continue
        # pip's own choice of torchvision beside that torch (a dry run, a few seconds)
        report = _pip_json(python, "install", "--dry-run", "--quiet", "--ignore-installed", "--report", "-",
                           *index, f"torch=={version}", str(specs["torchvision"]))
        chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in (report or {}).get("install", [])}
        if is_cpu_build(chosen.get("torchvision", "")):
            return ([*index, f"torch=={version}", f"torchvision=={chosen['torchvision']}"],
                    f"no NVIDIA GPU: the CPU build, torch {version} + torchvision {chosen['torchvision']}")
    where = "PyTorch's CPU index" if index else f"pip's indexes here ({TORCH_CPU_INDEX} is not reachable)"
    return [], (f"no NVIDIA GPU, but {where} offer no CPU build of torch with a torchvision built for it: "
                "the default (CUDA) build, about 6 GB with its nvidia-* wheels")


def _frameworks_env(session: nox.Session) -> Path:
    """Make (once) and update the shared environment ``FRAMEWORKS_ENV`` with this machine's extras
    (`_frameworks_extras`; PyTorch's CPU build where there is no NVIDIA GPU, its CUDA build in place of
    a CPU one where there is, `torch_cpu_args`), put it
    first on the session's PATH and return its bin directory. Its Python is the session's own; to start
    it afresh, remove the folder (nox -N renews only the session's own environment)."""
    python = FRAMEWORKS_ENV / "bin" / "python"
    if not python.exists():  # made in every mode: torch_cpu_args runs its python next (run_every_mode)
        run_every_mode(session, "python", "-m", "venv", str(FRAMEWORKS_ENV))
        run_every_mode(session, str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools>=77",
                       external=True)
    torch_args, why = torch_cpu_args(str(python))
    session.log(f"torch: {why}")
    session.run_install(str(python), "-m", "pip", "install", "-q", *torch_args, "-e",
                        f".[{_frameworks_extras()}]", external=True)  # skipped by nox --no-install
    bin_dir = FRAMEWORKS_ENV.absolute() / "bin"
    session.env["VIRTUAL_ENV"] = str(bin_dir.parent)
    session.env["PATH"] = os.pathsep.join([str(bin_dir), session.env.get("PATH") or os.environ.get("PATH", "")])
    return bin_dir


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite (GPU tests skip without a GPU)."""
    env = _frameworks_env(session)
    _own_env_pythons(session)
    session.run(str(env / "pytest"), *session.posargs, external=True)


# On Ctrl-C nox gives its command 0.3 s, then SIGTERM and 0.2 s, then SIGKILL: too short for `kernelmap
# run` to stop its worker processes (SIGTERM, then SIGKILL after 15 s) and remove its partial run
# directory, which a killed `kernelmap run` leaves behind with a worker still running.
STOP_TIMEOUTS = {"interrupt_timeout": 20.0, "terminate_timeout": 20.0}

BENCH_DEFAULTS = ("--steps", "100", "--profile", "all", "--batch-size", "64", "256")
# The job id `nox -s bench` gives `kernelmap run` (manifest["job"]) and the step benchmarks (the saved
# run's "kernelmap_job"): the run directory's name. kernelmap.history.keys.JOB_ENV (nox's Python does not
# import kernelmap; tests/test_noxfile.py holds the two equal).
JOB_ENV = "KERNELMAP_JOB"
BENCH_STORAGE = ".benchmarks"


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


def option_values(args: list[str], option: str) -> list[str]:
    """The values of ``option`` (e.g. ``--batch-size``) in ``kernelmap run`` arguments."""
    values: list[str] = []
    taking = False
    for a in args:
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            taking = name == option
            if taking and eq:
                values.append(value)
        elif taking:
            values.append(a)
    return values


def run_batch_sizes(args: list[str]) -> list[str]:
    """The values of ``--batch-size`` in ``kernelmap run`` arguments (as ``merge_options`` gives them)."""
    return option_values(args, "--batch-size")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The main job: run every framework, step benchmarks, the report."""
    env = _frameworks_env(session)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = os.path.join("runs", stamp)
    args = merge_options(BENCH_DEFAULTS, session.posargs)
    _own_env_pythons(session)
    session.env[JOB_ENV] = stamp  # one job: the run directory and the step benchmarks' saved run
    kernelmap = str(env / "kernelmap")
    session.run(kernelmap, "doctor", external=True)
    session.run(kernelmap, "run", "--framework", "all", "--device", "auto", "--out", run_dir, *args,
                external=True, **STOP_TIMEOUTS)
    # the step benchmarks of the run's batch sizes: each key's clean pass and step benchmark in one job
    # and on the run's data (`kernelmap run`'s default: auto), like with like
    sizes = run_batch_sizes(args)
    data = (option_values(args, "--data") or ["auto"])[0]
    _step_benchmarks(session, env, stamp, "--benchmark-max-time=0.5", f"--bench-data={data}",
                     *(f"--bench-batch-size={bs}" for bs in sizes))
    session.run(kernelmap, "report", run_dir, "-o", os.path.join(run_dir, "report"),
                "--storage", BENCH_STORAGE, external=True)
    session.log(f"report: {os.path.join(run_dir, 'report', 'report.html')}")


@nox.session(python=PYTHON)
def benchmarks(session: nox.Session) -> None:
    """Step benchmarks only, saved to .benchmarks/ as one run.

    pytest-benchmark of one training step per framework x mode x device x batch size, one saved run
    holding every framework (its job id: $KERNELMAP_JOB, else the UTC time)."""
    env = _frameworks_env(session)
    _own_env_pythons(session)
    job = os.environ.get(JOB_ENV) or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    session.env[JOB_ENV] = job
    _step_benchmarks(session, env, job, *session.posargs)


@nox.session(python=PYTHON)
def adapter_speed(session: nox.Session) -> None:
    """Adapter speed and memory beside Holistic Trace Analysis 0.5.0.

    Events/s and peak memory on >= 1M-event traces made from the real fixtures: the adapters alone
    (benches/bench_adapters.py), then the whole `kernelmap normalise` CLI on the scaled Kineto file
    and on a real foreign trace, beside HTA's parse of the same files in the same interleaved rounds
    (benches/bench_normalise.py; docs/adapter-speed.md)."""
    session.install("-e", ".[dev]", "holistictraceanalysis==0.5.0")
    session.run("pytest", "benches/bench_adapters.py", "--benchmark-only", "--benchmark-autosave",
                "--benchmark-columns=mean,rounds", "-p", "no:cacheprovider", *session.posargs)
    session.run("python", "benches/bench_normalise.py", "--rounds", "3", "--only", "kineto", "--only", "hta",
                "--input", "benches/data/owlv2-kineto-h100-tracelens.json.gz")


# Every framework folder with a descriptor (frameworks/<name>/descriptor.py; the registry lists them).
STEP_BENCH_FRAMEWORKS = tuple(sorted(p.parent.name for p in FRAMEWORKS_DIR.glob("*/descriptor.py")))


def step_benchmark_argv(framework: str, json_path: str | os.PathLike, *args: str) -> list[str]:
    """The pytest command line of one framework's step benchmarks (tests/test_history.py runs it too):
    its results go to ``json_path`` (``--benchmark-json``), one part of the job that ``kernelmap
    save-job`` saves as one numbered run. Benchmarks are named by their key, e.g.
    ``test_train_step[pytorch-eager-cpu-64]``, so ``kernelmap compare`` pairs like with like."""
    return ["pytest", "benches/bench_train_step.py", f"--framework={framework}", f"--benchmark-json={json_path}",
            "-p", "no:cacheprovider", *args]


def job_parts(files: dict[str, Path]) -> tuple[list[Path], list[str]]:
    """framework -> its --benchmark-json path, after its pytest process: (the files to save, in that
    order; the frameworks that wrote none). pytest-benchmark writes no file (before 5.0: an empty one)
    where every benchmark was skipped (the framework cannot run here; pytest said why)."""
    ran = [p for p in files.values() if p.is_file() and p.stat().st_size > 0]
    return ran, [fw for fw, p in files.items() if p not in ran]


def _step_benchmarks(session: nox.Session, env: Path, job: str, *args: str) -> None:
    """Each framework's step benchmarks in a pytest process of its own, writing --benchmark-json to a
    scratch folder; then `kernelmap save-job` saves them as ONE numbered run of the job in .benchmarks/
    (never overwritten). The scratch folder is removed once saved (kept, and named, when saving fails)."""
    scratch = Path(tempfile.mkdtemp(prefix="kernelmap-steps-"))
    files = {}
    for framework in STEP_BENCH_FRAMEWORKS:
        # One pytest process per framework: their CUDA runtimes must never share a process. A framework
        # with an environment of its own (KERNELMAP_PYTHON_<NAME>) is benchmarked by that interpreter.
        python = session.env.get(f"KERNELMAP_PYTHON_{framework.upper()}") or os.environ.get(
            f"KERNELMAP_PYTHON_{framework.upper()}")
        files[framework] = scratch / f"{framework}.json"
        session.run(python or str(env / "python"), "-m", *step_benchmark_argv(framework, files[framework], *args),
                    external=True)
    ran, none = job_parts(files)
    for framework in none:
        session.log(f"step benchmarks: {framework} ran none (each skipped; pytest said why above)")
    if not ran:
        session.log("step benchmarks: nothing to save")
        shutil.rmtree(scratch, ignore_errors=True)
        return
    session.log(f"step benchmarks: saving job {job} from {scratch}")
    session.run(str(env / "kernelmap"), "save-job", "--job", job, "--storage", BENCH_STORAGE, *map(str, ran),
                external=True)
    shutil.rmtree(scratch, ignore_errors=True)


@nox.session(python=False)
def compare(session: nox.Session) -> None:
    """Compare the last two bench jobs' step benchmarks, like with like.

    Per framework x mode x device x batch size, the latest two saved runs holding it (see
    kernelmap/history/compare.py); fails past a threshold. After the first bench job: says there is nothing
    earlier yet, and passes. Runs the kernelmap of .nox/frameworks (made by bench, tests or benchmarks,
    which save what it compares): no environment of its own."""
    kernelmap = FRAMEWORKS_ENV / "bin" / "kernelmap"
    if not kernelmap.exists():
        session.error(f"{kernelmap} not found: run `nox -s bench` first (it makes that environment and saves "
                      "the step benchmarks that compare reads)")
    session.run(str(kernelmap), "compare", *(session.posargs or ["--fail", "mean:5%"]), external=True)


REFERENCE_LOOP_OUT = "runs/reference-loop"


def reference_loop_job(posargs: list[str]) -> dict[str, str]:
    """The environment of benches/gpu_job.sh's job for ``nox -s reference_loop -- [DATA_DIR [OUT]]``: its
    reference and repeats phases in the foreground, with the Python of ``FRAMEWORKS_ENV`` (nox puts the
    session's own environment first on PATH)."""
    if len(posargs) > 2:
        raise ValueError(f"reference_loop takes [DATA_DIR [OUT]], not {' '.join(posargs)}")
    env = {"PHASES": "reference repeats", "VENV": str(FRAMEWORKS_ENV.absolute()),
           "OUT": posargs[1] if len(posargs) > 1 else REFERENCE_LOOP_OUT}
    if posargs and posargs[0] != "synthetic":
        env["DATA_DIR"] = posargs[0]
    return env


@nox.session(python=PYTHON)
def reference_loop(session: nox.Session) -> None:
    """GPU: the bare step loop beside the clean pass, three runs and their spread.

    benches/gpu_job.sh's reference and repeats phases, in the foreground:
    ``nox -s reference_loop -- [DATA_DIR [OUT]]`` (default synthetic data, runs/reference-loop)."""
    if _gpu_compute_capability() is None:
        session.skip("no NVIDIA GPU found (nvidia-smi)")
    try:
        env = reference_loop_job(list(session.posargs))
    except ValueError as e:
        session.error(str(e))
    _frameworks_env(session)
    session.run("bash", "benches/gpu_job.sh", "job", env=env, external=True)


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
    env = _frameworks_env(session)
    _own_env_pythons(session)
    session.run(str(env / "pytest"), "-m", "gpu", *session.posargs, external=True)
