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

