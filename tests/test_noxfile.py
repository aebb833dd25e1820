"""noxfile.merge_options: arguments after `--` override only the options they name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("nox")

from conftest import noxfile_module  # noqa: E402


def _noxfile():
    return noxfile_module()


def test_posargs_override_only_what_they_name():
    nf = _noxfile()
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--data", "synthetic"]) == [
        "--steps", "100", "--profile", "all", "--batch-size", "64", "256", "--data", "synthetic"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--steps", "20"]) == [
        "--steps", "20", "--profile", "all", "--batch-size", "64", "256"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--batch-size", "32", "--hybridize"]) == [
        "--steps", "100", "--profile", "all", "--batch-size", "32", "--hybridize"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--steps=7"]) == [
        "--steps", "7", "--profile", "all", "--batch-size", "64", "256"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, []) == list(nf.BENCH_DEFAULTS)
    with pytest.raises(ValueError, match="expected an option"):
        nf.merge_options(nf.BENCH_DEFAULTS, ["20"])


def test_run_batch_sizes_are_the_values_of_batch_size():
    nf = _noxfile()
    assert nf.run_batch_sizes(list(nf.BENCH_DEFAULTS)) == ["64", "256"]
    assert nf.run_batch_sizes(["--batch-size", "32", "--hybridize", "--steps", "5"]) == ["32"]
    assert nf.run_batch_sizes(["--batch-size=128", "--steps", "5"]) == ["128"]
    assert nf.run_batch_sizes(["--steps", "5"]) == []


def test_missing_python_names_the_command_that_fixes_it():
    nf = _noxfile()
    none = lambda name: None  # noqa: E731
    msg = nf.python_missing(which=none, find_spec=none)
    assert msg and f"Python {nf.PYTHON}" in msg and nf.PYTHON_FIX in msg
    assert nf.python_missing(which=lambda n: "/usr/bin/x" if n == f"python{nf.PYTHON}" else None,
                             find_spec=none) is None
    assert nf.python_missing(which=none, find_spec=lambda n: object() if n == "uv" else None) is None
    assert nf.python_missing(which=lambda n: "/bin/uv" if n == "uv" else None, find_spec=none) is None


def test_cpu_builds_newest_first():
    nf = _noxfile()
    assert nf.newest_cpu_builds(["2.14.1", "2.13.0+cpu", "2.14.1+cpu", "2.12.0+cu121", "not-a-version"]) == [
        "2.14.1+cpu", "2.13.0+cpu"]
    assert nf.newest_cpu_builds(["2.14.1", "2.15.0"]) == []


def _machine(monkeypatch, nf, *, gpu=None, installed=None, reachable=False, versions=(), resolved=None):
    """Stand-ins for what torch_cpu_args asks the machine: GPU, installed versions, index, pip."""
    calls = []
    monkeypatch.setattr(nf, "_gpu_compute_capability", lambda: gpu)
    monkeypatch.setattr(nf, "_installed", lambda python, *names: dict(installed or {}))
    monkeypatch.setattr(nf, "_reachable", lambda url, timeout=5.0: reachable)
    monkeypatch.setattr(nf, "_torch_versions", lambda python, index: list(versions))

    def pip_json(python, *args):
        calls.append(args)
        torch = next(a for a in args if a.startswith("torch=="))
        vision = (resolved or {}).get(torch.removeprefix("torch=="))
        return {"install": [{"metadata": {"name": "torch", "version": torch.removeprefix("torch==")}}]
                + ([{"metadata": {"name": "torchvision", "version": vision}}] if vision else [])}

    monkeypatch.setattr(nf, "_pip_json", pip_json)
    return calls


def test_torch_cpu_build_only_without_a_gpu_and_only_as_a_pair(monkeypatch):
    nf = _noxfile()
    _machine(monkeypatch, nf, gpu=(9, 0), versions=["2.14.1+cpu"], resolved={"2.14.1+cpu": "0.29.1+cpu"})
    args, why = nf.torch_cpu_args("py")
    assert args == [] and "GPU is present" in why
    # Online: PyTorch's CPU index is added and both packages pinned to CPU builds.
    calls = _machine(monkeypatch, nf, reachable=True, versions=["2.15.0+cpu", "2.14.1+cpu", "2.14.1"],
                     resolved={"2.14.1+cpu": "0.29.1+cpu"})
    args, why = nf.torch_cpu_args("py")
    assert args == ["--extra-index-url", nf.TORCH_CPU_INDEX, "torch==2.14.1+cpu", "torchvision==0.29.1+cpu"]
    assert "CPU build" in why and len(calls) == 1  # 2.15.0+cpu is outside pyproject's range
    # Offline with a CPU torch but only PyPI's (CUDA-linked) torchvision: the default build, said so.
    _machine(monkeypatch, nf, versions=["2.14.1", "2.13.0+cpu"], resolved={"2.13.0+cpu": "0.28.0"})
    args, why = nf.torch_cpu_args("py")
    assert args == [] and "not reachable" in why and "default (CUDA) build" in why
    # The newest CPU torch without a CPU torchvision here, an older one with: the older pair.
    _machine(monkeypatch, nf, versions=["2.14.1+cpu", "2.13.0+cpu"],
             resolved={"2.14.1+cpu": "0.29.1", "2.13.0+cpu": "0.28.0+cpu"})
    assert nf.torch_cpu_args("py")[0] == ["torch==2.13.0+cpu", "torchvision==0.28.0+cpu"]
    # A reused environment that already holds the CPU pair asks nothing more.
    calls = _machine(monkeypatch, nf, installed={"torch": "2.14.1+cpu", "torchvision": "0.29.1+cpu"})
    assert nf.torch_cpu_args("py")[0] == [] and calls == []


def test_gpu_machine_replaces_a_cpu_torch_already_installed(monkeypatch):
    """.nox/frameworks made without a GPU (or copied) holds torch +cpu; on a GPU machine pip would count
    `torch>=2.11` as met and PyTorch would run on the CPU: the CPU builds are excluded by version."""
    from packaging.requirements import Requirement

    nf = _noxfile()
    calls = _machine(monkeypatch, nf, gpu=(9, 0), installed={"torch": "2.14.1+cpu", "torchvision": "0.29.1+cpu"})
    args, why = nf.torch_cpu_args("py")
    assert args == ["torch==2.14.1,!=2.14.1+cpu", "torchvision==0.29.1,!=0.29.1+cpu"] and calls == []
    assert "GPU is present" in why and "torch 2.14.1+cpu" in why and "CUDA" in why
    for arg, cpu, cuda in zip(args, ("2.14.1+cpu", "0.29.1+cpu"), ("2.14.1", "0.29.1"), strict=True):
        spec = Requirement(arg).specifier  # as pip reads it (PEP 440: == ignores local labels, != does not)
        assert not spec.contains(cpu) and spec.contains(cuda) and spec.contains(cuda + "+cu128")
    # Only the package that is a CPU build is asked for again; a CUDA pair is left as it is.
    _machine(monkeypatch, nf, gpu=(9, 0), installed={"torch": "2.14.1+cpu", "torchvision": "0.29.1"})
    assert nf.torch_cpu_args("py")[0] == ["torch==2.14.1,!=2.14.1+cpu"]
    _machine(monkeypatch, nf, gpu=(9, 0), installed={"torch": "2.14.1", "torchvision": "0.29.1"})
    assert nf.torch_cpu_args("py") == ([], "an NVIDIA GPU is present: the default (CUDA) build of torch")


def test_nox_waits_for_kernelmap_run_to_stop_its_workers():
    """nox's own 0.3 s + 0.2 s before SIGKILL left a worker running and the .partial directory."""
    import inspect

    from kernelmap.run import processes as run_processes

    nf = _noxfile()
    grace = inspect.signature(run_processes.stop_group).parameters["grace_s"].default
    assert min(nf.STOP_TIMEOUTS.values()) > grace
    assert "**STOP_TIMEOUTS" in inspect.getsource(nf.bench)


