"""Executed FLOPs of the blocks that do work and of FFT convolutions' complex GEMMs (issue 38, kernelmap/gemmwork.py).

Where a CUTLASS kernel's name spells its threadblock swizzle, the blocks its launch rounded up past the GEMM's tiles
return at once and are not counted. The case: session 14's 1x H100 JAX bf16 capture
(tests/data/gpu_jax_h100_counters_run), conv2's weight gradient, a CUTLASS wgrad kernel (``GemmShape<64, 128, 64>``,
``GemmIdentityThreadblockSwizzle<4>``, grid (4, 1, 18)): the rule counted all 72 blocks (830,472,192 FLOPs) where its
tensor path counts 622,854,144 (0.752).

Where a layer direction ran cuDNN's FFT (``fft2d_r2c_16x16``, a complex ``xmma_gemm_cf32cf32`` GEMM, ``fft2d_c2r``),
its GEMM is one complex GEMM per frequency point, not the direct conv's: the H200 MXNet fp16 capture's conv2 weight and
data gradients read 2.94x and 32.4x before. Beside them, every real capture's conv/GEMM kernels (the 2x H200, 4x H200,
4x H100, 1x H100 and H200 MXNet fixtures), whose figures stay."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports.analyses import roofline
from kernelmap.reports.analyses.base import load_run
from test_gpu_mxnet_fp16_counters import FP16, TENSOR, M, counted

from kernelmap import flops, gemmwork

DATA = Path(__file__).parent / "data"
H100 = DATA / "gpu_jax_h100_counters_run"
WGRAD2 = ("jax-bf16", 38)  # (case, ncu position): conv2 bwd_weight's CUTLASS wgrad kernel
# M N K = C_out, 3·3·C_in, N·H·W = 64 288 12544; tiles 1 x ceil(288/128) = 3; the swizzle picks 4 for 3 N tiles:
# grid (1·4, ceil(3/4), 18) = ncu's (4, 1, 18), 54 of 72 blocks a tile; K: ceil(12544/64) = 196 tiles over 18
# splits, ceil(196/18) = 11 a block = 704: 2 · 54 · 64 · 128 · 704
WGRAD2_FLOPS = 2 * 54 * 64 * 128 * 704
ALL_BLOCKS = 2 * 72 * 64 * 128 * 704  # the rule before: every launched block
# conv1 bwd_weight's CUTLASS wgrad (GemmShape<64, 64, 64>, swizzle<4>, 8 channels an access): C_in 1 padded to 8,
# N = 3·3·8 = 72, 2 tiles of 64 (the swizzle's grid for 2 tiles is (2, 1, z), ncu's; for N = 9, 1 tile: (1, 1, z));
# K = 50176 = 784 tiles of 64: 23 splits -> 35 a block (2240), 66 -> 12 (768); every block works, figures unchanged
CONV1 = {("gpu_counters_run", "pytorch-bf16", 62): 2 * 2 * 23 * 64 * 64 * 2240,    # 844,103,680
         ("gpu_jax_counters_run", "jax-bf16", 49): 2 * 2 * 66 * 64 * 64 * 768,   # 830,472,192
         ("gpu_jax_h100_counters_run", "jax-bf16", 48): 2 * 2 * 66 * 64 * 64 * 768}
# the MXNet fp16 FFTs (H200): (ncu position, layer direction, grid, FFT, derived FLOPs, counter FLOPs); points =
# fh·(fw/2 + 1) = grid z; M N K: weight gradient C_out C_in N = 64 32 64, data gradient N C_in C_out = 64 32 64, 2
# tiles of 32x32 a point, K 64 = 8 tiles of 8 in one block; a complex FMA is 4 real: 2 · 4 · blocks · 32 · 32 · 64
FFTS = {55: ("bwd_weight", "(1, 2, 144)", (16, 16), 2 * 4 * 288 * 32 * 32 * 64, 152_764_416),     # 150,994,944
        59: ("bwd_data", "(2, 1, 544)", (32, 32), 2 * 4 * 1088 * 32 * 32 * 64, 577_110_016)}      # 570,425,344
# every real capture: its layer directions with a verdict, each within 10%
JUDGED = {"gpu_counters_run": 20, "gpu_jax_counters_run": 3, "gpu_jax_fp32_counters_run": 3,
          "gpu_mxnet_fp16_counters_run": 14, "gpu_jax_h100_counters_run": 7}


@pytest.fixture(scope="module")
def kernels() -> dict[str, pd.DataFrame]:
    return {name: roofline.counter_kernels([load_run(DATA / name)])[0] for name in JUDGED}


def row(k: pd.DataFrame, case: str, pos: int) -> pd.Series:
    rows = k[(k["case"] == case) & (k["position"] == pos)]
    assert len(rows) == 1, (case, pos)
    return rows.iloc[0]


def verdict(k: pd.DataFrame, case: str, layer: str, direction: str) -> pd.Series:
    lay = roofline.layer_counters(k)
    rows = lay[(lay["case"] == case) & (lay["layer"] == layer) & (lay["direction"] == direction)]
    assert len(rows) == 1, (case, layer, direction)
    return rows.iloc[0]


def tensor_ops(run: Path, case: str, pos: int) -> int:
    """The kernel's tensor-path ops as ncu wrote them (read with the stdlib)."""
    k = counted(case, run)[pos]
    return sum(k[c] for c in TENSOR.values())


