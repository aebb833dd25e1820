"""Executed FLOPs of tiled conv/GEMM kernels (kernelmap/gemmwork.py) against the counters of the first real counters
pass (tests/data/gpu_counters_run: 2x H200, fp32 and bf16, bs 64), read with the stdlib (test_counters_real_run)."""

from __future__ import annotations

import pandas as pd
import pytest
from kernelmap.reports.analyses import roofline
from kernelmap.reports.analyses.base import load_run
from test_counters_real_run import RUN, TENSOR, M, counted

from kernelmap import flops, gemmwork

# (case, ncu position): the FLOPs the rule derives (shape, tile in the name, blocks of the launch), and what the
# counters say the kernel's products were: the tensor path's ops, else 2 x FFMA (FMA kernels: their epilogue's
# alpha scaling, one FFMA an output, comes on top)
DERIVED = {
    ("pytorch", 4): (462_422_016, 462_422_016),     # conv2 fprop, 32x32x8, exact tiles
    ("pytorch", 8): (51_904_512, 51_920_896),       # fc1 fwd, 9 splits of K: 392 k-tiles -> 44 a block
    ("pytorch", 19): (393_216, 393_216),            # fc2 dgrad, K 10 -> 8 a block in each of 3 splits
    ("pytorch", 21): (524_288, 532_480),            # fc2 wgrad, N 10 under a 32 tile
    ("pytorch", 24): (51_380_224, 51_781_632),
    ("pytorch", 25): (51_380_224, 52_183_040),
    ("pytorch", 30): (462_422_016, 462_422_016),    # conv2 dgrad
    ("pytorch", 33): (150_994_944, 151_142_400),    # conv2 wgrad: Winograd F(4x4,3x3): 36 GEMMs 64x32x1024
    ("pytorch-bf16", 11): (462_422_016, 462_422_016),
    ("pytorch-bf16", 18): (52_428_800, 52_428_800),  # fc1 fwd, nvjet split-K: 2 x 1600 of K 3136
    ("pytorch-bf16", 23): (262_144, 262_144),        # fc2 fwd, 10 outputs under a 16 tile: 1.6x the shapes'
    ("pytorch-bf16", 32): (2_097_152, 2_097_152),    # fc2 dgrad, K 10 under a 128 K tile: 12.8x
    ("pytorch-bf16", 33): (1_048_576, 1_048_576),
    ("pytorch-bf16", 38): (54_525_952, 54_525_952),  # fc1 dgrad, 104 blocks for 98 tiles of output
    ("pytorch-bf16", 39): (54_525_952, 54_525_952),
    ("pytorch-bf16", 48): (924_844_032, 924_844_032),      # conv2 dgrad, C_in 32 under a 64 tile: 2.0x
    ("pytorch-bf16", 52): (1_644_167_168, 1_644_167_168),  # conv2 wgrad, 16 blocks of 64x64 over K 12544: 3.6x
    ("pytorch-bf16", 62): (844_103_680, 844_103_680),      # conv1 wgrad, 2 blocks x 23 splits, C_in 1: 29x
    ("mxnet", 9): (51_380_224, 51_380_224),
    ("mxnet", 13): (1_048_576, 1_048_576),
}
NOT_DERIVED = {("pytorch", 0), ("pytorch", 11), ("pytorch", 39), ("pytorch-bf16", 3), ("mxnet", 0), ("mxnet", 5),
               ("mxnet", 40), ("mxnet", 42), ("mxnet", 46)}  # no tile in the name
UNSPLIT = {("mxnet", 27), ("mxnet", 30), ("mxnet", 33), ("mxnet", 36)}  # MXNet's linear 'bwd': which gradient?


@pytest.fixture(scope="module")
def kernels() -> pd.DataFrame:
    return roofline.counter_kernels([load_run(RUN)])[0]


def one_row(lay: pd.DataFrame, key: tuple) -> pd.Series:
    rows = lay[[i == key for i in lay.index]]
    assert len(rows) == 1, key
    return rows.iloc[0]


def products(case: str, pos: int) -> int:
    k = counted(case)[pos]
    tensor = sum(k[c] for c in TENSOR.values())
    return tensor or 2 * k[M.format("ffma")]


