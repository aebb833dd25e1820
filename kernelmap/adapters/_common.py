"""Helpers shared by the adapters: transparent gzip and xz, a frame builder, and the ParseError wrap."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from .. import schema, strings
from ..errors import ParseError, SchemaError

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"

try:  # optional: gzip inflated by Intel's ISA-L, ~3x zlib's speed (the same bytes; zlib where it is missing)
    from isal import isal_zlib as _inflate_lib
except ImportError:  # pragma: no cover - depends on the environment
    _inflate_lib = zlib
GZIP_WBITS = 31  # zlib's gzip container: each member's header, CRC-32 and length checked
GZIP_ERRORS = (OSError, EOFError, zlib.error, _inflate_lib.error)  # what corrupt gzip data raises


def gunzip(data: bytes) -> bytes:
    """The content of gzip ``data`` (every member, as ``gzip.decompress``), by ISA-L where it is
    installed; ``GZIP_ERRORS`` for corrupt or cut data."""
    parts = []
    while True:
        d = _inflate_lib.decompressobj(GZIP_WBITS)
        parts.append(d.decompress(data))
        if not d.eof:
            raise EOFError("the gzip data ends before its end-of-stream marker")
        data = d.unused_data.lstrip(b"\0")  # gzip.decompress skips zero padding after a member too
        if not data:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def gunzip_blocks(fh, block: int, read: int = 1 << 16) -> Iterator[bytes]:
    """The content of the gzip file ``fh`` in blocks of ``block`` bytes (the last one shorter), reading
    ``read`` bytes of the file at a time (what is held: a block, the bytes read, the inflater's
    window); ``GZIP_ERRORS`` for corrupt or cut data, as ``gunzip``."""
    d = _inflate_lib.decompressobj(GZIP_WBITS)
    parts, have, pending = [], 0, False
    while chunk := fh.read(read):
        while chunk:
            pending = True
            out = d.decompress(chunk, block - have)
            parts.append(out)
            have += len(out)
            if have == block:
                yield b"".join(parts)
                parts, have = [], 0
            chunk = d.unconsumed_tail
            if d.eof:  # the next member, if any
                chunk, pending = d.unused_data.lstrip(b"\0"), False
                d = _inflate_lib.decompressobj(GZIP_WBITS)
    if have:
        yield b"".join(parts)
    if pending:
        raise EOFError("the gzip data ends before its end-of-stream marker")


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed when the content (not the name) is gzip or xz."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ParseError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:2] == GZIP_MAGIC:
        try:
            data = gunzip(data)
        except GZIP_ERRORS as exc:
            raise ParseError(path, f"corrupt gzip data: {exc}") from None
    elif data[:6] == XZ_MAGIC:
        try:
            data = lzma.decompress(data)
        except (lzma.LZMAError, EOFError) as exc:
            raise ParseError(path, f"corrupt xz data: {exc}") from None
    return data


def decompressed_copy(path: Path, head: bytes, dst: Path) -> bool:
    """Write the gzip or xz content of ``path`` (its first bytes: ``head``) to ``dst``; False where
    it is neither. ParseError for corrupt data."""
    import shutil

    opener, what, errors = ((gzip.open, "gzip", (OSError, EOFError, zlib.error)) if head[:2] == GZIP_MAGIC else
                            (lzma.open, "xz", (lzma.LZMAError, EOFError)) if head[:6] == XZ_MAGIC else (None, "", ()))
    if opener is None:
        return False
    try:
        with opener(path, "rb") as fi, open(dst, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
    except errors as exc:
        raise ParseError(path, f"corrupt {what} data: {exc}") from None
    return True


def read_text(path: str | os.PathLike) -> str:
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(path, f"not UTF-8 text (byte {exc.start})") from None


def load_json(path: str | os.PathLike):
    """The (gunzipped) file parsed as JSON; ParseError for bad bytes, bad JSON or deep nesting."""
    return parse_json(read_bytes(path), path)


def parse_json(data: bytes, path: str | os.PathLike):
    """``data`` (the content of ``path``) parsed as JSON, as ``load_json`` does."""
    import json

    if _orjson is not None and not _long_digit_run(data):
        try:
            return _orjson.loads(data)
        except (_orjson.JSONDecodeError, TypeError, ValueError):
            pass  # what orjson refuses (NaN, big integers, other encodings...) stdlib may read: it decides
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise ParseError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise ParseError(path, f"invalid JSON: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ParseError(path, "invalid JSON: nested too deeply") from None


class NoFastPath(Exception):
    """``trace_event_chunks`` cannot vouch for this document: parse it whole instead."""


_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = re.compile(rb"\s*")


def _cuts(data: bytes, pos: int, limit: int, end: int, tries: int) -> Iterator[int]:
    """Where a chunk starting at ``pos`` may end: after a ``}`` followed by ``,``, the last ones
    before ``limit`` first, then the first ones after it (an element longer than a chunk). A
    ``},`` then newline first: JSON strings hold no raw newline, so that one is never inside a
    kernel name (C++ names often contain ``},``); the end of the array last."""
    for sep in (b"},\n", b"},"):
        cut, n = data.rfind(sep, pos, limit), 0
        while cut >= 0 and n < tries:
            yield cut + 1
            cut, n = data.rfind(sep, pos, cut), n + 1
        cut, n = data.find(sep, limit, end), 0
        while cut >= 0 and n < tries:
            yield cut + 1
            cut, n = data.find(sep, cut + 1, end), n + 1
    yield end


def trace_events_extent(data: bytes, tries: int = 8, digits: bool = True) -> tuple[int, int]:
    """Where the ``traceEvents`` array's elements lie in ``data`` (after its ``[``, at its ``]``),
    vouched for as ``trace_event_chunks`` says; ``NoFastPath`` where the extent is not certain or,
    for a caller that parses the elements with orjson (``digits``), where orjson is missing or an
    integer could overflow it. ``digits=False`` (the native scanner, which reads no such integer):
    the document around the array is checked by orjson, else by the standard library (as
    ``parse_json`` would parse it), so the scanner does not need orjson."""
    start, end, _ = trace_events_shell(data, tries, digits)
    return start, end


def trace_events_shell(data: bytes, tries: int = 8, digits: bool = True) -> tuple[int, int, dict]:
    """``trace_events_extent`` and the document around the array, parsed (its ``traceEvents`` is
    ``[]``): the trace's other members (``distributedInfo``...) without a second read of the file.

    The extent taken is the last ``]`` of the document around which it parses so: where a member
    after the array holds an array of its own (``deviceProperties``), that member's ``]`` (its text
    is then no list of elements, which the readers find: ``trace_events_at`` for the real end)."""
    if digits and (_orjson is None or _long_digit_run(data)):
        raise NoFastPath
    m = _TRACE_EVENTS.search(data)
    if m is None:
        raise NoFastPath
    start, j = m.end(), len(data)
    for _ in range(tries):  # the array's closing bracket, from the end of the document backwards
        j = data.rfind(b"]", start, j)
        if j < 0:
            break
        try:
            return start, j, _shell(data, m, j)
        except _Unparsed:
            continue
    raise NoFastPath


def trace_events_at(data: bytes, start: int, end: int) -> dict:
    """The document around a ``traceEvents`` array whose elements are ``data[start:end]`` (its ``[``
    just before ``start``, its ``]`` at ``end``), parsed as ``trace_events_shell`` checks it;
    ``NoFastPath`` where that is not the document's one ``traceEvents`` array."""
    m = _TRACE_EVENTS.search(data)
    if m is None or m.end() != start or data[end:end + 1] != b"]":
        raise NoFastPath
    try:
        return _shell(data, m, end)
    except _Unparsed:
        raise NoFastPath from None


