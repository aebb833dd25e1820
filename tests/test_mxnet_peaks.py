"""The GPU's peaks through MXNet (frameworks/mxnet/peaks.py) for the counters pass's roofline, on the CPU.

``measure_on`` (no GPU check) at small sizes in MXNet's CPU context, fp16 skipped (MXNet's CPU has no float16
GEMM): with ``NVIDIA_TF32_OVERRIDE=0`` the float32 GEMM is fp32 and tf32 is not measured, without it the same GEMM
is tf32 (MXNet has no switch of its own) and fp32 is not measured; bf16 never (its CUDA operators have none); each
figure the work over the median of its times, in the shape the report reads (test_jax_peaks.PLANTED's). ``measure``
refuses the CPU; the workload's ``measure_peaks`` there says not measured. The GPU itself: docs/COUNTERS.md.
"""

from __future__ import annotations

import pytest
from conftest import run_framework
from kernelmap.frameworks import spec
from test_jax_peaks import PLANTED, figures_hold

N, NBYTES, REPEATS = 40, 1 << 15, 3
SCRIPT = f"""
import json, os
from kernelmap.errors import KernelmapError
from kernelmap.frameworks import spec
from kernelmap.frameworks.mxnet.loaded import mx
from kernelmap.frameworks.mxnet import peaks, workload as W
out = {{}}
for held in ("0", None):
    os.environ.pop(spec.TF32_OVERRIDE, None)
    if held:
        os.environ[spec.TF32_OVERRIDE] = held
    out[str(held)] = peaks.measure_on(mx.cpu(), {N}, {NBYTES}, 1, {REPEATS}, skip={{"fp16": "no CPU fp16 GEMM"}})
try:
    peaks.measure(mx.cpu())
    out["refused"] = None
except KernelmapError as exc:
    out["refused"] = str(exc)
out["workload"] = W.Workload(spec.TrainConfig(data="synthetic", batch_size=8)).measure_peaks()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured() -> dict:
    return run_framework("mxnet", ["-c", SCRIPT])


@pytest.mark.slow
@pytest.mark.parametrize(("held", "ran", "not_ran", "why"), [("0", "fp32", "tf32", "=0 in this process"),
                                                              ("None", "tf32", "fp32", "no TF32 switch")])
def test_the_float32_gemm_is_fp32_or_tf32_by_the_variable(measured, held, ran, not_ran, why):
    p = measured[held]
    assert set(p) == set(PLANTED) and set(p["gemm"]) == {m.value for m in spec.Math}
    assert p["gemm"][ran]["n"] == N and set(p["gemm"][ran]) == set(PLANTED["gemm"]["fp32"])
    figures_hold(p["gemm"][ran], "flops_per_s", 2.0 * N**3, REPEATS)
    assert list(p["gemm"][not_ran]) == ["not_measured"] and why in p["gemm"][not_ran]["not_measured"]
    assert "bfloat16" in p["gemm"]["bf16"]["not_measured"]
    assert p["gemm"]["fp16"] == {"not_measured": "no CPU fp16 GEMM"}
    assert p["dram"]["bytes"] == NBYTES and set(p["dram"]) == set(PLANTED["dram"])
    figures_hold(p["dram"], "bytes_per_s", 2.0 * NBYTES, REPEATS)
    assert "host-timed" in p["method"] and p["gpu"] == "cpu(0)"


@pytest.mark.slow
def test_the_gpu_entry_refuses_the_cpu_and_the_workload_says_not_measured(measured):
    assert "is no GPU" in measured["refused"]
    assert list(measured["workload"]) == ["not_measured"] and "CPU case" in measured["workload"]["not_measured"]
