"""Kineto JSON (torch.profiler ``export_chrome_trace``): cpu_op, user_annotation, cuda_runtime,
kernel, gpu_memcpy, gpu_memset spans (``ph: X``).

Links: kernel/memcpy/memset -> runtime launch (``args.correlation``) -> innermost enclosing
``cpu_op`` on the launching thread (time containment; ``External id`` where containment finds
none). Canonical op, phase, iteration and layer come from ``_trace.label``. Flow events (``ac2g``,
``fwdbwd``), metadata (``M``) and instant events are not records: ``ac2g`` only repeats the
correlation id the kernel already carries.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd

from .. import frameworks, strings
from ..errors import ParseError
from ..native import helpers as _scan  # the native path (below); kernelmap/native.py
from ..schema import Library
from ..strings import object_array
from . import _trace, graph_replay, inductor
from ._common import (
    GZIP_ERRORS,
    GZIP_MAGIC,
    XZ_MAGIC,
    NoFastPath,
    compact_json,
    finish,
    frame,
    gunzip_blocks,
    int64_array,
    loads_exact,
    ns_from_text,
    ns_from_us,
    numeric,
    numeric_at,
    parse_exact,
    parse_json,
    read_bytes,
    trace_event_chunks,
    trace_events_at,
    trace_events_shell,
)
from .canonical import CUSTOM_KERNEL_MARKS, NATIVE_KERNEL_MARKS, is_collective_kernel
from .kernel_libraries import library_of

SOURCE = "kineto"
FRAMEWORK = frameworks.of_trace_source(SOURCE).name  # the framework whose profiler writes it
_KIND = {
    "cpu_op": "op", "user_annotation": "annotation", "gpu_user_annotation": "annotation",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "kernel": "kernel",
    "gpu_memcpy": "memcpy", "gpu_memset": "memset",
    # PyTorch 1.8/1.9 (Kineto before the lower-case categories): the same events, other names
    "Operator": "op", "Runtime": "runtime", "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset",
}
# annotation categories on a GPU stream's timeline (not host spans; their steps are the GPU's copy)
DEVICE_ANNOTATION_CATS = ("gpu_user_annotation", "cuda_sync", "cuda_profiler_range", "overhead")
# device activity of accelerators whose events kernelmap does not read (MTIA, PyTorch's privateuse1
# backends, Intel XPU, Gaudi): a trace with them is refused, not read as a trace without kernels
UNSUPPORTED_DEVICE_PREFIXES = ("mtia_", "privateuse1_", "xpu_", "hpu_")
# the host spans that may hold a graph launch (graph_replay.link_to_launch): ops and user annotations
LAUNCH_CONTEXT_CATS = ("cpu_op", "user_annotation", "Operator")
# the categories of PyTorch 1.8/1.9's Kineto traces (with a lower-case ``external id`` arg)
OLD_CATEGORIES = ("Operator", "Runtime", "Kernel", "Memcpy", "Memset")


_MISSING = object()
CHUNK_BYTES = 8 << 20  # of the traceEvents array parsed at a time (see _common.trace_event_chunks)


def _check_events(path, ev: list, idx: list) -> None:
    """The first complete event without a string name (or with a non-string cat) or a ts."""
    for j, e in enumerate(ev):
        if "ts" not in e or "name" not in e:
            raise ParseError(path, f"complete event without {'ts' if 'ts' not in e else 'name'}", record=idx[j])
        bad = next((k for k in ("name", "cat") if not isinstance(e.get(k), str | None)), None)
        if bad or e["name"] is None:
            raise ParseError(path, f"{bad or 'name'} is a {type(e[bad or 'name']).__name__}, not a string", record=idx[j])


_KINETO_CAT = re.compile(rb'"cat"\s*:\s*"(?:cpu_op|cuda_runtime|kernel|Operator|Runtime|Kernel|Memcpy|Memset)"')


def sniff(head: bytes) -> bool:
    h = head.lstrip()
    return h.startswith(b"{") and b'"traceEvents"' in head and (
        b'"schemaVersion"' in head or b'"deviceProperties"' in head or b'"baseTimeNanoseconds"' in head
        or b'"cpu_op"' in head or b'"ProfilerStep' in head or _KINETO_CAT.search(head) is not None)


def _trace_events(doc, path) -> list:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ParseError(path, "not a Chrome trace: no traceEvents list")
    return doc["traceEvents"]


def _chunks(path: str | os.PathLike, read: dict | None = None) -> list[dict]:
    """Columns of the complete events, one dict per chunk of the ``traceEvents`` array (see
    ``trace_event_chunks``), or one for the whole array where that is not possible: by the native
    scanner where it is built and vouches for the file, else by the typed msgspec decoder, else
    by the general path (which also finds any error)."""
    scanned, tried = _scanned_file(path, read)
    if scanned is not None:
        return [scanned]
    data = read_bytes(path)
    if read is not None:
        read["data"] = data  # the document's other members are read from it (_rank), not a second read
    scanned = None if tried else _scanned(data, read)  # a compressed file's content
    if scanned is not None:
        return [scanned]
    seen: dict = {}  # one object per distinct name, category and shape list, not one per event
    if _typed is not None:
        try:
            return [_typed_columns(first, events, seen) for first, events in
                    trace_event_chunks(data, CHUNK_BYTES, loads=_typed_loads, invalid=(_msgspec.DecodeError,))]
        except (NoFastPath, _NotTyped):
            seen.clear()  # the general path below decides (and finds any error)
    try:  # numbers with their decimal text (ts/dur: exact nanoseconds)
        return [_columns(path, first, events, seen) for first, events in
                trace_event_chunks(data, CHUNK_BYTES, loads=loads_exact, invalid=(json.JSONDecodeError, UnicodeDecodeError))]
    except NoFastPath:
        pass
    events = _trace_events(parse_exact(data, path), path)
    del data
    return [_columns(path, 0, events, seen)]


def _columns(path, first: int, events: list, seen: dict) -> dict:
    """Per-event values of the complete (``ph: X``) events of ``events`` (``events[0]`` is
    record ``first`` of the file)."""
    if set(map(type, events)) - {dict}:
        bad = next(i for i, e in enumerate(events) if not isinstance(e, dict))
        raise ParseError(path, f"trace event is a {type(events[bad]).__name__}, not an object", record=first + bad)
    pos = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    idx = [first + i for i in pos]
    ev = [events[i] for i in pos]
    del events
    names = [e.get("name") for e in ev]
    cats = [e.get("cat") for e in ev]
    ts = [e.get("ts", _MISSING) for e in ev]
    if set(map(type, names)) - {str} or set(map(type, cats)) - {str, type(None)} or _MISSING in ts:
        _check_events(path, ev, idx)
    args = [e.get("args") or {} for e in ev]
    if set(map(type, args)) - {dict}:
        j = next(j for j, a in enumerate(args) if not isinstance(a, dict))
        raise ParseError(path, "args is not an object", record=idx[j])
    try:
        start = ns_from_us(ts)
        dur = ns_from_us([e.get("dur", 0) for e in ev])
    except (TypeError, ValueError) as exc:
        raise ParseError(path, f"non-numeric ts/dur: {exc}") from None

    def arg(key):
        return numeric([a.get(key) for a in args])

    def triple(key):
        vals = [a.get(key) for a in args]
        out, short = _triple(vals)
        if short is not None:
            raise ParseError(path, f"args.{key} has {len(vals[short])} entries, not 3", record=idx[short])
        return out

    dims = [a.get("Input Dims") for a in args]
    shapes = compact_json(dims)
    # the first list seen for each shape string stands for all equal ones
    dims = [None if s is None else seen.setdefault(("dims", s), d) for s, d in zip(shapes, dims, strict=True)]
    grid, block = triple("grid"), triple("block")
    return {
        "idx": idx,
        "names": [seen.setdefault(n, n) for n in names],
        "cats": [seen.setdefault(c, c) for c in cats],
        "start_ns": start, "dur_ns": dur,
        "pid": numeric([e.get("pid") for e in ev]),
        "tid": numeric([e.get("tid") for e in ev]),
        "correlation_id": arg("correlation"),
        "ext": _either(arg("External id"), arg("external id")),
        "seq": arg("Sequence number"),
        "stream": arg("stream"),
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "bytes": arg("bytes"),
        "shapes": [None if s is None else seen.setdefault(s, s) for s in shapes],
        "dims": dims,
    }


# --- the typed fast path -------------------------------------------------------------------
# msgspec decodes each chunk straight into small structs holding only the fields read here (the
# many other args, e.g. Input Strides and Concrete Inputs, are skipped, never built). Values are
# the same Python objects orjson would give (fields typed Any); any event the general path would
# treat differently (not an object, a missing ts or name, a non-string name or cat, args not an
# object or not None/empty) is not accepted here: the whole file then takes the general path.
try:  # optional, like orjson
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - depends on the environment
    _msgspec = None


class _NotTyped(Exception):
    """A chunk is JSON but not of the shape the typed path reads."""


if _msgspec is not None:
    from typing import Any

    class _Args(_msgspec.Struct, gc=False, omit_defaults=True):
        correlation: Any = None
        external: Any = _msgspec.field(default=None, name="External id")
        external_old: Any = _msgspec.field(default=None, name="external id")  # PyTorch 1.8/1.9
        seq: Any = _msgspec.field(default=None, name="Sequence number")
        stream: Any = None
        grid: Any = None
        block: Any = None
        bytes: Any = None
        dims: _msgspec.Raw = _msgspec.field(default=None, name="Input Dims")  # its JSON text, not parsed

    _NO_ARGS = _Args()

    class _Event(_msgspec.Struct, gc=False):
        ph: Any = None
        name: Any = _MISSING
        cat: Any = None
        ts: _msgspec.Raw = _msgspec.Raw()  # the JSON text: exact nanoseconds (_common.ns_from_text)
        dur: _msgspec.Raw = _msgspec.Raw()
        pid: Any = None
        tid: Any = None
        args: _Args | None = None

    _typed = _msgspec.json.Decoder(list[_Event])
else:  # pragma: no cover
    _typed = None


def _typed_loads(b: bytes) -> list:
    try:
        return _typed.decode(b)
    except _msgspec.ValidationError:
        raise _NotTyped from None


def _sparse(vals: list) -> pd.Series:
    """``numeric(vals)`` for a column that is mostly None (an arg few kinds of event carry)."""
    rows = [j for j, v in enumerate(vals) if v is not None]
    return numeric_at(len(vals), rows, [vals[j] for j in rows])


def _typed_columns(first: int, events: list, seen: dict) -> dict:
    """``_columns`` of one chunk of typed events: the same values, or ``_NotTyped``."""
    pos = [i for i, e in enumerate(events) if e.ph == "X"]
    ev = [events[i] for i in pos]
    del events
    names = [e.name for e in ev]
    cats = [e.cat for e in ev]
    ts = [e.ts for e in ev]
    if set(map(type, names)) - {str} or set(map(type, cats)) - {str, type(None)} or not all(map(len, ts)):
        raise _NotTyped
    args = [e.args or _NO_ARGS for e in ev]
    try:
        start = ns_from_text(ts)
        dur = ns_from_text([e.dur if len(e.dur) else b"0" for e in ev])
    except (TypeError, ValueError):
        raise _NotTyped from None

    def triple(vals):
        out, short = _triple(vals)
        if short is not None:
            raise _NotTyped
        return out

    shapes, dims = _raw_shapes([a.dims for a in args], seen)
    grid, block = triple([a.grid for a in args]), triple([a.block for a in args])
    return {
        "idx": [first + i for i in pos],
        "names": [seen.setdefault(n, n) for n in names],
        "cats": [seen.setdefault(c, c) for c in cats],
        "start_ns": start, "dur_ns": dur,
        "pid": numeric([e.pid for e in ev]),
        "tid": numeric([e.tid for e in ev]),
        "correlation_id": _sparse([a.correlation for a in args]),
        "ext": _either(_sparse([a.external for a in args]), _sparse([a.external_old for a in args])),
        "seq": _sparse([a.seq for a in args]),
        "stream": _sparse([a.stream for a in args]),
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "bytes": _sparse([a.bytes for a in args]),
        "shapes": shapes,
        "dims": dims,
    }


def _either(new: pd.Series, old: pd.Series) -> pd.Series:
    """The ``External id`` column, else (PyTorch 1.8/1.9's spelling) the ``external id`` one."""
    return new if not old.notna().any() else new.where(new.notna(), old)


def _triple(vals: list) -> tuple[list, int | None]:
    """x, y, z columns of ``vals`` (grid or block: a list of 3 numbers, or None), or the row of
    the first shorter list."""
    rows = [j for j, v in enumerate(vals) if isinstance(v, list) and v]
    short = next((j for j in rows if len(vals[j]) < 3), None)
    if short is not None:
        return [], short
    lists = [vals[j] for j in rows]
    return [numeric_at(len(vals), rows, [v[i] for v in lists]) for i in range(3)], None


_WS_BYTES = b" \t\r\n"


def _raw_shapes(raws: list, seen: dict) -> tuple[list, list]:
    """``compact_json`` of each ``Input Dims`` (given as its JSON text) and the value itself, one
    object per distinct shape string. Text of only digits, brackets and commas once its
    whitespace is gone is already what ``compact_json`` writes for the lists it holds (JSON has no
    leading zeros, and a minus sign could be ``-0``: those go through a parse); the rest is parsed
    and written as the general path does."""
    shapes, dims, by_raw = [], [], {}
    for r in raws:
        if r is None:
            shapes.append(None)
            dims.append(None)
            continue
        b = bytes(r)
        hit = by_raw.get(b)
        if hit is None:
            t = b.translate(None, _WS_BYTES)
            if t and not t.translate(None, b"0123456789[],"):
                s = t.decode()
                hit = (seen.setdefault(s, s), seen.get(("dims", s)))
                if hit[1] is None:
                    hit = (hit[0], seen.setdefault(("dims", s), parse_json(t, "Input Dims")))
            else:
                v = parse_json(b, "Input Dims")  # JSON the scan has read: as the rest of the trace is parsed
                s = compact_json([v])[0]
                hit = (None, None) if s is None else (seen.setdefault(s, s), seen.setdefault(("dims", s), v))
            by_raw[b] = hit
        shapes.append(hit[0])
        dims.append(hit[1])
    return shapes, dims


# --- the native path -----------------------------------------------------------------------
# _native.c's scan() reads the traceEvents array in one pass straight into columns (names, categories
# and shape texts interned: one object per distinct value), for exactly the files the typed path
# reads itself (see the C file's head); it returns None for any other, which then takes the paths
# above. Optional: built by setup.py where a C compiler is found (``_scan``: None where not).

_INTS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")


def _scanned_file(path, read: dict | None = None) -> tuple[dict | None, bool]:
    """``_scanned`` of an uncompressed file, mapped rather than read into memory (no copy of it),
    and whether it was tried (not for a compressed file, or one that cannot be mapped)."""
    import mmap

    if _scan is None:
        return None, True
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == GZIP_MAGIC or os.fstat(fh.fileno()).st_size == 0:
                return None, False
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data[:6] == XZ_MAGIC:
                    return None, False
                return _scanned(data, read), True
    except (OSError, ValueError):
        return None, False  # read_bytes says why, if the file cannot be read


def _scanned(data: bytes, read: dict | None = None) -> dict | None:
    """``_typed_columns`` of the whole array by the native scanner, or None where it is not built
    or does not vouch for the file: the same values, some already in the form ``read`` makes of
    them (ts/dur as int64 ns, the integer columns as Int64 arrays, shapes as a string column).
    ``read["shell"]``: the document around the array, parsed (for ``_rank``)."""
    if _scan is None:
        return None
    try:
        # the scanner reads no integer beyond 18 digits (it returns None) and stdlib json, which
        # the other paths take for longer ones, reads every other value as orjson does
        start, end, shell = trace_events_shell(data, digits=False)
    except NoFastPath:
        return None
    got = _scan.scan(data, start, end)
    if got is None or got[0] == 0:
        return None
    _, raw, names_u, cats_u, dims_u, odd, close = got
    if close >= 0:  # the array ended before the "]" taken for its end: a later member holds an array
        try:
            shell = trace_events_at(data, start, close)
        except NoFastPath:
            return None
    if any(c in OLD_CATEGORIES for c in cats_u):
        return None  # PyTorch 1.8/1.9's schema: its lower-case ``external id`` is read by the typed path
    for k in ("pid", "tid"):
        rows = [r for c, r, _ in odd if c == k]
        if rows:  # string ids: NA (what ``numeric`` makes of them) unless one reads as a number
            vals = pd.to_numeric(pd.Series([v for c, _, v in odd if c == k], dtype=object), errors="coerce")
            if vals.notna().any():
                return None
    raw = _string_args(raw, [(c, r, v) for c, r, v in odd if c not in ("pid", "tid")])
    if raw is None:
        return None
    seen: dict = {}
    shapes_u, dims_obj = _raw_shapes(dims_u, seen)
    codes = np.frombuffer(raw["dims"], dtype="int32")
    # the shape strings as a string column straight from codes (raw texts that differ only in
    # whitespace give one shape string: one code for it)
    shape = strings.Vocab()
    by_raw = np.array([shape.code(v) for v in shapes_u] + [-1])
    shapes = shape.strings(by_raw[codes])  # code -1: no Input Dims
    dims = object_array([*dims_obj, None])[codes]

    def ints(k):  # the scanner's int64 values and missing rows, as they are (its memory, no copy)
        return pd.arrays.IntegerArray(np.frombuffer(raw[k], dtype="int64"), np.frombuffer(raw[f"{k}_na"], dtype=bool))

    if read is not None:
        read["shell"] = shell  # the document the columns are the array of
    return {
        "idx": np.frombuffer(raw["idx"], dtype="int64"),
        "name_codes": np.frombuffer(raw["name"], dtype="int32"), "names_u": names_u,
        "cat_codes": np.frombuffer(raw["cat"], dtype="int32"), "cats_u": cats_u,
        "start_ns": np.frombuffer(raw["ts"], dtype="int64"), "dur_ns": np.frombuffer(raw["dur"], dtype="int64"),
        "pid": ints("pid"), "tid": ints("tid"), "correlation_id": ints("correlation"),
        "ext": pd.Series(np.frombuffer(raw["ext"], dtype="float64"), copy=False), "seq": ints("seq"),
        "stream": ints("stream"), "bytes": ints("bytes"),
        **{k: ints(k) for k in _INTS},
        "shapes": shapes, "dims": dims,
    }


_PLAIN_INT = re.compile(r"-?[0-9]{1,15}")


def _string_args(raw: dict, odd: list) -> dict | None:
    """The scanner's columns with its string args in them (``odd``: (column, row, text); NaN in
    the column): a plain decimal integer of up to 15 digits is its number, as ``numeric`` reads it
    (ROCm traces write ``"bytes": "616"``); None for any other text (the typed path decides)."""
    if not odd:
        return raw
    if not all(_PLAIN_INT.fullmatch(v) for _, _, v in odd):
        return None
    raw = dict(raw)
    for col in {c for c, _, _ in odd}:
        rows = np.array([r for c, r, _ in odd if c == col], dtype="int64")
        vals = [int(v) for c, _, v in odd if c == col]
        if col == "ext":  # float64, NaN where missing
            raw[col] = np.frombuffer(raw[col], dtype="float64").copy()
            raw[col][rows] = vals
            continue
        raw[col] = np.frombuffer(raw[col], dtype="int64").copy()
        raw[f"{col}_na"] = np.frombuffer(raw[f"{col}_na"], dtype=bool).copy()
        raw[col][rows], raw[f"{col}_na"][rows] = vals, False
    return raw


def _coded(c: dict) -> dict:
    """Names and categories of a column dict as codes into their distinct values."""
    if "name_codes" in c:
        return c
    for key, what in (("names", "name"), ("cats", "cat")):
        index: dict = {}
        codes = np.fromiter((index.setdefault(v, len(index)) for v in c.pop(key)), dtype="int32")
        c[f"{what}_codes"], c[f"{key}_u"] = codes, list(index)
    return c


def _joined(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    out = {}
    for key, first in parts[0].items():
        vals = [p[key] for p in parts]
        if isinstance(first, list):
            out[key] = [x for v in vals for x in v]
        elif isinstance(first, pd.Series):
            out[key] = pd.concat(vals, ignore_index=True)
        else:
            out[key] = np.concatenate(vals)
    return out


# the first device event's category decides (refuse_unsupported): that of an accelerator kernelmap does not
# read, or one it reads (CUDA and ROCm launches, kernels, copies, sets, in both schemas: the launches come
# early, between the host's ops, the device events after them)
_DEVICE_EXACT = tuple(c.encode() for c in ("cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset",
                                           "Runtime", "Kernel", "Memcpy", "Memset"))
_UNSUPPORTED_PREFIXES = tuple(p.encode() for p in UNSUPPORTED_DEVICE_PREFIXES)
_DEVICE_CAT = re.compile(rb'"cat"\s*:\s*"((?:' + b"|".join(map(re.escape, _UNSUPPORTED_PREFIXES)) + rb')[^"]*|'
                         + b"|".join(map(re.escape, _DEVICE_EXACT)) + rb')"')
PEEK_BLOCK = 1 << 20  # bytes of the (decompressed) content held at a time by the peek


def _blocks(path):
    """The file's content (gunzipped or xz-decompressed), ``PEEK_BLOCK`` bytes at a time, each with the
    last bytes of the one before (a category split between two blocks is still seen); ends quietly at
    corrupt data (``read_bytes`` reports it)."""
    import lzma

    with open(path, "rb") as raw:
        magic = raw.read(6)
        raw.seek(0)
        if magic[:2] == GZIP_MAGIC:  # ISA-L where installed (~3x zlib's speed); the next block inflated while
            blocks = _one_ahead(gunzip_blocks(raw, PEEK_BLOCK))  # this one is searched
        else:
            fh = lzma.LZMAFile(raw) if magic == XZ_MAGIC else raw
            blocks = iter(lambda: fh.read(PEEK_BLOCK), b"")
        tail = b""
        try:
            for block in blocks:
                yield tail + block
                tail = block[-64:]
        except (*GZIP_ERRORS, lzma.LZMAError):
            return
        finally:
            if hasattr(blocks, "close"):
                blocks.close()  # the read-ahead thread done before the file closes


def _one_ahead(items):
    """``items``, each next one made in a second thread while the caller works on the one it has (both
    without the GIL: the inflate, the native search); one item ahead, no more. OWLv2's peek (46 MB) at
    load 1.1 on the 2-core VM: 22 -> 15 ms; at load 7-8, where the second core is taken, ~10 ms more."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="kernelmap-peek") as worker:
        coming = worker.submit(next, items, None)
        while (item := coming.result()) is not None:
            coming = worker.submit(next, items, None)
            yield item


def refuse_unsupported(path: str | os.PathLike) -> None:
    """A trace of an accelerator kernelmap does not read (``UNSUPPORTED_DEVICE_PREFIXES``: MTIA,
    privateuse1, XPU, HPU) refused from its first device event, before the trace is parsed, in bounded
    memory (an uncompressed file is searched mapped; a compressed one streamed, ``PEEK_BLOCK`` at a time).
    A trace whose head (its first ``PEEK_BLOCK``) describes CUDA or ROCm devices (``computeMajor`` in its
    ``deviceProperties``, which PyTorch writes before the events) is not peeked at further; the others (CPU
    traces, other accelerators, files whose properties come last) up to their first device event or launch,
    or to their end where they have none: ~1 ms/MB mapped; gzipped ~0.5 ms/MB of content with ISA-L and the
    native search, ~0.9 with zlib (CPU time, 2026-11-27: OWLv2's 46 MB before its first device event)."""
    import mmap

    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
            if magic != XZ_MAGIC and magic[:2] != GZIP_MAGIC and os.fstat(fh.fileno()).st_size:
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    if data.find(b'"computeMajor"', 0, PEEK_BLOCK) < 0:
                        _refuse_category(path, first_device_category(data))
                return
        for k, block in enumerate(_blocks(path)):
            if k == 0 and b'"computeMajor"' in block:
                return
            cat = first_device_category(block)
            if cat is not None:
                return _refuse_category(path, cat)
    except (OSError, ValueError):
        return  # read_bytes says why, if the file cannot be read


def first_device_category(data) -> str | None:
    """The category of the first device event (or launch) in ``data`` (bytes or a mapped file): the first
    match of ``_DEVICE_CAT``, found by the native helper where it is built (sre looks for ``"cat"`` a
    byte at a time: ~0.5 ms/MB), else by the regex itself."""
    if _scan is not None and hasattr(_scan, "first_value"):
        at = _scan.first_value(data, b'"cat"', _DEVICE_EXACT, _UNSUPPORTED_PREFIXES)
        return None if at is None else bytes(data[at[0]:at[1]]).decode(errors="replace")
    m = _DEVICE_CAT.search(data)
    return None if m is None else m.group(1).decode(errors="replace")


def _refuse_category(path, cat: str | None) -> None:
    """The ParseError for a first device event of an unsupported category (``cat``), else nothing."""
    if cat is not None and cat.startswith(UNSUPPORTED_DEVICE_PREFIXES):
        raise ParseError(path, f"unsupported device events: its first device event is of category {cat} "
                               "(an accelerator whose activity kernelmap does not read: MTIA, privateuse1, "
                               "XPU, HPU)")


def read(path: str | os.PathLike) -> pd.DataFrame:
    refuse_unsupported(path)
    read_once: dict = {}
    c = _coded(_joined(_chunks(path, read_once)))
    idx, dims, ext = c.pop("idx"), c.pop("dims"), c.pop("ext")
    name_codes, names_u = c.pop("name_codes"), c.pop("names_u")
    cat_codes, cats_u = c.pop("cat_codes"), c.pop("cats_u")
    odd = [k for k in cats_u if isinstance(k, str) and k.startswith(UNSUPPORTED_DEVICE_PREFIXES)]
    if odd:
        n = int(np.isin(cat_codes, [cats_u.index(k) for k in odd]).sum())
        raise ParseError(path, f"unsupported device events: {n} events of categories {', '.join(odd)} "
                               "(an accelerator whose activity kernelmap does not read: MTIA, privateuse1, XPU, HPU)")
    # kinds as codes into their few values: one per category, "step" for the step annotations
    kinds = strings.Vocab()
    kind_of_cat = np.array([kinds.code(_KIND.get(k, "annotation")) for k in cats_u] or [0])
    kind = kind_of_cat[cat_codes]
    is_dev = np.isin(kind_of_cat, kinds.codes_of(_trace.DEVICE_KINDS))[cat_codes]
    step_u = np.array([n.startswith(("ProfilerStep#", "kernelmap:step#")) for n in names_u] or [False])
    kind[(kind == kinds.codes_of(["annotation"])[0]) & step_u[name_codes]] = kinds.code("step")
    inductor.mark_wrappers(kind, names_u, kinds, name_codes)  # torch.compile's region spans: not ops
    cols = {
        "kind": kinds.strings(kind),
        "op_name": strings.from_codes(np.where(is_dev, -1, name_codes), names_u),
        "kernel_name": strings.from_codes(np.where(is_dev, name_codes, -1), names_u),
        **c,
        "framework": FRAMEWORK,
        "device": "gpu" if is_dev.any() else "cpu",
    }
    del name_codes
    for col in ("pid", "tid", "correlation_id", "seq", "stream", "bytes",
                *[f"{g}_{a}" for g in ("grid", "block") for a in "xyz"]):
        cols[col] = int64_array(cols[col], path, col, idx) if len(idx) else pd.array([], dtype="Int64")
    # device rows of a Kineto trace sit in the process of their GPU: pid = device index
    cols["device_index"] = pd.arrays.IntegerArray(np.where(is_dev, cols["pid"].to_numpy(dtype="int64", na_value=0), 0),
                                                  ~is_dev | cols["pid"].isna())
    rank = _rank(path, read_once)
    cols["rank"] = pd.arrays.IntegerArray(np.full(len(idx), rank or 0, dtype="int64"),  # not a list of n objects
                                          np.full(len(idx), rank is None))
    df = frame(cols, path, SOURCE)
    del cols
    on_device = np.array([k in DEVICE_ANNOTATION_CATS for k in cats_u] or [False])[cat_codes]
    _trace.label(df, dims, FRAMEWORK, on_device=on_device)
    _link_by_external_id(df, ext.to_numpy(dtype="float64"))
    inductor.attribute(df)  # kernels torch.compile generated: the ops they fuse (adapters/inductor.py)
    kernel_library(df)
    # kernels replayed from a CUDA graph: from the reference step, else from the span around the launch
    # (an op or annotation span of the framework, not a Python function or a step)
    spans = np.array([k in LAUNCH_CONTEXT_CATS for k in cats_u] or [False])[cat_codes] & ~strings.eq(df["kind"], "step")
    replays = graph_replay.attribute(df, path, read, spans)
    out = finish(df, path, SOURCE)
    if replays:
        out.attrs["graph_replays"] = replays  # what normalise's summary lists per file
    return out


def _rank(path, read: dict) -> int | None:
    """``distributedInfo.rank`` of the trace document (None where it has none): the document
    around the ``traceEvents`` array, parsed without the array where its extent is certain
    (``read``: ``_chunks``' ``shell``, that document already parsed, or ``data``, the file's
    content, where either was read already; the file is read again only where neither was)."""
    doc = read.pop("shell", None)
    if doc is None:
        data = read.pop("data", None)
        if data is None:
            data = read_bytes(path)
        try:
            doc = trace_events_shell(data, digits=False)[2]
        except NoFastPath:
            doc = parse_json(data, path)
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    if rank is not None and (type(rank) is not int or not -(2**63) <= rank < 2**63):
        raise ParseError(path, f"distributedInfo.rank {rank!r} is not an integer")
    return rank


def _link_by_external_id(df: pd.DataFrame, ext: np.ndarray) -> None:
    """Runtime/device rows that time containment left without an op: the cpu_op with their
    ``External id`` (Kineto gives launches and kernels the External id of the launching op)."""
    need = df["op_event_id"].isna().to_numpy() & strings.isin(df["kind"], ["runtime", *_trace.DEVICE_KINDS]) & ~np.isnan(ext)
    if not need.any():
        return
    rows, src = _external_id_ops(strings.eq(df["kind"], "op"), ext, need)
    for col in ("canonical_op", "direction", "layer", "phase", "iteration"):
        keep = df[col].isna().to_numpy()[rows]  # only what containment left unknown
        strings.set_rows(df, col, rows[keep], df[col].array[src[keep]])
    df.loc[rows, "op_event_id"] = df["event_id"].to_numpy()[src]
    _trace.refine_direction(df)


def _external_id_ops(is_op: np.ndarray, ext: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``need`` whose External id an op has, and that op's row (the first such op)."""
    ops = is_op & ~np.isnan(ext)
    table = pd.Series(np.flatnonzero(ops), index=ext[ops])
    table = table[~table.index.duplicated(keep="first")]
    hit = table.reindex(ext[need]).to_numpy(dtype="float64")
    return np.flatnonzero(need)[~np.isnan(hit)], hit[~np.isnan(hit)].astype("int64")


_CUDNN_OPS = ("aten::cudnn_convolution", "aten::cudnn_convolution_backward",
              "aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight",
              "aten::cudnn_convolution_transpose")


# a framework's own kernels, by a namespace in their name (each vocabulary's: PyTorch's ATen, MXNet's
# operators), and the user's own kernels and ops (library "custom": kernelmap's custom op's namespace)
CUSTOM_MARKS = CUSTOM_KERNEL_MARKS


def kernel_library(df: pd.DataFrame) -> None:
    """Library of a kernel where it is known: by name (``nccl`` -> NCCL; the GPU libraries' names in
    ``kernel_libraries.KERNEL_LIBRARIES``; ``NATIVE_KERNEL_MARKS`` -> native) or because the launching op
    is a cuDNN entry point (which also takes the cuBLAS-named kernels cuDNN runs on cuBLASLt). A gemm's
    name says the library that holds it, not the API called (cuBLAS or cuBLASLt): a library-log link in
    attribution replaces it with its call's."""
    k = strings.eq(df["kind"], "kernel")
    # the library column as codes into its values (those it has, and those set here)
    lib, values = strings.factorize(df["library"])
    lib = lib.astype("int64")  # a copy: factorize's codes may be kept for a later call
    libs = strings.Vocab(values)
    # by name: once per distinct kernel name
    codes, uniq = strings.factorize(df["kernel_name"])
    by_name = np.array([libs.code("NCCL" if is_collective_kernel(n) else library_of(n)
                                  or ("native" if any(m in n for m in NATIVE_KERNEL_MARKS)
                                      else Library.CUSTOM.value if any(m in n for m in CUSTOM_MARKS) else None))
                        for n in uniq] + [-1], dtype="int64")[codes]
    named = k & (by_name >= 0)
    lib[named] = by_name[named]
    ids = df["op_event_id"]
    if ids.notna().any():
        # the launching op's name: the op_name of the row whose event_id is op_event_id
        op_codes, op_names = strings.factorize(df["op_name"])
        cudnn_op = np.array([n in _CUDNN_OPS for n in op_names] + [False], dtype=bool)
        event_id = df["event_id"].to_numpy(dtype="int64")
        launcher = np.zeros(len(df), dtype=bool)
        have = ids.notna().to_numpy()
        if np.array_equal(event_id, np.arange(len(df))):  # event_id = row (an adapter's own frame)
            launcher[have] = cudnn_op[op_codes[ids.to_numpy(dtype="int64", na_value=0)[have]]]
        else:
            row = pd.Series(np.arange(len(df)), index=event_id).reindex(ids.fillna(-1).to_numpy()).to_numpy(dtype="float64")
            found = ~np.isnan(row)
            launcher[found] = cudnn_op[op_codes[row[found].astype("int64")]]
        from_cudnn_op = k & launcher & (lib != libs.codes_of(["native"])[0])
        # cuDNN runs gemms on cuBLASLt's kernels: inside a cuDNN op, a cuBLAS-named kernel is cuDNN's call's
        blas = np.isin(lib, libs.codes_of([Library.CUBLAS.value, Library.CUBLASLT.value]))
        lib[from_cudnn_op & ((lib < 0) | blas)] = libs.code("cuDNN")
    # the custom op's own ops (a dispatcher op, or the record_function around a pybind11 call): its
    # library, as its kernels' (on the CPU the op is all there is of it)
    op_codes, op_names = strings.factorize(df["op_name"])
    custom_name = np.array([n.startswith(CUSTOM_MARKS) for n in op_names] + [False], dtype=bool)[op_codes]
    lib[custom_name & strings.isin(df["kind"], ["op", "annotation"]) & (lib < 0)] = libs.code(Library.CUSTOM.value)
    df["library"] = libs.strings(lib)


_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def base_ns(path: str | os.PathLike) -> int:
    """``baseTimeNanoseconds`` of a PyTorch Kineto trace: its ``ts`` (µs) plus this are Unix time.
    Read from the head of the file (PyTorch writes it before ``traceEvents``); 0 where absent."""
    m = _BASE.search(read_bytes(path)[: 1 << 20])
    return int(m.group(1)) if m else 0
