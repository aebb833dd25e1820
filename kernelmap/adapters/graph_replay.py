"""Kernels replayed from a CUDA graph, attributed to the ops that launched their twins.

Every kernel (memcpy, memset) of one graph replay correlates with one ``cudaGraphLaunch``: the trace
itself cannot say which op launched it. A framework pass whose steps replay graphs (docs/MODES.md)
therefore profiles first, into a companion file beside its trace (``rundir.GRAPH_REFERENCE``), one
step that launches the same kernels one by one, each under its op (the reference step). Here the
device rows a step replays are matched to the reference step's by name and occurrence (the k-th
``sm90_xmma_fprop...`` of a step is the k-th of the reference step). Exact or an error: a step that
replays a kernel the reference step lacks, or lacks one of the reference step's kernels without
running it eagerly (outside the graphs), is a ``ParseError`` naming the difference, never a guess.
Matched rows take the reference row's canonical op, direction, layer, phase and library; their
iteration stays the step whose ``cudaGraphLaunch`` they replay.
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

GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # runtime/driver API names of a graph launch
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


def _device_name(df: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """The name of each device row: the kernel's; a memcpy or memset by its kind alone, since Kineto names
    the same memset "Memset (Device)" when run eagerly and "memset32" when replayed as a graph node (an
    H200 capture, torch 2.11: one of a step's memsets replayed as a kernel "memset32")."""
    kind = df["kind"].to_numpy(dtype=object)[rows]
    kn = df["kernel_name"].to_numpy(dtype=object)[rows]
    return [str(c) if c != "kernel" or not isinstance(k, str) else
            "memset" if MEMSET_NODE.match(k) else str(k) for c, k in zip(kind, kn, strict=True)]


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


def attribute(df: pd.DataFrame, path: str | os.PathLike, read_reference) -> int:
    """Attribute ``df``'s graph-replayed device rows in place from the reference step beside ``path``
    (``read_reference(file) -> DataFrame``: the adapter's own reader). Returns how many rows were
    replayed (0: the trace has no graph launch, nothing is read)."""
    rows, launches = replayed_rows(df)
    if not len(rows):
        return 0
    ref_path = Path(path).with_name(GRAPH_REFERENCE)
    if not ref_path.is_file():
        raise ParseError(path, f"{len(rows)} kernels were replayed from CUDA graphs ({GRAPH_LAUNCHES[0]}) and "
                               f"there is no {GRAPH_REFERENCE} beside the trace to attribute them (the framework "
                               "pass of a mode that replays graphs writes it)")
    ref = read_reference(ref_path)
    if len(replayed_rows(ref)[0]):
        raise ParseError(ref_path, "the graph reference step itself replays a CUDA graph")
    rdev = reference_rows(ref)
    ref_index = dict(zip(twin_keys(ref, rdev), rdev.tolist(), strict=True))
    want = Counter(_device_name(ref, rdev))
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
        # the reference step's events a step does not replay must run there eagerly (not captured)
        unreplayed = Counter(_device_name(df, np.flatnonzero(dev_all & ~replayed & (dev_it == g)))) if g >= 0 else Counter()
        extra = sorted((got - want).items())[:3]
        missing = sorted(((want - got) - unreplayed).items())[:3]
        if extra or missing:
            what = f"step {int(g)}" if g >= 0 else f"graph launch (correlation {int(-1 - g)})"
            raise ParseError(path, f"{what}: its {sum(got.values())} replayed device events are not those of the "
                                   f"reference step in {GRAPH_REFERENCE} ({sum(want.values())}): not in the reference "
                                   f"{extra}, neither replayed nor run eagerly {missing}")
        src[at] = [ref_index[o] for o in _occurrences([names[i] for i in at])]
    for col in COPIED:
        strings.set_rows(df, col, rows, ref[col].array[src])
    return len(rows)
