"""noxfile.merge_options: arguments after `--` override only the options they name."""

from __future__ import annotations

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

    from kernelmap import runner

    nf = _noxfile()
    grace = inspect.signature(runner.stop_group).parameters["grace_s"].default
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