def test_each_conv_and_gemm_kernel(kernels):
    """Every conv/GEMM kernel of the capture: the derived figure where its name gives a tile, exact where the
    counters count the products alone (the tensor path), within 10% of its counter FLOPs; none, with the reason,
    where it is not derivable."""
    k = kernels[kernels["expected_from"].notna()].set_index(["case", "position"])
    assert set(k.index) == set(DERIVED) | NOT_DERIVED | UNSPLIT
    for key, (expected, counted_products) in DERIVED.items():
        assert k.loc[key, "expected_flops"] == expected, key
        assert products(*key) == counted_products, key
        assert abs(k.loc[key, "flops"] / expected - 1) <= roofline.FLOP_TOLERANCE, key
    for key in NOT_DERIVED:
        assert pd.isna(k.loc[key, "expected_flops"]) and k.loc[key, "expected_from"] == gemmwork.NO_TILE, key
    for key in UNSPLIT:
        assert k.loc[key, "expected_from"].startswith("direction 'bwd'"), key
    # the tensor-core kernels: the rule gives the tensor path's count exactly
    assert sum(1 for key, (e, c) in DERIVED.items() if e == c and key[0] == "pytorch-bf16") == 10


def test_layer_verdicts(kernels):
    """Per layer direction: the shapes' ratio stays a measurement, the verdict is the executed FLOPs': every
    derivable layer within 10% (bf16 conv1 weight gradient: 29.3x the shapes', 1.0007x its derived work),
    the rest without a verdict, saying why."""
    lay = roofline.layer_counters(kernels).set_index(["case", "layer", "direction"])
    row = one_row(lay, ("pytorch-bf16", "conv1", "bwd_weight"))
    assert row["ratio"] == pytest.approx(29.285, abs=1e-3) and row["expected_flops"] == 844_103_680
    assert row["gemm_counter_flops"] == 844_668_928 and bool(row["within_tolerance"])
    row = one_row(lay, ("pytorch", "conv2", "bwd_weight"))  # Winograd: 0.38x the shapes'; transforms not compared
    assert row["ratio"] == pytest.approx(0.3755, abs=1e-4) and row["gemm_counter_flops"] == 151_160_832
    assert bool(row["within_tolerance"]) and "Winograd F(4x4)" in row["expected_from"]
    judged = lay[lay["within_tolerance"].notna()]
    assert len(judged) == 20 and judged["within_tolerance"].astype(bool).all()
    none = lay[lay["model_flops"].notna() & lay["within_tolerance"].isna()]
    assert sorted(none.index) == sorted([
        ("mxnet", "conv1", "bwd_weight"), ("mxnet", "conv1", "fwd"), ("mxnet", "conv2", "bwd_data"),
        ("mxnet", "conv2", "bwd_weight"), ("mxnet", "conv2", "fwd"), ("pytorch", "conv1", "bwd_weight"),
        ("pytorch", "conv1", "fwd"), ("pytorch", "fc2", "fwd"), ("pytorch-bf16", "conv1", "fwd")])
    assert all(gemmwork.NO_TILE in w for w in none["expected_from"])


def test_a_kernel_that_did_other_work_fails(kernels):
    """Planted: the bf16 conv2 data gradient named as a 64x64 tile (half what ran): the layer fails the 10%."""
    k = kernels.copy()
    at = (k["case"] == "pytorch-bf16") & (k["position"] == 48)
    k.loc[at, "kernel_name"] = k.loc[at, "kernel_name"].str.replace("128x64_32x6", "64x64_32x6")
    k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
    lay = roofline.layer_counters(k).set_index(["case", "layer", "direction"])
    row = one_row(lay, ("pytorch-bf16", "conv2", "bwd_data"))
    assert row["expected_flops"] == 462_422_016 and not bool(row["within_tolerance"])


def test_rules():
    assert gemmwork.tile_of("sm90_xmma_wgrad_indexed_implicit_gemm_bf16_tilesize64x64x64_warpgroupsize1x1x1")[:3] == (64, 64, 64)
    assert gemmwork.tile_of("nvjet_sm90_tst_64x32_64x16_4x2_h_bz_NNT")[:3] == (64, 32, 64)
    assert gemmwork.tile_of("cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_nt_align1")[:3] == (64, 64, None)
    assert gemmwork.tile_of("void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, 0, 0, 1>") is None
    assert not gemmwork.is_gemm_kernel("void cudnn::winogradWgradData4x4<float, float>(cudnn::WinogradDataParams)")
    assert not gemmwork.is_gemm_kernel("void cublasLt::splitKreduce_kernel<32, 16, int, float>")
    assert gemmwork.winograd_tile(["x", "void cudnn::winogradWgradDelta4x4<float, float>"]) == 4
    for layer in ("conv1", "conv2", "fc1", "fc2"):
        for d in flops.DIRECTIONS:
            m, n, k = flops.gemm_dims(layer, d, 64)
            assert 2 * m * n * k == flops.layer_flops(layer, d, 64)
    assert flops.winograd_wgrad_dims("conv2", 64, 4) == (36, 64, 32, 1024)
    assert gemmwork.expected_flops("tilesize32x32x8", "(2, x)", "fc1", "fwd", 64) == (None, "the launch's grid is not known")