def test_readme_says_where_nox_installs_kernelmap():
    """`kernelmap` is not on PATH after the quick start: the README names the environment the noxfile
    installs it into, and each framework environment of its own that `kernelmap run` then needs."""
    nf = _noxfile()
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())  # lines joined
    env_bin = (nf.FRAMEWORKS_ENV / "bin").as_posix()
    assert f"`{env_bin}/kernelmap`" in readme and f"`. {env_bin}/activate`" in readme
    own = sorted(p.parent.name for p in nf.FRAMEWORKS_DIR.glob("*/own-env.txt"))
    assert own  # JAX's clashes with MXNet's numpy pin
    for name in own:
        assert f"`--python {name}={(nf.own_env(name) / 'bin' / 'python').as_posix()}`" in readme, name


# --- one bench job, one saved run ---------------------------------------------------------------
def test_job_variable_and_storage_are_kernelmaps():
    from kernelmap.history import keys, storage

    nf = _noxfile()
    assert nf.JOB_ENV == keys.JOB_ENV and Path(nf.BENCH_STORAGE) == storage.default_storage()


def test_job_parts_leave_out_a_framework_that_wrote_nothing(tmp_path):
    nf = _noxfile()
    (tmp_path / "jax.json").write_text('{"benchmarks": []}')
    (tmp_path / "pytorch.json").write_text("")  # pytest-benchmark < 5 opened the file before running anything
    files = {fw: tmp_path / f"{fw}.json" for fw in ("jax", "mxnet", "pytorch")}
    assert nf.job_parts(files) == ([tmp_path / "jax.json"], ["mxnet", "pytorch"])


