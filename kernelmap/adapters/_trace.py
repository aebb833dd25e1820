"""Linking and labelling shared by the profiler adapters (Kineto, nsys): op nesting, canonical
op, phase, iteration, layer; kernel -> runtime launch (correlation) -> op."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import frameworks
from .. import strings as S
from ..schema import DTYPES, phase_of
from . import canonical as C

HOST_KINDS = ("op", "annotation", "runtime", "step")
# the columns ``label`` reads besides those it fills (op_event_id, canonical_op, direction, phase,
# iteration, layer) and event_id
LABEL_INPUTS = ("kind", "op_name", "start_ns", "dur_ns", "tid", "seq", "correlation_id", "kernel_name", "library")
DEVICE_KINDS = ("kernel", "memcpy", "memset")


def label(df: pd.DataFrame, dims: list | None, framework: str,
          on_device: np.ndarray | None = None) -> pd.DataFrame:
    """Fill op_event_id, canonical_op, direction, phase, iteration, layer in place and return df.

    ``on_device`` (optional, per row): annotation and step rows that lie on a GPU stream's clock
    (Kineto's ``gpu_user_annotation`` copy of each ``ProfilerStep#N``, ``cuda_sync``...): they are
    not host spans (no nesting); a device step gives the iteration of device rows without a launch
    only, every other row takes its step from the host's step regions.

    ``df`` holds kind, op_name, start_ns, dur_ns, tid, correlation_id, seq (event_id = row
    position); ``dims`` is, per row, the op's list of input shapes (or None). The labels are
    worked out as codes (``strings.Vocab``) and made strings once, at the end. ``df`` may be an
    adapter's own frame (``_common.frame``): the inputs it lacks are added as NA."""
    for col in LABEL_INPUTS:
        if col not in df:
            df[col] = pd.Series(pd.NA, index=df.index, dtype=DTYPES[col]).array
    n = len(df)
    is_kind = _kinds(df["kind"])
    name_codes, name_u = S.factorize(df["op_name"], small=True)  # only indexed with and compared
    start, has_start = _ints(df["start_ns"])  # read only: the column's own values where none is NA
    start = start if has_start.all() else np.where(has_start, start, 0)
    del has_start
    dur = _ints(df["dur_ns"])

    # row positions in int32 where the rows allow it (half the memory of the row-length tables)
    pos_t = np.int32 if n < 2**31 else np.int64
    canon, direc, layers, phases = S.Vocab(), S.Vocab(), S.Vocab(), S.Vocab()

    # regions: kernelmap:forward|backward|optimizer and steps (kernelmap:step#N / ProfilerStep#N)
    # (one answer per distinct name; the last entry answers for NA, code -1)
    ann = is_kind("annotation", "step")
    ph_u = np.full(len(name_u) + 1, -1, dtype=np.int32)
    st_u = np.zeros(len(name_u) + 1, dtype=np.int64)
    is_step_u = np.zeros(len(name_u) + 1, dtype=bool)
    for c in np.unique(name_codes[ann]).tolist():
        if c >= 0:
            ph_u[c] = phases.code(C.region_phase(name_u[c]))
            st = C.step_number(name_u[c])
            is_step_u[c], st_u[c] = st is not None, st or 0
    rmask = ann & (ph_u[name_codes] >= 0)
    smask = ann & is_step_u[name_codes]
    dev_ann = np.zeros(n, dtype=bool) if on_device is None else (np.asarray(on_device, dtype=bool) & ann)
    rmask &= ~dev_ann
    host = is_kind(*HOST_KINDS) & ~(rmask | smask) & ~dev_ann
    hidx = np.flatnonzero(host)
    tid = df["tid"].to_numpy(dtype="int64", na_value=-1)

    # canonical op and direction of each distinct name (mapped for op and annotation rows only)
    table = [C.lookup(u, framework) for u in name_u]
    canon_u = np.array([canon.code(v[0] if v else None) for v in table] + [-1], dtype=np.int32)
    direc_u = np.array([direc.code(v[1] if v else None) for v in table] + [-1], dtype=np.int32)
    canon_a = np.where(is_kind("op", "annotation"), canon_u[name_codes], -1)
    mapped = canon_a >= 0
    is_op = is_kind("op")
    # nesting of host spans per thread, resolved over host rows only (local indices): the outermost
    # mapped span above each (its top) and the nearest enclosing op (where a launch sits)
    parent, top_local, op_local = C.forest(tid[hidx], start[hidx], _ends(start, dur, hidx), mapped[hidx], is_op[hidx])
    # exceptions to "the outermost mapped op" (canonical.COLLECTIVE, canonical.RECOMPUTED_OPS): the
    # outermost collective on the chain; a forward op re-run inside a backward node
    coll_local, recompute_local = _launch_labels(parent, top_local, name_codes[hidx], canon_a[hidx], name_u,
                                                 canon, direc, direc_u, framework)
    del parent
    top = np.full(n, -1, dtype=pos_t)
    top[hidx] = np.where(top_local >= 0, hidx[np.maximum(top_local, 0)], -1)
    inner_op = np.full(n, -1, dtype=pos_t)
    inner_op[hidx] = np.where(op_local >= 0, hidx[np.maximum(op_local, 0)], -1)
    # (row-length temporaries are dropped once used, here and below: peak memory of a large trace)
    del top_local, op_local, tid, mapped

    has_top = top >= 0
    top0 = np.maximum(top, 0)
    out_canon = np.where(has_top, canon_a[top0], -1).astype(np.int32)
    out_dir = np.where(has_top, direc_u[name_codes[top0]], -1).astype(np.int32)
    other = is_op & ~has_top
    out_canon[other] = canon.code("other")
    out_dir[other] = direc.code("none")
    del canon_a, other
    # the phase rule reads the outermost op's labels (a collective inside AccumulateGrad: backward)
    ph_canon, ph_dir = out_canon.copy(), out_dir.copy()
    recompute = np.zeros(n, dtype=bool)
    if coll_local is not None:
        rows = hidx[coll_local >= 0]
        out_canon[rows], out_dir[rows] = canon.code(C.COLLECTIVE), direc.code("none")
    if recompute_local is not None:
        sel = recompute_local >= 0
        rows, src = hidx[sel], hidx[recompute_local[sel]]
        out_canon[rows], out_dir[rows] = canon_u[name_codes[src]], direc.code("fwd")
        recompute[rows] = True
        del sel, rows, src

    # layers: own (weight argument by position) -> per top-level tree -> through seq for backward
    own = np.full(n, -1, dtype=np.int32)
    if dims is not None:
        # only ops with a weight argument can name a layer
        weight_ops = [c for c, u in enumerate(name_u) if u in C.WEIGHT_ARG_OPS]
        rows = np.flatnonzero(is_op & np.isin(name_codes, weight_ops))
        own[rows] = _own_layers(rows, name_codes, name_u, dims, layers)
    tree_layer = _tree_layers(top, own)
    layer = np.where(has_top, tree_layer[top0], own).astype(np.int32)
    del tree_layer, own
    seq = df["seq"].to_numpy(dtype="int64", na_value=-1)
    fwd_rows = (seq >= 0) & (out_dir == direc.codes_of(["fwd"])[0]) & (layer >= 0)
    if fwd_rows.any():
        # the layer of each forward seq (the last such row's, where several have one seq)
        seq_u, last = np.unique(seq[fwd_rows][::-1], return_index=True)
        seq_layer = layer[fwd_rows][::-1][last]
        # a backward tree's seq: the first seq in it, in start order (nsys' evaluate_function
        # wrapper has none, the autograd node inside it has the forward op's)
        with_seq = np.flatnonzero(has_top & (seq >= 0))
        by_start = with_seq[np.argsort(start[with_seq], kind="stable")]
        tops, first = np.unique(top[by_start], return_index=True)  # the trees with a seq, ascending
        tree_seq = seq[by_start[first]]  # each one's first seq (>= 0)
        # the rows still without a layer whose tree has a seq, and that seq (looked up per row
        # among those trees: no row-length table of trees)
        cand = np.flatnonzero((layer < 0) & has_top)
        at = np.minimum(np.searchsorted(tops, top[cand]), len(tops) - 1)
        in_tree = tops[at] == top[cand]
        need, want = cand[in_tree], tree_seq[at[in_tree]]
        hit = np.minimum(np.searchsorted(seq_u, want), len(seq_u) - 1)
        found = seq_u[hit] == want
        layer[need[found]] = seq_layer[hit[found]]
        del with_seq, by_start, tops, first, tree_seq, cand, at, in_tree, need, want, hit, found
    del seq, fwd_rows, top0
    layer[np.isin(out_canon, canon.codes_of(C.LOSS_OPS))] = layers.code("loss")
    layer[out_canon == canon.code(C.COLLECTIVE)] = -1
    del hidx, coll_local, recompute_local

    # phase and iteration by time containment of the start (any thread), then name rules
    asynchronous = framework in C.ASYNC_FRAMEWORKS  # ops run after the issuing host left its regions
    # (for those, a phase region and a step reach to the next one's start, as in mxnet_profiler)
    rrows, srows = np.flatnonzero(rmask), np.flatnonzero(smask)
    region_end = C.until_next(start[rrows], _ends(start, dur, rrows)) if asynchronous else _ends(start, dur, rrows)
    phase = np.append(ph_u[name_codes[rmask]], -1)[C.region_index(start, start[rmask], region_end)]
    step_end = C.until_next(start[srows], _ends(start, dur, srows)) if asynchronous else _ends(start, dur, srows)
    host_step = ~dev_ann[srows]
    step_no = np.append(st_u[name_codes[smask]], 0)
    step_at = C.region_index(start, start[srows[host_step]], step_end[host_step])
    step_at = _among(host_step, step_at)
    if not host_step.all():  # device rows (those without a launch keep this): the GPU's own step copy
        dev = is_kind(*DEVICE_KINDS)
        d_at = C.region_index(start[dev], start[srows[~host_step]], step_end[~host_step])
        d_at = _among(~host_step, d_at)
        step_at[dev] = np.where(d_at >= 0, d_at, step_at[dev])
        del dev, d_at
    it_na = step_at < 0  # iteration: step number (int64) where it_na is False
    it_val = step_no[step_at]
    del step_at, name_codes, rrows, srows
    if not _has_shapes(dims) and is_op.any():  # a trace without shapes (MXNet's NVTX ranges): layer by position
        pos = C.layers_by_position(is_op, canon.take(out_canon), direc.take(out_dir),
                                   np.where(it_na, np.nan, it_val), start)
        need = has_top & (layer < 0)
        layer[need] = np.array([layers.code(v) for v in pos[top[need]].tolist()], dtype=np.int32)
    del top, has_top, start

    # device rows inherit from their runtime launch (same correlation id)
    dev = is_kind(*DEVICE_KINDS)
    corr, has_corr = _ints(df["correlation_id"])
    has_corr = has_corr & (corr >= 0)
    rt = np.flatnonzero(is_kind("runtime") & has_corr)
    launch = pd.Series(rt, index=corr[rt])
    launch = launch[~launch.index.duplicated(keep="first")]
    didx = np.flatnonzero(dev & has_corr)
    del has_corr
    src = launch.reindex(corr[didx]).to_numpy(dtype="float64")
    ok = ~np.isnan(src)
    d_ok, s_ok = didx[ok], src[ok].astype("int64")
    inner_op[d_ok] = inner_op[s_ok]
    for arr in (out_canon, out_dir, layer, phase, it_val, it_na, ph_canon, ph_dir, recompute):
        arr[d_ok] = arr[s_ok]
    # collective kernels (NCCL/RCCL by name): a collective whatever launched them
    kcodes, knames = S.factorize(df["kernel_name"], small=True)
    coll_k = np.array([C.is_collective_kernel(u) for u in knames] + [False], dtype=bool)[kcodes] & dev
    if coll_k.any():
        out_canon[coll_k], out_dir[coll_k] = canon.code(C.COLLECTIVE), direc.code("none")
        layer[coll_k] = -1
    del kcodes, knames, coll_k
    del corr, rt, launch, didx, src, ok, d_ok, s_ok
    # device rows without a launch keep the regions of their own (device) time, found above

    op_ids = df["event_id"].to_numpy(dtype="int64")
    df["op_event_id"] = pd.arrays.IntegerArray(np.where(inner_op >= 0, op_ids[np.maximum(inner_op, 0)], 0),
                                               inner_op < 0)
    df["canonical_op"] = canon.strings(out_canon)
    df["direction"] = direc.strings(out_dir)
    df["layer"] = layers.strings(layer)
    df["iteration"] = pd.arrays.IntegerArray(np.where(it_na, 0, it_val), it_na)
    del op_ids, it_val, it_na
    # the region's phase, else the direction rule's (schema.phase_of, once per distinct pair);
    # asynchronous ops: the name's first (canonical.ASYNC_FRAMEWORKS)
    rule = np.array([[phases.code(phase_of(d, c)) for c in [None, *canon.values]] for d in [None, *direc.values]],
                    dtype=np.int32)  # [direction code + 1, canonical code + 1]: a few dozen pairs
    fallback = rule[ph_dir + 1, ph_canon + 1]
    fallback[recompute] = phases.code("backward")  # a recomputed forward op runs in the backward pass
    take = (fallback >= 0) if asynchronous else (phase < 0)
    phase[take] = fallback[take]
    df["phase"] = phases.strings(phase)
    del out_canon, out_dir, layer, fallback, take, phase, ph_canon, ph_dir, recompute, dev
    refine_direction(df)
    _refine_linear(df, inner_op, dims)
    return df


def _launch_labels(parent, top, name_codes, canon_a, name_u, canon: S.Vocab, direc: S.Vocab, direc_u,
                   framework: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Over host spans (``parent``, ``top``: canonical.forest's, local indices): the outermost
    collective span on each span's chain (itself included), and for spans inside a recomputed
    forward op (a forward op of ``canonical.RECOMPUTED_OPS`` with a backward node above it) that
    op; -1 where none, None where no span has one."""
    coll = None
    cc = int(canon.codes_of([C.COLLECTIVE])[0])  # -2: no name maps to it
    if cc >= 0 and (canon_a == cc).any():
        coll = C.outermost_mapped(parent, canon_a == cc)
    recompute = None
    fwd = int(direc.codes_of(["fwd"])[0])
    if fwd >= 0:
        dir_a = np.where(canon_a >= 0, direc_u[name_codes], -1)
        not_names = np.array([u in C.NOT_RECOMPUTE_NAMES for u in name_u] + [False], dtype=bool)[name_codes]
        cand = (dir_a == fwd) & _in_values(canon_a, canon, C.RECOMPUTED_OPS) & ~not_names
        ctx = np.array([C.backward_context(u, framework) for u in name_u] + [False], dtype=bool)[name_codes]
        if cand.any() and ctx.any():
            f_top, b_top = C.outermost_mapped(parent, cand), C.outermost_mapped(parent, ctx)
            depth = C.tree_depth(parent)
            ok = (f_top >= 0) & (b_top >= 0)
            ok[ok] = depth[b_top[ok]] < depth[f_top[ok]]
            if ok.any():
                recompute = np.where(ok, f_top, -1)
    return coll, recompute


def _in_values(codes: np.ndarray, vocab: S.Vocab, values) -> np.ndarray:
    """Whether each code (-1: NA) is that of one of ``values``."""
    return np.isin(codes, vocab.codes_of([v for v in values if v in vocab.values]))


def _among(subset: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Positions ``at`` into the rows of a boolean ``subset`` as positions into all its rows (-1 stays)."""
    pos = np.append(np.flatnonzero(subset), -1)
    return pos[np.where(at >= 0, at, len(pos) - 1)]


def _own_layers(rows: np.ndarray, name_codes: np.ndarray, name_u, dims, layers: S.Vocab) -> np.ndarray:
    """The layer code that each op row of ``rows`` names by its weight argument (-1: none); one
    answer per (name, shape list object)."""
    known: dict = {}
    out = np.full(len(rows), -1, dtype=np.int32)
    for j, i in enumerate(rows.tolist()):
        d = dims[i]
        if d is not None:
            key = (name_codes[i], id(d))
            if key not in known:
                known[key] = layers.code(C.layer_from_inputs(name_u[name_codes[i]], d))
            out[j] = known[key]
    return out


def _has_shapes(dims) -> bool:
    """Whether a trace's per-row input shapes (a list of shapes per row) hold any: an adapter gives
    None where its trace has none, or rows without a list (None, or NaN where its tables were
    joined)."""
    return dims is not None and any(isinstance(d, list) for d in dims)


def _refine_linear(df: pd.DataFrame, inner_op: np.ndarray, dims: list | None) -> None:
    """Linear backward kernels: the innermost ``aten::mm`` says which half it computes —
    [B,out] x [out,in] is the input gradient (bwd_data), [out,B] x [B,in] the weight's."""
    if dims is None:
        return
    from ..frameworks.spec import LAYERS

    w = {x.name: x.weight_shape for x in LAYERS if x.kind == "linear"}
    # NA (an unattributed kernel) is not "linear": fill before leaving pandas' three-valued logic
    sel = np.flatnonzero(S.isin(df["kind"], DEVICE_KINDS) & S.eq(df["canonical_op"], "linear")
                         & S.eq(df["direction"], "bwd") & (inner_op >= 0))
    if not len(sel):
        return
    ops = inner_op[sel]
    is_mm = S.eq(df["op_name"], "aten::mm")[ops]
    sel, ops = sel[is_mm], ops[is_mm]
    layers = S.objects(df["layer"].array[sel])  # these rows' only (a Categorical's objects are made)
    changed: dict = {}
    known: dict = {}  # (layer, shape list object) -> the half, or None: one answer per distinct pair
    for i, op, layer in zip(sel.tolist(), ops.tolist(), layers.tolist(), strict=True):
        d = dims[op]
        key = (layer, id(d))
        if key not in known:
            known[key] = C.linear_half(w.get(layer) if isinstance(layer, str) else None, d)
        if known[key] is not None:
            changed[i] = known[key]
    S.set_rows(df, "direction", np.fromiter(changed, dtype="int64", count=len(changed)), list(changed.values()))


def refine_direction(df: pd.DataFrame) -> None:
    """Convolution backward kernels: the kernel name says its half (``dgrad`` -> bwd_data,
    ``wgrad`` -> bwd_weight; cuDNN's ``wgrad_alg0_engine``, ``winogradWgradData4x4``,
    ``sm90_xmma_dgrad_implicit_gemm_...`` ...). The unnamed kernels of the same launching op take
    the half of the named kernels around them, in launch order: between two kernels of one half,
    that half. A layout or scaling kernel (``LAYOUT_MARKS``) elsewhere goes with its neighbour:
    before the first or after the last named kernel, the nearest one's; between a dgrad and a wgrad
    kernel, the following call's, except a conversion back to NCHW (``ToNchw``), which ends the
    preceding call. Any other unnamed kernel outside a bracket of one half (an FFT or a gemm ahead
    of the first named kernel: a call of either half) stays ``bwd``: not split, rather than guessed.

    Bias gradients, of a convolution or a linear layer's backward op: cuDNN's ``calc_bias_diff``
    (``cudnnConvolutionBackwardBias``), MXNet's ``AddBiasGrad`` kernels and a native reduction
    (``BIAS_GRAD_MARKS``) are ``bwd_bias``; they are no anchor for the unnamed ones."""
    k = (S.eq(df["kind"], "kernel") & S.isin(df["canonical_op"], ["conv2d", "linear"]) & S.eq(df["direction"], "bwd"))
    if not k.any():
        return
    kidx = np.flatnonzero(k)  # these rows' direction is "bwd"; dirs: theirs from here on
    name_codes, names = S.factorize(df["kernel_name"], small=True)
    name_codes = name_codes[kidx]

    def named(test) -> np.ndarray:  # test(kernel name) of these rows, once per distinct name (NA: False)
        return np.array([bool(test(u)) for u in names] + [False], dtype=bool)[name_codes]

    dirs = np.full(len(kidx), "bwd", dtype=object)
    conv = S.eq(df["canonical_op"], "conv2d")[kidx]
    dirs[conv & named(lambda u: "dgrad" in u.lower())] = "bwd_data"
    dirs[conv & named(lambda u: "wgrad" in u.lower())] = "bwd_weight"
    lib = ~S.eq(df["library"], "native")[kidx] & ~named(lambda u: "at::native" in u)
    pos = np.flatnonzero(df["op_event_id"].notna().to_numpy()[kidx] & lib & conv)
    if len(pos):
        _fill_unnamed(df, kidx, pos, dirs, named)
    bias = named(lambda u: any(m in u for m in BIAS_GRAD_MARKS))
    dirs[bias & S.notna(df["layer"])[kidx]] = "bwd_bias"
    S.set_rows(df, "direction", kidx, dirs)


# kernel names of a bias gradient within a conv2d/linear backward op: cuDNN legacy API's
# cudnnConvolutionBackwardBias, MXNet FullyConnected's, PyTorch's (at::native::reduce_kernel: the
# only reduction in ConvolutionBackward0 and in linear's backward), kernelmap's custom op's
BIAS_GRAD_MARKS = ("calc_bias_diff", "AddBiasGradKernel", "at::native::reduce_kernel",
                   *(m for d in frameworks.REGISTRY.values() for m in d.bias_grad_kernel_marks))
# unnamed kernels that belong to the named kernel next to them: layout conversions and scaling
LAYOUT_MARKS = ("tonhwc", "tonchw", "converttensor", "scalepackedtensor")


def _fill_unnamed(df: pd.DataFrame, kidx: np.ndarray, pos: np.ndarray, dirs: np.ndarray, named) -> None:
    """``refine_direction``'s unnamed kernels (rows ``kidx[pos]``; ``dirs``: the directions of the
    rows ``kidx``, filled in place; ``named(test)``: the test of the rows ``kidx``' kernel names)."""
    sel = kidx[pos]
    # per launching op, in launch order: the nearest named kernel before and after each unnamed one
    start = df["start_ns"].to_numpy(dtype="int64", na_value=0)[sel]
    op = df["op_event_id"].to_numpy(dtype="int64", na_value=0)[sel]
    order = np.lexsort((np.arange(len(sel)), start, op))
    op = op[order]
    at = pos[order]  # the rows' places in dirs
    d = pd.Series(dirs[at])
    half = pd.Series(np.where(d != "bwd", d.to_numpy(dtype=object), None), dtype=object)
    prev = half.groupby(op, sort=False).ffill().to_numpy(dtype=object)
    nxt = half.groupby(op, sort=False).bfill().to_numpy(dtype=object)
    unnamed = (d == "bwd").to_numpy()
    has_prev, has_nxt = pd.notna(prev), pd.notna(nxt)
    tonchw = named(lambda u: "tonchw" in u.lower())[at]
    layout = named(lambda u: any(m in u.lower() for m in LAYOUT_MARKS))[at]
    val = np.where(~has_prev, nxt, np.where(~has_nxt | (prev == nxt) | tonchw, prev, nxt))
    bracketed = has_prev & has_nxt & (prev == nxt)
    fill = unnamed & (has_prev | has_nxt) & (bracketed | layout)
    dirs[at[fill]] = val[fill]


def _kinds(kind: pd.Series):
    """A test of the rows' kind, ``is_kind("op", "runtime")`` -> bool array, by codes of the column's
    distinct values (factorized once)."""
    codes, uniq = S.factorize(kind, small=True)

    def is_kind(*kinds: str) -> np.ndarray:
        return np.isin(codes, [c for c, u in enumerate(uniq) if u in kinds])

    return is_kind


def _ints(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(values as int64, which rows have one) of an integer column: an Int64 array's own values
    and mask, read in place (no row-length copy); other columns converted (NA: 0)."""
    arr = col.array
    if isinstance(arr, pd.arrays.IntegerArray) and arr.dtype == "Int64":
        return arr._data, ~arr._mask
    return col.to_numpy(dtype="int64", na_value=0), col.notna().to_numpy()


def _ends(start: np.ndarray, dur: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """start + duration (NA: 0) of these rows (``dur``: ``_ints``): the ends of the rows asked
    for, not of all."""
    values, has = dur
    return start[rows] + np.where(has[rows], values[rows], 0)


def _tree_layers(top: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per top-level op: the one layer code named by the weights in its tree, -1 if none or several."""
    res = np.full(len(top), -1, dtype=np.int32)
    sel = (top >= 0) & (own >= 0)
    if not sel.any():
        return res
    width = int(own.max()) + 1
    pairs = np.unique(top[sel] * width + own[sel])  # distinct (top, layer), by top
    tops, first, count = np.unique(pairs // width, return_index=True, return_counts=True)
    one = count == 1
    res[tops[one]] = pairs[first[one]] % width
    return res