class _Unparsed(Exception):
    """The document around the array does not parse."""


def _shell(data: bytes, m: re.Match, j: int) -> dict:
    """The document with the elements between ``m`` (the ``"traceEvents": [`` match) and ``j`` (a
    ``]``) taken out, parsed by orjson, else by the standard library (as ``parse_json`` would);
    ``_Unparsed`` where it does not parse, ``NoFastPath`` where it parses to anything but an object
    whose ``traceEvents`` is ``[]`` and that holds the key once, at the top level."""
    loads, invalid = (_orjson.loads, _orjson.JSONDecodeError) if _orjson is not None else (json.loads, ValueError)
    try:
        shell = loads(data[:m.end()] + b"]" + data[j + 1:])
    except invalid:
        raise _Unparsed from None
    # the key once, at the top level: not before the array, not after it
    once = data.find(b'"traceEvents"', 0, m.start()) < 0 and data.find(b'"traceEvents"', j + 1) < 0
    if isinstance(shell, dict) and shell.get("traceEvents") == [] and once:
        return shell
    raise NoFastPath


def trace_event_chunks(data: bytes, chunk_bytes: int = 8 << 20, tries: int = 8, loads=None,
                       invalid: tuple = ()) -> Iterator[tuple[int, list]]:
    """The ``traceEvents`` array of a Chrome trace, parsed a few MB at a time: yields (index of the
    chunk's first event in the array, its events). The same values as a whole-document parse, with
    only one chunk's objects alive at a time (a whole parse of a Kineto trace holds ~8x the file).

    How it stays exact: the array's extent is accepted only if the document with the array emptied
    parses to an object whose ``traceEvents`` is ``[]``. Each chunk is cut after a ``},`` and
    accepted only if ``[chunk]`` parses; a chunk that starts at an element and parses as a list of
    complete values ends at an element boundary, so the chunks are the array's elements in order.
    Raises ``NoFastPath`` (the caller parses the whole document, which also finds any error) where
    orjson is missing, an integer could overflow it, or no cut parses (``_cuts``).

    ``loads`` parses each chunk (``[...]`` bytes) in place of ``orjson.loads`` (e.g. a typed
    msgspec decoder); ``invalid``: the exceptions by which it says "not JSON" (a cut to try
    again), beside orjson's. Any other exception it raises reaches the caller.
    """
    loads = loads or (_orjson.loads if _orjson is not None else None)
    invalid = (_orjson.JSONDecodeError, *invalid) if _orjson is not None else invalid
    start, end = trace_events_extent(data, tries)
    pos, first = start, 0
    if _WS.fullmatch(data, start, end):
        return
    while True:
        cuts = [end] if end - pos <= chunk_bytes else _cuts(data, pos, pos + chunk_bytes, end, tries)
        events = None
        for cut in cuts:
            try:
                events = loads(b"[" + data[pos:cut] + b"]")
                break
            except invalid:
                continue
        if events is None:
            raise NoFastPath
        yield first, events
        if cut == end:
            return
        first += len(events)
        pos = cut + 1  # past the comma
        if _WS.fullmatch(data, pos, end):  # a comma before the closing bracket: not JSON
            raise NoFastPath


