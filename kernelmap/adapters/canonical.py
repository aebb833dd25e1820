"""Framework op name -> (canonical op, direction) by each framework's vocabulary (``frameworks/<name>/
ops.py``, read through the registry: ``Framework.vocabulary``), op nesting, phase regions, and layer
inference from weight shapes. No framework is named here.

Everything here is vectorised over unique names or runs one pass over the ops of a trace.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .. import frameworks
from .. import strings as S
from ..frameworks.spec import LAYERS
from ..native import helpers as _native  # optional C helpers: forest's loop, the same answers
from ..strings import STRING


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Depth of each node of a forest given as parent indices (-1 for a root): roots are 0."""
    depth = np.zeros(len(parent), dtype="int64")
    p = parent.copy()
    active = p >= 0
    while active.any():
        depth[active] += 1
        p[active] = parent[p[active]]
        active = p >= 0
    return depth

# Collective communication (NCCL/RCCL, gloo): a category of its own, whatever op launches it (DDP's
# all-reduce runs inside the AccumulateGrad of a gradient hook; that is not an add): the ops a vocabulary
# maps to it or names by its ``collective_prefixes``.
COLLECTIVE = "collective"
# kernel names of collective libraries (NCCL's ncclKernel_*/ncclDevKernel_*; RCCL keeps NCCL's names)
COLLECTIVE_KERNEL_MARKS = ("nccl",)


def is_collective_kernel(name: str) -> bool:
    return any(m in name.lower() for m in COLLECTIVE_KERNEL_MARKS)


# the loss computation, whichever way a framework spells it
LOSS_OPS = frozenset({"log_softmax", "nll_loss", "softmax_cross_entropy", "pick", "mean"})


# Each framework's op names, by the framework whose names they are (a framework whose trace is read by
# its own adapter, such as JAX's xla_trace, keeps its rules there: its descriptor has no vocabulary).
VOCABULARIES = {name: d.vocabulary for name, d in frameworks.REGISTRY.items() if d.vocabulary is not None}
# an export that no framework's marks claim is read with the first registered vocabulary's rules
FALLBACK_FRAMEWORK = next(iter(VOCABULARIES))
# the vocabularies' marks of kernels no GPU library launched: a framework's own (native) and its workload
# variants' (kernelmap's custom op: library "custom")
NATIVE_KERNEL_MARKS = tuple(m for v in VOCABULARIES.values() for m in v.native_kernel_marks)
CUSTOM_KERNEL_MARKS = tuple(m for v in VOCABULARIES.values() for m in v.custom_kernel_marks)


def lookup(name: str, framework: str) -> tuple[str, str] | None:
    """(canonical_op, direction) for one framework op name, or None where there is no rule (also for a
    framework without a vocabulary)."""
    vocabulary = VOCABULARIES.get(framework)
    return vocabulary.lookup(name) if vocabulary is not None else None


def framework_of_names(names) -> str | None:
    """The first framework (registry order) whose op-name prefixes (``aten::``) one of ``names`` carries."""
    for name, v in VOCABULARIES.items():
        if v.op_prefixes and any(str(n).startswith(v.op_prefixes) for n in names):
            return name
    return None


# Activation-checkpoint recompute: a forward op of these canonical ops run again inside a backward
# node (non-reentrant checkpointing unpacks its saved tensors in the node that needs them; the
# reentrant one runs inside CheckpointFunctionBackward) is labelled as that forward op, in the
# backward phase. Not ``aten::mm``: linear's backward computes its gradients with it.
RECOMPUTED_OPS = frozenset({"conv2d", "linear", "relu", "max_pool2d", "batch_norm", "log_softmax"})
NOT_RECOMPUTE_NAMES = frozenset().union(*(v.not_recompute for v in VOCABULARIES.values()))


def backward_context(name: str, framework: str) -> bool:
    """Whether an op name is an autograd node's (its evaluate_function wrapper or a backward op)."""
    vocabulary = VOCABULARIES.get(framework)
    if vocabulary is not None and vocabulary.backward_prefix and name.startswith(vocabulary.backward_prefix):
        return True
    v = lookup(name, framework)
    return v is not None and v[1].startswith("bwd")


def map_names(names: pd.Series, framework: str) -> tuple[pd.Series, pd.Series]:
    """Vectorised ``lookup``: (canonical_op, direction) series with NA where unmapped."""
    canon, direc = map_name_codes(*S.factorize(names), framework)
    return (pd.Series(pd.array(canon, dtype=STRING), index=names.index),
            pd.Series(pd.array(direc, dtype=STRING), index=names.index))