class FakeSession:
    """What the bench and benchmarks sessions ask of nox: each command is recorded with the
    environment it would get; a framework's pytest writes that framework's part of a real recorded
    job (tests/data/bench_jobs/job1), except the frameworks in ``silent`` (every benchmark skipped);
    `kernelmap save-job` and `kernelmap compare` run in-process."""

    def __init__(self, posargs=(), silent=()):
        self.posargs = list(posargs)
        self.env: dict[str, str] = {}
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.logs: list[str] = []
        self.silent = set(silent)

    def log(self, msg):
        self.logs.append(msg)

    def run(self, *args, external=False, **kwargs):
        import gzip

        from kernelmap.cli import main as cli_main

        argv = [str(a) for a in args]
        self.calls.append((argv, dict(self.env)))
        if "bench_train_step.py" in " ".join(argv):
            fw = next(a.split("=", 1)[1] for a in argv if a.startswith("--framework="))
            out = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("--benchmark-json=")))
            if fw not in self.silent:
                src = Path(__file__).resolve().parent / "data" / "bench_jobs" / "job1" / f"{fw}.json.gz"
                out.write_bytes(gzip.decompress(src.read_bytes()))
        elif argv[0].endswith("kernelmap") and argv[1] in ("save-job", "compare"):
            assert cli_main(argv[1:]) == 0


def _bench_session(monkeypatch, tmp_path, session):
    nf = _noxfile()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNELMAP_JOB", raising=False)
    monkeypatch.setattr(nf, "_frameworks_env", lambda s: Path("/env/bin"))
    monkeypatch.setattr(nf, "_own_env_pythons", lambda s: None)
    scratch = []
    real = nf.tempfile.mkdtemp

    def mkdtemp(**kw):
        scratch.append(Path(real(dir=tmp_path, **kw)))
        return str(scratch[-1])

    monkeypatch.setattr(nf.tempfile, "mkdtemp", mkdtemp)
    return nf, scratch


def test_bench_saves_one_run_per_job_named_as_its_run_directory(monkeypatch, tmp_path):
    from kernelmap.history.storage import list_runs

    session = FakeSession(silent={"mxnet"})
    nf, scratch = _bench_session(monkeypatch, tmp_path, session)
    nf.bench(session)
    (run_cmd, run_env), = [(a, e) for a, e in session.calls if a[:2] == ["/env/bin/kernelmap", "run"]]
    job = Path(run_cmd[run_cmd.index("--out") + 1]).name
    assert run_env["KERNELMAP_JOB"] == job  # the runner writes manifest["job"] from it
    steps = [(a, e) for a, e in session.calls if "benches/bench_train_step.py" in a]
    assert [next(x for x in a if x.startswith("--framework=")) for a, _ in steps] == [
        f"--framework={fw}" for fw in nf.STEP_BENCH_FRAMEWORKS]
    assert all(e["KERNELMAP_JOB"] == job for _, e in steps)
    # the run's batch sizes (BENCH_DEFAULTS: 64 256), not the step benchmark's own default of three
    assert all([x for x in a if x.startswith("--bench-batch-size")] == ["--bench-batch-size=64",
                                                                        "--bench-batch-size=256"] for a, _ in steps)
    assert all("--bench-data=auto" in a for a, _ in steps)  # the run's data (its default), not synthetic
    (save,) = [a for a, _ in session.calls if a[1:2] == ["save-job"]]
    assert save[2:6] == ["--job", job, "--storage", nf.BENCH_STORAGE]
    assert [Path(p).name for p in save[6:]] == [f"{fw}.json" for fw in nf.STEP_BENCH_FRAMEWORKS if fw != "mxnet"]
    assert "step benchmarks: mxnet ran none (each skipped; pytest said why above)" in session.logs
    (saved,) = list_runs(tmp_path / nf.BENCH_STORAGE)
    assert saved.number == "0001" and saved.job == job
    assert [b["extra_info"]["framework"] for b in saved.data["benchmarks"]] == [
        fw for fw in nf.STEP_BENCH_FRAMEWORKS if fw != "mxnet"]
    assert len(scratch) == 1 and not scratch[0].exists()  # removed once saved
    # the report reads the same storage
    (report,) = [a for a, _ in session.calls if a[1:2] == ["report"]]
    assert report[-2:] == ["--storage", nf.BENCH_STORAGE]


