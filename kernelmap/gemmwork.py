"""The FLOPs a tiled conv or GEMM kernel executes, derived from the layer's shape, the tile its name gives and
the thread blocks its launch ran (issue 38: counter FLOPs against the shapes' within ±10%).

``kernelmap/flops.py`` counts the useful work of the direct algorithm (2·M·N·K). A tiled kernel executes
more or less: each thread block computes a whole tile_M x tile_N block of the output over the whole reduction
rounded up to tile_K (out-of-range rows and columns are zero-filled and multiplied all the same: a C_in of 32
under a 64-wide tile runs twice the MACs), split-K divides the reduction's tiles among the blocks of the grid's z
(CUTLASS's threadblock swizzle), and Winograd and FFT replace the direct convolution by a batched GEMM over their
transformed tiles. The rule (``expected_flops``)::

    2 · f · blocks · tile_M · tile_N · K_block,  K_block = tile_K · ceil(ceil(K / tile_K) / splits)

with blocks = the grid's product (ncu's launch; the blocks that do work, below), splits = grid z (or, where the name
says split-K and z is 1, blocks over the output's tiles), K from ``flops.gemm_dims`` (a Winograd GEMM's from
``flops.winograd_wgrad_dims``, whose grid z is its 36 GEMMs, not splits; an FFT's complex GEMM's from
``flops.fft_gemm_dims``, one GEMM per frequency point of its ``fft2d_r2c_16x16`` transform, 16·9 = 144 = grid z,
checked against the launch), f = 1, or 4 for a complex GEMM (``xmma_gemm_cf32cf32``: a complex FMA is 4 real ones). Nothing is fitted to the counters: they only check it. A kernel whose
name gives no tile (cuDNN's precompiled ``implicit_convolve_sgemm``, ``wgrad_alg0_engine``, ``dgrad_engine``,
cuBLAS's ``sgemm_largek_lds64``) gets no figure, and its reason.

blocks counts only the blocks that do work where the kernel's name spells CUTLASS 2.x's threadblock swizzle
(``gemm::GemmIdentityThreadblockSwizzle<4>``, cuDNN's CUTLASS wgrad kernels): the swizzle maps ceil(M/tile_M) x
ceil(N/tile_N) output tiles onto a grid of (tiles_M·2^s, ceil(tiles_N / 2^s), splits), 2^s the width it picks for the
N tiles (``swizzle_grid``), and a block whose tile lies outside the GEMM returns before any product (CUTLASS's
kernels: "Early exit if CTA is out of range"). Where ncu's grid is that grid, blocks = tiles_M · tiles_N · splits;
where it is not, the name's M/N mapping does not explain the launch and every block is counted, as without a
swizzle (kernels whose names do not spell it: which grid dimension is M and which N, and whether a block past the
output computes, is not in their names; nvjet's do compute: fc1's 104 blocks for 98 tiles count 104 tiles' tensor
ops). A CUTLASS wgrad kernel whose activation iterator reads ``AlignedArray<bfloat16_t, 8, 16>`` (8 channels an
access) runs on C_in padded to a multiple of 8: conv1's 1 input channel makes N = 3·3·8 = 72, 2 tiles of 64, and its
launch (2, 1, z) is the swizzle's grid for 2 tiles (for N = 9, 1 tile, it would be (1, 1, z))."""

from __future__ import annotations

import math
import re

from kernelmap import flops