try:  # optional: the same documents as stdlib json, parsed ~2x faster; stdlib decides what orjson refuses
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def compact_json(values: list) -> list:
    """``json.dumps(v, separators=(",", ":"))`` of each value (None stays None). With orjson, its
    output is taken where it has only digits, minus signs, brackets and commas (nested lists of
    ints, the usual ``Input Dims``), which is exactly what stdlib writes for those."""
    import json

    # a Decimal (a number read with its text, ``parse_exact``) as the float orjson would have read
    enc = json.JSONEncoder(separators=(",", ":"), default=_decimal_as_float).encode
    if _orjson is None:
        return [enc(v) if v is not None else None for v in values]
    dumps, out = _orjson.dumps, []
    for v in values:
        if v is None:
            out.append(None)
            continue
        try:
            b = dumps(v)
        except (TypeError, ValueError):
            b = b"x"
        out.append(b.decode() if not b.translate(None, b"0123456789-[],") else enc(v))
    return out


def _decimal_as_float(o):
    import decimal

    if isinstance(o, decimal.Decimal):
        return float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


_DIGITS = bytes.maketrans(b"123456789", b"000000000")  # every digit -> "0"


def _long_digit_run(data: bytes, chunk: int = 1 << 24) -> bool:
    """Whether ``data`` may hold an integer that orjson and stdlib json read differently: orjson
    returns exact ints from -2**63 to 2**64-1 and floats beyond, so that is a run of 20 digits, or
    19 after a minus sign (checked in chunks, not one copy of the file). Kineto's own 19-digit
    ``baseTimeNanoseconds`` does not send a trace to the slower parser."""
    z20, neg19 = b"0" * 20, b"-" + b"0" * 19
    for i in range(0, len(data), chunk):
        t = data[i:i + chunk + 20].translate(_DIGITS)
        if t.find(z20) >= 0 or t.find(neg19) >= 0:
            return True
    return False


