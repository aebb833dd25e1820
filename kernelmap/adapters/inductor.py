"""``torch.compile`` (TorchInductor) in a Kineto trace: its wrapper spans and its generated kernels.

* Wrapper spans (``Torch-Compiled Region: 0/0``, ``CompiledFunction``, ``CompiledFunctionBackward``,
  ``TorchDynamo Cache Lookup``, ...) are the compiled region's plumbing, not ops of the model: they
  are ``annotation`` rows, so that the ops inside them (extern ``aten::convolution``, ``aten::mm``,
  and each generated kernel's own span) are the outermost ops.
* A generated kernel (``triton_poi_fused_convolution_relu_0`` on the GPU, its launching span of the
  same name; ``cpp_fused_relu_max_pool2d_with_indices_1`` on the CPU, a span where Inductor's
  ``cpp.enable_kernel_profile`` is on) is named after the ATen ops it fuses. As the XLA adapter does
  for fusions, it is attributed to ONE canonical op, the first of ``PRIORITY`` among those it fuses;
  its direction is the phase region's it runs in (the forward graph's kernels are forward work even
  where Inductor names one after a backward op; the backward graph's are backward); the optimizer
  region's kernels are ``sgd_update``; outside a phase region, bwd where it fuses a backward op. Its
  library is ``native`` (the framework's own kernel, as XLA's fusions are).
  ``op_name`` keeps the kernel's name. The backward graph's extern calls (``aten::mm`` in the backward
  region, outside any autograd node) are backward. Layers: a generated kernel's name does not say which layer it
  belongs to; its layer stays NA unless the trace says so otherwise.

``fused_ops`` is not shared with ``fused_ops.fused_names`` (MXNet's ``_FusedOp`` kernels): the grammars differ; here
the known ATen words are picked out of the name's ``<ops>`` and the rest skipped, there every part between the
prefix and each ``_`` must be a known op name or the kernel is not read.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from .. import strings
from ..frameworks.spec import LAYERS
from . import canonical

WRAPPER = re.compile(r"^(Torch-Compiled Region: .*|CompiledFunction|CompiledFunctionBackward|"
                     r"autograd::engine::evaluate_function: CompiledFunctionBackward|TorchDynamo Cache Lookup|"
                     r"Pregraph bytecode|AOTDispatcher Runtime Wrapper Prologue|## .* ##|"
                     r"CompiledFxGraph|cudagraphs?.*|CUDAGraphNode.*)$")
GENERATED = re.compile(r"^(?:graph_\d+_)?(?:triton|cpp)_(?:[a-z]+_)?fused_(?P<ops>.*?)_?(?P<index>\d+)$")

# ATen names a generated kernel's name may hold -> (canonical op, direction); longest first when matching
ATEN_TOKENS: dict[str, tuple[str, str]] = {
    "convolution_backward": ("conv2d", "bwd"), "convolution": ("conv2d", "fwd"),
    "threshold_backward": ("relu", "bwd"), "relu": ("relu", "fwd"),
    "max_pool2d_with_indices_backward": ("max_pool2d", "bwd"), "max_pool2d_with_indices": ("max_pool2d", "fwd"),
    "_log_softmax_backward_data": ("log_softmax", "bwd"), "_log_softmax": ("log_softmax", "fwd"),
    "nll_loss_backward": ("nll_loss", "bwd"), "nll_loss_forward": ("nll_loss", "fwd"),
    "addmm": ("linear", "fwd"), "mm": ("linear", "fwd"),
    "view": ("flatten", "fwd"), "clone": ("copy", "none"), "sum": ("sum", "none"),
    "add": ("add", "none"), "mul": ("mul", "none"), "sub": ("add", "none"), "zeros": ("fill", "none"),
    "fill": ("fill", "none"), "scatter": ("nll_loss", "bwd"), "gather": ("nll_loss", "fwd"),
}
PRIORITY = ("conv2d", "linear", "max_pool2d", "log_softmax", "nll_loss", "relu", "flatten", "sum", "add", "mul",
            "copy", "fill")
_TOKEN = re.compile("|".join(sorted(map(re.escape, ATEN_TOKENS), key=len, reverse=True)))
PHASE_DIRECTION = {"optimizer": ("sgd_update", "update"), "backward": (None, "bwd"), "forward": (None, "fwd")}


def fused_ops(name: str) -> list[tuple[str, str]] | None:
    """The (canonical op, direction) of each ATen op a generated kernel's name holds, in name order;
    None for a name Inductor did not generate."""
    m = GENERATED.match(name)
    if not m:
        return None
    return [ATEN_TOKENS[t] for t in _TOKEN.findall(m.group("ops"))]


def classify(name: str, phase: str | None) -> tuple[str, str] | None:
    """(canonical op, direction) of a generated kernel run in ``phase``; None for another name."""
    ops = fused_ops(name)
    if ops is None:
        return None
    canon_phase, dir_phase = PHASE_DIRECTION.get(phase or "", (None, None))
    if canon_phase:  # the optimizer's kernels are its update, whatever arithmetic they name
        return canon_phase, dir_phase
    if not ops:
        return "other", dir_phase or "none"
    canon = min((c for c, _ in ops), key=lambda c: PRIORITY.index(c) if c in PRIORITY else len(PRIORITY))
    if dir_phase:  # the graph it runs in says it: the forward graph's kernels are forward work (Inductor
        # names a forward max-pool kernel after max_pool2d_with_indices_backward), the backward graph's
        # backward work (its recomputed forward ops included)
        return canon, dir_phase
    direc = next(d for c, d in ops if c == canon)
    return canon, "bwd" if any(d == "bwd" for _, d in ops) else direc


def mark_wrappers(kind: np.ndarray, names: list, kinds: strings.Vocab, name_codes: np.ndarray) -> None:
    """Make the compiled region's wrapper spans annotations, in place (``kind`` codes into ``kinds``)."""
    wrap = np.array([bool(WRAPPER.match(n)) for n in names] + [False], dtype=bool)
    if not wrap.any():
        return
    op = kinds.codes_of(["op"])[0]
    kind[(kind == op) & wrap[name_codes]] = kinds.code("annotation")