# the tile a kernel's name gives: (regex, what it reads); the groups are tile_M, tile_N[, tile_K]
TILE_NAMES = (
    (re.compile(r"tilesize(\d+)x(\d+)x(\d+)"), "xmma tilesize MxNxK"),
    (re.compile(r"GemmShape<(\d+), ?(\d+), ?(\d+)>"), "CUTLASS GemmShape<M, N, K>"),
    (re.compile(r"_(\d+)x(\d+)_(\d+)x\d+_"), "MxN_KxStages (CUTLASS; nvjet read the same way)"),
    (re.compile(r"_(\d+)x(\d+)_(?:nn|nt|tn|tt)_"), "CUTLASS MxN, no K tile in the name"),
)
# a kernel that computes a conv or GEMM's products (the rest of a layer's library kernels transform layouts,
# reduce split-K partials, scale, add a bias: not compared); cuDNN's direct ``convolve_common_engine_float_NHWC`` and
# the gemv its Winograd weight gradient runs (ncu: ``internal::kernel<..., cublasGemvParamsEx<...>>``) are products too
# (the 4x H100 JAX fp32 conv1 fwd and bwd_weight: "no conv or GEMM kernel" until they were)
GEMM_KERNEL = re.compile(r"gemm|[gG]emv|convolve|fprop|dgrad|wgrad|nvjet|ImplicitGemm|_engine<")
WINOGRAD_TRANSFORM = re.compile(r"winograd\w*?(?:Data|Delta|Output|Filter)(\d+)x\1")
SPLIT_K_NAME = re.compile(r"splitK")
# an xmma GEMM's second kernel that sums its split-K partials: named after the GEMM (``…_wgrad_…_execute_split_k_kernel``)
# but a reduction (the 4x H200 JAX bf16 capture: 405,504 FADD, no tensor op)
SPLIT_K_REDUCE = re.compile(r"_execute_split_k_kernel")
# an xmma kernel whose blocks share K in segments (``…_execute_segment_k_on_kernel``): the grid is output tiles x
# segments, which its name does not split (the 4x H200 JAX bf16 conv2 weight gradient, 99 blocks: its 924,844,032
# tensor ops are 9 tiles of 64x64 over K's 196 tiles of 64, 9 x 11 blocks, where the rule read 99 tiles: 11x;
# PyTorch's ``…_segment_k_off_kernel`` of the same layer, 16 blocks each over all of K, is the rule's)
SEGMENT_K_ON = re.compile(r"_segment_k_on_")
SEGMENTED = ("its blocks share K in segments (xmma segment_k_on): how many output tiles its grid covers is not "
             "in its name: its executed work is not derivable")
# CUTLASS 2.x's threadblock swizzle, where the name spells its template, and the channels a CUTLASS weight gradient's
# activation iterator reads an access (its C_in padded to a multiple of them). The 1x H100 JAX bf16 conv2 wgrad
# (GemmShape<64, 128, 64>, GemmIdentityThreadblockSwizzle<4>, grid (4, 1, 18)): M N K = 64 288 12544, 1 x 3 tiles;
# the swizzle picks 4 (3 N tiles >= 3) and launches (1·4, ceil(3/4), 18) = (4, 1, 18): 54 of its 72 blocks do work,
# 2 · 54 · 64 · 128 · 704 = 622,854,144 FLOPs (K: 196 tiles of 64 over 18 splits, 11 a block), where all 72 read
# 830,472,192 and its counters say 624,181,248 (1.002; 0.752 before; its tensor ops: 622,854,144 exactly)
SWIZZLE = re.compile(r"Gemm(?:SplitK)?IdentityThreadblockSwizzle<(\d+)>")
# conv1's wgrad (GemmShape<64, 64, 64>, swizzle<4>, its activation read as AlignedArray<bfloat16_t, 8, 16>): C_in 1
# padded to 8, N = 3·3·8 = 72, 1 x 2 tiles, whose swizzle grid (2, 1, 66) is ncu's (N = 9 would be 1 tile, grid
# (1, 1, 66)): all 132 blocks work, 2 · 132 · 64 · 64 · 768 = 830,472,192 = its tensor ops (H200 and H100 alike)
WGRAD_ACTIVATION_ACCESS = re.compile(r"Conv2dWgradActivationTileAccessIterator\w*<.*?AlignedArray<[^<>,]+, (\d+),")
# cuDNN's FFT convolution: the real-to-complex transform's size (``fft2d_r2c_16x16<__half>``: 16x16, 16·9 = 144
# frequency points) and the complex GEMM between the transforms (``sm80_xmma_gemm_cf32cf32_f32f32_cf32_...``), one
# GEMM per point, grid z the points. The H200 MXNet fp16 conv2 weight gradient (FFT, grid (1, 2, 144)) was read as the
# direct conv's GEMM split 144 ways: 51,904,512 where its counters say 152,764,416 (2.94x); as the FFT's, M N K
# = C_out C_in N = 64 32 64, 2 tiles of 32x32 a point, 4 real FMAs a complex one: 2 · 4 · 288 · 32 · 32 · 64 =
# 150,994,944 (1.012). Its data gradient (FFT_TILING, fft2d_r2c_32x32: 32·17 = 544 points, grid (2, 1, 544)):
# 17,825,792 (32.4x) -> 2 · 4 · 1088 · 32 · 32 · 64 = 570,425,344 against 577,110,016 (1.012)
FFT_TRANSFORM = re.compile(r"fft2d_r2c_(\d+)x(\d+)")
COMPLEX_GEMM = re.compile(r"gemm_c(?:f32|f16|bf16)c")
COMPLEX_WITHOUT_FFT = ("a complex GEMM without an FFT's transforms among the layer's kernels: which transform it "
                       "multiplies is not known: its executed work is not derivable")
