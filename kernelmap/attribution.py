"""Linking across the files of one run, and the coverage figures of ``kernelmap normalise``.

* GPU kernel -> canonical op: done by the profiler adapters (kernel -> launch -> op).
* library call (cuDNN/cuBLAS/cuBLASLt log) -> kernels: the logs come from their own capture pass
  (another process, other steps, another clock), so a kernel is linked to a call by *signature*:
  the log's call with the kernel's (canonical op, layer, direction) in the same framework x batch
  size (``link_library_calls``). It says which call, engine and math mode that kind of kernel is
  launched by, not which log line launched this kernel instance.
* oneDNN primitive -> op (CPU): per key (canonical op, layer, direction) the n-th primitive of the
  log is the n-th op occurrence of the trace, aligned from the end; 0 with the reason where the
  run has no trace.

Every profiler source (Kineto, nsys, MXNet profiler) is its own capture pass, so kernel figures
are given per source (``by_source``) as well as over all kernels read. Nothing is dropped:
unattributed and unlinked kernels are counted and the top names by time listed with the reason.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import frameworks
from . import strings as S
from .strings import STRING

GPU_LIBS = ("cuDNN", "cuBLAS", "cuBLASLt")
TOP_N = 10


def _dir_group(d: pd.Series) -> pd.Series:
    return d.where(~d.fillna("").str.startswith("bwd"), "bwd")


def _match(calls: pd.DataFrame, occ: pd.DataFrame, keys: list[str]) -> list[tuple[int, int]]:
    """Pairs (call row label, occurrence row label) per key, in order, aligned from the end."""
    pairs: list[tuple[int, int]] = []
    cg = calls.groupby(keys, dropna=False, sort=False)
    og = {k: g for k, g in occ.groupby(keys, dropna=False, sort=False)}
    for key, c in cg:
        o = og.get(key)
        if o is None:
            continue
        n = min(len(c), len(o))
        pairs.extend(zip(c.index[len(c) - n:], o.index[len(o) - n:], strict=True))
    return pairs


LOG_SOURCES = ("cudnn_log", "cublas_log", "cublaslt_log")
# Sources whose own records name the library call that launched each kernel (same pass, same process):
# XLA's trace (the custom call of the kernel's ``hlo_op``, adapters/xla_trace.py). Their links are
# ``LINK_IN_TRACE``; a link of a kernel to a library-log call of another pass is ``LINK_SIGNATURE``.
IN_TRACE_SOURCES = tuple(d.trace_source for d in frameworks.REGISTRY.values() if d.library_calls_in_trace)
# the profiler traces whose op records are framework ops (the run's "ops" figure)
FRAMEWORK_OP_SOURCES = [d.trace_source for d in frameworks.REGISTRY.values() if d.trace_ops_are_framework_ops]
LINK_IN_TRACE = "in_trace"
LINK_SIGNATURE = "signature"

SIGNATURE = ["canonical_op", "layer", "direction"]
# The model's weightless ops (frameworks/spec.py) that a GPU library runs (MXNet's cuDNN activation,
# pooling and softmax calls): neither their calls nor their kernels have a layer, so their signature
# is (op, ANY_LAYER, direction): one per op and direction, over all of the op's layers.
LAYERLESS_OPS = ("relu", "max_pool2d", "log_softmax")
LIBRARY_OPS = ("conv2d", "linear")  # the model's ops whose non-native kernels are library kernels, linked or not
ANY_LAYER = "*"
_CALL_COLS = ["library", "library_call", "algo", "math_mode"]


def _native(k: pd.DataFrame) -> np.ndarray:
    """Kernels of no GPU library: the framework's own (native) and the user's own (custom op)."""
    from .adapters import OWN_KERNEL_MARKS

    out = S.eq(k["library"], "native") | S.eq(k["library"], "custom")
    for mark in OWN_KERNEL_MARKS:
        out = out | S.contains(k["kernel_name"], mark)
    return out


def native_kernels(k: pd.DataFrame) -> np.ndarray:
    """The framework's own kernels among ``k`` (never a library kernel): library ``native`` or a name
    with one of ``adapters.OWN_KERNEL_MARKS``."""
    return _native(k)


def _rows(df: pd.DataFrame, mask: np.ndarray, cols: list[str]) -> pd.DataFrame:
    """``df.loc[mask, cols]``, a column's rows at a time: pandas' ``loc`` copies each column whole
    before it takes the rows (on a 1M-row table, ~9 MB a column alive at once, for a few rows).
    ``mask``: a bool array, or the row positions themselves."""
    idx = np.flatnonzero(mask) if mask.dtype == bool else mask
    return pd.DataFrame({c: _plain_array(df[c].array.take(idx)) for c in cols}, index=df.index.take(idx), copy=False)


def _plain_array(arr):
    """A Categorical string column's rows as ``STRING`` (pandas' own operations read them)."""
    return S.to_string_array(arr) if isinstance(arr, pd.Categorical) else arr


def _some(frame: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """``frame[mask]`` for a reader of the rows: ``frame`` itself where every row is kept (one
    source's kernels, most runs: no copy of them)."""
    return frame if mask.all() else frame[mask]


def _kind(df: pd.DataFrame, kind: str) -> np.ndarray:
    """Rows of this kind (a bool array); by the codes ``summarise`` keeps of its frame's kinds
    (``_KIND_CODES``: summarise only reads its frame), else by ``strings.eq``."""
    arr = df["kind"].array
    for kinds, codes, uniq in _KIND_CODES:
        if kinds is arr:
            return codes == (list(uniq).index(kind) if kind in uniq else -2)
    return S.eq(df["kind"], kind)


_KIND_CODES: list = []  # (kind array, codes, distinct kinds) of the frame summarise reads


def _log_calls(df: pd.DataFrame) -> pd.DataFrame:
    """The GPU library-log calls, their layer keyed (``_keyed``)."""
    calls = S.plain(df[_kind(df, "library_call")])  # few rows: the string tests below run on those only
    return _keyed(calls[calls["library"].isin(GPU_LIBS) & calls["source"].isin(LOG_SOURCES)])


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``layer`` = ANY_LAYER where it is NA and the op is one of LAYERLESS_OPS (a
    copy where any row changes)."""
    fill = S.isna(frame["layer"]) & S.isin(frame["canonical_op"], list(LAYERLESS_OPS))
    if not fill.any():
        return frame
    layer = frame["layer"].astype(STRING)  # a copy
    layer[fill] = ANY_LAYER
    return frame.assign(layer=layer)


def _sig(frame: pd.DataFrame) -> pd.Series:
    """The signature of each row as one string (empty frames too): built once per distinct
    signature, not once per row."""
    if frame.empty:
        return pd.Series([], index=frame.index, dtype=object)
    codes = np.zeros(len(frame), dtype="int64")
    for col in SIGNATURE:
        c, u = pd.factorize(frame[col], use_na_sentinel=True)
        codes = codes * (len(u) + 1) + (c + 1)
    uniq, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    rows = frame[SIGNATURE].iloc[first]
    text = np.array(["|".join(map(str, r)) for r in rows.itertuples(index=False)], dtype=object)
    return pd.Series(text[inverse], index=frame.index, dtype=object)


def _signed(calls: pd.DataFrame) -> pd.Series:
    return calls[SIGNATURE].notna().all(axis=1)


def _targets(calls: pd.DataFrame, steady_calls: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per signature: the call kernels link to (one row per signature whose calls agree on
    library, API, algo and math mode: the last of them), and the signatures whose calls do not.
    ``steady_calls``: only a signature's last that many calls must agree (the log's timed steps;
    its first calls may be warm-up's, such as MXNet's cuDNN autotuning, which calls each algorithm
    it tries once); None: all of them.

    A backward op whose kernels are not split into data and weight gradients (MXNet's
    ``_backward_FullyConnected`` launches both GEMMs) has direction ``bwd``: its signature is the union
    of the op's ``bwd_data`` and ``bwd_weight`` calls, which link only where they agree (both
    ``cublasSgemmEx``, one math mode), and never where the log itself has ``bwd`` calls."""
    signed = calls[_signed(calls)].sort_values(["start_ns", "event_id"], kind="stable")
    split = signed[S.isin(signed["direction"], list(_SPLIT_BWD))]
    if len(split):
        union = split.assign(direction=pd.array(["bwd"] * len(split), dtype=STRING))
        have = set(signed.loc[S.eq(signed["direction"], "bwd"), ["canonical_op", "layer"]].itertuples(index=False))
        union = union[[k not in have for k in union[["canonical_op", "layer"]].itertuples(index=False)]]
        t, a = _agreeing(signed, steady_calls)
        ut, ua = (x.assign(derived=True) for x in _agreeing(union, steady_calls))
        return (pd.concat([t.assign(derived=False), ut], ignore_index=True),
                pd.concat([a.assign(derived=False), ua], ignore_index=True))
    return tuple(x.assign(derived=False) for x in _agreeing(signed, steady_calls))


_SPLIT_BWD = ("bwd_data", "bwd_weight")  # the directions a backward op's kernels can be split into


def _agreeing(signed: pd.DataFrame, steady_calls: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``_targets`` of calls already signed and in time order."""
    if signed.empty:
        empty = pd.DataFrame(columns=[*SIGNATURE, "call_event_id", *_CALL_COLS, "log_calls"])
        return empty, empty
    judged = signed if steady_calls is None else signed.groupby(SIGNATURE, dropna=False).tail(steady_calls)
    variants = judged.groupby(SIGNATURE, dropna=False)[_CALL_COLS].apply(
        lambda g: len(g.astype(str).drop_duplicates()))
    last = signed.groupby(SIGNATURE, dropna=False).tail(1).set_index(SIGNATURE)
    n = signed.groupby(SIGNATURE, dropna=False).size()
    t = last[["event_id", *_CALL_COLS]].rename(columns={"event_id": "call_event_id"})
    t["log_calls"] = n.reindex(t.index).to_numpy()
    t["variants"] = variants.reindex(t.index).to_numpy()
    t = t.reset_index()
    return t[t["variants"].eq(1)].drop(columns="variants"), t[t["variants"].gt(1)].drop(columns="variants")


def link_library_calls(df: pd.DataFrame, steady_calls: int | None = None, exclude=None) -> dict:
    """Link library kernels to the GPU library-log calls of the same run, by signature.

    The logs come from their own capture pass (another process, other steps), so a kernel is not
    linked to the call that launched it in time but to the log's call with the same signature
    (canonical op, layer, direction) in the same framework x batch size: the call a kernel of
    that signature is launched inside. A signature's calls must agree on library, API function,
    algo/engine and math mode (else the signature is ambiguous and nothing links to it); the
    kernel gets the last of them as ``call_event_id`` and the call's library, API function, algo
    and math mode. ``steady_calls``: only the last that many calls of a signature must agree (the
    timed steps of the log's pass: ``_targets``). ``exclude``: row labels of kernels not to link
    (``calllink.carry`` found that their pass ran other kernels than the libs pass's call). Sets those
    columns in place; returns what could not be used."""
    calls = _log_calls(df)
    info: dict = {"library_call_signatures": 0, "library_calls_without_signature": [],
                  "ambiguous_signatures": []}
    if calls.empty:
        return info
    targets, ambiguous = _targets(calls, steady_calls)
    # the log's own signatures (not the bwd unions derived from them for unsplit backward kernels)
    real = ~ambiguous["derived"].astype(bool)
    info["library_call_signatures"] = int((~targets["derived"].astype(bool)).sum() + real.sum())
    info["ambiguous_signatures"] = [dict(zip(SIGNATURE, map(str, r), strict=True))
                                    for r in ambiguous.loc[real, SIGNATURE].itertuples(index=False)]
    uns = calls[~_signed(calls)]
    if len(uns):
        g = uns.assign(shapes=uns["shapes"].fillna(""), algo=uns["algo"].fillna("")).groupby(
            ["library", "library_call", "shapes", "algo"], dropna=False).size()
        info["library_calls_without_signature"] = [
            {"library": a, "library_call": b, "shapes": c or None, "algo": d or None, "count": int(n),
             "reason": "no model layer and direction in its arguments (e.g. a matmul one library runs "
                       "inside another library's call)"} for (a, b, c, d), n in g.items()]
    k = _keyed(_rows(df, _kind(df, "kernel"), ["library", "kernel_name", "call_event_id", *SIGNATURE]))
    k = k[np.logical_and.reduce([S.notna(k[c]) for c in SIGNATURE])]
    k = k[~_native(k)]
    if k.empty or targets.empty:
        return info
    # a kernel its own trace already links to the call that launched it (``IN_TRACE_SOURCES``) keeps it
    k = k[k["call_event_id"].isna().to_numpy()]
    if exclude:
        k = k[~k.index.isin(list(exclude))]
    m = k[SIGNATURE].reset_index().merge(targets, on=SIGNATURE, how="inner").set_index("index")
    rows = m.index.to_numpy()
    S.set_rows(df, "call_event_id", rows, m["call_event_id"].astype("Int64"))
    for col in _CALL_COLS:
        S.set_rows(df, col, rows, m[col].astype(STRING))
    return info


_LIBRARY_KERNEL_COLS = ["call_event_id", "library", *SIGNATURE, "kernel_name", "op_event_id", "op_name", "source",
                        "iteration", "dur_ns"]


def _library_rule(k: pd.DataFrame, calls: pd.DataFrame) -> tuple[np.ndarray, pd.Series, pd.DataFrame]:
    """``library_kernel_mask`` of the kernels ``k`` (non-native ones) against the log calls ``calls``
    (``_log_calls``), with each kernel's signature and its keyed signature columns."""
    # without log calls no kernel has a call's signature (nor an ambiguous one): no strings to build
    keyed = _keyed(k[SIGNATURE])  # the rows keep their own layer (NA for a weightless op)
    sig = _sig(keyed) if len(calls) else pd.Series(None, index=k.index, dtype=object)
    call_sigs = set(_sig(calls[_signed(calls)]))
    linked = k["call_event_id"].notna().to_numpy() if "call_event_id" in k else np.zeros(len(k), dtype=bool)
    lib = (linked | S.isin(k["library"], GPU_LIBS) | S.isin(k["canonical_op"], list(LIBRARY_OPS))
           | sig.isin(call_sigs).to_numpy())
    return lib, sig, keyed


def library_kernel_mask(k: pd.DataFrame, records: pd.DataFrame) -> np.ndarray:
    """Which of the kernel rows ``k`` are library kernels: the one rule, read by the timing passes' figures
    (``library_kernels``) and by the libs pass for its own trace (``calllink.launches``). A kernel is one when it
    is not the framework's own (``native_kernels``) and it is linked to a log call (``call_event_id``, where
    ``k`` has it), its name says its library (``library`` one of ``GPU_LIBS``), its op is one of
    ``LIBRARY_OPS``, or its signature is a call's of the GPU library logs in ``records``.
    ``k``: columns library, kernel_name, canonical_op, layer, direction (call_event_id optional)."""
    keep = ~np.asarray(_native(k), dtype=bool)
    out = np.zeros(len(k), dtype=bool)
    out[keep] = _library_rule(_some(k, keep), _log_calls(records))[0]
    return out


def _library_rows(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, pd.Series, pd.DataFrame, pd.DataFrame]:
    """(the non-native kernels' positions, which of them are library kernels, their signatures, their keyed
    signature columns, the log calls): ``library_kernel_mask`` worked out on the few columns it reads."""
    rows = np.flatnonzero(_kind(df, "kernel"))
    rows = rows[~_native(_rows(df, rows, ["library", "kernel_name"]))]
    calls = _log_calls(df)
    head = _rows(df, rows, ["call_event_id", "library", *SIGNATURE])
    lib, sig, keyed = _library_rule(head, calls)
    return rows, lib, sig, keyed, calls


def library_kernel_rows(df: pd.DataFrame) -> np.ndarray:
    """The positions in ``df`` of its library kernels (``library_kernels``' rows, without their reasons)."""
    rows, lib, *_ = _library_rows(df)
    return rows[lib]


def library_kernels(df: pd.DataFrame, steady_calls: int | None = None, reasons: dict | None = None) -> pd.DataFrame:
    """The kernels launched inside a GPU library call, linked or not, with ``reason`` (NA where
    linked). A kernel is a library kernel when it is linked to a log call, when its name says its
    library, or when it is a non-native kernel of a convolution/linear op or of an op whose
    signature a log call has. ``reasons``: row label -> the reason an unlinked kernel was given where it was
    looked at (``calllink.carry``: the timing pass ran other kernels than the libs pass), before the rules."""
    # which kernels are library kernels is worked out on the few columns it reads, and the rows
    # are taken once, for those kernels only (peak memory of a large trace: not the kernels' whole
    # rows copied at each step)
    rows, lib, sig, keyed, calls = _library_rows(df)
    k = _rows(df, rows[lib], _LIBRARY_KERNEL_COLS)  # the columns read here and by the figures
    sig = sig[lib]
    keyed = keyed[lib]
    _, ambiguous = _targets(calls, steady_calls) if len(calls) else (None, pd.DataFrame(columns=SIGNATURE))
    amb = set(_sig(ambiguous))
    canon = k["canonical_op"]
    given = np.array([(reasons or {}).get(i) for i in k.index], dtype=object) if reasons else None
    rules = [  # the first rule that holds gives an unlinked kernel its reason
        *([(pd.notna(given), given)] if given is not None else []),
        # as _kernel_figures counts a launching op known (an op row, or XLA's HLO instruction): never both said
        (k["op_event_id"].isna().to_numpy() & S.isna(k["op_name"]),
         "not launched inside a framework op of its trace (outside the op ranges)"),
        (S.isna(canon) | S.eq(canon, "other"), "its launching op is none of the model's ops (no canonical op)"),
        (np.full(len(k), calls.empty), "no GPU library log in this run"),
        (S.isna(keyed["layer"]), "no layer for its op"),
        (S.eq(k["direction"], "bwd") & S.eq(canon, "conv2d"),
         "convolution backward kernel not split into bwd_data/bwd_weight"),
        (sig.isin(amb).to_numpy(), "the log's calls of its signature differ in library/API/algo/math mode"),
        (np.ones(len(k), dtype=bool), "no library-log call with its signature (canonical op, layer, direction)"),
    ]
    reason = np.full(len(k), None, dtype=object)
    open_ = k["call_event_id"].isna().to_numpy()
    for cond, text in rules:
        hit = open_ & cond
        reason[hit] = text[hit] if isinstance(text, np.ndarray) else text
        open_ = open_ & ~hit  # to_numpy() may be read-only (pandas 3 copy-on-write)
    k["reason"] = pd.array(reason, dtype=STRING)  # k is this function's own frame: no copy of it
    return k


def library_links(df: pd.DataFrame, log_steps: int | None = None) -> list[dict]:
    """Per run, source and kind of linked call (library, API, op signature, algo, math mode): how
    the kernels are linked (``link``: ``LINK_IN_TRACE``, the trace names each kernel's call;
    ``LINK_SIGNATURE``, a library-log call of the libs pass with the kernels' signature), how many
    times the log has the call (and per logged step, when ``log_steps`` is known; warm-up included),
    the calls of that kind the trace itself records per traced step (in-trace links only), and the
    kernels linked to it in that source (count, time, per traced step, launching ops per step)."""
    k = S.plain(df[_kind(df, "kernel") & df["call_event_id"].notna().to_numpy()])
    if k.empty:
        return []
    calls = _log_calls(df)
    n_calls = calls[_signed(calls)].groupby(["run", *SIGNATURE], dropna=False).size()
    all_calls = S.plain(df[_kind(df, "library_call")])
    by_id = all_calls.assign(key_layer=_keyed(all_calls)["layer"]).set_index("event_id")
    key_cols = ["source", "library", "library_call", "canonical_op", "key_layer", "direction", "algo", "math_mode"]
    info = by_id.reindex(k["call_event_id"].astype("int64").to_numpy())[key_cols].rename(
        columns={"source": "call_source"}).fillna("").astype(str)
    k = k.assign(**{c: info[c].to_numpy() for c in info.columns})
    out = []
    groups = ["run", "source", "call_source", *key_cols[1:]]
    for key, g in k.groupby(groups, dropna=False, sort=True):
        run, src, call_src, lib, api, op, key_layer, direction, algo, math = key
        c = by_id.loc[int(g["call_event_id"].iloc[-1])]
        c = c.iloc[0] if isinstance(c, pd.DataFrame) else c
        steps = max(int(g["iteration"].nunique()), 1)
        layer = None if pd.isna(c["layer"]) else c["layer"]
        in_trace = call_src in IN_TRACE_SOURCES
        logged = None if in_trace else int(n_calls.get((run, op, key_layer or None, direction), 0))
        out.append({
            "run": run, "source": src, "library": lib, "library_call": api,
            "canonical_op": op, "layer": layer, "direction": direction,
            "algo": algo or None, "math_mode": math or None,
            "link": LINK_IN_TRACE if in_trace else LINK_SIGNATURE,
            "call_event_id": int(g["call_event_id"].iloc[-1]),
            "log_calls": logged,
            "log_calls_per_step": (logged / log_steps) if logged is not None and log_steps else None,
            "traced_calls_per_step": int(g["call_event_id"].nunique()) / steps if in_trace else None,
            "kernels": len(g), "kernel_time_ns": int(g["dur_ns"].sum()),
            "traced_steps": int(g["iteration"].nunique()),
            "kernels_per_step": len(g) / steps,
            "launching_ops_per_step": int(g["op_event_id"].nunique()) / steps,
            "kernel_names": sorted(g["kernel_name"].dropna().unique().tolist()),
        })
    return out


CPU_LIBS = ("oneDNN", "BLAS")
# the framework ops that run a CPU library's calls, per trace source (Framework.cpu_library_entry_ops)
_CPU_ENTRY = {d.trace_source: d.cpu_library_entry_ops for d in frameworks.REGISTRY.values() if d.cpu_library_entry_ops}


def link_onednn(df: pd.DataFrame) -> dict:
    """CPU library-log calls (oneDNN primitives, BLAS calls) -> the framework op of the run's
    profiler trace (op_event_id), per library: per key (canonical op, layer, direction group)
    the n-th call is the n-th entry-op occurrence, aligned from the end."""
    prims = S.plain(df[_kind(df, "library_call") & S.isin(df["library"], CPU_LIBS)])
    if prims.empty:
        return {}
    ops = S.plain(df[_kind(df, "op") & S.isin(df["source"], list(_CPU_ENTRY))])
    if ops.empty:
        return {"onednn_linked_share": 0.0, "onednn_link_reason": "no profiler trace of this run to link to"}
    name = ops["op_name"]
    pairs = []
    for lib in CPU_LIBS:
        runs = np.zeros(len(ops), dtype=bool)
        for source, entry_ops in _CPU_ENTRY.items():
            names = entry_ops.get(lib, ())
            runs |= ops["source"].eq(source).to_numpy(dtype=bool) & (
                True if names == frameworks.ANY_OP else name.isin(names).to_numpy(dtype=bool))
        entry = ops[runs]
        occ = entry.assign(dgroup=_dir_group(entry["direction"]), layer_k=entry["layer"].fillna("-"))
        lp = prims[prims["library"].eq(lib)]
        p = lp.assign(dgroup=_dir_group(lp["direction"]), layer_k=lp["layer"].fillna("-"))
        for d in ("bwd_data", "bwd_weight", "bwd_bias", "bwd", "fwd"):
            sub = p[p["direction"].eq(d)]
            if not sub.empty:
                pairs += _match(sub, occ, ["canonical_op", "layer_k", "dgroup"])
    if pairs:
        pr = np.array([a for a, _ in pairs])
        oc = np.array([b for _, b in pairs])
        S.set_rows(df, "op_event_id", pr, df["event_id"].array[oc])
        for col in ("phase", "iteration"):
            S.set_rows(df, col, pr, df[col].array[oc])
        _link_reorders(df, prims.index[prims["library"].eq("oneDNN")])
    onednn = prims.index[prims["library"].eq("oneDNN")]
    linked = int(df.loc[onednn, "op_event_id"].notna().sum())
    out = {"onednn_linked_share": linked / len(onednn) if len(onednn) else None, "onednn_link_reason": None}
    blas = prims.index[prims["library"].eq("BLAS")]
    if len(blas):
        out["blas_linked_share"] = int(df.loc[blas, "op_event_id"].notna().sum()) / len(blas)
    return out


def _link_reorders(df: pd.DataFrame, prims: pd.Index) -> None:
    """A layout ``reorder`` belongs to the op of the primitive it feeds: the next primitive the
    verbose log executes after it (in log order, per file), or, after the last one, the primitive
    it follows. Only reorders with no op of their own are touched."""
    for _, g in S.plain(df.loc[prims]).sort_values(["source_file", "event_id"]).groupby("source_file", sort=False):
        reorder = g["canonical_op"].eq("reorder").fillna(False).to_numpy(dtype=bool)
        if not reorder.any():
            continue
        own = pd.Series(np.where(~reorder & g["op_event_id"].notna().to_numpy(), g.index, -1), index=g.index)
        own = own.where(own >= 0)
        target = own.bfill().fillna(own.ffill())
        pick = reorder & g["op_event_id"].isna().to_numpy() & target.notna().to_numpy()
        if not pick.any():
            continue
        rows, src = g.index[pick].to_numpy(), target[pick].astype("int64").to_numpy()
        for col in ("op_event_id", "phase", "iteration"):
            S.set_rows(df, col, rows, df[col].array[src])


def _top_groups(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``frame.groupby(keys)["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    .head(TOP_N)``: the same table (the groups in key order before the same sort), grouped by the
    codes of the string keys (``strings.factorize``: once per distinct value, not per row)."""
    if len(frame) < 4096:  # as fast either way
        return frame.groupby(keys)["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False).head(TOP_N)
    coded = [S.factorize(frame[k]) for k in keys]
    valid = np.logical_and.reduce([c >= 0 for c, _ in coded])  # groupby leaves out NA keys
    key = np.zeros(len(frame), dtype="int64")
    for c, u in coded:
        key = key * (len(u) + 1) + c
    groups, at = np.unique(key[valid], return_inverse=True)
    at = at.reshape(-1)
    size = np.bincount(at, minlength=len(groups)).astype("int64")
    dur = frame["dur_ns"].to_numpy(dtype="int64", na_value=0)[valid]  # sum: NA counts as nothing
    order = np.argsort(at, kind="stable")
    total = np.add.reduceat(dur[order], np.r_[0, np.cumsum(size)[:-1]]) if len(groups) else np.zeros(0, "int64")
    labels, rest = [], groups
    for _, u in reversed(coded):
        labels.append(np.asarray(u, dtype=object)[rest % (len(u) + 1)])
        rest = rest // (len(u) + 1)
    labels = [pd.array(v, dtype=frame[k].dtype) for v, k in zip(reversed(labels), keys, strict=True)]
    index = pd.MultiIndex.from_arrays(labels, names=keys) if len(keys) > 1 else pd.Index(labels[0], name=keys[0])
    proto = frame.iloc[:0].groupby(keys)["dur_ns"].agg(["size", "sum"])  # pandas' dtypes for this frame
    table = pd.DataFrame({"size": pd.array(size, dtype=proto["size"].dtype),
                          "sum": pd.array(total, dtype=proto["sum"].dtype)}, index=index)
    return table.sort_index().sort_values("sum", ascending=False).head(TOP_N)


_KERNEL_FIGURE_COLS = ["dur_ns", "canonical_op", "kernel_name", "op_event_id", "op_name"]


def _kernel_figures(k: pd.DataFrame) -> dict:
    """Kernel figures of two kinds, named for what they count: ``attributed_*``, kernels whose op is in
    the model's vocabulary (a canonical op other than ``other``); ``launch_op_known_*``, kernels whose
    launching op is known (an op row of their trace, ``op_event_id``; XLA: the HLO instruction,
    ``op_name``), whatever that op is."""
    t = int(k["dur_ns"].sum()) if len(k) else 0
    attributed = S.notna(k["canonical_op"]) & ~S.eq(k["canonical_op"], "other")
    t_attr = int(k.loc[attributed, "dur_ns"].sum())
    known = k["op_event_id"].notna().to_numpy() | S.notna(k["op_name"])
    t_known = int(k.loc[known, "dur_ns"].sum())
    top = _top_groups(_rows(k, ~attributed, ["kernel_name", "dur_ns"]), ["kernel_name"])  # what it reads
    return {
        "kernels": len(k),
        "kernel_time_ns": t,
        "attributed_kernel_time_ns": t_attr,
        "attributed_kernel_time_share": (t_attr / t) if t else None,
        "launch_op_known_kernels": int(known.sum()),
        "launch_op_known_kernel_time_share": (t_known / t) if t else None,
        "unattributed_kernels": int((~attributed).sum()),
        "unattributed_top": [{"kernel_name": n, "count": int(r["size"]), "time_ns": int(r["sum"])}
                             for n, r in top.iterrows()],
    }


def _library_figures(lk: pd.DataFrame) -> dict:
    linked = lk["reason"].isna()
    t = int(lk["dur_ns"].sum())
    t_linked = int(lk.loc[linked, "dur_ns"].sum())
    top = _top_groups(_rows(lk, ~linked.to_numpy(), ["kernel_name", "reason", "dur_ns"]), ["kernel_name", "reason"])
    return {
        "library_kernels": len(lk),
        "library_kernels_linked": int(linked.sum()),
        "library_kernel_linked_share": float(linked.mean()) if len(lk) else None,
        "library_kernel_time_ns": t,
        "library_kernel_time_linked_ns": t_linked,
        "library_kernel_time_linked_share": (t_linked / t) if t else None,
        "library_kernels_unlinked": int((~linked).sum()),
        "library_unlinked_top": [{"kernel_name": n, "reason": r, "count": int(v["size"]), "time_ns": int(v["sum"])}
                                 for (n, r), v in top.iterrows()],
    }


def by_source(df: pd.DataFrame, lk: pd.DataFrame | None = None, whole: tuple[dict, dict] | None = None) -> dict:
    """The kernel figures per profiler source (Kineto, nsys, MXNet profiler): each source is its
    own capture pass of other steps, so its kernels are counted once, never merged with another's.
    ``op_steps``: the steps in which the source recorded framework ops (the profiled window);
    the ``..._in_op_steps`` figures count only kernels of those steps. ``whole``: the kernel and library
    figures of all of ``df``'s kernels and of ``lk`` (``summarise``'s), taken where a selection is all of them
    (one source; every kernel in an op step) rather than counted again."""
    is_kernel = _kind(df, "kernel")
    k = _rows(df, is_kernel, ["source", "iteration", *_KERNEL_FIGURE_COLS])  # what is read here
    lk = library_kernels(df) if lk is None else lk
    out = {}
    is_op = _kind(df, "op")
    source_codes, sources = S.factorize(df["source"], small=True)
    iteration = df["iteration"]
    k_codes = source_codes[is_kernel]
    for code in sorted(np.unique(k_codes[k_codes >= 0]).tolist(), key=lambda c: sources[c]):  # k.groupby("source")
        src = sources[code]
        g = _some(k, k_codes == code)
        # the steps of this source's ops (their iteration column only, not a copy of their rows;
        # the distinct values of those rows, NA left out of the few, not of the rows)
        op_steps = sorted(int(i) for i in pd.unique(iteration.array[is_op & (source_codes == code)]) if not pd.isna(i))
        w = _some(g, g["iteration"].isin(op_steps).to_numpy())
        fg = whole[0] if whole and g is k else _kernel_figures(g)
        fw = fg if w is g else _kernel_figures(w)
        ls = _some(lk, lk["source"].eq(src).to_numpy())
        out[str(src)] = {
            **fg,
            "steps": int(g["iteration"].nunique()),
            "op_steps": len(op_steps),
            "kernels_in_op_steps": fw["kernels"],
            "kernel_time_in_op_steps_ns": fw["kernel_time_ns"],
            "attributed_kernel_time_share_in_op_steps": fw["attributed_kernel_time_share"],
            "launch_op_known_kernel_time_share_in_op_steps": fw["launch_op_known_kernel_time_share"],
            **(lfs := whole[1] if whole and ls is lk else _library_figures(ls)),
        }
        lw = _some(ls, ls["iteration"].isin(op_steps).to_numpy())
        lf = lfs if lw is ls else _library_figures(lw)
        out[str(src)].update(library_kernels_in_op_steps=lf["library_kernels"],
                             library_kernel_time_linked_share_in_op_steps=lf["library_kernel_time_linked_share"])
    return out


def summarise(df: pd.DataFrame, log_steps: int | None = None, steady_calls: int | None = None,
              reasons: dict | None = None) -> dict:
    """The figures of one run (or of any records table). Top-level kernel figures count every
    kernel event read (all sources together); ``by_source`` has them per source."""
    _KIND_CODES.append((df["kind"].array, *S.factorize(df["kind"], small=True)))  # kinds coded once, not per test
    try:
        return _summarise(df, log_steps, steady_calls, reasons)
    finally:
        _KIND_CODES.pop()


def _summarise(df: pd.DataFrame, log_steps: int | None, steady_calls: int | None = None,
               reasons: dict | None = None) -> dict:
    calls = S.plain(df[_kind(df, "library_call")])
    gpu_calls = calls[calls["library"].isin(GPU_LIBS)]
    prims = calls[calls["library"].eq("oneDNN")]
    blas = calls[calls["library"].eq("BLAS")]
    is_op = _kind(df, "op")
    lk = library_kernels(df, steady_calls, reasons)
    kf, lf = _kernel_figures(_rows(df, _kind(df, "kernel"), _KERNEL_FIGURE_COLS)), _library_figures(lk)  # what it reads
    return {
        "events": len(df),
        **kf,
        "ops": int((is_op & S.isin(df["source"], FRAMEWORK_OP_SOURCES)).sum()),
        "nvtx_ops": int((is_op & S.eq(df["source"], "nsys")).sum()),
        "canonical_ops": sorted(S.distinct(df["canonical_op"])),
        "library_calls": {str(n): int(c) for n, c in gpu_calls["library_call"].value_counts().sort_index().items()},
        **lf,
        "onednn_primitives": {str(n): int(c) for n, c in prims["op_name"].value_counts().sort_index().items()},
        "onednn_linked": int(prims["op_event_id"].notna().sum()),
        "blas_calls": {str(n): int(c) for n, c in blas["library_call"].value_counts().sort_index().items()},
        "blas_linked": int(blas["op_event_id"].notna().sum()),
        "by_source": by_source(df, lk, (kf, lf)),
        "library_links": library_links(df, log_steps),
    }
