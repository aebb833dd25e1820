"""Data-parallel training on N devices (issue 39), on the CPU at N = 2 through the code path the GPU takes:
PyTorch DDP over gloo (two processes launched by the worker), MXNet's KVStore local over two CPU contexts,
JAX's jitted step over two XLA host devices. Parity: each framework's weights after k steps on 2 devices equal
its weights on 1 device at the same global batch (kernelmap/devparity.py's tolerance), and a run that differs
(half the global batch on one device) fails it. Real subprocesses; JAX from its own interpreter
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

from kernelmap import devparity, options
from kernelmap.errors import KernelmapError
from kernelmap.run.case import spread_cases
from kernelmap.run.devices import Decision

ROOT = Path(__file__).resolve().parents[1]
STEPS, BS = 6, 32


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


def test_parity_figures_fail_past_the_tolerance():
    w = spec.init_weights(0)
    a = {"losses": np.array([2.3, 2.2]), **{f"weight/{k}": v for k, v in w.items()}}
    same = devparity.figures(a, dict(a))
    assert same["passed"] and same["weights_worst"] == 0
    moved = dict(a, **{"weight/fc2.bias": w["fc2.bias"] * np.float32(1 + 3e-5)})
    bad = devparity.figures(a, moved)
    assert not bad["passed"] and bad["failures"] == [f"weights_worst = {bad['weights_worst']:.3g} > 1e-05"]


# --- parity at N = 2 on the CPU, per framework ----------------------------------------------------------
def _check_parity(r: dict) -> None:
    assert r["devices"] == [1, 2] and r["device"] == "cpu"
    assert r["passed"], r["failures"]
    for key, tol in devparity.TOLERANCES.items():
        assert 0 <= r[key] <= tol, (key, r[key])
    losses = np.array(r["losses"]["2"])
    assert losses.shape == (STEPS,) and abs(losses[-1] - losses[0]) > 1e-3  # it trained
    assert list(r["weights_max_rel_diff"]) == spec.weight_names()


@pytest.mark.slow
def test_pytorch_ddp_gloo_two_ranks_equals_one_device(tmp_path):
    require_framework("pytorch")
    r = devparity.compute("pytorch", 2, steps=STEPS, batch_size=BS, workdir=str(tmp_path))
    _check_parity(r)
    # the check can fail: one device at half the global batch is another training
    half = devparity.compute("pytorch", 2, steps=STEPS, batch_size=BS, workdir=str(tmp_path),
                             reference_batch_size=BS // 2)
    assert not half["passed"] and half["weights_worst"] > 100 * devparity.TOLERANCES["weights_worst"]


@pytest.mark.slow
@pytest.mark.mxnet
def test_mxnet_kvstore_local_two_contexts_equals_one_device(tmp_path):
    r = devparity.compute("mxnet", 2, steps=STEPS, batch_size=BS, workdir=str(tmp_path))
    _check_parity(r)
    assert r["modes"] == {"1": "imperative", "2": "imperative"}


@pytest.mark.slow
def test_jax_two_host_devices_equals_one_device(tmp_path):
    python = _jax_python()
    r = devparity.compute("jax", 2, steps=STEPS, batch_size=BS, workdir=str(tmp_path), python={"jax": python})
    _check_parity(r)


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
    assert par["devices"] == [1, 2] and par["steps"] == 2 and par["weights_worst"] <= devparity.TOLERANCES["weights_worst"]


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
