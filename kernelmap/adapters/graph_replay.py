"""Kernels replayed from a CUDA (or HIP) graph, attributed to the ops that launched their twins.

Every kernel (memcpy, memset) of one graph replay correlates with one graph launch (``cudaGraphLaunch``,
``hipGraphLaunch``, ``GRAPH_LAUNCHES``): the trace itself cannot say which op launched it. Without a
reference step (below), each replayed event is linked to the span that encloses its graph launch
(``link_to_launch``: the innermost op, else the innermost framework span such as torch.compile's
``CompiledFunction``) and keeps that launch's labels; the trace's ``graph_replays`` attribute counts
them (kernels, memsets and memcpys apart). kernelmap's own runs never take that path: a framework pass
whose steps replay graphs (docs/MODES.md)
therefore profiles first, into a companion file beside its trace (``rundir.GRAPH_REFERENCE``), one
step that launches the same kernels one by one, each under its op (the reference step). Here the
device rows a step replays are matched to the reference step's by name and occurrence (the k-th
``sm90_xmma_fprop...`` of a step is the k-th of the reference step; a memset or memcpy by its kind, a
graph's memset and memcpy nodes, which Kineto records as kernels "memset32", "memcpy32_post", included).
Exact or an error: a step that replays a kernel the reference step lacks, or lacks one of the reference
step's kernels without running it eagerly (outside the graphs: the same name, a memcpy or memset of the
same size), is a ``ParseError`` naming the difference, never a guess.
Matched rows take the reference row's canonical op, direction, layer, phase and library; their
iteration stays the step whose ``cudaGraphLaunch`` they replay. A trace of kernelmap's own
(``kernelmap:step#N`` steps) without its reference file is an error, as is a mismatch.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from .. import strings
from ..errors import ParseError
from ..rundir import GRAPH_REFERENCE
from ._trace import DEVICE_KINDS
from .canonical import region_index

# runtime/driver API names of a graph launch: CUDA's (and their per-thread default stream variants), HIP's
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_ptsz", "cuGraphLaunch_ptsz",
                  "hipGraphLaunch", "hipGraphLaunch_spt")
OWN_STEP_PREFIX = "kernelmap:step#"  # the worker's step regions: a trace of kernelmap's own run
COPIED = ("canonical_op", "direction", "layer", "phase", "library")  # what a replayed row takes from its twin


def replayed_rows(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(device rows replayed from a graph, the correlation id of the launch of each), rows in start order."""
    launch = strings.isin(df["kind"], ["runtime"]) & strings.isin(df["op_name"], list(GRAPH_LAUNCHES))
    corr = df["correlation_id"]
    ids = corr[launch].dropna().to_numpy(dtype="int64")
    dev = strings.isin(df["kind"], list(DEVICE_KINDS)) & corr.notna().to_numpy()
    rows = np.flatnonzero(dev)
    rows = rows[np.isin(corr.to_numpy(dtype="float64", na_value=np.nan)[rows], ids)]
    start = df["start_ns"].to_numpy(dtype="int64", na_value=0)[rows]
    rows = rows[np.argsort(start, kind="stable")]
    return rows, corr.to_numpy(dtype="float64", na_value=np.nan)[rows].astype("int64")


# a memset node of a replayed graph, recorded by Kineto as a kernel (category "kernel") of this name
MEMSET_NODE = re.compile(r"^memset(8|16|32|64)?$")
# a memcpy node of a replayed graph, likewise: the driver runs a captured device-to-device copy as kernels
# (GradScaler's 4-byte copies, H200, torch 2.11+cu130: one "memcpy32_post" each, where the reference step,
# run eagerly, has a gpu_memcpy "Memcpy DtoD (Device -> Device)"). A larger copy may run as two such kernels
# (a body and its "_post" tail: pytorch/pytorch#191284); each kernel counts as one copy here, so a copy
# replayed as two is one memcpy more than the reference step has: an error, never a guess
MEMCPY_NODE = re.compile(r"^memcpy(8|16|32|64|128)(_post)?$")
NODE_KINDS = ((MEMSET_NODE, "memset"), (MEMCPY_NODE, "memcpy"))


def node_kind(kernel_name: str) -> str | None:
    """"memset" or "memcpy" for the kernel name of a graph's memset or memcpy node, else None."""
    return next((kind for pat, kind in NODE_KINDS if pat.match(kernel_name)), None)


