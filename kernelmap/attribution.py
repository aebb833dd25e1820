"""Linking across the files of one run, and the coverage figures of ``kernelmap normalise``.

* GPU kernel -> canonical op: done by the profiler adapters (kernel -> launch -> op).
* library call (cuDNN/cuBLAS/cuBLASLt log) -> kernels: the logs come from their own capture pass
  (another process, another clock), so calls are linked *structurally*: per key (canonical op,
  layer, direction), the n-th call of the log is the n-th launching op occurrence of the trace,
  aligned from the end (a pass may have more warm-up steps than another). Kernels of a matched op
  get ``call_event_id``; everything else is counted as unlinked.
* oneDNN primitive -> op (CPU): same matching against the profiler trace of the run, when there is
  one; otherwise 0 with the reason.

Nothing is dropped: unattributed kernels are counted and the top names by time listed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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


def link_library_calls(df: pd.DataFrame) -> dict:
    """Set ``call_event_id`` (and ``library`` where NA) of library kernels from the GPU library
    logs of the same run. Returns counts for the summary."""
    calls = df[df["kind"].eq("library_call") & df["library"].isin(GPU_LIBS)
               & df["canonical_op"].notna() & df["layer"].notna() & df["direction"].notna()]
    k = df[df["kind"].eq("kernel") & df["op_event_id"].notna() & ~df["library"].eq("native").fillna(False)
           & df["canonical_op"].isin(["conv2d", "linear"])]
    info = {"library_calls_matched": 0}
    if calls.empty or k.empty:
        return info
    occ = (k.assign(start=k["start_ns"]).sort_values("start")
           .groupby(["op_event_id", "canonical_op", "layer", "direction"], dropna=False, sort=False)
           .agg(start=("start", "first")).reset_index().sort_values("start").reset_index(drop=True))
    calls = calls.sort_values(["start_ns", "event_id"], kind="stable")
    pairs = _match(calls, occ, ["canonical_op", "layer", "direction"])
    if not pairs:
        return info
    call_rows = np.array([p[0] for p in pairs])
    occ_rows = np.array([p[1] for p in pairs])
    m = occ.loc[occ_rows, ["op_event_id", "canonical_op", "layer", "direction"]].copy()
    m["call_event_id"] = df.loc[call_rows, "event_id"].to_numpy()
    m["call_library"] = df.loc[call_rows, "library"].to_numpy()
    key = ["op_event_id", "canonical_op", "layer", "direction"]
    kk = k[key].reset_index().merge(m, on=key, how="inner").set_index("index")
    df.loc[kk.index, "call_event_id"] = kk["call_event_id"].astype("Int64")
    fill = df.loc[kk.index, "library"].isna()
    df.loc[fill[fill].index, "library"] = kk.loc[fill[fill].index, "call_library"].astype("string")
    info["library_calls_matched"] = len(pairs)
    return info


def link_onednn(df: pd.DataFrame) -> dict:
    """oneDNN primitives -> the framework op of the run's profiler trace (op_event_id)."""
    prims = df[df["kind"].eq("library_call") & df["library"].eq("oneDNN")]
    ops = df[df["kind"].eq("op") & df["source"].isin(["kineto", "mxnet_profiler"])]
    if prims.empty:
        return {}
    if ops.empty:
        return {"onednn_linked_share": 0.0, "onednn_link_reason": "no profiler trace of this run to link to"}
    name = ops["op_name"]
    # the op that runs the primitive: MXNet ops are flat; in PyTorch the oneDNN entry points
    entry = ops[(ops["source"].eq("mxnet_profiler"))
                | name.isin(["aten::mkldnn_convolution", "aten::convolution_backward",
                             "aten::mkldnn_linear", "aten::mkldnn_max_pool2d"])]
    occ = entry.assign(dgroup=_dir_group(entry["direction"]), layer_k=entry["layer"].fillna("-"))
    p = prims.assign(dgroup=_dir_group(prims["direction"]), layer_k=prims["layer"].fillna("-"))
    pairs = []
    for d in ("bwd_data", "bwd_weight", "bwd_bias", "bwd", "fwd"):
        sub = p[p["direction"].eq(d)]
        if not sub.empty:
            pairs += _match(sub, occ, ["canonical_op", "layer_k", "dgroup"])
    if pairs:
        pr = np.array([a for a, _ in pairs])
        oc = np.array([b for _, b in pairs])
        df.loc[pr, "op_event_id"] = df.loc[oc, "event_id"].to_numpy()
        for col in ("phase", "iteration"):
            df.loc[pr, col] = df.loc[oc, col].to_numpy()
    return {"onednn_linked_share": len(pairs) / len(prims), "onednn_link_reason": None}


def summarise(df: pd.DataFrame) -> dict:
    """The figures of one run (or of any records table)."""
    k = df[df["kind"].eq("kernel")]
    t = int(k["dur_ns"].sum()) if len(k) else 0
    attributed = k["canonical_op"].notna() & ~k["canonical_op"].eq("other")
    t_attr = int(k.loc[attributed, "dur_ns"].sum())
    un = k[~attributed]
    top = (un.groupby("kernel_name")["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False)
           .head(TOP_N))
    lib_k = k[k["library"].isin(GPU_LIBS) | (k["canonical_op"].isin(["conv2d", "linear"])
                                              & ~k["library"].eq("native").fillna(False))]
    calls = df[df["kind"].eq("library_call")]
    gpu_calls = calls[calls["library"].isin(GPU_LIBS)]
    prims = calls[calls["library"].eq("oneDNN")]
    ops = df[df["kind"].eq("op") & df["source"].isin(["kineto", "mxnet_profiler"])]
    out = {
        "events": len(df),
        "kernels": len(k),
        "kernel_time_ns": t,
        "attributed_kernel_time_ns": t_attr,
        "attributed_kernel_time_share": (t_attr / t) if t else None,
        "unattributed_kernels": int((~attributed).sum()),
        "unattributed_top": [{"kernel_name": n, "count": int(r["size"]), "time_ns": int(r["sum"])}
                             for n, r in top.iterrows()],
        "ops": len(ops),
        "nvtx_ops": int((df["kind"].eq("op") & df["source"].eq("nsys")).sum()),
        "canonical_ops": sorted(df["canonical_op"].dropna().unique().tolist()),
        "library_calls": {str(n): int(c) for n, c in gpu_calls["library_call"].value_counts().sort_index().items()},
        "library_kernels": len(lib_k),
        "library_kernels_linked": int(lib_k["call_event_id"].notna().sum()),
        "library_kernel_linked_share": (float(lib_k["call_event_id"].notna().mean()) if len(lib_k) else None),
        "onednn_primitives": {str(n): int(c) for n, c in prims["op_name"].value_counts().sort_index().items()},
        "onednn_linked": int(prims["op_event_id"].notna().sum()),
    }
    return out