NO_TILE = ("no tile in the kernel's name (a precompiled cuDNN/cuBLAS kernel whose template arguments are not "
           "documented, or a compiler's own, as XLA's Triton gemm_fusion kernels): its executed work is not derivable")


def is_gemm_kernel(name: str) -> bool:
    """A kernel that multiplies the conv's or GEMM's operands (not a layout, reduction, scale or Winograd transform)."""
    return bool(GEMM_KERNEL.search(name)) and not WINOGRAD_TRANSFORM.search(name) and not SPLIT_K_REDUCE.search(name)


def tile_of(name: str) -> tuple[int, int, int | None, str] | None:
    """(tile_M, tile_N, tile_K or None, which naming) from a kernel's name; None where it names none."""
    for pat, how in TILE_NAMES:
        m = pat.search(name)
        if m:
            g = [int(x) for x in m.groups()]
            return g[0], g[1], (g[2] if len(g) > 2 else None), how
    return None


def grid_of(text) -> tuple[int, int, int] | None:
    """ncu's ``Grid Size`` text ``(2, 1, 23)`` as ints; None where it is not one."""
    try:
        g = tuple(int(x) for x in str(text).strip().strip("()").split(","))
    except ValueError:
        return None
    return g if len(g) == 3 and min(g) > 0 else None