def head(path: str | os.PathLike, n: int = 4096) -> bytes:
    """The first ``n`` bytes of the (gunzipped or xz-decompressed) content, for sniffing."""
    with open(path, "rb") as fh:
        start = fh.read(6)
        fh.seek(0)
        if start[:2] == GZIP_MAGIC:
            try:
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(n)
            except (OSError, EOFError, zlib.error):
                return b""
        if start == XZ_MAGIC:
            try:
                with lzma.LZMAFile(fh) as xz:
                    return xz.read(n)
            except (lzma.LZMAError, EOFError):
                return b""
        return fh.read(n)


def frame(cols: dict, path: str | os.PathLike, source: str) -> pd.DataFrame:
    """An adapter's own columns as a frame, with source, source_file and event_id (row order within
    the file); the schema's other columns are not there yet (``finish`` adds them): a labeller
    fills this frame first, and a large trace's NA columns are not alive beside its temporaries."""
    n = next((len(v) for v in cols.values() if not isinstance(v, str | int | float | type(None))), 0)
    one = np.zeros(n, dtype=np.int64)
    # one value for every row: a string column of that one object (each row converted otherwise)
    cols = {k: strings.from_codes(one, [v]) if isinstance(v, str) else v for k, v in
            {**cols, "source": source, "source_file": str(Path(path).name)}.items()}
    df = pd.DataFrame(cols, index=pd.RangeIndex(n), copy=False)  # a builder's own arrays: no copies
    df["event_id"] = np.arange(n, dtype="int64")
    if schema.compacting():  # normalise's records: narrow before the labelling's temporaries
        schema.narrow_ints(df)
    return df


def finish(cols: dict | pd.DataFrame, path: str | os.PathLike, source: str) -> pd.DataFrame:
    """A schema-conforming frame of column arrays, or of ``frame``'s frame (ParseError where the
    records do not fit the schema)."""
    df = cols if isinstance(cols, pd.DataFrame) else frame(cols, path, source)
    try:
        return schema.validate(schema.conform(df, copy=False), str(path))
    except (SchemaError, TypeError, ValueError) as exc:
        raise ParseError(path, f"records do not fit the schema: {exc}") from None


def ns_from_us(values) -> np.ndarray:
    """Microseconds (Chrome trace ``ts``/``dur``) to integer nanoseconds, exactly for what the JSON
    text holds where the value still says it: an int is ``v * 1000``, a ``Decimal`` (a number read
    with its text, ``parse_exact``) or a JSON number's text (bytes) is ``v * 1000`` rounded
    half to even (``ns_from_text``); a float is ``rint(v * 1000)`` (its text is gone: a float64
    holds ~16 digits, and 1.7e15 us is already 16). ValueError for values that are not finite or
    do not fit int64 nanoseconds."""
    vals = values if isinstance(values, list) else list(values)
    types = set(map(type, vals))
    if types <= {float} or (types <= {int, float} and float in types and _floats_hold(vals)):
        ns = np.rint(np.asarray(vals, dtype="float64") * 1000.0)
        if len(ns) and not (np.isfinite(ns).all() and np.abs(ns).max() < 2**63):
            raise ValueError("value out of range")
        return ns.astype("int64")
    if types == {int}:
        a = np.asarray(vals, dtype="object" if any(abs(v) >= 2**62 for v in vals) else "int64")
        if a.dtype == "int64" and np.abs(a).max() < 2**63 // 1000:
            return a * 1000
    out = np.empty(len(vals), dtype="int64")
    for i, v in enumerate(vals):
        if type(v) is int:
            x = v * 1000
        elif type(v) is float:
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("value out of range")
            x = int(np.rint(v * 1000.0))
        else:
            x = _ns_plain(str(v).encode()) if type(v) is _Decimal else None  # its text, as read
            if x is None:
                x = _ns_exact(v)
        if not -(2**63) < x < 2**63:
            raise ValueError("value out of range")
        out[i] = x
    return out