def test_benchmarks_session_is_one_job_too(monkeypatch, tmp_path):
    from kernelmap.history.storage import list_runs

    session = FakeSession(posargs=["--benchmark-max-time=0.1"])
    nf, scratch = _bench_session(monkeypatch, tmp_path, session)
    monkeypatch.setenv("KERNELMAP_JOB", "ci-1234")
    nf.benchmarks(session)
    steps = [(a, e) for a, e in session.calls if "benches/bench_train_step.py" in a]
    assert len(steps) == len(nf.STEP_BENCH_FRAMEWORKS) and all(a[-1] == "--benchmark-max-time=0.1" for a, _ in steps)
    (saved,) = list_runs(tmp_path / nf.BENCH_STORAGE)
    assert saved.job == "ci-1234" and len(saved.data["benchmarks"]) == 4
    assert not scratch[0].exists()


class InstallSession:
    """nox's two ways with an environment's commands: ``session.run`` runs nothing under ``--install-only`` (nox
    returns None there, True where it ran), ``session.run_install`` runs in that mode too. A ``python -m venv DIR``
    that runs makes ``DIR/bin/python`` (an empty file: nothing here runs it); every command is recorded with the
    method that ran it."""

    def __init__(self, install_only: bool):
        self.install_only = install_only
        self.posargs: list[str] = []
        self.env: dict[str, str] = {}
        self.ran: list[tuple[str, list[str]]] = []
        self.logs: list[str] = []

    def log(self, msg):
        self.logs.append(msg)

    def _ran(self, how: str, args) -> bool:
        argv = [str(a) for a in args]
        self.ran.append((how, argv))
        if argv[1:3] == ["-m", "venv"]:
            python = Path(argv[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()
        return True

    def run(self, *args, **kwargs):
        return None if self.install_only else self._ran("run", args)

    def run_install(self, *args, **kwargs):
        return self._ran("run_install", args)


@pytest.mark.parametrize("install_only", [True, False])
def test_install_only_makes_and_fills_every_environment_of_the_tests_session(monkeypatch, tmp_path, install_only):
    """A fresh clone's ``nox -s tests --install-only`` ran the frameworks environment's python before anything made
    it (its ``python -m venv`` a ``session.run``, which that flag skips: FileNotFoundError). Now every command that
    makes or fills an environment runs there as ``run_install``; without the flag each is the ``session.run`` it
    was, and pytest runs only then."""
    nf = _noxfile()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nf, "_gpu_compute_capability", lambda: None)
    own = sorted(p.parent.name for p in nf.FRAMEWORKS_DIR.glob("*/own-env.txt"))
    assert own == ["jax"]
    for name in own:
        monkeypatch.delenv(f"KERNELMAP_PYTHON_{name.upper()}", raising=False)
    seen = []

    def torch_args(python):  # the first thing that runs the environment's python
        seen.append(Path(python).is_file())
        return [], "stand-in"

    monkeypatch.setattr(nf, "torch_cpu_args", torch_args)
    session = InstallSession(install_only)
    nf.tests(session)
    assert seen == [True]
    fw_py, jax_py = str(nf.FRAMEWORKS_ENV / "bin" / "python"), str(nf.own_env("jax") / "bin" / "python")
    made = "run_install" if install_only else "run"
    upgrade = ["-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools>=77"]
    assert session.ran == [
        (made, ["python", "-m", "venv", str(nf.FRAMEWORKS_ENV)]), (made, [fw_py, *upgrade]),
        ("run_install", [fw_py, "-m", "pip", "install", "-q", "-e", ".[pytorch,mxnet,dev]"]),
        (made, [sys.executable, "-m", "venv", str(nf.own_env("jax"))]), (made, [jax_py, *upgrade]),
        (made, [jax_py, "-m", "pip", "install", "-q", "-e", ".", "-r", str(nf.FRAMEWORKS_DIR / "jax" / "own-env.txt")]),
        *([] if install_only else [("run", [str(nf.FRAMEWORKS_ENV.absolute() / "bin" / "pytest")])])]
    assert session.env["KERNELMAP_PYTHON_JAX"] == str(tmp_path / jax_py)