def mark_wrapper_rows(df: pd.DataFrame) -> None:
    """``mark_wrappers`` on a records frame (the nsys adapter's NVTX ranges), in place: the compiled region's
    wrapper ops become annotations."""
    names = strings.distinct(df["op_name"])
    wrappers = [n for n in names if isinstance(n, str) and WRAPPER.match(n)]
    if wrappers:
        rows = np.flatnonzero(strings.isin(df["kind"], ["op"]) & strings.isin(df["op_name"], wrappers))
        strings.set_rows(df, "kind", rows, "annotation")


def _linear_halves(df: pd.DataFrame, flipped: np.ndarray) -> None:
    """The backward graph's extern ``aten::mm`` of a linear layer, and the kernels it launched: which half of
    the layer's backward it computes (``canonical.linear_half`` of its input shapes), in place. In eager
    traces the kineto adapter does this under the autograd node; here the rows were forward until now."""
    mm = np.flatnonzero(flipped & strings.isin(df["kind"], ["op"]) & strings.isin(df["op_name"], canonical.GEMM_OPS)
                        & df["layer"].notna().to_numpy())
    if not len(mm):
        return
    weights = {x.name: x.weight_shape for x in LAYERS if x.kind == "linear"}
    half: dict[int, str] = {}  # op event id -> bwd_data | bwd_weight
    for eid, layer, shapes in zip(df["event_id"].to_numpy()[mm].tolist(), df["layer"].array[mm].tolist(),
                                  df["shapes"].array[mm].tolist(), strict=True):
        h = canonical.linear_half(weights.get(layer), json.loads(shapes) if isinstance(shapes, str) else None)
        if h is not None:
            half[eid] = h
    if not half:
        return
    ops = df["op_event_id"].to_numpy(dtype="float64", na_value=np.nan)
    own = df["event_id"].to_numpy()
    key = np.where(strings.isin(df["kind"], ["op"]), own, ops)  # an op row is its own launcher
    rows = np.flatnonzero(flipped & pd.Series(key).isin(list(half)).to_numpy())
    strings.set_rows(df, "direction", rows, [half[int(k)] for k in key[rows]])


def attribute(df: pd.DataFrame) -> int:
    """Set canonical op and direction of generated-kernel rows (their spans and their kernels) in place;
    and, in a trace of a compiled step, make the backward graph's extern calls (an ``aten::mm`` run in
    the backward region, outside any autograd node) backward. Returns how many rows were set."""
    if not strings.isin(df["op_name"], ["CompiledFunctionBackward"]).any():
        return 0
    fwd_in_bwd = strings.isin(df["phase"], ["backward"]) & strings.isin(df["direction"], ["fwd"])
    strings.set_rows(df, "direction", np.flatnonzero(fwd_in_bwd), "bwd")
    _linear_halves(df, fwd_in_bwd)
    is_op = strings.isin(df["kind"], ["op"])
    is_k = strings.isin(df["kind"], ["kernel"])
    # as objects: an nsys export's names are categoricals of different categories
    name = df["op_name"].astype(object).where(is_op, df["kernel_name"].astype(object))
    codes, uniq = strings.factorize(name)
    gen = np.array([bool(GENERATED.match(u)) for u in uniq] + [False], dtype=bool)[codes]
    rows = np.flatnonzero(gen & (is_op | is_k))
    if not len(rows):
        return 0
    # a generated kernel is the framework's own, as XLA's fusions are: no GPU library launched it (a triton
    # kernel fusing a convolution's bias and ReLU is not a cuDNN kernel waiting for its call)
    strings.set_rows(df, "library", np.flatnonzero(gen & is_k), "native")
    phases = df["phase"].to_numpy(dtype=object)[rows]
    names = name.to_numpy(dtype=object)[rows]
    cache: dict = {}
    canon, direc = [], []
    for n, p in zip(names, phases, strict=True):
        p = p if isinstance(p, str) else None
        c = cache.get((n, p)) or cache.setdefault((n, p), classify(n, p))
        canon.append(c[0])
        direc.append(c[1])
    strings.set_rows(df, "canonical_op", rows, pd.array(canon, dtype=df["canonical_op"].dtype)
                     if not isinstance(df["canonical_op"].dtype, pd.CategoricalDtype) else np.array(canon, dtype=object))
    strings.set_rows(df, "direction", rows, pd.array(direc, dtype=df["direction"].dtype)
                     if not isinstance(df["direction"].dtype, pd.CategoricalDtype) else np.array(direc, dtype=object))
    return len(rows)
