"""Which half of a convolution's backward a kernel computes, on a real sequence: PyTorch at batch
1024 on the H100 (sample run of 2026-11-25, Kineto trace of the framework pass, 20 steps), where
cuDNN ran conv2's data gradient as FFT kernels (no ``dgrad`` in their names) right before the
``wgrad_alg0_engine`` of its weight gradient. tests/data/gpu_pytorch_bs1024_conv_bwd_kernels.csv.gz
holds the conv backward kernels' rows from that run's records, direction reset to the adapter's
``bwd`` (before refine_direction)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernelmap import schema
from kernelmap.adapters import _trace

DATA = Path(__file__).parent / "data" / "gpu_pytorch_bs1024_conv_bwd_kernels.csv.gz"


def _refined() -> pd.DataFrame:
    df = pd.read_csv(DATA, dtype={c: "string" for c in ("kind", "canonical_op", "layer", "direction", "library",
                                                         "kernel_name")})
    df["op_event_id"] = df["op_event_id"].astype("Int64")
    _trace.refine_direction(df)
    return df


def test_kernels_ahead_of_the_first_named_one_are_not_guessed():
    df = _refined()
    assert (len(df), int(df["dur_ns"].sum())) == (160, 22_269_484)
    got = df.assign(k=df["kernel_name"].str.extract(r"(fft2d_r2c|fft2d_c2r|cf32cf32|wgrad_alg0|reduce_kernel)")[0]) \
        .groupby(["layer", "direction", "k"]).size().to_dict()
    assert got == {
        # conv2: the FFT data gradient is not split (was: the wgrad's bwd_weight, 0.82 ms/step)
        ("conv2", schema.Direction.BWD, "fft2d_r2c"): 40, ("conv2", schema.Direction.BWD, "cf32cf32"): 20,
        ("conv2", schema.Direction.BWD, "fft2d_c2r"): 20, ("conv2", schema.Direction.BWD_WEIGHT, "wgrad_alg0"): 20,
        ("conv2", schema.Direction.BWD_BIAS, "reduce_kernel"): 20,
        ("conv1", schema.Direction.BWD_WEIGHT, "wgrad_alg0"): 20, ("conv1", schema.Direction.BWD_BIAS, "reduce_kernel"): 20}


def test_layout_kernels_still_follow_their_neighbour():
    """A layout conversion before the first named kernel is that call's (cuDNN's NCHW <-> NHWC)."""
    rows = pd.DataFrame({
        "kind": ["kernel"] * 4, "canonical_op": ["conv2d"] * 4, "layer": ["conv2"] * 4, "direction": ["bwd"] * 4,
        "library": ["cuDNN"] * 4, "op_event_id": pd.array([7] * 4, dtype="Int64"), "start_ns": [1, 2, 3, 4],
        "kernel_name": ["nchwToNhwcKernel", "sm90_xmma_dgrad_implicit_gemm", "nhwcToNchwKernel", "flip_filter"]})
    _trace.refine_direction(rows)
    assert rows["direction"].tolist() == ["bwd_data", "bwd_data", "bwd_data", "bwd"]
