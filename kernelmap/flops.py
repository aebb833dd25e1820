"""FLOPs of the model's conv and linear work, from the shapes in the workload spec.

Counted as 2 x multiply-accumulates. For conv2d (stride 1, padding 1, 3x3, so the output keeps the
input's height and width): ``2 * N * C_out * H * W * C_in * kh * kw``; the data gradient and the
weight gradient each cost the same. For linear: ``2 * N * in * out`` per direction. The spatial
size a conv sees follows the spec: 28x28 for conv1, then halved by each 2x2 max-pool (14x14 for
conv2). The bias add and its gradient are not counted.
"""

from __future__ import annotations

from kernelmap.frameworks import spec

DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")


def _conv_input_hw() -> dict[str, tuple[int, int]]:
    h, w = spec.INPUT_SHAPE[1:]
    out = {}
    for layer in spec.LAYERS:
        if layer.kind == "conv2d":
            out[layer.name] = (h, w)
            h, w = h // 2, w // 2  # each conv is followed by a 2x2 max-pool
    return out


_HW = _conv_input_hw()
_LAYERS = {layer.name: layer for layer in spec.LAYERS}


def layer_flops(layer: str, direction: str, batch_size: int) -> int | None:
    """FLOPs of one ``direction`` pass of ``layer`` over a batch; None where it is not model work."""
    lay = _LAYERS.get(layer)
    if lay is None or direction not in DIRECTIONS:
        return None
    if lay.kind == "conv2d":
        c_out, c_in, kh, kw = lay.weight_shape
        h, w = _HW[layer]
        return 2 * batch_size * c_out * h * w * c_in * kh * kw
    out_f, in_f = lay.weight_shape
    return 2 * batch_size * in_f * out_f



# --- FLOPs of one library call, from the sizes its own log records --------------------------------
def conv2d_call_flops(w: list[int] | None, y: list[int] | None) -> int | None:
    """``2 * N * C_out * H_out * W_out * (C_in / groups) * kh * kw`` from the filter ``w``
    ([C_out, C_in/groups, kh, kw]) and the output ``y`` ([N, C_out, H_out, W_out]); the same for
    forward, data gradient and weight gradient. None unless both are 4-d with matching C_out."""
    if not (_ints(w, 4) and _ints(y, 4)) or w[0] != y[1]:
        return None
    n, c_out, h, wd = y
    return _fits(2 * n * c_out * h * wd * w[1] * w[2] * w[3])


def gemm_call_flops(m: int | None, n: int | None, k: int | None, batch: int | None = 1) -> int | None:
    """``2 * m * n * k * batch`` of a (batched) matrix multiply; None where a size is unknown."""
    if not _ints([m, n, k, batch], 4):
        return None
    return _fits(2 * m * n * k * batch)


def _fits(flops: int) -> int | None:
    """None for a count no int64 column holds (only a corrupt log gets there)."""
    return flops if flops < 2**63 else None


def _ints(v, n: int) -> bool:
    return isinstance(v, list | tuple) and len(v) == n and all(isinstance(x, int) and x >= 0 for x in v)


# --- the GEMM each direction is, as a tiled kernel runs it ------------------------------------------
def gemm_dims(layer: str, direction: str, batch_size: int, c_in_align: int = 1) -> tuple[int, int, int] | None:
    """(M, N, K) of the GEMM a ``direction`` of ``layer`` is, ``2 * M * N * K`` = ``layer_flops``. A conv as an
    implicit GEMM in CUTLASS's convention (docs/implicit_gemm_convolution.md of NVIDIA/cutlass): forward
    M = N·H·W, N = C_out, K = C_in·kh·kw; data gradient M = N·H·W, N = C_in, K = C_out·kh·kw; weight gradient
    M = C_out, N = C_in·kh·kw, K = N·H·W. A linear layer as cuBLAS runs a row-major framework's matmul (column
    major: C^T = B^T A^T): forward m = out, n = batch, k = in; data gradient m = in, n = batch, k = out; weight
    gradient m = in, n = out, k = batch. ``c_in_align``: a conv's C_in rounded up to a multiple of it (a kernel
    that reads the input that many channels an access runs on an input padded so: ``kernelmap/gemmwork.py``);
    ``layer_flops`` is the unpadded GEMM's. None where ``direction`` is not one of ``DIRECTIONS``."""
    lay = _LAYERS.get(layer)
    if lay is None or direction not in DIRECTIONS:
        return None
    if lay.kind == "conv2d":
        c_out, c_in, kh, kw = lay.weight_shape
        c_in = -(-c_in // c_in_align) * c_in_align
        npq = batch_size * _HW[layer][0] * _HW[layer][1]
        return {"fwd": (npq, c_out, c_in * kh * kw), "bwd_data": (npq, c_in, c_out * kh * kw),
                "bwd_weight": (c_out, c_in * kh * kw, npq)}[direction]
    out_f, in_f = lay.weight_shape
    return {"fwd": (out_f, batch_size, in_f), "bwd_data": (in_f, batch_size, out_f),
            "bwd_weight": (in_f, out_f, batch_size)}[direction]


def winograd_wgrad_dims(layer: str, batch_size: int, m: int) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of the batched GEMM of a Winograd weight gradient with output tiles of m x m: one GEMM per
    point of the (m + kh - 1) x (m + kw - 1) transformed tile, M = C_out, N = C_in, K = the tiles,
    N·ceil(H/m)·ceil(W/m) (cuDNN's ``winogradWgrad*4x4`` kernels: F(4x4, 3x3), 6x6 = 36 GEMMs). None for a
    layer that is not a conv."""
    lay = _LAYERS.get(layer)
    if lay is None or lay.kind != "conv2d":
        return None
    c_out, c_in, kh, kw = lay.weight_shape
    h, w = _HW[layer]
    return (m + kh - 1) * (m + kw - 1), c_out, c_in, batch_size * -(-h // m) * -(-w // m)


def fft_gemm_dims(layer: str, direction: str, batch_size: int, fh: int, fw: int) -> tuple[int, int, int, int] | None:
    """(frequency points, M, N, K) of the batched complex GEMM of an FFT convolution with fh x fw transforms (cuDNN's
    ``fft2d_r2c_16x16`` ... ``xmma_gemm_cf32cf32`` ... ``fft2d_c2r_16x16``): by the convolution theorem each point
    of the real-to-complex transform, fh·(fw/2 + 1) of them, is one GEMM over the channels: forward
    Y[n,k] = Σ_c X[n,c]·W[k,c] (M = N, N = C_out, K = C_in), data gradient dX[n,c] = Σ_k dY[n,k]·W[k,c] (N, C_in,
    C_out), weight gradient dW[k,c] = Σ_n dY[n,k]·conj(X[n,c]) (C_out, C_in, N). None for a layer that is not a
    conv, or whose input and filter (H + kh - 1) exceed one transform: the FFT then tiles the image, a count its
    kernels' names do not give."""
    lay = _LAYERS.get(layer)
    if lay is None or lay.kind != "conv2d" or direction not in DIRECTIONS:
        return None
    c_out, c_in, kh, kw = lay.weight_shape
    h, w = _HW[layer]
    if h + kh - 1 > fh or w + kw - 1 > fw:
        return None
    m, n, k = {"fwd": (batch_size, c_out, c_in), "bwd_data": (batch_size, c_in, c_out),
               "bwd_weight": (c_out, c_in, batch_size)}[direction]
    return fh * (fw // 2 + 1), m, n, k
