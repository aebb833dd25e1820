"""Which half of a convolution's backward a kernel computes, on a real trace:
tests/data/gpu_kineto_bs1024_fft.json.gz is PyTorch's Kineto trace of the framework pass at batch 1024
on an H100 (docs/sample-report's run of 2026-11-25, 20 profiled steps, whole). There cuDNN ran conv2's
data gradient as FFT kernels (no ``dgrad`` in their names) right before the ``wgrad_alg0_engine``
of its weight gradient."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd

from kernelmap import adapters, schema
from kernelmap.adapters import _trace

TRACE = Path(__file__).parent / "data" / "gpu_kineto_bs1024_fft.json.gz"
KERNELS = r"(fft2d_r2c|fft2d_c2r|cf32cf32|wgrad_alg0|reduce_kernel<512, 1)"


def test_kernels_ahead_of_the_first_named_one_are_not_guessed():
    raw = [e["name"] for e in json.load(gzip.open(TRACE))["traceEvents"] if e.get("cat") == "kernel"]
    in_trace = pd.Series(raw).str.extract(KERNELS)[0].value_counts().to_dict()
    assert len(raw) == 900 and in_trace == {"fft2d_r2c": 40, "fft2d_c2r": 20, "cf32cf32": 20, "wgrad_alg0": 40,
                                            "reduce_kernel<512, 1": 40}
    df = adapters.read(TRACE)
    k = df[df["kind"].eq("kernel") & df["canonical_op"].eq("conv2d")]
    got = k.assign(k=k["kernel_name"].str.extract(KERNELS)[0]).groupby(["layer", "direction", "k"]).size().to_dict()
    assert got == {
        # conv2: the FFT data gradient is not split (it was counted as the wgrad's bwd_weight: 0.82 ms/step)
        ("conv2", schema.Direction.BWD, "fft2d_r2c"): 40, ("conv2", schema.Direction.BWD, "cf32cf32"): 20,
        ("conv2", schema.Direction.BWD, "fft2d_c2r"): 20, ("conv2", schema.Direction.BWD_WEIGHT, "wgrad_alg0"): 20,
        ("conv2", schema.Direction.BWD_BIAS, "reduce_kernel<512, 1"): 20,
        ("conv1", schema.Direction.BWD_WEIGHT, "wgrad_alg0"): 20,
        ("conv1", schema.Direction.BWD_BIAS, "reduce_kernel<512, 1"): 20}


def test_layout_kernels_still_follow_their_neighbour():
    """A layout conversion before the first named kernel is that call's (cuDNN's NCHW <-> NHWC)."""
    rows = pd.DataFrame({
        "kind": ["kernel"] * 4, "canonical_op": ["conv2d"] * 4, "layer": ["conv2"] * 4, "direction": ["bwd"] * 4,
        "library": ["cuDNN"] * 4, "op_event_id": pd.array([7] * 4, dtype="Int64"), "start_ns": [1, 2, 3, 4],
        "kernel_name": ["nchwToNhwcKernel", "sm90_xmma_dgrad_implicit_gemm", "nhwcToNchwKernel", "flip_filter"]})
    _trace.refine_direction(rows)
    assert rows["direction"].tolist() == ["bwd_data", "bwd_data", "bwd_data", "bwd"]
