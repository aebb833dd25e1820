"""torch.compile on the GPU: a real Kineto trace of the compile mode's framework pass (H200, torch 2.11+cu130,
`kernelmap run --framework pytorch --mode compile --profile all --batch-size 64 --steps 20`, the whole
file: tests/data/gpu_compile_kineto_bs64.json.gz, 97 KB).

In that run 56-82% of the library kernels' time was unlinked, "no layer for its op": Inductor calls
``aten::mm`` itself (no linear op or autograd node above it to name the layer), and its generated triton
kernels (a conv's bias + ReLU, fc1's bias + ReLU) were taken for library kernels of their conv/linear op.
Now an ``aten::mm`` names its layer by its matrices' dims, the backward graph's take their half
(bwd_data/bwd_weight) from their input shapes, and a generated kernel is the framework's own (native)."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from kernelmap import attribution
from kernelmap.adapters import canonical, kineto

TRACE = Path(__file__).parent / "data" / "gpu_compile_kineto_bs64.json.gz"
STEPS = 20
# each aten::mm's input dims (as the trace writes them) -> the layer and direction it computes
MM = {"[[64,3136],[3136,128],[64,128]]": ("fc1", "fwd"), "[[64,128],[128,3136],[64,3136]]": ("fc1", "bwd_data"),
      "[[128,64],[64,3136],[128,3136]]": ("fc1", "bwd_weight"), "[[64,10],[10,128],[64,128]]": ("fc2", "bwd_data"),
      "[[10,64],[64,128],[10,128]]": ("fc2", "bwd_weight")}


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    return json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]


@pytest.fixture(scope="module")
def df():
    return kineto.read(TRACE)


def test_the_raw_trace_holds_what_the_tests_count(raw):
    """Counted by the standard library alone: 5 gemm shapes x 20 steps; 760 kernels, 320 of them triton's."""
    mm = collections.Counter(json.dumps(e["args"]["Input Dims"], separators=(",", ":"))
                             for e in raw if e.get("name") == "aten::mm" and e.get("ph") == "X")
    assert mm == {dims: STEPS for dims in MM}
    kernels = [e for e in raw if e.get("cat") == "kernel"]
    assert (len(kernels), sum(e["name"].startswith("triton_") for e in kernels)) == (760, 320)


def test_each_extern_gemm_names_its_layer_and_half(df):
    ops = df[(df["kind"] == "op") & (df["op_name"] == "aten::mm")]
    got = collections.Counter(zip(ops["shapes"], ops["layer"], ops["direction"], strict=True))
    assert got == {(dims, *ld): STEPS for dims, ld in MM.items()}


def test_generated_kernels_are_the_frameworks_own(df, raw):
    k = df[df["kind"] == "kernel"]
    triton = k[k["kernel_name"].str.startswith("triton_")]
    assert len(triton) == 320 and (triton["library"] == "native").all()


def test_every_library_kernel_has_its_layer_and_direction(df):
    lk = attribution.library_kernels(df)
    assert len(lk) == 360 and not lk["kernel_name"].str.startswith("triton_").any()
    assert lk["layer"].notna().all() and not lk["direction"].isin(["bwd"]).any()
    # no library log beside this trace: that, and nothing else, is why they are unlinked here
    assert set(lk["reason"]) == {"no GPU library log in this run"}
    per = collections.Counter(zip(lk["canonical_op"], lk["layer"], lk["direction"], strict=True))
    assert per == {("conv2d", "conv1", "fwd"): 20, ("conv2d", "conv1", "bwd_weight"): 20,
                   ("conv2d", "conv2", "fwd"): 20, ("conv2d", "conv2", "bwd_data"): 20,
                   ("conv2d", "conv2", "bwd_weight"): 80,
                   ("linear", "fc1", "fwd"): 40, ("linear", "fc1", "bwd_data"): 20, ("linear", "fc1", "bwd_weight"): 20,
                   ("linear", "fc2", "fwd"): 60, ("linear", "fc2", "bwd_data"): 40, ("linear", "fc2", "bwd_weight"): 20}


def test_gemm_layer_and_half_from_dims():
    assert canonical.layer_from_inputs("aten::mm", [[64, 3136], [3136, 128]]) == "fc1"
    assert canonical.layer_from_inputs("aten::mm", [[64, 10], [10, 128]]) == "fc2"
    assert canonical.layer_from_inputs("aten::mm", [[64, 7], [7, 5]]) is None
    assert canonical.layer_from_inputs("aten::mm", [[64, 3136]]) is None
    assert canonical.linear_half((128, 3136), [[64, 128], [128, 3136]]) == "bwd_data"
    assert canonical.linear_half((128, 3136), [[128, 64], [64, 3136]]) == "bwd_weight"
    assert canonical.linear_half((128, 3136), [[64, 3136], [3136, 128]]) is None
