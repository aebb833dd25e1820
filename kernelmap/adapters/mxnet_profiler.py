"""MXNet profiler JSON (``mx.profiler.set_config(profile_all=True, ...)``, ``mx.profiler.dump()``).

Records: each ``operator`` span of a device process (B/E pair; ``process_name`` metadata maps the
pid to "cpu/0", "gpu/0", ...) is one ``op``; ``mx.profiler.Event`` spans (B/E pairs of category
``event``: the workload's ``kernelmap:step#N`` and ``kernelmap:forward|backward|optimizer``) and
``b``/``e`` pairs of other domains (``mx.profiler.Task``) are ``step``/``annotation`` rows. Steps
give every row its ``iteration``, the regions the phase of what the op name leaves open (see
``_label``: operators run asynchronously, after the host has left the region that issued them). Not records: the async ``b``/``e`` copy
of every operator span that MXNet writes under the "operator" process (a duplicate of the B/E
span), ``MXNET_C_API`` calls, and counters (``C``). ``tid`` is MXNet's hash of the thread (64 bits, unsigned): one
of 2^63 or more is kept as the int64 of the same bits (``_tid_int64``), so that every thread stays apart. Until
now those were NA, every such thread one: on the 2x H200 an engine thread's ``DeleteVariable`` (164 µs) then
"enclosed" a ``_backward_FullyConnected`` of the GPU worker thread, and the report counted 39 linear backward
calls in 20 steps ("calls per step: linear bwd: expected 2, measured 1.95").

Layer: MXNet writes no shapes, so a conv/linear op takes the layer at its position among the ops
of its kind within the iteration and its device (forward in model order, backward in reverse); left NA
when the count does not match frameworks/spec.LAYERS. An op's device is its process (pid: "gpu/0",
"gpu/1", ... or "cpu/0", "cpu/1"): one process driving two contexts runs each layer twice a step.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from .. import frameworks
from .. import strings as S
from ..errors import ParseError
from ..strings import STRING
from . import canonical as C
from ._common import finish, load_json

SOURCE = "mxnet_profiler"
FRAMEWORK = frameworks.of_trace_source(SOURCE).name  # the framework whose profiler writes it
_SKIP_ASYNC = {"operator", "MXNET_C_API"}


def sniff(head: bytes) -> bool:
    return b'"traceEvents"' in head and (b'"process_name"' in head) and (
        b'"cpu/' in head or b'"gpu/' in head or b'"MXNET_C_API"' in head or b'"operator"' in head) and (
        b'"cpu_op"' not in head and b'"schemaVersion"' not in head)


def read(path: str | os.PathLike) -> pd.DataFrame:
    doc = load_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ParseError(path, "not an MXNet profiler trace: no traceEvents list")
    pname: dict = {}
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ParseError(path, "trace event is not an object", record=i)
        bad = next((k for k, ok in (("pid", int | str), ("tid", int | str), ("id", int | str), ("name", str),
                                     ("cat", str), ("ph", str)) if not isinstance(e.get(k), ok | None)), None)
        if bad:
            raise ParseError(path, f"{bad} is a {type(e[bad]).__name__}", record=i)
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e.get("pid")] = str((e.get("args") or {}).get("name", ""))
    devices = {p: n.split("/")[0] for p, n in pname.items() if n.startswith(("cpu/", "gpu/"))}
    rows: list[tuple] = []
    open_sync: dict = {}  # (pid, tid) -> stack of (name, ts, record)
    open_async: dict = {}  # (pid, id, name) -> stack of (ts, record)
    open_event: dict = {}  # (pid, tid) -> stack of (name, ts, record), mx.profiler.Event spans
    for i, e in enumerate(events):
        ph = e.get("ph")
        if ph in ("B", "E") and e.get("cat") != "operator":
            # mx.profiler.Event spans (the workload's kernelmap:step#N / forward / backward /
            # optimizer regions): B/E on the calling thread, category "event"
            if e.get("cat") != "event":
                continue
            try:
                key, ts, name = (e["pid"], e["tid"]), int(e["ts"]), e["name"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ParseError(path, f"event span without a usable {exc}", record=i) from None
            if ph == "B":
                open_event.setdefault(key, []).append((name, ts, i))
            else:
                stack = open_event.get(key)
                if not stack or stack[-1][0] != name:
                    raise ParseError(path, f"E of event {name!r} without a matching B on its thread", record=i)
                _, bts, _ = stack.pop()
                kind = "step" if C.step_number(name) is not None else "annotation"
                rows.append((kind, name, bts, ts - bts, e["pid"], e["tid"], None))
        elif ph in ("B", "E"):
            if e.get("pid") not in devices:
                continue
            try:
                key, ts, name = (e["pid"], e["tid"]), int(e["ts"]), e["name"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ParseError(path, f"operator event without a usable {exc}", record=i) from None
            if ph == "B":
                open_sync.setdefault(key, []).append((name, ts, i))
            else:
                stack = open_sync.get(key)
                if not stack or stack[-1][0] != name:
                    raise ParseError(path, f"E of {name!r} without a matching B on its thread", record=i)
                bname, bts, _ = stack.pop()
                rows.append(("op", name, bts, ts - bts, e["pid"], e["tid"], devices[e["pid"]]))
        elif ph in ("b", "e"):
            if e.get("cat") in _SKIP_ASYNC:
                continue
            try:
                key, ts, name = (e["pid"], e.get("id"), e["name"]), int(e["ts"]), e["name"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ParseError(path, f"async event without a usable {exc}", record=i) from None
            if ph == "b":
                open_async.setdefault(key, []).append((ts, i))
            else:
                stack = open_async.get(key)
                if not stack:
                    raise ParseError(path, f"e of {name!r} without a matching b", record=i)
                bts, _ = stack.pop()
                kind = "step" if C.step_number(name) is not None else "annotation"
                rows.append((kind, name, bts, ts - bts, e["pid"], e.get("tid"), None))
    unclosed = [v[-1] for v in open_sync.values() if v]
    if unclosed:
        raise ParseError(path, f"B of {unclosed[0][0]!r} never ends (truncated trace?)", record=unclosed[0][2])
    df = pd.DataFrame(rows, columns=["kind", "op_name", "start_us", "dur_us", "pid", "tid", "dev"])
    df = df.sort_values(["start_us", "kind"], kind="stable").reset_index(drop=True)
    ops_dev = df.loc[df["kind"].eq("op"), "dev"]
    device = "gpu" if ops_dev.eq("gpu").any() else "cpu"
    try:
        start = df["start_us"].to_numpy(dtype="int64")
        dur = df["dur_us"].to_numpy(dtype="int64")
    except (OverflowError, ValueError, TypeError):
        raise ParseError(path, "a timestamp or duration does not fit a 64-bit integer") from None
    limit = np.iinfo(np.int64).max // 1000  # µs -> ns must not wrap around
    if len(start) and max(np.abs(start).max(), np.abs(dur).max()) > limit:
        raise ParseError(path, "a timestamp or duration is out of range (more than 292 years in ns)")
    start, dur = start * 1000, dur * 1000
    # pid: MXNet's small numbers; tid: its 64-bit unsigned hashes, as int64 of the same bits
    cols = {
        "kind": df["kind"].tolist(), "op_name": df["op_name"].tolist(),
        "start_ns": start, "dur_ns": dur,
        "pid": _int64_or_na(df["pid"]), "tid": _int64_or_na(df["tid"], wrap=True),
        "framework": FRAMEWORK, "device": device,
    }
    out = S.plain(finish(cols, path, SOURCE))  # labelled by pandas' own string operations
    _label(out)
    return finish(out, path, SOURCE)


def _tid_int64(v: int) -> int:
    """An unsigned 64-bit thread hash as the int64 of the same bits (one to one over [0, 2^64))."""
    return v - 2**64 if 2**63 <= v < 2**64 else v


def _int64_or_na(s: pd.Series, wrap: bool = False) -> pd.array:
    """Each value as an int64; NA where it is not an integer or does not fit (``wrap``: an unsigned 64-bit one past
    int64 as the int64 of the same bits, ``_tid_int64``)."""
    vals = [(_tid_int64(v) if wrap else v) if isinstance(v, int) else None for v in s.tolist()]
    return pd.array([v if v is not None and -(2**63) <= v < 2**63 else None for v in vals], dtype="Int64")


def _label(df: pd.DataFrame) -> None:
    kind = df["kind"].to_numpy(dtype=object)
    names = df["op_name"].fillna("").to_numpy(dtype=object)
    start = df["start_ns"].to_numpy(dtype="int64")
    end = start + df["dur_ns"].to_numpy(dtype="int64")
    canon, direc = C.map_names(df["op_name"], FRAMEWORK)
    is_op = df["kind"].eq("op")
    df["canonical_op"] = canon.where(is_op).astype(STRING)
    df.loc[is_op & df["canonical_op"].isna(), "canonical_op"] = "other"
    df["direction"] = direc.where(is_op).astype(STRING)
    df.loc[is_op & df["direction"].isna(), "direction"] = "none"
    rph = np.array([C.region_phase(n) for n in names], dtype=object)
    stp = np.array([C.step_number(n) for n in names], dtype=object)
    r, s = rph != None, stp != None  # noqa: E711
    # operators run asynchronously (canonical.ASYNC_FRAMEWORKS): a step and each phase region reach to
    # the next one's start; an op's phase is its name's, the region's only where the name says none.
    iteration = C.containing(start, start[s], C.until_next(start[s], end[s]), stp[s])
    phase = C.containing(start, start[r], C.until_next(start[r], end[r]), rph[r])
    own = C.containing(start, start[r], end[r], rph[r])
    by_name = C.phase_from_direction(df["direction"], df["canonical_op"])
    region = pd.Series(pd.array(np.where(is_op.to_numpy(), phase, own), dtype=STRING), index=df.index)
    df["phase"] = by_name.where(is_op).fillna(region).where(is_op | region.notna())
    df["iteration"] = pd.array(iteration, dtype="Int64")
    df.loc[is_op & df["canonical_op"].isin(list(C.LOSS_OPS)), "layer"] = "loss"
    pos = C.layers_by_position(is_op.to_numpy(), df["canonical_op"].to_numpy(dtype=object, na_value=None),
                               df["direction"].to_numpy(dtype=object, na_value=None),
                               df["iteration"].to_numpy(dtype=object, na_value=None), start,
                               df["pid"].to_numpy(dtype="int64", na_value=-1))  # an op's device: its process
    has = pos != None  # noqa: E711
    df.loc[has, "layer"] = pos[has]
    del kind
