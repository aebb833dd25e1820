"""Linking and labelling shared by the profiler adapters (Kineto, nsys): op nesting, canonical
op, phase, iteration, layer; kernel -> runtime launch (correlation) -> op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
          on_device: np.ndarray | None = None, process: np.ndarray | None = None) -> pd.DataFrame:
    """Fill op_event_id, canonical_op, direction, phase, iteration, layer in place and return df.

    ``on_device`` (optional, per row): annotation and step rows that lie on a GPU stream's clock
    (Kineto's ``gpu_user_annotation`` copy of each ``ProfilerStep#N``, ``cuda_sync``...): they are
    not host spans (no nesting); a device step gives the iteration of device rows without a launch
    only, every other row takes its step from the host's step regions.

    ``process`` (optional, per row: a code >= 0, -1 none): the process whose correlation ids the row carries,
    where the trace holds several processes that each count their own ids (nsys' one capture of a case's every
    rank: both count from the same first id); a device row then joins the launch of its own process only.

    ``df`` holds kind, op_name, start_ns, dur_ns, tid, correlation_id, seq (event_id = row
    position); ``dims`` is, per row, the op's list of input shapes (or None). The labels are
    worked out as codes (``strings.Vocab``) and made strings once, at the end. ``df`` may be an
    adapter's own frame (``_common.frame``): the inputs it lacks are added as NA.

    The stages, in order, each filling codes of one ``LabelRows`` (-1: none): ``find_regions`` (phase and
    step regions, host spans), ``nest_host_spans`` (each host span's outermost mapped op and nearest op),
    ``label_ops`` (canonical op and direction from the outermost op), ``label_layers`` (by weights, per
    tree, through seq), ``label_steps`` (phase region and iteration by time), ``inherit_from_launches`` (device
    rows take their launch's labels), ``write_labels`` (the columns; the phase rule where no region says
    it); then the kernel names' refinements of direction (``refine_direction``, ``_refine_linear``)."""
    r = label_inputs(df, framework)
    r.process = None if process is None else np.asarray(process, dtype="int64")
    find_regions(r, on_device)
    nest_host_spans(r)
    label_ops(r)
    label_layers(r, dims)
    label_steps(r, dims)
    inherit_from_launches(r)
    write_labels(r)
    refine_direction(df)
    _refine_linear(df, r.inner_op, dims)
    return df


@dataclass(eq=False)
class LabelRows:
    """What ``label``'s stages share: the rows' inputs as arrays, the label vocabularies, and the
    labels as codes into them as the stages fill them (each stage's docstring says what it reads
    and fills; a field a later stage no longer needs is dropped: peak memory of a large trace)."""

    df: pd.DataFrame
    framework: str
    is_kind: Callable[..., np.ndarray]  # is_kind("op", "runtime") -> bool per row
    name_codes: np.ndarray  # op_name codes (-1: NA) into name_u
    name_u: list
    start: np.ndarray  # int64 ns (NA: 0)
    dur: tuple[np.ndarray, np.ndarray]  # (values, has one)
    canon: S.Vocab = field(default_factory=S.Vocab)
    direc: S.Vocab = field(default_factory=S.Vocab)
    layer_v: S.Vocab = field(default_factory=S.Vocab)
    phases: S.Vocab = field(default_factory=S.Vocab)
    # regions: per distinct name (+1: NA) its region's phase code and step number; region, step and
    # device-annotation rows; host spans (rows)
    ph_u: np.ndarray | None = None
    st_u: np.ndarray | None = None
    rmask: np.ndarray | None = None
    smask: np.ndarray | None = None
    dev_ann: np.ndarray | None = None
    hidx: np.ndarray | None = None
    # nesting: per distinct name its canonical op and direction; per row the outermost mapped op
    # (top) and nearest op (inner_op) above it, as rows; collective spans; recomputed spans and
    # their forward ops
    canon_u: np.ndarray | None = None
    direc_u: np.ndarray | None = None
    canon_a: np.ndarray | None = None
    is_op: np.ndarray | None = None
    top: np.ndarray | None = None
    inner_op: np.ndarray | None = None
    coll_rows: np.ndarray | None = None
    recomputed: tuple[np.ndarray, np.ndarray] | None = None
    # op_labels, layers, steps: the labels
    out_canon: np.ndarray | None = None
    out_dir: np.ndarray | None = None
    ph_canon: np.ndarray | None = None  # the outermost op's labels, for the phase rule
    ph_dir: np.ndarray | None = None
    recompute: np.ndarray | None = None
    layer: np.ndarray | None = None
    phase: np.ndarray | None = None
    it_val: np.ndarray | None = None
    it_na: np.ndarray | None = None
    process: np.ndarray | None = None  # label's ``process``: per row its process's code (-1: none), or None

    @property
    def n(self) -> int:
        return len(self.start)

    @property
    def asynchronous(self) -> bool:  # ops run after the issuing host left its regions
        return self.framework in C.ASYNC_FRAMEWORKS


def label_inputs(df: pd.DataFrame, framework: str) -> LabelRows:
    """The inputs of ``label`` (``LABEL_INPUTS``; those ``df`` lacks added as NA) as arrays."""
    for col in LABEL_INPUTS:
        if col not in df:
            df[col] = pd.Series(pd.NA, index=df.index, dtype=DTYPES[col]).array
    is_kind = _kinds(df["kind"])
    name_codes, name_u = S.factorize(df["op_name"], small=True)  # only indexed with and compared
    start, has_start = _ints(df["start_ns"])  # read only: the column's own values where none is NA
    start = start if has_start.all() else np.where(has_start, start, 0)
    return LabelRows(df, framework, is_kind, name_codes, name_u, start, _ints(df["dur_ns"]))


def find_regions(r: LabelRows, on_device: np.ndarray | None) -> None:
    """Phase regions (kernelmap:forward|backward|optimizer) and steps (kernelmap:step#N,
    ProfilerStep#N) among the annotation and step rows, one answer per distinct name; the
    annotations on a device's clock (``on_device``); the host spans (rows of ``HOST_KINDS`` that
    are none of these). Fills ph_u, st_u, rmask, smask, dev_ann, hidx."""
    ann = r.is_kind("annotation", "step")
    r.ph_u = np.full(len(r.name_u) + 1, -1, dtype=np.int32)  # the last entry answers for NA (code -1)
    r.st_u = np.zeros(len(r.name_u) + 1, dtype=np.int64)
    is_step_u = np.zeros(len(r.name_u) + 1, dtype=bool)
    for c in np.unique(r.name_codes[ann]).tolist():
        if c >= 0:
            r.ph_u[c] = r.phases.code(C.region_phase(r.name_u[c]))
            st = C.step_number(r.name_u[c])
            is_step_u[c], r.st_u[c] = st is not None, st or 0
    r.rmask = ann & (r.ph_u[r.name_codes] >= 0)
    r.smask = ann & is_step_u[r.name_codes]
    r.dev_ann = np.zeros(r.n, dtype=bool) if on_device is None else (np.asarray(on_device, dtype=bool) & ann)
    r.rmask &= ~r.dev_ann
    r.hidx = np.flatnonzero(r.is_kind(*HOST_KINDS) & ~(r.rmask | r.smask) & ~r.dev_ann)


def nest_host_spans(r: LabelRows) -> None:
    """Canonical op and direction of each distinct name (mapped for op and annotation rows only),
    and the nesting of the host spans per thread: the outermost mapped span above each (``top``)
    and the nearest enclosing op (``inner_op``: where a launch sits), as rows (-1: none); the
    exceptions to "the outermost mapped op" (``_launch_labels``): collective spans, and spans of a
    forward op re-run inside a backward node with that op. Fills canon_u, direc_u, canon_a, is_op,
    top, inner_op, coll_rows, recomputed."""
    hidx = r.hidx
    tid = r.df["tid"].to_numpy(dtype="int64", na_value=-1)
    table = [C.lookup(u, r.framework) for u in r.name_u]
    r.canon_u = np.array([r.canon.code(v[0] if v else None) for v in table] + [-1], dtype=np.int32)
    r.direc_u = np.array([r.direc.code(v[1] if v else None) for v in table] + [-1], dtype=np.int32)
    r.canon_a = np.where(r.is_kind("op", "annotation"), r.canon_u[r.name_codes], -1)
    mapped = r.canon_a >= 0
    r.is_op = r.is_kind("op")
    # over host rows only (local indices)
    parent, top_local, op_local = C.forest(tid[hidx], r.start[hidx], _ends(r.start, r.dur, hidx), mapped[hidx],
                                           r.is_op[hidx])
    del tid, mapped
    coll_local, recompute_local = _launch_labels(parent, top_local, r.name_codes[hidx], r.canon_a[hidx], r.name_u,
                                                 r.canon, r.direc, r.direc_u, r.framework)
    del parent
    r.top, r.inner_op = _as_rows(top_local, hidx, r.n), _as_rows(op_local, hidx, r.n)
    if coll_local is not None:
        r.coll_rows = hidx[coll_local >= 0]
    if recompute_local is not None:
        sel = recompute_local >= 0
        r.recomputed = hidx[sel], hidx[recompute_local[sel]]


def _as_rows(local: np.ndarray, hidx: np.ndarray, n: int) -> np.ndarray:
    """Positions into the host rows ``hidx`` (-1: none) as positions into all ``n`` rows, in int32
    where the rows allow it (half the memory of the row-length tables)."""
    out = np.full(n, -1, dtype=np.int32 if n < 2**31 else np.int64)
    out[hidx] = np.where(local >= 0, hidx[np.maximum(local, 0)], -1)
    return out


def label_ops(r: LabelRows) -> None:
    """Canonical op and direction of each row from its outermost mapped op (an op outside every
    mapped one: "other", "none"); collective spans are "collective", and a recomputed forward op's
    spans take that op's, forward. Fills out_canon, out_dir, the outermost op's own labels for the
    phase rule (ph_canon, ph_dir) and the recomputed rows (recompute)."""
    has_top = r.top >= 0
    top0 = np.maximum(r.top, 0)
    r.out_canon = np.where(has_top, r.canon_a[top0], -1).astype(np.int32)
    r.out_dir = np.where(has_top, r.direc_u[r.name_codes[top0]], -1).astype(np.int32)
    other = r.is_op & ~has_top
    r.out_canon[other] = r.canon.code("other")
    r.out_dir[other] = r.direc.code("none")
    r.canon_a = None
    del other, has_top, top0
    # the phase rule reads the outermost op's labels (a collective inside AccumulateGrad: backward)
    r.ph_canon, r.ph_dir = r.out_canon.copy(), r.out_dir.copy()
    r.recompute = np.zeros(r.n, dtype=bool)
    if r.coll_rows is not None:
        r.out_canon[r.coll_rows], r.out_dir[r.coll_rows] = r.canon.code(C.COLLECTIVE), r.direc.code("none")
    if r.recomputed is not None:
        rec, src = r.recomputed
        r.out_canon[rec], r.out_dir[rec] = r.canon_u[r.name_codes[src]], r.direc.code("fwd")
        r.recompute[rec] = True
    r.coll_rows = r.recomputed = None


def label_layers(r: LabelRows, dims: list | None) -> None:
    """Layer of each row: the one its op names by its weight argument's shape (``dims``), else the
    one layer the op tree it sits in names, else (a backward tree) its forward op's, through the
    autograd seq (``layers_through_seq``); loss ops "loss", collectives none. Fills layer."""
    own = np.full(r.n, -1, dtype=np.int32)
    if dims is not None:
        # only ops with a weight argument can name a layer
        weight_ops = [c for c, u in enumerate(r.name_u) if u in C.WEIGHT_ARG_OPS]
        ops = np.flatnonzero(r.is_op & np.isin(r.name_codes, weight_ops))
        own[ops] = _own_layers(ops, r.name_codes, r.name_u, dims, r.layer_v)
    tree_layer = _tree_layers(r.top, own)
    r.layer = np.where(r.top >= 0, tree_layer[np.maximum(r.top, 0)], own).astype(np.int32)
    del tree_layer, own
    layers_through_seq(r)
    r.layer[np.isin(r.out_canon, r.canon.codes_of(C.LOSS_OPS))] = r.layer_v.code("loss")
    r.layer[r.out_canon == r.canon.code(C.COLLECTIVE)] = -1


def layers_through_seq(r: LabelRows) -> None:
    """The rows still without a layer in a tree whose first seq (in start order) is a forward op's
    take that op's layer (the last such row's, where several forward rows share a seq): nsys'
    evaluate_function wrapper has no seq, the autograd node inside it has the forward op's."""
    seq = r.df["seq"].to_numpy(dtype="int64", na_value=-1)
    layer, top = r.layer, r.top
    fwd_rows = (seq >= 0) & (r.out_dir == r.direc.codes_of(["fwd"])[0]) & (layer >= 0)
    if not fwd_rows.any():
        return
    seq_u, last = np.unique(seq[fwd_rows][::-1], return_index=True)
    seq_layer = layer[fwd_rows][::-1][last]
    del fwd_rows, last
    has_top = top >= 0
    with_seq = np.flatnonzero(has_top & (seq >= 0))
    by_start = with_seq[np.argsort(r.start[with_seq], kind="stable")]
    tops, first = np.unique(top[by_start], return_index=True)  # the trees with a seq, ascending
    tree_seq = seq[by_start[first]]  # each one's first seq (>= 0)
    del with_seq, by_start, first, seq
    # the rows still without a layer whose tree has a seq, and that seq (looked up per row among
    # those trees: no row-length table of trees)
    cand = np.flatnonzero((layer < 0) & has_top)
    at = np.minimum(np.searchsorted(tops, top[cand]), len(tops) - 1)
    in_tree = tops[at] == top[cand]
    need, want = cand[in_tree], tree_seq[at[in_tree]]
    hit = np.minimum(np.searchsorted(seq_u, want), len(seq_u) - 1)
    found = seq_u[hit] == want
    layer[need[found]] = seq_layer[hit[found]]


def label_steps(r: LabelRows, dims: list | None) -> None:
    """Phase region and step of each row by time containment of its start (any thread; its own process's regions
    where the trace holds several: ``held_by``): host
    steps for every row, a device step for device rows no host step holds (their launch's, if
    any, replaces it in ``inherit_from_launches``). For asynchronous frameworks (ops run after the issuing
    host left its regions) a region and a step reach to the next one's start, as in
    mxnet_profiler. A trace without shapes (MXNet's NVTX ranges): layers by position in the step.
    Fills phase, it_val, it_na (and layer)."""
    start, dur = r.start, r.dur
    rrows, srows = np.flatnonzero(r.rmask), np.flatnonzero(r.smask)
    region_end = C.until_next(start[rrows], _ends(start, dur, rrows)) if r.asynchronous else _ends(start, dur, rrows)
    r.phase = np.append(r.ph_u[r.name_codes[r.rmask]], -1)[held_by(r, rrows, region_end)]
    step_end = C.until_next(start[srows], _ends(start, dur, srows)) if r.asynchronous else _ends(start, dur, srows)
    host_step = ~r.dev_ann[srows]
    step_no = np.append(r.st_u[r.name_codes[r.smask]], 0)
    step_at = _among(host_step, held_by(r, srows[host_step], step_end[host_step]))
    if not host_step.all():  # device rows (those without a launch keep this): the GPU's own step copy
        dev = r.is_kind(*DEVICE_KINDS)
        d_at = _among(~host_step, C.region_index(start[dev], start[srows[~host_step]], step_end[~host_step]))
        step_at[dev] = np.where(d_at >= 0, d_at, step_at[dev])
        del dev, d_at
    r.it_na = step_at < 0  # iteration: step number (int64) where it_na is False
    r.it_val = step_no[step_at]
    del step_at
    r.rmask = r.smask = r.dev_ann = r.name_codes = None
    if not _has_shapes(dims) and r.is_op.any():
        pos = C.layers_by_position(r.is_op, r.canon.take(r.out_canon), r.direc.take(r.out_dir),
                                   np.where(r.it_na, np.nan, r.it_val), start, op_devices(r))
        need = (r.top >= 0) & (r.layer < 0)
        r.layer[need] = np.array([r.layer_v.code(v) for v in pos[r.top[need]].tolist()], dtype=np.int32)
    r.top = None


def op_devices(r: LabelRows) -> np.ndarray | None:
    """Per row, the GPU its outermost op (``top``; an op outside every mapped one: itself) launched its
    kernels onto (``device_index`` through the launch's correlation id), else the one GPU its thread launched
    onto (an op that launched nothing), else -1; None where the trace's kernels ran on fewer than two GPUs
    (``canonical.layers_by_position`` then counts per step alone). One process driving N GPUs (MXNet's
    contexts): each op thread launches onto one GPU (2x H200: two threads a GPU)."""
    df = r.df
    if "device_index" not in df:
        return None
    dev, has_dev = _ints(df["device_index"])
    corr, has_corr = launch_ids(r)
    kern = np.flatnonzero(r.is_kind(*DEVICE_KINDS) & has_dev & has_corr)
    if len(np.unique(dev[kern])) < 2:
        return None
    by_corr = pd.Series(dev[kern], index=corr[kern])
    by_corr = by_corr[~by_corr.index.duplicated(keep="first")]
    rt = np.flatnonzero(r.is_kind("runtime") & has_corr)
    got = by_corr.reindex(corr[rt]).to_numpy(dtype="float64")
    rt, got = rt[~np.isnan(got)], got[~np.isnan(got)].astype("int64")
    tid = df["tid"].to_numpy(dtype="int64", na_value=-1)

    def one(keys: np.ndarray) -> pd.Series:  # key -> its one device (keys with several left out)
        g = pd.Series(got).groupby(keys)
        return g.first()[g.nunique() == 1]

    owner = np.where(r.top >= 0, r.top, np.arange(r.n))  # the op whose position names the row's layer
    of_op, of_thread = one(owner[rt]), one(tid[rt])
    out = pd.Series(owner).map(of_op)
    out = out.fillna(pd.Series(tid).map(of_thread))
    return out.fillna(-1).to_numpy(dtype="int64")


def launch_ids(r: LabelRows) -> tuple[np.ndarray, np.ndarray]:
    """(per row the id that joins a device row to its runtime launch, which rows have one): the correlation id,
    made one per process where the trace holds several (``r.process``: each counts its own ids; a row without a
    process has none)."""
    corr, has = _ints(r.df["correlation_id"])
    if r.process is None:
        return corr, has
    has = has & (r.process >= 0) & (corr >= 0)
    span = int(corr[has].max()) + 1 if has.any() else 1
    return np.where(has, r.process * span + corr, -1), has


def held_by(r: LabelRows, regions: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per row, the position (into ``regions``: rows of region spans, ending at ``ends``) of the region that holds its
    start (``canonical.region_index``), -1 none. Where the trace holds several processes (``r.process``), a row of
    a process that marks regions of its own is held by those only: two ranks' steps overlap (one runs into its next
    step while the other ends its own: 240 of rank 0's host rows of 2x H100's nsys capture took rank 1's next step
    number); other rows by every region."""
    out = C.region_index(r.start, r.start[regions], ends)
    if r.process is None:
        return out
    rp = r.process[regions]
    for p in np.unique(rp[rp >= 0]).tolist():
        mine, sel = np.flatnonzero(r.process == p), np.flatnonzero(rp == p)
        at = C.region_index(r.start[mine], r.start[regions[sel]], ends[sel])
        out[mine] = np.where(at >= 0, sel[np.maximum(at, 0)], -1)
    return out


def inherit_from_launches(r: LabelRows) -> None:
    """Device rows (kernels, memcpys, memsets) take every label and the launching op of their
    runtime launch (the same correlation id, of the same process where the trace holds several: ``launch_ids``;
    the first launch of an id); those without a launch
    keep the regions of their own (device) time. Collective kernels (NCCL/RCCL by name) are
    collectives whatever launched them."""
    df = r.df
    dev = r.is_kind(*DEVICE_KINDS)
    corr, has_corr = launch_ids(r)
    has_corr = has_corr & (corr >= 0)
    rt = np.flatnonzero(r.is_kind("runtime") & has_corr)
    launch = pd.Series(rt, index=corr[rt])
    launch = launch[~launch.index.duplicated(keep="first")]
    didx = np.flatnonzero(dev & has_corr)
    del has_corr, rt
    src = launch.reindex(corr[didx]).to_numpy(dtype="float64")
    ok = ~np.isnan(src)
    d_ok, s_ok = didx[ok], src[ok].astype("int64")
    del launch, didx, src, ok, corr
    for arr in (r.inner_op, r.out_canon, r.out_dir, r.layer, r.phase, r.it_val, r.it_na, r.ph_canon, r.ph_dir,
                r.recompute):
        arr[d_ok] = arr[s_ok]
    del d_ok, s_ok
    kcodes, knames = S.factorize(df["kernel_name"], small=True)
    coll_k = np.array([C.is_collective_kernel(u) for u in knames] + [False], dtype=bool)[kcodes] & dev
    if coll_k.any():
        r.out_canon[coll_k], r.out_dir[coll_k] = r.canon.code(C.COLLECTIVE), r.direc.code("none")
        r.layer[coll_k] = -1


def write_labels(r: LabelRows) -> None:
    """The label columns from their codes: op_event_id (the nearest op's event_id), canonical_op,
    direction, layer, iteration, and phase: the region's, else the direction rule's
    (``schema.phase_of``, once per distinct pair; a recomputed forward op: backward); for
    asynchronous frameworks the name's first (``canonical.ASYNC_FRAMEWORKS``)."""
    df = r.df
    op_ids = df["event_id"].to_numpy(dtype="int64")
    df["op_event_id"] = pd.arrays.IntegerArray(np.where(r.inner_op >= 0, op_ids[np.maximum(r.inner_op, 0)], 0),
                                               r.inner_op < 0)
    del op_ids
    df["canonical_op"] = r.canon.strings(r.out_canon)
    df["direction"] = r.direc.strings(r.out_dir)
    df["layer"] = r.layer_v.strings(r.layer)
    df["iteration"] = pd.arrays.IntegerArray(np.where(r.it_na, 0, r.it_val), r.it_na)
    r.out_canon = r.out_dir = r.layer = r.it_val = r.it_na = None
    rule = np.array([[r.phases.code(phase_of(d, c)) for c in [None, *r.canon.values]] for d in [None, *r.direc.values]],
                    dtype=np.int32)  # [direction code + 1, canonical code + 1]: a few dozen pairs
    fallback = rule[r.ph_dir + 1, r.ph_canon + 1]
    fallback[r.recompute] = r.phases.code("backward")  # a recomputed forward op runs in the backward pass
    take = (fallback >= 0) if r.asynchronous else (r.phase < 0)
    r.phase[take] = fallback[take]
    df["phase"] = r.phases.strings(r.phase)
    r.phase = r.ph_canon = r.ph_dir = r.recompute = None


def _launch_labels(parent, top, name_codes, canon_a, name_u, canon: S.Vocab, direc: S.Vocab, direc_u,
                   framework: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Over host spans (``parent``, ``top``: canonical.forest's, local indices): the outermost
    collective span on each span's chain (itself included), and for spans inside a recomputed
    forward op (a forward op of ``canonical.RECOMPUTED_OPS`` with a backward node above it) that
    op; -1 where none, None where no span has one."""
    coll = depth = None
    cc = int(canon.codes_of([C.COLLECTIVE])[0])  # -2: no name maps to it
    if cc >= 0 and (canon_a == cc).any():
        depth = C.tree_depth(parent)  # one pass for each use below
        coll = C.outermost_mapped(parent, canon_a == cc, depth)
    recompute = None
    fwd = int(direc.codes_of(["fwd"])[0])
    if fwd >= 0:
        dir_a = np.where(canon_a >= 0, direc_u[name_codes], -1)
        not_names = np.array([u in C.NOT_RECOMPUTE_NAMES for u in name_u] + [False], dtype=bool)[name_codes]
        cand = (dir_a == fwd) & _in_values(canon_a, canon, C.RECOMPUTED_OPS) & ~not_names
        ctx = np.array([C.backward_context(u, framework) for u in name_u] + [False], dtype=bool)[name_codes]
        if cand.any() and ctx.any():
            depth = C.tree_depth(parent) if depth is None else depth
            f_top, b_top = C.outermost_mapped(parent, cand, depth), C.outermost_mapped(parent, ctx, depth)
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
