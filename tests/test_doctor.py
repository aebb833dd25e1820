"""``kernelmap doctor``: a report (exit 0) as valid JSON; gpuinfo parsing; tool lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernelmap import doctor, frameworks, gpuinfo


def test_doctor_json_is_valid_and_exits_0():
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "doctor", "--json"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert list(report["frameworks"]) == list(frameworks.FRAMEWORKS)  # every registered framework, in order
    for facts in report["frameworks"].values():
        assert facts["installed"] in (True, False)
        if not facts["installed"]:
            assert facts["fix"] and facts["error"]
    assert set(report["profilers"]) == {"nsys", "ncu"}
    installed = {fw for fw, facts in report["frameworks"].items() if facts["installed"]}
    assert set(report["gpu_use"]) == installed
    for use in report["gpu_use"].values():
        assert use["usable"] is bool(use["usable"]) and (use["usable"] or use["why"])
    for item in report["missing"]:
        assert item["what"] and item["fix"]
    if not report["gpu"]["gpus"]:  # said once, as a fact about the machine, not as a fault
        assert [item["what"] for item in report["notes"]].count("NVIDIA GPU") == 1
        assert not any(item["what"] == "NVIDIA GPU" for item in report["missing"])


def test_parse_smi_csv():
    text = "0, NVIDIA H100 80GB HBM3, 9.0, 570.86.15, 81559\n1, NVIDIA A100-SXM4-40GB, 8.0, 570.86.15, [N/A]\n"
    gpus = gpuinfo.parse_smi_csv(text)
    assert [(g.index, g.name, g.compute_capability) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "9.0"), (1, "NVIDIA A100-SXM4-40GB", "8.0")]
    assert gpus[0].driver == "570.86.15" and gpus[0].memory_mib == 81559 and gpus[1].memory_mib is None


def test_mxnet_without_code_for_the_gpu_names_the_build_with_its_time(monkeypatch, tmp_path):
    """On sm_90 the MXNet wheels cannot run: the verdict's fix (doctor's `missing`, run's note) is the
    one command, with its measured time."""
    from kernelmap.frameworks.mxnet import built

    monkeypatch.setenv(built.ENV_HOME, str(tmp_path))  # no built tree
    probe = {"installed": True, "cuda_build": True, "num_gpus": 1, "version": "1.9.1"}
    v = frameworks.get("mxnet").gpu_verdict(probe, (9, 0), None)
    assert not v.usable and v.cpu_regardless and v.fix.startswith("kernelmap build-mxnet, about 16 min")
    assert "build-mxnet" in v.why
    assert frameworks.get("mxnet").gpu_verdict(probe, (8, 6), None).usable
    assert not frameworks.get("mxnet").gpu_verdict(probe, None, "nvidia-smi not on PATH").usable


def _fake_python(path, version):
    """An executable that answers any probe with one JSON line (a stand-in for an environment's python)."""
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\necho '{{\"version\": \"{version}\"}}'\n")
    path.chmod(0o755)
    return path


def test_doctor_finds_the_environments_nox_made(tmp_path, monkeypatch):
    """Right after `nox -s bench` JAX lives in .nox/jax-workers: the doctor finds it there (and says
    which interpreter, and what `kernelmap run` then needs) instead of calling it missing."""
    for name in frameworks.FRAMEWORKS:
        monkeypatch.delenv(frameworks.get(name).python_env_var, raising=False)
    own = _fake_python(tmp_path / ".nox" / "jax-workers" / "bin" / "python", "9.9")
    shared = _fake_python(tmp_path / ".nox" / "frameworks" / "bin" / "python", "1.1")
    monkeypatch.chdir(tmp_path)
    assert doctor.interpreters("jax", roots=[tmp_path]) == [str(own), sys.executable, str(shared)]
    assert doctor.interpreters("pytorch", roots=[tmp_path]) == [sys.executable, str(shared)]
    # a named interpreter is the only one tried
    assert doctor.interpreters("jax", {"jax": "/x/python"}, roots=[tmp_path]) == ["/x/python"]
    facts = doctor.probe_framework("jax", look_in_nox=True)
    assert facts["installed"] and facts["version"] == "9.9" and facts["python"] == str(own)
    # what `kernelmap run` uses (no --python): this interpreter only
    assert doctor.probe_framework("jax", python={"jax": str(shared)})["version"] == "1.1"


def test_doctor_python_option(tmp_path):
    fake = _fake_python(tmp_path / "env" / "bin" / "python", "7.7")
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "doctor", "--json", "--python", f"jax={fake}"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-2000:]
    jax = json.loads(proc.stdout)["frameworks"]["jax"]
    assert jax["version"] == "7.7" and jax["python"] == str(fake)
    bad = subprocess.run([sys.executable, "-m", "kernelmap.cli", "doctor", "--python", "nope=/x"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--python 'nope=/x'" in bad.stderr


def test_find_tool_on_path(tmp_path, monkeypatch):
    tool = tmp_path / "nsys"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert doctor.find_tool("nsys") == str(tool)


def test_noxfile_picks_the_mxnet_extra_by_the_same_verdict(monkeypatch):
    """nox runs outside the project's venv; its mxnet-gpu/mxnet choice loads cuda11.py by path."""
    import importlib.util
    from pathlib import Path

    import pytest

    pytest.importorskip("nox")
    from kernelmap.frameworks.mxnet import cuda11

    spec = importlib.util.spec_from_file_location("_noxfile", Path(__file__).resolve().parents[1] / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    for cc in [(9, 0), (8, 6), (8, 9), (7, 5), (6, 1), (5, 2), (12, 0), (3, 7)]:
        assert noxfile._mxnet_gpu_verdict(cc) == cuda11.gpu_verdict(cc)
        monkeypatch.setattr(noxfile, "_gpu_compute_capability", lambda cc=cc: cc)
        assert noxfile._mxnet_extra() == ("mxnet-gpu" if cuda11.gpu_verdict(cc)[0] else "mxnet")
    monkeypatch.setattr(noxfile, "_gpu_compute_capability", lambda: None)
    assert noxfile._mxnet_extra() == "mxnet"
    assert noxfile._mxnet_gpu_verdict((8, 9))[0] and not noxfile._mxnet_gpu_verdict((9, 0))[0]


def _doctor_text(monkeypatch, capsys, gpus: tuple[gpuinfo.Gpu, ...]) -> tuple[dict, str]:
    """The doctor's report and text on a machine with ``gpus``, neither nsys nor ncu installed and every
    framework installed (a probe without GPU facts)."""
    monkeypatch.setattr(doctor.gpuinfo, "query", lambda: gpuinfo.GpuReport(
        gpus, "nvidia-smi" if gpus else None, None if gpus else "nvidia-smi not on PATH", None))
    monkeypatch.setattr(doctor, "find_tool", lambda name: None)
    for name in doctor.frameworks.FRAMEWORKS:  # nox's test session names the workers' interpreters
        monkeypatch.delenv(doctor.frameworks.get(name).python_env_var, raising=False)
    monkeypatch.setattr(doctor, "probe_framework", lambda name, **kw: {"installed": True, "version": "1.0"})
    report = doctor.collect()
    doctor._print_text(report)
    return report, capsys.readouterr().out


def test_without_a_gpu_absent_gpu_profilers_are_not_missing(monkeypatch, capsys):
    """On a CPU machine `missing: nsys` read like a failure, though kernelmap runs nsys on GPU work only."""
    report, text = _doctor_text(monkeypatch, capsys, ())
    assert report["missing"] == [] and "missing:" not in text, text
    assert {n["what"] for n in report["notes"]} == {"nsys", "ncu", "NVIDIA GPU"}
    gpu = gpuinfo.Gpu(0, "NVIDIA H100", "9.0", "570.86.15", 81559, "nvidia-smi")
    report, text = _doctor_text(monkeypatch, capsys, (gpu,))  # with a GPU they are: each with its fix
    assert {"nsys", "ncu"} <= {m["what"] for m in report["missing"]} and "missing:" in text


def test_a_framework_found_in_this_interpreter_while_another_is_named(monkeypatch, capsys):
    """$KERNELMAP_PYTHON_<NAME> names another interpreter, and the probe found the framework in this one
    (its facts name no interpreter): a note that says where it was found (this once raised KeyError)."""
    name = doctor.frameworks.FRAMEWORKS[0]
    _doctor_text(monkeypatch, capsys, ())
    monkeypatch.setenv(doctor.frameworks.get(name).python_env_var, "/elsewhere/bin/python")
    report = doctor.collect()
    notes = [n["note"] for n in report["notes"] if n["what"] == name]
    assert notes == [f"found in {sys.executable}: `kernelmap run` outside nox needs --python {name}={sys.executable}"]


def test_a_named_interpreter_that_does_not_exist_is_reported_not_raised(monkeypatch):
    """$KERNELMAP_PYTHON_<NAME> naming a missing file made `kernelmap doctor` die with a traceback."""
    name = frameworks.FRAMEWORKS[0]
    monkeypatch.setenv(frameworks.get(name).python_env_var, "/no/such/python")
    facts = doctor.probe_framework(name, look_in_nox=True)
    assert facts["installed"] is False
    assert facts["error"].startswith("/no/such/python: cannot run it (No such file or directory")
    assert frameworks.get(name).python_env_var in facts["fix"]
