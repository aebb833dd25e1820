"""Data-parallel training on N devices (issue 39), on the CPU at N = 2 through the code path the GPU takes:
PyTorch DDP over gloo (two processes launched by the worker), MXNet's KVStore local over two CPU contexts,
JAX's jitted step over two XLA host devices. Parity: each framework on 2 devices against 1 at the same global batch
passes kernelmap/devparity.py's rule (the forward and the first 3 updates held to parity's fp32 bounds), and each
fault planted in the 2-device workers (tests/devparity_plants.py: an N x or 1/N step, the other ranks' gradients
dropped from the reduction, a rank's slice never read, a rank's data a step late) fails it. Real subprocesses; JAX from its own interpreter
(KERNELMAP_PYTHON_JAX, else .nox/jax-workers/bin/python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_framework
from kernelmap.frameworks import REGISTRY, dataparallel, spec
from kernelmap.frameworks.case import Case

from kernelmap import devparity, options, parity
from kernelmap.errors import KernelmapError
from kernelmap.run.case import spread_cases
from kernelmap.run.devices import Decision

ROOT = Path(__file__).resolve().parents[1]
STEPS, BS = 3, 32  # the held figures: the forward and the first 3 updates


def _jax_python() -> str:
    python = os.environ.get("KERNELMAP_PYTHON_JAX") or str(ROOT / ".nox" / "jax-workers" / "bin" / "python")
    if not Path(python).exists():
        python = sys.executable
    probe = subprocess.run([python, "-c", "import jax, flax, optax, kernelmap.frameworks.jax.workload"],
                           capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if probe.returncode != 0:
        pytest.skip(f"jax is not importable by {python}: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    return python


# --- the slicing rule and the refusals -------------------------------------------------------------------
def test_each_rank_takes_its_contiguous_slice_of_every_global_batch():
    order = np.arange(16)  # two global batches of 8
    got = [dataparallel.rank_slice(order, 8, r, 2) for r in range(2)]
    assert [g[1] for g in got] == [4, 4]
    assert got[0][0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert got[1][0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    # together the ranks train on exactly the global batches, each sample once
    assert sorted(np.concatenate([g[0] for g in got]).tolist()) == order.tolist()
    with pytest.raises(KernelmapError, match="multiple of 3"):
        dataparallel.rank_slice(order, 8, 0, 3)


def test_devices_option_is_checked_before_any_work():
    options.check_devices([64, 1024], [1, 2, 4])
    with pytest.raises(KernelmapError, match="--batch-size 30 is not a multiple of 4"):
        options.check_devices([64, 30], [1, 4])
    with pytest.raises(KernelmapError, match="2 given twice"):
        options.check_devices([64], [2, 2])
    with pytest.raises(KernelmapError, match="must be at least 1"):
        options.check_devices([64], [0])


def test_cases_per_devices_value_and_the_modes_that_cannot_spread():
    class Gpus:
        gpus = [object(), object()]

    decisions = {"pytorch": Decision("pytorch", "gpu", "gpu", None)}
    cases, skips = spread_cases(["pytorch"], {"pytorch": ["eager", "cuda-graph"]}, decisions, "fp32", [1, 2, 4], Gpus)
    assert cases == [Case("pytorch", "eager", "fp32", 1), Case("pytorch", "eager", "fp32", 2),
                     Case("pytorch", "cuda-graph", "fp32", 1)]
    assert Case("pytorch", "eager", "fp32", 2).name == "pytorch-x2"
    assert "this machine has 2 GPU(s)" in skips[Case("pytorch", "eager", "fp32", 4)]
    assert "CUDA graphs" in skips[Case("pytorch", "cuda-graph", "fp32", 2)]
    # every registered framework has a data-parallel path, and names its communication
    assert all(d.data_parallel is not None and d.data_parallel.cpu for d in REGISTRY.values())


def _run(losses, logits, weights, early):
    """A parity worker's arrays: ``early`` the weights after each of the first steps (path: their distances)."""
    out = {"losses": np.asarray(losses), "logits": logits, **{f"weight/{k}": v for k, v in weights.items()}}
    for k, v in weights.items():
        steps = np.stack([e[k] for e in early])
        out[f"early/{k}"] = steps
        out[f"early_path/{k}"] = np.cumsum([np.linalg.norm(steps[0].astype(np.float64) - v)]
                                           + [np.linalg.norm(steps[i] - steps[i - 1]) for i in range(1, len(steps))])
        out[f"path/{k}"] = np.float64(out[f"early_path/{k}"][-1])
    return out