def map_name_codes(codes: np.ndarray, uniq, framework: str) -> tuple[np.ndarray, np.ndarray]:
    """``map_names`` of names given as codes into their distinct values (code -1: NA): object
    arrays, None where unmapped; one lookup per distinct name."""
    table = [lookup(n, framework) for n in uniq]
    canon = np.array([v[0] if v else None for v in table] + [None], dtype=object)
    direc = np.array([v[1] if v else None for v in table] + [None], dtype=object)
    return canon[codes], direc[codes]


def nest(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index of the innermost span enclosing each span on the same thread (-1: none).

    One pass over the spans sorted by (thread, start, longest first) with a stack (the Python twin
    of the native ``forest``'s pass)."""
    n = len(start)
    parent = np.full(n, -1, dtype="int64")
    if n == 0:
        return parent
    order = span_order(tid, start, end)
    tid_s, start_s, end_s = tid[order].tolist(), start[order].tolist(), end[order].tolist()
    order_l = order.tolist()
    stack: list[int] = []  # positions in sorted order
    cur_tid = None
    out = [-1] * n
    for k in range(n):
        t = tid_s[k]
        if t != cur_tid:
            stack.clear()
            cur_tid = t
        s = start_s[k]
        while stack and end_s[stack[-1]] <= s:
            stack.pop()
        if stack:
            out[order_l[k]] = order_l[stack[-1]]
        stack.append(k)
    parent[:] = out
    return parent


def span_order(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The spans' positions sorted by (thread, start, longest first), ties in all three in given
    order: ``np.lexsort((-(end - start), start, tid))``. Where no two spans of a thread start
    together, one stable sort of a single int64 key (thread rank, then start) gives it (several
    times faster on a trace, which is nearly in start order already)."""
    if len(start) > 1:
        # each row's thread rank (threads in sorted order) by hashing, not by sorting the rows:
        # one row-length array (the key, built in place), where np.unique's inverse takes four
        codes, threads = pd.factorize(tid)
        lo = int(start.min())
        span = int(start.max()) - lo
        bits = max(int(len(threads) - 1).bit_length(), 1)
        if span.bit_length() + bits <= 62:
            rank_of = np.empty(len(threads), dtype="int64")
            rank_of[np.argsort(threads, kind="stable")] = np.arange(len(threads))
            key = rank_of[codes]
            del codes
            key <<= span.bit_length()  # rank above the start's bits: (rank << b) | (start - lo)
            key += start
            key -= lo
            order = np.argsort(key, kind="stable")
            key = key[order]
            if not (key[1:] == key[:-1]).any():  # no ties: the length never decides
                return order
    return np.lexsort((-(end - start), start, tid))


def forest(tid: np.ndarray, start: np.ndarray, end: np.ndarray, mapped: np.ndarray,
           is_op: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``nest``'s parents, with each span's ``outermost_mapped`` ancestor and ``nearest_op``: three
    int64 arrays (-1: none). The native helper resolves all three in one pass of nest's stack."""
    if _native is None or len(start) == 0:
        parent = nest(tid, start, end)
        return parent, outermost_mapped(parent, mapped), nearest_op(parent, is_op)
    order = span_order(tid, start, end)
    got = _native.forest(*(np.ascontiguousarray(a, dtype="int64") for a in (tid, start, end, order)),
                         np.ascontiguousarray(mapped, dtype=bool), np.ascontiguousarray(is_op, dtype=bool))
    return tuple(np.frombuffer(a, dtype="int64") for a in got)


def nearest_op(parent: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """For each span, its nearest strict ancestor that is an op; -1 if none is."""
    out = np.full(len(parent), -1, dtype="int64")
    depth = tree_depth(parent)
    for d in range(1, int(depth.max()) + 1 if len(parent) else 0):  # parents first: by depth
        idx = np.flatnonzero(depth == d)
        par = parent[idx]
        out[idx] = np.where(is_op[par], par, out[par])
    return out


def outermost_mapped(parent: np.ndarray, mapped: np.ndarray, depth: np.ndarray | None = None) -> np.ndarray:
    """For each span, the outermost span on its ancestor chain (itself included) that has a
    mapping; -1 if none has. ``depth``: ``tree_depth(parent)`` where the caller has it."""
    n = len(parent)
    out = np.full(n, -1, dtype="int64")
    # resolve in an order where parents come first: by depth
    depth = tree_depth(parent) if depth is None else depth
    for d in range(int(depth.max()) + 1 if n else 0):
        idx = np.flatnonzero(depth == d)
        par = parent[idx]
        inherited = np.where(par >= 0, out[np.maximum(par, 0)], -1)
        out[idx] = np.where(inherited >= 0, inherited, np.where(mapped[idx], idx, -1))
    return out


def region_index(starts: np.ndarray, r_start: np.ndarray, r_end: np.ndarray) -> np.ndarray:
    """For each time in ``starts``, the position (into ``r_start``) of the latest-starting region
    [r_start, r_end) that contains it (regions may nest or overlap: a later-starting region that
    has already ended does not hide an earlier one that still holds the time; of regions starting
    together, the last given); -1 where none does. Each region paints the times it holds, in start
    order (later ones over earlier ones): the work is the sum of the regions' sizes in times."""
    out = np.full(len(starts), -1, dtype="int64")
    if len(r_start) == 0 or len(starts) == 0:
        return out
    order = np.argsort(r_start, kind="stable")
    t_order = np.argsort(starts, kind="stable")
    t_sorted = starts[t_order]
    lo = np.searchsorted(t_sorted, r_start[order], side="left")
    hi = np.searchsorted(t_sorted, r_end[order], side="left")
    painted = np.full(len(starts), -1, dtype="int64")
    for j, a, b in zip(order.tolist(), lo.tolist(), hi.tolist(), strict=True):
        if b > a:
            painted[a:b] = j
    out[t_order] = painted
    return out


def containing(starts: np.ndarray, r_start: np.ndarray, r_end: np.ndarray, r_value: np.ndarray,
               fill=None) -> np.ndarray:
    """For each time in ``starts``, the value of the region [r_start, r_end) containing it (the
    latest-starting one when regions nest or overlap); ``fill`` where none does."""
    idx = region_index(starts, r_start, r_end)
    return np.append(np.asarray(r_value, dtype=object), np.array([fill], dtype=object))[idx]  # -1: fill


_REGION = re.compile(r"^kernelmap:(forward|backward|optimizer)$")
# The workload's region around a whole nsys capture where nsys records the whole process
# (registry.NsysWindow.NVTX_RANGE): the nsys adapter keeps only what starts inside it.
CAPTURE_RANGE = "kernelmap:capture"
_STEP = re.compile(r"^(?:kernelmap:step#|ProfilerStep#)(-?\d+)$")


def region_phase(name: str) -> str | None:
    m = _REGION.match(name)
    return m.group(1) if m else None


def step_number(name: str) -> int | None:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def phase_from_direction(direction: pd.Series, canonical: pd.Series) -> pd.Series:
    """Fallback phase by the direction rule (``schema.phase_series``) where no kernelmap region covers an event."""
    from ..schema import phase_series

    return phase_series(direction, canonical)


# --- frameworks whose operators run asynchronously -------------------------------------------
# A framework whose vocabulary says ``asynchronous`` (MXNet's engine threads) runs operators after the
# host thread that issued them has left the region (kernelmap:forward|backward|optimizer,
# kernelmap:step#N) around the issuing call; the loop waits for each step before issuing the next. So
# for these frameworks an op's phase is its name's (their names say fwd/bwd/update), a region's only
# where the name says none, and a step reaches to the next step's start. Whatever source records their
# ops (the framework's profiler, nsys' NVTX).
ASYNC_FRAMEWORKS = frozenset(name for name, v in VOCABULARIES.items() if v.asynchronous)


def until_next(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Each span's end moved to the next span's start (the last one: to the end of time)."""
    if len(starts) == 0:
        return ends
    order = np.argsort(starts, kind="stable")
    out = np.empty_like(ends)
    nxt = np.append(starts[order][1:], np.iinfo("int64").max)
    out[order] = np.maximum(nxt, ends[order])
    return out


def layers_by_position(is_op: np.ndarray, canonical: np.ndarray, direction: np.ndarray,
                       iteration: np.ndarray, start: np.ndarray, device: np.ndarray | None = None) -> np.ndarray:
    """For traces without shapes (MXNet's): a conv2d/linear op's layer is its position among the
    ops of its kind and direction within the iteration and ``device`` (per row, -1: not known; None: one
    device), in time order (forward in model order, backward in reverse); None where that count differs
    from frameworks/spec.LAYERS. One process driving N devices (MXNet's contexts) runs each layer's op once
    per device a step: counted over the step alone, N times the model's, no op would have its layer."""
    out = np.full(len(is_op), None, dtype=object)
    dev = np.zeros(len(is_op), dtype="int64") if device is None else np.asarray(device, dtype="int64")
    frame = pd.DataFrame({"canon": canonical, "dir": direction, "it": iteration, "start": start, "dev": dev})
    for kind_name in ("conv2d", "linear"):
        names_fwd = [layer.name for layer in LAYERS if layer.kind == kind_name]
        for d, order in (("fwd", names_fwd), ("bwd", names_fwd[::-1])):
            sel = frame[is_op & (frame["canon"] == kind_name).to_numpy() & (frame["dir"] == d).to_numpy()]
            if sel.empty:
                continue
            sel = sel.sort_values("start", kind="stable")
            key = [pd.to_numeric(sel["it"], errors="coerce").fillna(-(10**9)), sel["dev"]]
            pos = sel.groupby(key).cumcount()
            ok = (sel.groupby(key)["canon"].transform("size") == len(order)).to_numpy()
            out[sel.index[ok]] = [order[p] for p in pos[ok].tolist()]
    return out


# --- layers from weight shapes ---------------------------------------------------------------
_WEIGHTS = {tuple(layer.weight_shape): layer.name for layer in LAYERS}


def layer_of_weight(shape) -> str | None:
    """The layer whose weight has this shape (frameworks/spec.py LAYERS), or None."""
    return _WEIGHTS.get(tuple(shape))


# a convolution's bias gradient (cuDNN's BackwardBias: a [1, C, 1, 1] tensor) -> its layer
_CONV_BIASES = {layer.bias_shape: layer.name for layer in LAYERS if layer.kind == "conv2d"}
assert len(_CONV_BIASES) == sum(layer.kind == "conv2d" for layer in LAYERS), "conv biases must tell layers apart"


def conv_layer_from_bias(dims) -> str | None:
    """The spec conv layer whose bias a cuDNN bias tensor ``[1, C, 1, 1]`` is, or None."""
    if not isinstance(dims, list) or len(dims) != 4 or dims[0] != 1 or dims[2:] != [1, 1]:
        return None
    return _CONV_BIASES.get((dims[1],))


# gemm ops with no weight argument of their own (their layer from the two matrices' dims:
# ``linear_layer``, a unique match only), and op name -> (position of the weight among the inputs,
# transposed?): every vocabulary's
GEMM_OPS = tuple(dict.fromkeys(o for v in VOCABULARIES.values() for o in v.gemm_ops))
_WEIGHT_ARG = {op: rule for v in VOCABULARIES.values() for op, rule in v.weight_args.items()}
WEIGHT_ARG_OPS = (*_WEIGHT_ARG, *GEMM_OPS)  # the only op names ``layer_from_inputs`` can give a layer for


_LINEAR = [(layer.name, sorted(layer.weight_shape)) for layer in LAYERS if layer.kind == "linear"]


def linear_layer(dims: list[int]) -> str | None:
    """The spec linear layer whose two weight dims are among ``dims`` (unique match only)."""
    hits = []
    for name, w in _LINEAR:
        rest = list(dims)
        ok = True
        for d in w:
            if d in rest:
                rest.remove(d)
            else:
                ok = False
                break
        if ok:
            hits.append(name)
    return hits[0] if len(hits) == 1 else None


def linear_half(weight, d) -> str | None:
    """The half of a linear layer's backward (``weight``: its (out, in) shape) that an ``aten::mm`` with
    input shapes ``d`` computes — [B,out] x [out,in] the input gradient (bwd_data), [out,B] x [B,in] the
    weight's (bwd_weight) — or None."""
    if weight is None or not isinstance(d, list) or len(d) < 2 \
            or not all(isinstance(x, list) and len(x) == 2 for x in d[:2]):
        return None
    out_f, in_f = weight
    (p, q), (_, r) = d[0], d[1]
    if (q, r) == (out_f, in_f):
        return "bwd_data"
    if (p, r) == (out_f, in_f):
        return "bwd_weight"
    return None


def layer_from_inputs(name: str, dims) -> str | None:
    """The spec layer whose weight is the op's weight argument (by position), or for a ``GEMM_OPS`` op
    the linear layer its two matrices' dims name; None where neither says."""
    if name in GEMM_OPS:
        mats = [d for d in (dims[:2] if isinstance(dims, list) else []) if isinstance(d, list) and len(d) == 2]
        return linear_layer([*mats[0], *mats[1]]) if len(mats) == 2 else None
    rule = _WEIGHT_ARG.get(name)
    if rule is None or not isinstance(dims, list) or len(dims) <= rule[0]:
        return None
    w = dims[rule[0]]
    if not isinstance(w, list):
        return None
    shape = tuple(reversed(w)) if rule[1] else tuple(w)
    return _WEIGHTS.get(shape)