def _floats_hold(vals: list) -> bool:
    """Whether every int among ``vals`` is one a float64 times 1000 gives exactly (|v| < 2**43)."""
    return all(abs(v) < 2**43 for v in vals if type(v) is int)


_NS_CONTEXT = None
_Decimal = __import__("decimal").Decimal


def _ns_exact(v) -> int:
    """``v`` microseconds (a Decimal, or a JSON number's text as bytes) as nanoseconds, rounded half
    to even; ValueError for anything else (a bool, a str: a JSON string is not a time)."""
    import decimal

    global _NS_CONTEXT
    if _NS_CONTEXT is None:
        _NS_CONTEXT = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_EVEN, traps=[decimal.InvalidOperation])
    if isinstance(v, bytes | bytearray | memoryview):  # a JSON number's text (not a JSON string)
        v = bytes(v).decode("ascii", "replace")
        if not _JSON_NUMBER.fullmatch(v):
            raise ValueError(f"not a JSON number: {v[:40]!r}")
        v = decimal.Decimal(v)
    if not isinstance(v, decimal.Decimal) or not v.is_finite():
        raise ValueError(f"not a number: {v!r}")
    if v.adjusted() > 22:
        raise ValueError("value out of range")
    return int((v.scaleb(3, _NS_CONTEXT)).to_integral_value(rounding=decimal.ROUND_HALF_EVEN, context=_NS_CONTEXT))


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def ns_from_text(texts: list) -> np.ndarray:
    """``ns_from_us`` of JSON number texts (bytes): the exact decimal times 1000, rounded half to
    even; an integer text (the usual Kineto ``dur``, an old trace's ``ts``) by int arithmetic."""
    out = np.empty(len(texts), dtype="int64")
    for i, t in enumerate(texts):
        b = bytes(t)
        if b.isdigit() and len(b) < 16:
            out[i] = int(b) * 1000
            continue
        x = _ns_plain(b)
        if x is None:
            x = _ns_exact(b)
        if not -(2**63) < x < 2**63:
            raise ValueError("value out of range")
        out[i] = x
    return out


def _ns_plain(b: bytes) -> int | None:
    """``_ns_exact`` of a plain decimal text (``-?digits[.digits]``) by integer arithmetic; None for
    any other (an exponent: the Decimal path)."""
    neg = b[:1] == b"-"
    i, dot, f = (b[1:] if neg else b).partition(b".")
    if not i.isdigit() or (dot and not f.isdigit()):
        return None
    v = int(i) * 1000 + (int(f[:3].ljust(3, b"0")) if f else 0)
    rest = f[3:].rstrip(b"0")
    if rest:  # below a nanosecond: round half to even
        if rest[0] > 0x35 or (rest[0] == 0x35 and len(rest) > 1) or (rest == b"5" and v & 1):
            v += 1
    return -v if neg else v