def test_the_swizzled_weight_gradient(kernels):
    """conv2's wgrad on the H100: the 54 blocks that compute a tile, exactly its tensor path's ops; the layer
    within 10% (1.002, was 0.752)."""
    r = row(kernels["gpu_jax_h100_counters_run"], *WGRAD2)
    assert r["grid"] == "(4, 1, 18)" and "GemmIdentityThreadblockSwizzle<4>" in r["kernel_name"]
    assert r["expected_flops"] == WGRAD2_FLOPS == 622_854_144 == tensor_ops(H100, *WGRAD2)
    assert "54 blocks of 64x128" in r["expected_from"] and "18 return at once" in r["expected_from"]
    v = verdict(kernels["gpu_jax_h100_counters_run"], "jax-bf16", "conv2", "bwd_weight")
    assert v["gemm_counter_flops"] == 624_181_248 and v["expected_ratio"] == pytest.approx(1.00213, abs=1e-5)
    assert bool(v["within_tolerance"])


def test_conv1_weight_gradients_pad_their_one_channel(kernels):
    """conv1's wgrad (three captures): C_in padded to the 8 channels its iterator reads, 2 N tiles, every block
    works: the figures stay, each its tensor path's ops exactly."""
    for (run, case, pos), expected in CONV1.items():
        r = row(kernels[run], case, pos)
        assert r["expected_flops"] == expected == tensor_ops(DATA / run, case, pos), (run, case)
        assert r["expected_from"].startswith("M N K 32 72 50176 (C_in padded to a multiple of 8"), run
        assert r["expected_from"].endswith("tiles x 23: none idle" if case == "pytorch-bf16" else
                                           "tiles x 66: none idle"), run


def test_every_captured_verdict(kernels):
    """Every real capture's layer directions with a verdict (47): each within 10% (before: the H100 wgrad 0.752,
    MXNet fp16's FFTs 2.94 and 32.4)."""
    for run, k in kernels.items():
        lay = roofline.layer_counters(k)
        judged = lay[lay["within_tolerance"].notna()]
        assert len(judged) == JUDGED[run], run
        assert judged["within_tolerance"].astype(bool).all(), run


def test_fft_complex_gemms(kernels):
    """MXNet fp16's FFT weight and data gradients (H200): one complex GEMM per frequency point; the derived figure
    is exactly twice the kernel's FFMAs less its epilogue's (one FFMA beside each FMUL of the complex alpha: FFMA -
    FMUL), the verdict 1.012 for both."""
    k = kernels["gpu_mxnet_fp16_counters_run"]
    for pos, (direction, grid, (fh, fw), derived, flops_counted) in FFTS.items():
        r = row(k, FP16, pos)
        assert (r["direction"], r["grid"]) == (direction, grid) and "gemm_cf32cf32" in r["kernel_name"]
        assert r["expected_flops"] == derived and r["flops"] == flops_counted, pos
        assert r["expected_from"].startswith(f"FFT {fh}x{fw} complex GEMM per frequency point, {fh * (fw // 2 + 1)}")
        c = counted(FP16)[pos]
        assert 2 * (c[M.format("ffma")] - c[M.format("fmul")]) == derived, pos
        v = verdict(k, FP16, "conv2", direction)
        assert v["expected_ratio"] == pytest.approx(1.01172, abs=1e-5) and bool(v["within_tolerance"]), pos


def test_planted_an_fft_not_named(kernels):
    """Planted: the weight gradient's transforms named as no FFT (the complex GEMM alone: no figure, said so, where
    the direct conv's 51,904,512 was read before); the data gradient's as 16x16 where 32x32 ran (144 points against
    its grid z 544: no figure)."""
    k = kernels["gpu_mxnet_fp16_counters_run"].copy()
    wgrad = (k["case"] == FP16) & (k["layer"] == "conv2") & (k["direction"] == "bwd_weight")
    k.loc[wgrad, "kernel_name"] = k.loc[wgrad, "kernel_name"].str.replace("fft2d_r2c_16x16", "r2c_kernel")
    dgrad = (k["case"] == FP16) & (k["layer"] == "conv2") & (k["direction"] == "bwd_data")
    k.loc[dgrad, "kernel_name"] = k.loc[dgrad, "kernel_name"].str.replace("fft2d_r2c_32x32", "fft2d_r2c_16x16")
    k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
    r = row(k, FP16, 55)
    assert pd.isna(r["expected_flops"]) and r["expected_from"] == gemmwork.COMPLEX_WITHOUT_FFT
    r = row(k, FP16, 59)
    assert pd.isna(r["expected_flops"]) and r["expected_from"] == "FFT 16x16: grid z 544 is not its 144 frequency points"
    assert pd.isna(verdict(k, FP16, "conv2", "bwd_weight")["within_tolerance"])