def test_devices_parity_rule_is_parity_fp32_rule():
    """Held: the forward and the first 3 updates, to the fp32 rule's derived bounds; the 20-step figures reported."""
    assert devparity.TOLERANCES == parity.tolerances(("fp32", "fp32"))
    assert devparity.TOLERANCES["forward_logits_max_rel_diff"] == pytest.approx(1.0405e-5, rel=1e-3)
    assert devparity.TOLERANCES["weights_early_worst"] == pytest.approx(2.909e-3, rel=1e-3)
    assert set(devparity.REPORTED) == {"loss_max_rel_diff", "weights_worst", "weights_worst_per_path"}


def test_parity_figures_fail_past_the_tolerance():
    w0 = spec.init_weights(0)
    rng = np.random.default_rng(0)
    early = [{k: (v + np.float32(0.01 * (i + 1)) * rng.standard_normal(v.shape).astype(np.float32))
              for k, v in w0.items()} for i in range(3)]
    logits = rng.standard_normal((32, 10)).astype(np.float32)
    a = _run([2.3, 2.2, 2.1], logits, w0, early)
    same = devparity.figures(a, dict(a))
    assert same["passed"] and same["weights_early_worst"] == 0 and same["forward_logits_max_rel_diff"] == 0
    tol = devparity.TOLERANCES
    # the weights after 20 steps 1e-3 apart: reported, not held
    last = dict(a, **{"weight/fc2.bias": w0["fc2.bias"] + np.float32(1e-3) * np.abs(w0["fc2.bias"]).max()})
    moved = devparity.figures(a, last)
    assert moved["passed"] and moved["weights_worst"] > 100 * 1e-5
    # the second update of fc2.bias moved by 2x the bound of its path: held, fails
    bump = a["early/fc2.bias"].copy()
    step = 2 * tol["weights_early_worst"] * a["early_path/fc2.bias"][1] / np.sqrt(bump.shape[1])
    bump[1] += np.float32(step)
    bad = devparity.figures(a, dict(a, **{"early/fc2.bias": bump}))
    assert [f.split(" = ")[0] for f in bad["failures"]] == ["weights_early_worst"]
    assert bad["weights_early_worst"] == pytest.approx(2 * tol["weights_early_worst"], rel=1e-2)
    # the logits 3e-5 of their max apart: the forward fails
    shifted = logits.copy()
    shifted[3, 4] += np.float32(3e-5) * np.abs(logits).max()
    fwd = devparity.figures(a, dict(a, logits=shifted))
    assert [f.split(" = ")[0] for f in fwd["failures"]] == ["forward_logits_max_rel_diff"]
    with pytest.raises(KernelmapError, match="first batches differ"):
        devparity.figures(a, dict(a, logits=logits[:16]))


# --- parity at N = 2 on the CPU, per framework, and a fault planted in each -----------------------------
def _parity_and_plants(framework: str, tmp_path, monkeypatch, python: dict[str, str] | None = None) -> dict:
    """The figures of ``framework`` on 2 devices against 1 (synthetic data, bs 32, the first ``STEPS`` steps):
    the real run's and each planted fault's (tests/devparity_plants.py: in the 2-device workers only)."""
    import devparity_plants

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    params = {"batch_size": BS, "lr": 0.01, "momentum": 0.9, "steps": STEPS, "seed": 0, "data": "synthetic",
              "data_dir": None, "device": "cpu", "math": "fp32", "modes": {}}
    exe = devparity.interpreters((framework,), python)[framework]
    weights = tmp_path / "initial_weights.npz"
    spec.save_weights(weights, spec.init_weights(0))
    a = devparity.run_one(framework, 1, params, weights, tmp_path / "x1.npz", exe, 600)
    out = {"real": devparity.figures(a, devparity.run_one(framework, 2, params, weights, tmp_path / "x2.npz", exe, 600))}
    out["real"]["losses"] = a["losses"]
    monkeypatch.setattr(devparity, "WORKER_MODULE", "devparity_plants")
    for plant in devparity_plants.PLANTS:
        monkeypatch.setenv(devparity_plants.PLANT_ENV, plant)
        out[plant] = devparity.figures(a, devparity.run_one(framework, 2, params, weights, tmp_path / f"{plant}.npz",
                                                            exe, 600))
    return out