def parse_exact(data: bytes, path: str | os.PathLike):
    """``parse_json`` with every non-integer number read as a ``decimal.Decimal`` of its text (the
    general path of a Chrome trace, whose ``ts``/``dur`` are decimal microseconds)."""
    import decimal

    try:
        return json.loads(data, parse_float=decimal.Decimal)
    except json.JSONDecodeError as exc:
        raise ParseError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise ParseError(path, f"invalid JSON: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ParseError(path, "invalid JSON: nested too deeply") from None


def loads_exact(b: bytes):
    """A chunk of a Chrome trace's events with non-integer numbers as ``Decimal`` (``parse_exact``)."""
    import decimal

    return json.loads(b, parse_float=decimal.Decimal)


_PLAIN = frozenset({int, float, type(None)})


def numeric(values: list) -> pd.Series:
    """``pd.to_numeric(values, errors="coerce")`` of a list of JSON values, done in numpy where
    they are all ints, floats and None that float64 holds exactly (the usual case)."""
    types = set(map(type, values))
    if types <= _PLAIN:
        a = np.array(values, dtype="float64")
        if not len(a) or not (np.abs(a) >= 2**53).any():
            return pd.Series(a, copy=False)
    elif _PLAIN & types:
        # a few other values (a string pid): pandas converts those, numpy the rest. pandas converts
        # element by element, so where those few come out float64 the whole column does too.
        odd = [j for j, v in enumerate(values) if type(v) not in _PLAIN]
        if len(odd) * 8 < len(values):
            o = pd.to_numeric(pd.Series([values[j] for j in odd], dtype=object), errors="coerce")
            rest = list(values)
            for j in odd:
                rest[j] = None
            a = np.array(rest, dtype="float64")
            if o.dtype == "float64" and not (np.abs(a) >= 2**53).any():
                a[odd] = o.to_numpy()
                return pd.Series(a, copy=False)
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")


def numeric_at(n: int, rows: list, values: list) -> pd.Series:
    """``numeric`` of a list of ``n`` values that are None but at ``rows`` (where they are
    ``values``), without building or scanning the None: the same Series."""
    if set(map(type, values)) <= _PLAIN:
        a = np.array(values, dtype="float64")
        if not len(a) or not (np.abs(a) >= 2**53).any():
            out = np.full(n, np.nan)
            out[rows] = a
            return pd.Series(out, copy=False)
    col = [None] * n
    for j, v in zip(rows, values, strict=True):
        col[j] = v
    return numeric(col)


def int64_array(values, path: str | os.PathLike, what: str, records=None) -> pd.arrays.IntegerArray:
    """Numbers to an Int64 array (non-numeric -> NA, fractions rounded); ParseError for a number
    outside int64, naming its record where ``records`` (row -> record number) is given."""
    if isinstance(values, pd.arrays.IntegerArray) and values.dtype == "Int64":
        return values  # already what this makes (the native Kineto scanner's columns)
    if isinstance(values, pd.Series | np.ndarray) and values.dtype == "float64":
        f = np.asarray(values)
        nan = np.isnan(f)
        r = np.rint(f)  # round half to even, as np.round
        r[nan] = 0
        if not len(r) or (r.min() > -2.0**63 and r.max() < 2.0**63):
            return pd.arrays.IntegerArray(r.astype("int64"), nan)
    if isinstance(values, pd.Series | np.ndarray) and values.dtype == "int64":
        return pd.arrays.IntegerArray(np.asarray(values, dtype="int64").copy(), np.zeros(len(values), dtype=bool))
    num = pd.to_numeric(pd.Series(values, dtype=object) if not isinstance(values, pd.Series) else values,
                        errors="coerce")
    if num.dtype.kind in "fO":
        f = pd.to_numeric(num.astype(object), errors="coerce", downcast=None).astype("float64")
        out = ~f.isna() & ~(f.abs() < 2**63)
        if out.any():
            i = int(np.flatnonzero(out.to_numpy())[0])
            raise ParseError(path, f"{what} {num.iloc[i]!r} does not fit a 64-bit integer",
                             record=None if records is None else int(records[i]))
        num = f.round()
    return pd.array(num, dtype="Int64")


def api_log_blocks(path, head: re.Pattern, library: str) -> Iterator[tuple[int, re.Match, list[str]]]:
    """The blocks of an NVIDIA library API log (cuDNN, cuBLAS): an ``I! ...`` header line, matched
    by ``head``, then its ``i!`` lines. Yields (0-based line index of the header, match, body)."""
    text = read_text(path)
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("I! ")]
    if not heads and text.strip():
        raise ParseError(path, f"no 'I! {library} (v...) function ... called:' block", line=1)
    for n, h in enumerate(heads):
        m = head.match(lines[h])
        if not m:
            raise ParseError(path, f"malformed {library} log header", line=h + 1)
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        yield h, m, lines[h + 1:end]