def test_fft_gemm_dims():
    assert flops.fft_gemm_dims("conv2", "bwd_weight", 64, 16, 16) == (144, 64, 32, 64)
    assert flops.fft_gemm_dims("conv2", "bwd_data", 64, 32, 32) == (544, 64, 32, 64)
    assert flops.fft_gemm_dims("conv2", "fwd", 64, 16, 16) == (144, 64, 64, 32)
    assert flops.fft_gemm_dims("conv1", "fwd", 64, 16, 16) is None  # 28 + 2 > 16: the image tiled
    assert flops.fft_gemm_dims("fc1", "fwd", 64, 16, 16) is None
    assert gemmwork.fft_size(["flip_filter<__half, __half>", "void fft2d_r2c_32x32<__half, 0, 1, 0>(float2 *)"]) == (32, 32)
    assert gemmwork.fft_size(["void cudnn::winogradWgradData4x4<float, float>"]) is None


def test_planted_a_name_without_the_swizzle(kernels):
    """Planted: the H100 wgrad row without the swizzle in its name: every launched block counted again, 0.752."""
    k = kernels["gpu_jax_h100_counters_run"].copy()
    at = (k["case"] == WGRAD2[0]) & (k["position"] == WGRAD2[1])
    k.loc[at, "kernel_name"] = k.loc[at, "kernel_name"].str.replace("GemmIdentityThreadblockSwizzle<4>",
                                                                    "GemmIdentityThreadblockSwizzle")
    k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
    assert row(k, *WGRAD2)["expected_flops"] == ALL_BLOCKS == 830_472_192
    v = verdict(k, "jax-bf16", "conv2", "bwd_weight")
    assert v["expected_ratio"] == pytest.approx(0.7516, abs=1e-4) and not bool(v["within_tolerance"])


def test_planted_a_launch_the_swizzle_does_not_explain(kernels):
    """Planted: conv1's wgrad read without its 8-channel access (N = 9, 1 tile: the swizzle's grid (1, 1, 66)) does
    not explain ncu's (2, 1, 66): every block counted, said so; and the H100 wgrad's grid as (4, 2, 18): the same."""
    k = kernels["gpu_jax_h100_counters_run"].copy()
    at = (k["case"] == "jax-bf16") & (k["position"] == 48)
    k.loc[at, "kernel_name"] = k.loc[at, "kernel_name"].str.replace("bfloat16_t, 8, 16>", "bfloat16_t, 1, 2>")
    at2 = (k["case"] == WGRAD2[0]) & (k["position"] == WGRAD2[1])
    k.loc[at2, "grid"] = "(4, 2, 18)"
    k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
    r = row(k, "jax-bf16", 48)
    assert r["expected_from"].startswith("M N K 32 9 50176;")
    assert r["expected_from"].endswith("the launch (2, 1, 66) is not CUTLASS's swizzle<4> grid (1, 1, 66) for 1x1 "
                                       "tiles: every block counted")
    assert r["expected_flops"] == 2 * 132 * 64 * 64 * 768  # K unchanged: the padding is N's
    r = row(k, *WGRAD2)  # the swizzle's grid for 1x3 tiles is (4, 1, 18): all 144 blocks of (4, 2, 18) counted
    assert r["expected_flops"] == 2 * 144 * 64 * 128 * 704 and r["expected_from"].endswith("every block counted")


def test_swizzle_grid():
    """CUTLASS's get_grid_shape: the width it picks (at most the template's) by the N tiles."""
    assert gemmwork.swizzle_grid(1, 3, 18, 4) == (4, 1, 18)   # the H100 wgrad: 4 wide, 1 of 4 idle a split
    assert gemmwork.swizzle_grid(1, 2, 66, 4) == (2, 1, 66)   # conv1, N 72: 2 wide, none idle
    assert gemmwork.swizzle_grid(1, 1, 66, 4) == (1, 1, 66)   # N 9 would be 1 tile: no swizzle
    assert gemmwork.swizzle_grid(3, 7, 1, 8) == (24, 1, 1)    # 8 wide from 6 N tiles: 1 of 8 idle
    assert gemmwork.swizzle_grid(3, 7, 1, 2) == (6, 4, 1)     # the template caps it at 2: 1 of 8 idle
    assert gemmwork.swizzle_grid(2, 5, 1, 1) == (2, 5, 1)     # swizzle<1>: the tiles as they are