FORWARD = ["forward_logits_max_rel_diff", "loss_first_diff_over_logits"]


def _check_parity_and_plants(runs: dict) -> None:
    tol = devparity.TOLERANCES
    real = runs["real"]
    assert real["passed"], real["failures"]
    assert len(real["weights_early_per_step"]) == 3 and list(real["weights_max_rel_diff"]) == spec.weight_names()
    losses = real["losses"]
    assert losses.shape == (STEPS,) and abs(losses[-1] - losses[0]) > 1e-3  # it trained
    # an N x (or 1/N) step, or the other ranks' gradients dropped: the same forward, the first updates far past
    for plant in ("scaled", "dropped"):
        assert [f.split(" = ")[0] for f in runs[plant]["failures"]] == ["weights_early_worst"], runs[plant]["failures"]
        assert runs[plant]["weights_early_worst"] > 100 * tol["weights_early_worst"]
    # a rank's slice never read, or read a step late: other images, so the forward fails too
    for plant in ("unread", "late"):
        r = runs[plant]
        assert [f.split(" = ")[0] for f in r["failures"]] == [*FORWARD, "weights_early_worst"], (plant, r["failures"])
        assert r["forward_logits_max_rel_diff"] > 1e3 * tol["forward_logits_max_rel_diff"]
        assert r["weights_early_worst"] > 100 * tol["weights_early_worst"]


@pytest.mark.slow
def test_pytorch_ddp_gloo_two_ranks_equals_one_device(tmp_path, monkeypatch):
    require_framework("pytorch")
    _check_parity_and_plants(_parity_and_plants("pytorch", tmp_path, monkeypatch))


@pytest.mark.slow
@pytest.mark.mxnet
def test_mxnet_kvstore_local_two_contexts_equals_one_device(tmp_path, monkeypatch):
    _check_parity_and_plants(_parity_and_plants("mxnet", tmp_path, monkeypatch))


@pytest.mark.slow
def test_jax_two_host_devices_equals_one_device(tmp_path, monkeypatch):
    python = _jax_python()
    _check_parity_and_plants(_parity_and_plants("jax", tmp_path, monkeypatch, {"jax": python}))


@pytest.mark.slow
def test_jax_step_on_two_host_devices_all_reduces_its_gradients():
    """Not one device in disguise: the batch is sharded over two devices and the compiled step all-reduces."""
    python = _jax_python()
    code = """
import json
from kernelmap.frameworks import spec
from kernelmap.frameworks.jax.workload import Workload
w = Workload(spec.TrainConfig(batch_size=8, data="synthetic", devices=2))
for x, y in w.batches("train", 8, spec.training_batches(w.data_info.n_train, 0, 8, 1).ravel()):
    w.train_step(x, y)
hlo = next(iter(w.compiled_hlo().values()))
print(json.dumps({"batch": len(x.sharding.device_set), "params": len(w.params["fc1"]["kernel"].sharding.device_set),
                  "all_reduce": hlo.count(" all-reduce(")}))
"""
    env = dataparallel.merged_env(dict(os.environ, JAX_PLATFORMS="cpu"), REGISTRY["jax"].data_parallel.env(2, "cpu"))
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["batch"] == 2 and got["params"] == 2 and got["all_reduce"] >= 1