def swizzle_grid(tiles_m: int, tiles_n: int, splits: int, width: int) -> tuple[int, int, int]:
    """The grid CUTLASS's ``GemmIdentityThreadblockSwizzle<width>`` launches for tiles_m x tiles_n output tiles and
    ``splits`` of K (cutlass/gemm/threadblock/threadblock_swizzle.h: ``get_log_tile`` picks 8, 4, 2 or 1 by the N
    tiles, at most ``width``; ``get_grid_shape`` is (tiles_m·that, ceil(tiles_n / that), splits))."""
    log = (3 if width >= 8 and tiles_n >= 6 else 2 if width >= 4 and tiles_n >= 3 else
           1 if width >= 2 and tiles_n >= 2 else 0)
    return tiles_m << log, -(-tiles_n // (1 << log)), splits


def working_blocks(name: str, g: tuple[int, int, int], m: int, n: int, tm: int, tn: int) -> tuple[int, str]:
    """(the blocks of grid ``g`` that compute an output tile, how that was read): those the name's CUTLASS swizzle
    maps onto the GEMM's tiles where the launch is that swizzle's grid, else every block (the module's docstring)."""
    total = g[0] * g[1] * g[2]
    sw = SWIZZLE.search(name)
    if not sw:
        return total, ""
    tiles_m, tiles_n, width = math.ceil(m / tm), math.ceil(n / tn), int(sw.group(1))
    grid = swizzle_grid(tiles_m, tiles_n, g[2], width)
    if grid != g:
        return total, (f"; the launch {g} is not CUTLASS's swizzle<{width}> grid {grid} for {tiles_m}x{tiles_n} "
                       "tiles: every block counted")
    work = tiles_m * tiles_n * g[2]
    rest = f"{total - work} return at once" if work < total else "none idle"
    return work, f"; {g} is CUTLASS's swizzle<{width}> grid for {tiles_m}x{tiles_n} tiles x {g[2]}: {rest}"


def fft_size(names) -> tuple[int, int] | None:
    """(fh, fw) of the FFT a layer direction ran (its real-to-complex transform's ``fft2d_r2c_16x16``: (16, 16)),
    None where none of ``names`` is one."""
    for n in names:
        m = FFT_TRANSFORM.search(str(n))
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def winograd_tile(names) -> int | None:
    """The output tile m of the Winograd algorithm a layer direction ran (its transform kernels'
    ``winogradWgradData4x4``: 4), None where none of ``names`` is a Winograd transform."""
    for n in names:
        m = WINOGRAD_TRANSFORM.search(str(n))
        if m:
            return int(m.group(1))
    return None


def batched_gemm(name: str, g: tuple[int, int, int], layer: str, direction: str, batch_size: int,
                 winograd: int | None, fft: tuple[int, int] | None) -> tuple[tuple | None, str]:
    """((M, N, K, real FMAs a product) of a kernel that runs one GEMM per transformed point, grid z being the
    points, how read) where the layer direction ran Winograd or an FFT, (None, why not) where it is not derivable,
    ((), "") for a GEMM of the direct algorithm."""
    if COMPLEX_GEMM.search(name):
        if not fft:
            return None, COMPLEX_WITHOUT_FFT
        dims = flops.fft_gemm_dims(layer, direction, batch_size, *fft)
        if dims is None:
            return None, (f"FFT {fft[0]}x{fft[1]} of {layer}: not one transform per image (tiled, by a count its "
                          "names do not give): its executed work is not derivable")
        points, m, n, k = dims
        if g[2] != points:
            return None, f"FFT {fft[0]}x{fft[1]}: grid z {g[2]} is not its {points} frequency points"
        return (m, n, k, 4), (f"FFT {fft[0]}x{fft[1]} complex GEMM per frequency point, {points} (grid z), M N K {m} "
                              f"{n} {k}, 4 real FMAs a complex one")
    if winograd:
        if direction != "bwd_weight":
            return None, f"Winograd {winograd}x{winograd} {direction}: only the weight gradient's GEMM is derived"
        dims = flops.winograd_wgrad_dims(layer, batch_size, winograd)
        if dims is None:
            return None, f"{layer} is not a conv"
        _, m, n, k = dims
        return (m, n, k, 1), f"Winograd F({winograd}x{winograd}) weight-gradient GEMM, K = {k} tiles, grid z = its GEMMs"
    return (), ""


def expected_flops(name: str, grid, layer: str, direction: str, batch_size: int,
                   winograd: int | None = None, fft: tuple[int, int] | None = None) -> tuple[int | None, str]:
    """(the FLOPs the kernel executes by the module's rule, how they were derived) or (None, why not)."""
    tile = tile_of(name)
    g = grid_of(grid)
    if tile is None:
        return None, NO_TILE
    if g is None:
        return None, "the launch's grid is not known"
    tm, tn, tk, how = tile
    blocks = g[0] * g[1] * g[2]
    if SEGMENT_K_ON.search(name):
        return None, SEGMENTED
    batched, what = batched_gemm(name, g, layer, direction, batch_size, winograd, fft)
    if batched is None:
        return None, what
    if batched:
        m, n, k, fmas = batched
        splits, launch = 1, ""
    else:
        access = WGRAD_ACTIVATION_ACCESS.search(name) if direction == "bwd_weight" else None
        align = int(access.group(1)) if access else 1
        dims = flops.gemm_dims(layer, direction, batch_size, align)
        if dims is None:
            return None, f"no GEMM known for {layer} {direction}"
        (m, n, k), fmas = dims, 1
        splits = g[2]
        if splits == 1 and SPLIT_K_NAME.search(name):
            splits = max(1, blocks // (math.ceil(m / tm) * math.ceil(n / tn)))
        blocks, launch = working_blocks(name, g, m, n, tm, tn)
        what = f"M N K {m} {n} {k}" + (f" (C_in padded to a multiple of {align}: {align} channels an access)"
                                       if align > 1 and dims != flops.gemm_dims(layer, direction, batch_size) else "")
    k_block = tk * math.ceil(math.ceil(k / tk) / splits) if tk else math.ceil(k / splits)
    note = "" if tk else " (K tile not in the name: K not rounded)"
    return (2 * fmas * blocks * tm * tn * k_block,
            f"{what}; {blocks} blocks of {tm}x{tn} ({how}), {splits} split(s) of K, {k_block} a block{note}{launch}")


def expected_columns(kernels) -> tuple[list, list]:
    """Per row of a counters table (``kernel_name``, ``grid``, ``layer``, ``canonical_op``, ``direction``,
    ``batch_size``): the executed FLOPs ``expected_flops`` derives for a conv or GEMM kernel of a conv2d or linear
    layer, and how (or why none); (None, None) for every other kernel. A layer direction whose kernels include a
    Winograd transform has its GEMM read as Winograd's, one with an FFT's its complex GEMM as the FFT's."""
    wino: dict[tuple, int | None] = {}
    fft: dict[tuple, tuple[int, int] | None] = {}
    for key, g in kernels.groupby(["case", "layer", "direction"], sort=False) if len(kernels) else []:
        wino[key] = winograd_tile(g["kernel_name"])
        fft[key] = fft_size(g["kernel_name"])
    exp, why = [], []
    for r in kernels.itertuples(index=False):
        name = str(r.kernel_name)
        op = r.canonical_op if isinstance(r.canonical_op, str) else None  # NA: a kernel left unpaired
        if op not in ("conv2d", "linear") or not is_gemm_kernel(name):
            exp.append(None)
            why.append(None)
            continue
        if r.direction not in flops.DIRECTIONS:
            exp.append(None)
            why.append(f"direction {r.direction!r}: the records do not say which gradient (data or weight) it is")
            continue
        key = (r.case, r.layer, r.direction)
        e, w = expected_flops(name, r.grid, r.layer, r.direction, int(r.batch_size), wino.get(key), fft.get(key))
        exp.append(e)
        why.append(w)
    return exp, why
