"""The GPU math mode (``spec.Math``): one environment rule for every worker, each framework's own
switch, GPU parity with TF32 off; and how nsys NVTX ranges are told to be MXNet's operators."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kernelmap.frameworks import spec

from kernelmap import frameworks, parity
from kernelmap.adapters import nsys


@pytest.mark.parametrize("inherited", [None, "0", "1"])
def test_fp32_turns_tf32_off_in_every_library_and_tf32_drops_an_inherited_override(inherited):
    base = {"PATH": "/bin"} if inherited is None else {"PATH": "/bin", "NVIDIA_TF32_OVERRIDE": inherited}
    assert spec.Math.FP32.apply(base) == {"PATH": "/bin", "NVIDIA_TF32_OVERRIDE": "0"}
    assert spec.Math.TF32.apply(base) == {"PATH": "/bin"}  # a shell's "0" would run fp32 under a tf32 label
    # mixed precision: what stays fp32 is strict fp32 (the variable never touches a bf16/fp16 GEMM or conv)
    assert spec.Math.BF16.apply(base) == spec.Math.FP16.apply(base) == {"PATH": "/bin", "NVIDIA_TF32_OVERRIDE": "0"}
    assert spec.MATH_DEFAULT is spec.Math.FP32 and spec.TrainConfig().math == "fp32"


@pytest.mark.parametrize("framework", ["pytorch", "mxnet", "jax"])
def test_run_worker_environment_under_an_inherited_override(framework, monkeypatch):
    from kernelmap.run import devices as run_devices

    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    own = run_devices.worker_own_env(framework, "gpu")
    assert "NVIDIA_TF32_OVERRIDE" not in run_devices.worker_environ("gpu", "tf32", {"OMP_NUM_THREADS": "2"}, own)
    fp32 = run_devices.worker_environ("gpu", "fp32", {"OMP_NUM_THREADS": "2"}, own)
    assert fp32["NVIDIA_TF32_OVERRIDE"] == "0" and fp32["OMP_NUM_THREADS"] == "2"
    assert run_devices.worker_environ("cpu", "tf32")["NVIDIA_TF32_OVERRIDE"] == "0"  # the CPU: left as inherited


@pytest.mark.parametrize("framework", ["pytorch", "mxnet", "jax"])
def test_parity_worker_environment(framework):
    gpu = parity.worker_env(framework, "gpu")
    assert gpu["NVIDIA_TF32_OVERRIDE"] == "0" and "CUDA_VISIBLE_DEVICES" not in {
        k for k, v in gpu.items() if v == ""}
    cpu = parity.worker_env(framework, "cpu")
    # no GPU visible, and the framework's own CPU environment (its descriptor's cpu_env: JAX_PLATFORMS for JAX)
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""
    own = frameworks.get(framework).cpu_env
    assert {k: cpu[k] for k in own} == dict(own)
    assert (own.get("JAX_PLATFORMS") == "cpu") == (framework == "jax")


def test_run_and_parity_take_the_math_option():
    from kernelmap.cli import build_parser

    p = build_parser(["run"])
    assert p.parse_args(["run"]).math == ["fp32"]
    assert p.parse_args(["run", "--math", "tf32"]).math == ["tf32"]
    assert p.parse_args(["run", "--math", "fp32", "tf32", "bf16", "fp16"]).math == ["fp32", "tf32", "bf16", "fp16"]
    with pytest.raises(SystemExit):
        p.parse_args(["run", "--math", "fp8"])
    assert build_parser(["parity"]).parse_args(["parity", "--device", "gpu"]).device == "gpu"


def test_nvtx_texts_say_whose_ranges_they_are():
    assert nsys.nvtx_framework(["aten::conv2d, seq = 3, op_id = 7", "kernelmap:step#5"]) == "pytorch"
    assert nsys.nvtx_framework(["kernelmap:step#5", "Convolution", "_backward_FullyConnected"]) == "mxnet"
    assert nsys.nvtx_framework(["kernelmap:step#5", "my range"]) is None
    texts = ["Convolution", "_FusedOp", "kernelmap:forward", "kernelmap:step#7", "MXImperativeInvokeEx", ""]
    assert nsys._nvtx_is_op(texts, "mxnet") == [True, True, False, False, False, False]
    assert nsys._nvtx_is_op(texts, None) == [False] * len(texts)


@pytest.mark.gpu
@pytest.mark.parametrize("math,allowed", [("fp32", False), ("tf32", True)])
def test_pytorch_workload_sets_its_tf32_switches(math, allowed):
    code = (
        "import json, torch; from kernelmap.frameworks import spec, load_workload\n"
        f"w = load_workload('pytorch')(spec.TrainConfig(device='gpu', math='{math}', data='synthetic'))\n"
        "print(json.dumps(w.versions()['allow_tf32']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"matmul": allowed, "cudnn": allowed}


@pytest.mark.gpu
def test_gpu_parity_pytorch_jax_fp32():
    out = subprocess.run([sys.executable, "-m", "kernelmap.cli", "parity", "--device", "gpu", "--frameworks",
                          "pytorch,jax", "--data", "synthetic", "--json"], capture_output=True, text=True, timeout=900)
    if out.returncode == 3:
        pytest.skip(out.stderr.strip().splitlines()[-1])
    result = json.loads(out.stdout)
    assert result["device"] == "gpu" and result["math"].startswith("fp32")
    assert out.returncode == 0 and result["passed"], result["failures"]