def _device_name(df: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """The name of each device row: the kernel's; a memcpy or memset by its kind alone, since Kineto names
    the same memset "Memset (Device)" when run eagerly and "memset32" when replayed as a graph node (an
    H200 capture, torch 2.11: one of a step's memsets replayed as a kernel "memset32"), and the same copy
    "Memcpy DtoD (Device -> Device)" eagerly and "memcpy32_post" replayed (``MEMCPY_NODE``)."""
    kind = df["kind"].to_numpy(dtype=object)[rows]
    kn = df["kernel_name"].to_numpy(dtype=object)[rows]
    return [str(c) if c != "kernel" or not isinstance(k, str) else node_kind(k) or str(k)
            for c, k in zip(kind, kn, strict=True)]


def _sized_names(df: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """``_device_name`` with the size of a memcpy or memset where the trace gives it ("memcpy of 4 bytes")."""
    size = df["bytes"].to_numpy(dtype="float64", na_value=np.nan)[rows]
    return [f"{n} of {int(b)} bytes" if n in ("memset", "memcpy") and b == b else n
            for n, b in zip(_device_name(df, rows), size, strict=True)]


def _occurrences(names: list[str]) -> list[tuple[str, int]]:
    seen: Counter = Counter()
    out = []
    for n in names:
        out.append((n, seen[n]))
        seen[n] += 1
    return out


def twin_keys(df: pd.DataFrame, rows: np.ndarray) -> list[tuple[str, int]]:
    """(device name, its occurrence among ``rows``) per row: what pairs a replayed device row with its twin
    in a reference step (``rows`` in start order, one step's)."""
    return _occurrences(_device_name(df, rows))


def reference_rows(ref: pd.DataFrame) -> np.ndarray:
    """A reference step's device rows (positions), in start order: the twins of one step's replayed rows."""
    rdev = np.flatnonzero(strings.isin(ref["kind"], list(DEVICE_KINDS)))
    return rdev[np.argsort(ref["start_ns"].to_numpy(dtype="int64", na_value=0)[rdev], kind="stable")]


def counts(df: pd.DataFrame, rows: np.ndarray) -> dict[str, int]:
    """How many of the device ``rows`` are kernels, memsets and memcpys (by kind: the trace's categories)."""
    kind = np.asarray(df["kind"].array.take(rows), dtype=object)
    return {f"{k}s": int((kind == k).sum()) for k in ("kernel", "memset", "memcpy")}


def matched_counts(df: pd.DataFrame, rows: np.ndarray) -> dict[str, int]:
    """``counts`` as the matching sees the rows: a graph's memset or memcpy node (a kernel in the trace)
    counted as the memset or memcpy it replays."""
    names = Counter(_device_name(df, rows))
    nodes = {k: names.pop(k, 0) for k in ("memset", "memcpy")}
    return {"kernels": sum(names.values()), "memsets": nodes["memset"], "memcpys": nodes["memcpy"]}


def describe(c: dict[str, int]) -> str:
    """``counts`` in words: "4464 kernels, 576 memsets and 6 memcpys"."""
    parts = [f"{n} {k[:-1] if n == 1 else k}" for k, n in c.items()]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _own_run(df: pd.DataFrame) -> bool:
    """Whether a trace is one of kernelmap's own runs (its steps are the worker's ``kernelmap:step#N``)."""
    names = strings.distinct(df["op_name"].array.take(np.flatnonzero(strings.eq(df["kind"], "step"))))
    return any(str(n).startswith(OWN_STEP_PREFIX) for n in names)


def attribute(df: pd.DataFrame, path: str | os.PathLike, read_reference, context: np.ndarray | None = None) -> dict:
    """Attribute ``df``'s graph-replayed device rows in place: from the reference step beside ``path``
    where there is one (``read_reference(file) -> DataFrame``: the adapter's own reader), else (a trace
    not of kernelmap's own) each linked to the span enclosing its graph launch (``link_to_launch``;
    ``context``: the rows that may be that span). Returns what the trace's ``graph_replays`` attribute
    says: the launches, the replayed kernels, memsets and memcpys, how they were attributed (empty: the
    trace has no graph launch, nothing is read)."""
    rows, launches = replayed_rows(df)
    if not len(rows):
        return {}
    c = counts(df, rows)
    info = {"launches": len(np.unique(launches)), **c}
    ref_path = Path(path).with_name(GRAPH_REFERENCE)
    if ref_path.is_file():
        _from_reference(df, path, ref_path, rows, launches, read_reference)
        return {**info, "attributed_by": "reference step"}
    if _own_run(df):
        raise ParseError(path, f"{describe(c)} were replayed from CUDA graphs ({GRAPH_LAUNCHES[0]}) and "
                               f"there is no {GRAPH_REFERENCE} beside the trace to attribute them (the framework "
                               "pass of a mode that replays graphs writes it)")
    linked = link_to_launch(df, context)
    return {**info, "attributed_by": "span enclosing each graph launch", "linked_to_a_span": linked}


def link_to_launch(df: pd.DataFrame, context: np.ndarray | None = None) -> int:
    """Graph launches that no op encloses, and the device rows they replay: linked (``op_event_id``) to
    the innermost span of ``context`` (default: op and annotation rows other than steps) on the launch's
    thread that holds the launch's start (torch.compile's ``CompiledFunction``, a user annotation).
    Returns how many device rows were linked so."""
    is_launch = strings.eq(df["kind"], "runtime") & strings.isin(df["op_name"], list(GRAPH_LAUNCHES))
    lrows = np.flatnonzero(is_launch & df["op_event_id"].isna().to_numpy())
    if not len(lrows):
        return 0
    if context is None:
        context = strings.isin(df["kind"], ["op", "annotation"])
    ctx = np.flatnonzero(context)
    start = df["start_ns"].to_numpy(dtype="int64", na_value=0)
    end = start + df["dur_ns"].to_numpy(dtype="int64", na_value=0)
    thread = df["pid"].to_numpy(dtype="int64", na_value=-1) * (1 << 32) + df["tid"].to_numpy(dtype="int64", na_value=-1)
    span = np.full(len(lrows), -1, dtype="int64")
    for t in np.unique(thread[lrows]).tolist():
        at = thread[lrows] == t
        cands = ctx[thread[ctx] == t]
        found = region_index(start[lrows[at]], start[cands], end[cands])
        span[at] = np.where(found >= 0, cands[np.maximum(found, 0)], -1)
    ok = span >= 0
    lrows, span = lrows[ok], span[ok]
    if not len(lrows):
        return 0
    eid = df["event_id"].to_numpy(dtype="int64")
    corr = df["correlation_id"].to_numpy(dtype="float64", na_value=np.nan)
    target = pd.Series(eid[span], index=corr[lrows])
    target = target[~target.index.duplicated(keep="first")]
    dev = np.flatnonzero(strings.isin(df["kind"], list(DEVICE_KINDS)) & df["op_event_id"].isna().to_numpy()
                         & np.isin(corr, corr[lrows]))
    rows = np.concatenate([lrows, dev])
    ids = np.concatenate([eid[span], target.reindex(corr[dev]).to_numpy(dtype="int64")])
    op = df["op_event_id"].to_numpy(dtype="float64", na_value=np.nan)
    op[rows] = ids
    df["op_event_id"] = pd.arrays.IntegerArray(np.nan_to_num(op).astype("int64"), np.isnan(op))
    return len(dev)


def _from_reference(df: pd.DataFrame, path, ref_path: Path, rows: np.ndarray, launches: np.ndarray,
                    read_reference) -> None:
    """The replayed ``rows`` (``launches``: the correlation id of each one's launch) take their twins'
    labels in the reference step of ``ref_path`` (module docstring); a ParseError where they are not
    that step's events."""
    ref = read_reference(ref_path)
    if len(replayed_rows(ref)[0]):
        raise ParseError(ref_path, "the graph reference step itself replays a CUDA graph")
    rdev = reference_rows(ref)
    rkeys = twin_keys(ref, rdev)
    ref_index = dict(zip(rkeys, rdev.tolist(), strict=True))
    want = Counter(_device_name(ref, rdev))
    rsized = _sized_names(ref, rdev)
    src = np.empty(len(rows), dtype="int64")
    names = _device_name(df, rows)
    # one step: its launches' events (a compiler's graphs: several a step), else one launch
    it = df["iteration"].to_numpy(dtype="float64", na_value=np.nan)[rows]
    group = np.where(np.isnan(it), -1.0 - launches, it)
    dev_all = strings.isin(df["kind"], list(DEVICE_KINDS))
    dev_it = df["iteration"].to_numpy(dtype="float64", na_value=np.nan)
    replayed = np.zeros(len(df), dtype=bool)
    replayed[rows] = True
    for g in np.unique(group).tolist():
        at = np.flatnonzero(group == g)
        got = Counter(names[i] for i in at)
        # the reference step's events no replayed row pairs with (a name's occurrences past the step's replayed
        # ones) must run there eagerly (not captured): as many of the same name, a memcpy or memset of the same
        # size (the input batch's copies outside the graph stand for no copy of the graph)
        unpaired = Counter(s for s, (n, k) in zip(rsized, rkeys, strict=True) if k >= got[n])
        outside = Counter(_sized_names(df, np.flatnonzero(dev_all & ~replayed & (dev_it == g)))) if g >= 0 else Counter()
        extra = sorted((got - want).items())[:3]
        missing = sorted((unpaired - outside).items())[:3]
        if extra or missing:
            what = f"step {int(g)}" if g >= 0 else f"graph launch (correlation {int(-1 - g)})"
            raise ParseError(path, f"{what}: its replayed {describe(counts(df, rows[at]))} (a graph's memset and "
                                   f"memcpy nodes as such: {describe(matched_counts(df, rows[at]))}) are not those "
                                   f"of the reference step in {GRAPH_REFERENCE} ({describe(counts(ref, rdev))}): not in "
                                   f"the reference {extra}, neither replayed nor run eagerly {missing}")
        src[at] = [ref_index[o] for o in _occurrences([names[i] for i in at])]
    for col in COPIED:
        strings.set_rows(df, col, rows, ref[col].array[src])