# --- kernelmap run --devices 1 2 -----------------------------------------------------------------------
@pytest.mark.slow
def test_run_devices_one_and_two_every_framework(tmp_path):
    require_framework("pytorch")
    python = _jax_python()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "kernelmap.cli", "run", "--device", "cpu", "--devices", "1", "2", "--steps", "2",
            "--warmup", "1", "--trials", "1", "--max-repeats", "0", "--data", "synthetic", "--batch-size", "16",
            "--python", f"jax={python}", "--out", str(out), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    got = sorted((e["framework"], e["devices"], e["dir"]) for e in results)
    assert [(fw, n) for fw, n, _ in got] == [(fw, n) for fw in sorted(REGISTRY) for n in (1, 2)]
    dirs = {(fw, n): d for fw, n, d in got}
    assert dirs[("pytorch", 2)] == "pytorch-x2/bs16" and dirs[("mxnet", 2)] == "mxnet-x2/bs16"
    for (_fw, n), d in dirs.items():
        clean = json.loads((out / d / "clean-1.json").read_text())
        assert clean["devices"] == n and clean["rank"] == 0 and clean["batch_size"] == 16
    # PyTorch's second rank ran the same steps and wrote its own result beside rank 0's
    rank1 = json.loads((out / "pytorch-x2/bs16/rank1/clean-1.json").read_text())
    assert rank1["rank"] == 1 and rank1["steps"] == 2 and rank1["test_accuracy"] is None
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(c["devices"] for c in manifest["config"]["cases"]) == [1, 1, 1, 2, 2, 2]
    # each multi-device case against its framework on one device, in the run (kernelmap/devparity.py)
    assert manifest["parity_devices"] == {"pytorch-x2": True, "mxnet-x2": True, "jax-x2": True}
    par = json.loads((out / "parity-devices-pytorch-x2.json").read_text())
    assert par["devices"] == [1, 2] and par["steps"] == 2 and par["passed"] and par["tolerances"] == devparity.TOLERANCES
    assert par["weights_early_worst"] <= devparity.TOLERANCES["weights_early_worst"]


def test_each_rank_writes_its_own_library_logs(tmp_path):
    case = tmp_path / "run" / "pytorch-x2" / "bs16"
    env = {"MKL_VERBOSE_OUTPUT_FILE": str(case / "blas.log"), "CUDNN_LOGDEST_DBG": str(case / "cudnn.log"),
           "OTHER": "/elsewhere/x.log", "ONEDNN_VERBOSE": "1"}
    assert dataparallel.rank_paths(env, case, 0) == {}
    assert dataparallel.rank_paths(env, case, 1) == {"MKL_VERBOSE_OUTPUT_FILE": str(case.resolve() / "rank1" / "blas.log"),
                                                     "CUDNN_LOGDEST_DBG": str(case.resolve() / "rank1" / "cudnn.log")}


@pytest.mark.slow
def test_libs_pass_on_two_ranks_keeps_rank_zeros_logs(tmp_path):
    """The CPU libs pass of PyTorch on 2 ranks: each rank's MKL log in its own folder; normalise reads rank 0's
    library logs and every rank's trace, and says why it left rank 1's log out."""
    require_framework("pytorch")
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "cpu", "--devices", "2",
            "--steps", "2", "--warmup", "1", "--trials", "1", "--max-repeats", "0", "--data", "synthetic",
            "--batch-size", "16", "--profile", "libs", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-4000:]
    case = out / "pytorch-x2" / "bs16"
    assert (case / "blas.log").is_file() and (case / "rank1" / "blas.log").is_file()
    att = json.loads((out / "attribution.json").read_text())
    left = {x["file"]: x["reason"] for x in att["not_records"]}
    assert "rank 0's" in left["pytorch-x2/bs16/rank1/blas.log"]


def test_nccl_without_nvlink_multicast_on_several_gpus():
    assert dataparallel.device_env({}, 2, "gpu") == {"NCCL_NVLS_ENABLE": "0"}
    assert dataparallel.device_env({"NCCL_NVLS_ENABLE": "1"}, 4, "gpu") == {}  # the user's own setting kept
    assert dataparallel.device_env({}, 1, "gpu") == {} and dataparallel.device_env({}, 2, "cpu") == {}
