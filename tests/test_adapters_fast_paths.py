"""The adapters' fast paths give what their plain counterparts give: orjson or stdlib json, numpy
or pandas numbers, float/int arrays or object lists to Int64."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelmap.adapters import _common, read

DATA = Path(__file__).parent / "data"

_TRICKY = [[[1, 2], [3]], [], [[]], [1.5], [1e16], ["é"], [True], [None], [math.nan], [2**70], [-3, [4]], None,
           [[64, 1, 28, 28], [32, 1, 3, 3], [32], [], []], {"a": 1}, "x", 5, -0.0]


@pytest.fixture
def no_orjson(monkeypatch):
    monkeypatch.setattr(_common, "_orjson", None)


def test_compact_json_same_with_and_without_orjson(monkeypatch):
    fast = _common.compact_json(_TRICKY)
    monkeypatch.setattr(_common, "_orjson", None)
    assert _common.compact_json(_TRICKY) == fast


@pytest.mark.parametrize("doc", [b'{"a": NaN}', b'{"a": 123456789012345678901234567890}', b'\xef\xbb\xbf{"a": 1}',
                                 '{"a": 1}'.encode("utf-16"), b'{"a": "\\ud800"}', b'{"a": 1, "a": 2}', b'[1e400]'])
def test_load_json_same_with_and_without_orjson(tmp_path, monkeypatch, doc):
    p = tmp_path / "doc.json"
    p.write_bytes(doc)

    def load():
        try:
            return repr(_common.load_json(p))
        except Exception as exc:  # noqa: BLE001 - the comparison is of whatever happens
            return type(exc).__name__

    fast = load()
    monkeypatch.setattr(_common, "_orjson", None)
    assert load() == fast


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "cpu_torch_kineto.json.gz", "cpu_mxnet_profile.json.gz"])
def test_json_adapters_same_without_orjson(monkeypatch, name):
    fast = read(DATA / name)
    monkeypatch.setattr(_common, "_orjson", None)
    pd.testing.assert_frame_equal(read(DATA / name), fast, check_exact=True)


@pytest.mark.parametrize("values", [[1, None, 2.5], [1, 2, 3], [], [None], [True, 1], ["12", 3], [2**60, 1],
                                    [math.inf, 1], [{"a": 1}, 2], ["x", None]])
def test_numeric_is_to_numeric(values):
    got = _common.numeric(values)
    want = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
    np.testing.assert_array_equal(got.to_numpy(dtype="float64"), want.to_numpy(dtype="float64"))


_MOSTLY_PLAIN = [[*range(20), "Spans"], [None, *range(20), "3.5"], [*range(20), "12"], [*range(20), True],
                 [2**60, *range(20), "x"], [*range(20), "1e400", None], [*range(20), {"a": 1}], [1.5] * 20 + ["-0"]]


@pytest.mark.parametrize("values", _MOSTLY_PLAIN)
def test_numeric_with_a_few_odd_values_is_to_numeric(values):
    """A few non-numbers among numbers (a string pid) take a split path: the same Series."""
    pd.testing.assert_series_equal(_common.numeric(values),
                                   pd.to_numeric(pd.Series(values, dtype=object), errors="coerce"))


@pytest.mark.parametrize("values", [[1, None, 2.5, None], [None, None], [], [None, 2**60], [None, "x", 3], [None, True]])
def test_numeric_at_is_numeric(values):
    rows = [j for j, v in enumerate(values) if v is not None]
    pd.testing.assert_series_equal(_common.numeric_at(len(values), rows, [values[j] for j in rows]),
                                   _common.numeric(values))


@pytest.mark.parametrize("values", [np.array([1.4, np.nan, -2.5, 3.5]), np.array([1, 2], dtype="int64"),
                                    pd.Series([np.nan]), np.array([], dtype="float64")])
def test_int64_array_fast_path_is_the_object_path(values):
    fast = _common.int64_array(values, "x", "c")
    slow = _common.int64_array(pd.Series(values, dtype=object), "x", "c")
    pd.testing.assert_extension_array_equal(fast, slow)


# --- the Kineto trace read a chunk of the traceEvents array at a time ----------------------------
def _whole(monkeypatch, path):
    """The Kineto adapter with the chunked reader switched off: one parse of the whole document."""
    from kernelmap.adapters import kineto

    def unavailable(*args, **kwargs):
        raise _common.NoFastPath
        yield

    with monkeypatch.context() as m:
        m.setattr(kineto, "trace_event_chunks", unavailable)
        m.setattr(kineto, "_scan", None)
        return kineto.read(path)


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "cpu_torch_kineto.json.gz"])
@pytest.mark.parametrize("chunk", [300, 4000, 60000])
def test_kineto_in_chunks_is_the_whole_parse(monkeypatch, name, chunk):
    """Cut into 300-byte to 60 KB chunks, the real traces give exactly the records of one parse.
    (GPU kernel names such as ``{lambda(float)#1}, std::array`` hold ``},`` inside strings.)
    The chunked parse is orjson's (without it, ``trace_event_chunks`` says NoFastPath)."""
    pytest.importorskip("orjson")
    from kernelmap.adapters import kineto

    data = _common.read_bytes(DATA / name)
    chunks = list(_common.trace_event_chunks(data, chunk))
    whole = _common.parse_json(data, name)["traceEvents"]
    assert len(chunks) >= len(data) // chunk // 2 > 1
    assert [e for _, evs in chunks for e in evs] == whole
    assert [first for first, _ in chunks] == list(np.cumsum([0] + [len(evs) for _, evs in chunks[:-1]]))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(kineto, "_scan", None)  # the chunked typed path, not the native scanner
    pd.testing.assert_frame_equal(kineto.read(DATA / name), _whole(monkeypatch, DATA / name), check_exact=True)


_EVENT = '{"ph": "X", "name": "a},b", "ts": 1, "args": {"x": {"y": 1}, "z": [1]}}'


def _doc(template: str, n: int = 1, sep: str = ",\n") -> str:
    """``template`` with each ``@`` replaced by ``n`` copies of ``_EVENT``."""
    return template.replace("@", sep.join([_EVENT] * n))


@pytest.mark.parametrize(("doc", "valid"), [
    (_doc('{"traceEvents": [@]}', 5, ", "), True),
    (_doc('{"a": {"b": 1},\n "traceEvents": [\n@\n],\n"traceName": "t]"}', 5), True),
    ('{"traceEvents": []}', True),
    (_doc('{"traceEvents": [@,\n]}', 5), False),  # a trailing comma
    (_doc('{"traceEvents": [@', 5), False),  # truncated
    (_doc('{"traceEvents": [@]', 5), False),
    (_doc('{"traceEvents": [@]}, 1', 5), False),
    (_doc('{"traceEvents": [@], "traceEvents": [@]}'), True),  # the last one wins
    (_doc('{"x": {"traceEvents": [@]}, "traceEvents": []}'), True),  # a nested key of the same name
    (_doc('{"traceEvents": [@, {"ts": NaN}]}'), None),  # stdlib's JSON, not orjson's: stdlib decides
    (_doc('{"traceEvents": [@, {"ts": 123456789012345678901}]}'), True),
    (_doc('{"traceEvents": [@}, @]}'), False),
])
@pytest.mark.parametrize("chunk", [1, 40, 1 << 20])
def test_trace_event_chunks_yield_the_array_or_step_aside(doc, valid, chunk):
    """Either the chunks are exactly the array a whole parse finds, or NoFastPath (the whole parse
    then decides, and reports any error); never a different list, never an invalid document."""
    import json

    data = doc.encode()
    try:
        got = [e for _, evs in _common.trace_event_chunks(data, chunk) for e in evs]
    except _common.NoFastPath:
        got = None
    if not valid:
        assert got is None
        if valid is False:
            with pytest.raises(ValueError):
                json.loads(data)
    elif got is not None:
        assert got == json.loads(data)["traceEvents"]


def _kineto_doc(extra_events: list) -> dict:
    base = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 1.0, "dur": 10.0,
             "args": {"External id": 7, "Input Dims": [[64, 1, 28, 28], [32, 1, 3, 3], [32], [], []]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0,
             "args": {"correlation": 9, "External id": 7}},
            {"ph": "X", "cat": "kernel", "name": "k<1, 2>", "pid": 0, "tid": 7, "ts": 3.0, "dur": 2.5,
             "args": {"correlation": 9, "stream": 7, "grid": [4, 1, 1], "block": [128, 1, 1, 5]}},
            {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 3.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
            {"ph": "i", "s": "t", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0.0, "name": "Iteration Start"}]
    return {"schemaVersion": 1, "traceEvents": base + extra_events}


# (extra events, whether the typed path reads them itself rather than leaving the file to the general path)
_KINETO_VARIANTS = [
    ([], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": "Spans", "tid": 1, "ts": 5, "dur": 1,
       "args": {"Input Dims": [[64, 128], [10, 128], [128, 10]]}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 5.5, "args": None}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 6, "dur": 1,
       "args": {"Input Dims": [[-1, 2], [ 2 , 3 ]], "Sequence number": 4}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 6, "dur": 1,
       "args": {"Input Dims": [[1.0, 2], "x", None, {"a": 1}]}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 6, "dur": 1,
       "args": {"Input Dims": None, "bytes": 2**60}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 6, "dur": 1,
       "args": {"Input Dims": "RAW:[[-0, 2], [2, 3]]"}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 6, "dur": 1,
       "args": {"Input Dims": "RAW:[[64, 1, 28, 28],[32,1,3,3] , [32], [], [ ]]"}}], True),
    ([{"ph": "X", "cat": None, "name": "x", "pid": 1, "tid": 1, "ts": 7, "dur": 1, "args": {}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 7, "dur": 1, "args": []}], False),
    ([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 8, "dur": 1,
       "args": {"grid": [1.5, 2, 3], "correlation": "9"}}], True),
    # names and ids the native scanner decodes or leaves to the Python paths
    ([{"ph": "X", "cat": "cpu_op", "name": "a\"b\\c/\u00e9\U0001f600\t", "pid": 1, "tid": 7, "ts": 1234567890123.4567,
       "dur": 1e-3, "args": {"Sequence number": -0, "stream": 1.0e2}}], True),
    ([{"ph": "X", "cat": "cpu_op", "name": "x", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 9.999999999999999e14,
       "dur": 0.1, "args": {"grid": [], "block": "x", "bytes": None}}], True),
    ([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 8, "dur": 1, "args": {"stream": True}}], True),
    ([{"ph": "i", "cat": 3, "name": 4, "args": {"grid": [1], "stream": [], "Input Dims": {}}}], True),
]


@pytest.mark.parametrize("extra, typed", _KINETO_VARIANTS)
def test_kineto_typed_path_is_the_general_path(tmp_path, monkeypatch, extra, typed):
    """Odd but valid events: the typed (msgspec) path gives the general path's records, or
    leaves the file to it."""
    from kernelmap.adapters import kineto

    if kineto._typed is None:
        pytest.skip("msgspec not installed")
    f = tmp_path / "t.json"
    text = json.dumps(_kineto_doc(extra), indent=1)
    for raw in re.findall(r'"RAW:([^"]*)"', text):  # JSON text as written, not as json.dumps writes it
        text = text.replace(f'"RAW:{raw}"', raw)
    f.write_text(text)
    native = read(f)  # the native scanner where it is built (it takes these files or leaves them)
    monkeypatch.setattr(kineto, "_scan", None)
    taken = []
    real = kineto._typed_columns
    monkeypatch.setattr(kineto, "_typed_columns", lambda *a: taken.append(1) or real(*a))
    fast = read(f)
    assert bool(taken) == typed
    pd.testing.assert_frame_equal(native, fast, check_exact=True)
    monkeypatch.setattr(kineto, "_typed", None)
    pd.testing.assert_frame_equal(read(f), fast, check_exact=True)


@pytest.mark.parametrize("ts", ["true", '"12"', "null"])
def test_kineto_ts_not_a_number_is_refused(tmp_path, monkeypatch, ts):
    """A ts that is not a JSON number (a bool, a string, null) is a ParseError on every path (a
    float path used to read ``true`` as 1 us)."""
    from kernelmap.adapters import kineto
    from kernelmap.errors import ParseError

    f = tmp_path / "t.json"
    f.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                 f'"tid": 7, "ts": {ts}, "dur": 1}}]}}')
    for attr in ("_scan", "_typed"):
        with pytest.raises(ParseError, match="ts"):
            read(f)
        monkeypatch.setattr(kineto, attr, None)
    with pytest.raises(ParseError, match="ts"):
        read(f)


@pytest.mark.parametrize("seed", range(40))
def test_span_order_is_lexsort(seed):
    """``canonical.span_order`` (one stable sort of a (thread rank, start) key where no two spans of
    a thread start together) is the three-key lexsort: with and without ties, NA threads (-1),
    negative and 2**60-sized starts (the key does not fit: lexsort)."""
    from kernelmap.adapters import canonical

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    tid = rng.choice([-1, 0, 5, 527, 2**40], n) if seed % 2 else rng.integers(-3, 3, n)
    start = int(rng.choice([0, 1_763_900_000_000_000_000, -5, 2**60])) + rng.integers(0, [10, 10**6, 10**12][seed % 3], n)
    if seed % 4 == 3 and n:
        start[0] = -(2**61)  # a span wider than the key holds
    end = start + rng.integers(0, 60, n)
    want = np.lexsort((-(end - start), start, tid))
    np.testing.assert_array_equal(canonical.span_order(tid, start, end), want)


@pytest.mark.parametrize("seed", range(5))
def test_native_nest_is_the_python_nest(monkeypatch, seed):
    """The native stack pass (``canonical.forest``) gives the Python loop's parents (``nest``; ties
    in start and length, zero-length spans, several threads, unsorted input)."""
    from kernelmap.adapters import canonical

    if canonical._native is None:
        pytest.skip("the native helpers are not built here")
    rng = np.random.default_rng(seed)
    n = 3000
    tid = rng.integers(0, 4, n)
    start = rng.integers(0, 500, n)
    end = start + rng.integers(0, 60, n)
    mapped, is_op = rng.random(n) < 0.3, rng.random(n) < 0.5
    native = canonical.nest(tid, start, end)
    native_forest = canonical.forest(tid, start, end, mapped, is_op)
    monkeypatch.setattr(canonical, "_native", None)
    np.testing.assert_array_equal(native, canonical.nest(tid, start, end))
    assert (native >= 0).any()
    # forest: the same parents, and each span's outermost mapped ancestor and nearest strict op
    # ancestor as the Python passes by depth give them
    parent, top, op = canonical.forest(tid, start, end, mapped, is_op)
    np.testing.assert_array_equal(parent, native)
    for got, want in zip(native_forest, (parent, top, op), strict=True):
        np.testing.assert_array_equal(got, want)
    assert (top >= 0).any() and (op >= 0).any() and (top != np.arange(n)).any()
    # the Python answers checked by their definitions, walking each span's chain up
    for i in rng.choice(n, 200, replace=False):
        chain, p = [], parent[i]
        while p >= 0:
            chain.append(p)
            p = parent[p]
        assert op[i] == next((a for a in chain if is_op[a]), -1)
        assert top[i] == next((a for a in reversed([i, *chain]) if mapped[a]), -1)


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "cpu_torch_kineto.json.gz"])
def test_native_scan_in_two_threads_is_one_thread(name):
    """The native scanner's two-thread read (forced on a small file) gives the one-thread columns,
    also where the second thread's start is not an element boundary (a "},\\n" inside an event)."""
    from kernelmap.adapters import kineto

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    data = _common.read_bytes(DATA / name)
    start, end = _common.trace_events_extent(data, digits=False)
    one = _scan(data, start, end, 1)
    assert one is not None and one[0] > 100
    two = _scan(data, start, end, 2, 0)
    assert two == one
    # the only "},\n" is inside an event's args, past the middle: the second thread's start is no
    # element boundary, the first thread does not meet it and reads the whole array itself
    ev = '{"ph": "X", "cat": "kernel", "name": "k%d", "ts": %d, "dur": 1, "pid": 1, "tid": 1}'
    inner = '{"ph": "X", "cat": "cpu_op", "name": "n", "ts": 5, "args": {"a": {"b": 1},\n"c": 2}}'
    events = [ev % (i, i) for i in range(200)]
    doc = ('{"traceEvents": [' + ", ".join(events[:120] + [inner] + events[120:]) + "]}").encode()
    s2, e2 = _common.trace_events_extent(doc, digits=False)
    one = _scan(doc, s2, e2, 1)
    assert one is not None and one[0] == 201
    assert _scan(doc, s2, e2, 2, 0) == one
    # compact JSON ("},{" between elements): the first "}," + "{" past the middle is inside a long
    # name; the first thread does not meet it and reads the array itself
    ev = '{"ph":"X","cat":"kernel","name":"k%d","ts":%d,"dur":1,"pid":1,"tid":1}'
    inner = '{"ph":"X","cat":"cpu_op","name":"' + "p" * 4000 + '},{q","ts":5}'
    events = [ev % (i, i) for i in range(200)]
    doc = ('{"traceEvents":[' + ",".join(events[:100] + [inner] + events[100:]) + "]}").encode()
    s3, e3 = _common.trace_events_extent(doc, digits=False)
    mid = s3 + (e3 - s3) // 2
    assert doc.index(b"},{", mid) > doc.index(b'"pppp')  # the first candidate is the one in the name
    one = _scan(doc, s3, e3, 1)
    assert one is not None and one[0] == 201
    assert _scan(doc, s3, e3, 2, 0) == one
    compact = ('{"traceEvents":[' + ",".join(events) + "]}").encode()  # a boundary is met: two threads
    s4, e4 = _common.trace_events_extent(compact, digits=False)
    assert _scan(compact, s4, e4, 2, 0) == _scan(compact, s4, e4, 1)


def _scan(data, start, end, *how):
    """The native scanner's result with each column's memory as bytes (comparable with ==)."""
    from kernelmap.adapters import kineto

    got = kineto._scan.scan(data, start, end, *how)
    if got is None:
        return None
    n, cols, *rest = got
    return (n, {k: bytes(memoryview(v)) for k, v in cols.items()}, *rest)


def test_native_scan_reads_numbers_as_python_does():
    """Decimals of up to 19 significant digits (Kineto's ts: 13 digits of microseconds and 3 of
    nanoseconds) read by the scanner's fast path or strtod are Python's floats, bit for bit (as
    ``External id``, kept as float64); ts and dur become the exact nanoseconds of their text
    (``ns_from_text``: the decimal times 1000, rounded half to even; not a float's rounding, which
    misses by up to 128 ns at epoch microseconds); a ts whose nanoseconds int64 cannot hold makes
    the scanner decline the file (the typed path, which raises, then reads it)."""
    from kernelmap.adapters import kineto

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    rng = np.random.default_rng(5)
    texts = [f"{int(a)}.{int(b):0{k}d}" for a, b, k in zip(rng.integers(0, 10**13, 3000), rng.integers(0, 10**6, 3000),
                                                          rng.integers(1, 7, 3000), strict=True)]
    texts += ["0.1", "1763912345678.123", "1.5e-7", "-0.0", "2.5e-4", "-17.0005"]
    wide = ["9007199254740993.0", "9007199254740992.5", "4503599627370497.5"]  # past 2**53: ts only

    def doc(ts, ext):
        return ('{"traceEvents":[' + ",".join(f'{{"ph":"X","name":"n","ts":{t},"dur":{t},"args":{{"External id":{x}}}}}'
                                              for t, x in zip(ts, ext, strict=True)) + "]}").encode()

    d = doc(texts + wide, texts + ["1"] * len(wide))
    got = kineto._scan.scan(d, *_common.trace_events_extent(d, digits=False), 1)
    assert got is not None and got[0] == len(texts) + len(wide)
    ext = np.frombuffer(got[1]["ext"], dtype="float64")[:len(texts)]
    assert ext.tobytes() == np.array([float(t) for t in texts]).tobytes()
    want = _common.ns_from_text([t.encode() for t in texts + wide])
    assert want[texts.index("1763912345678.123")] == 1763912345678123  # float64 * 1000: ...122.9999
    assert list(want[-3:]) == [9007199254740993000, 9007199254740992500, 4503599627370497500]
    import decimal  # the decimal text times 1000, rounded half to even: what Decimal says

    exact = [int((decimal.Decimal(t) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN)) for t in texts + wide]
    assert want.tolist() == exact
    for col in ("ts", "dur"):
        np.testing.assert_array_equal(np.frombuffer(got[1][col], dtype="int64"), want)
    for big in ("1e22", "123456789012345678.9", "-9223372036854776.0"):  # nanoseconds beyond int64
        with pytest.raises(ValueError):
            _common.ns_from_us([float(big)])
        d = doc(["1", big], ["1", "1"])
        assert kineto._scan.scan(d, *_common.trace_events_extent(d, digits=False), 1) is None


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "gpu_nsys.sqlite.gz", "cpu_torch_onednn.log.gz"])
def test_xz_is_read_like_gzip(tmp_path, name):
    """An xz-compressed trace or log is recognised and read as its gzip twin is (same records but
    the file name); a corrupt one is a ParseError."""
    import gzip
    import lzma

    from kernelmap import adapters
    from kernelmap.errors import ParseError

    raw = gzip.decompress((DATA / name).read_bytes())
    xz = tmp_path / name.replace(".gz", ".xz")
    xz.write_bytes(lzma.compress(raw))
    assert adapters.detect(xz) == adapters.detect(DATA / name)
    a, b = adapters.read(xz), adapters.read(DATA / name)
    assert set(a["source_file"]) == {xz.name}
    pd.testing.assert_frame_equal(a.drop(columns="source_file"), b.drop(columns="source_file"), check_exact=True)
    bad = tmp_path / ("bad_" + xz.name)
    bad.write_bytes(lzma.compress(raw)[:200])
    with pytest.raises(ParseError):
        adapters.read(bad, adapters.detect(DATA / name))


def test_uncompressed_kineto_is_scanned_mapped(tmp_path, monkeypatch):
    """An uncompressed Kineto file is scanned through a memory map (not read into memory), with
    the records of its gzip twin; a broken one is not scanned twice and is the whole parse's error."""
    import gzip

    from kernelmap.adapters import kineto
    from kernelmap.errors import ParseError

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    plain = tmp_path / "gpu_kineto.json"
    plain.write_bytes(gzip.decompress((DATA / "gpu_kineto.json.gz").read_bytes()))
    scans = []
    real = kineto._scanned
    monkeypatch.setattr(kineto, "_scanned", lambda data, rd=None: scans.append(type(data).__name__) or real(data, rd))
    pd.testing.assert_frame_equal(read(plain).drop(columns="source_file"),
                                  read(DATA / "gpu_kineto.json.gz").drop(columns="source_file"), check_exact=True)
    assert scans == ["mmap", "bytes"]  # the mapped file, then the gzip file's content
    broken = tmp_path / "broken.json"
    broken.write_bytes(plain.read_bytes()[:-50])
    scans.clear()
    with pytest.raises(ParseError):
        read(broken)
    assert scans == ["mmap"]


def test_uncompressed_kineto_rank_without_a_second_read(tmp_path, monkeypatch):
    """``distributedInfo.rank`` of an uncompressed trace comes from the document the scanner
    checked around the mapped array: the file is never read into memory (it was read whole a
    second time for the rank: 282 MB on the 1M-event bench file). The real H200 trace with a
    ``distributedInfo`` member put before its ``traceEvents`` (as PyTorch's DDP traces have it)."""
    import gzip

    from kernelmap.adapters import kineto

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    raw = gzip.decompress((DATA / "gpu_kineto.json.gz").read_bytes())
    at = raw.index(b"{")
    assert not raw[:at].strip() and b"distributedInfo" not in raw
    plain = tmp_path / "gpu_kineto.json"
    plain.write_bytes(b'{"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4},' + raw[at + 1:])
    reads = []
    real = kineto.read_bytes
    monkeypatch.setattr(kineto, "read_bytes", lambda path: reads.append(path) or real(path))
    df = kineto.read(plain)
    assert reads == []
    assert len(df) == len(read(DATA / "gpu_kineto.json.gz")) and (df["rank"] == 3).all()
    reads.clear()
    (tmp_path / "gpu_kineto.json.gz").write_bytes(gzip.compress(plain.read_bytes()))
    assert (kineto.read(tmp_path / "gpu_kineto.json.gz")["rank"] == 3).all()  # the read content's own
    assert reads == [tmp_path / "gpu_kineto.json.gz"]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_kineto_array_before_another_array_is_scanned(tmp_path, monkeypatch, suffix):
    """A trace whose ``traceEvents`` is followed by a member holding an array of its own
    (``deviceProperties`` after the events, as in TraceLens' H100 OWLv2 trace): the last ``]`` of
    the document is that member's, and the document around it parses too, so the extent taken
    runs past the array. The scanner ends the elements at the array's own ``]`` and the document
    around that is checked (and gives the rank): the native path, with the typed path's records.
    It used to fall to the typed path (2.4 s instead of 0.16 s of CPU on that 132k-event trace)."""
    import gzip

    from kernelmap.adapters import kineto

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    doc = json.loads(gzip.decompress((DATA / "gpu_kineto.json.gz").read_bytes()))
    tail = {k: doc.pop(k) for k in ("deviceProperties", "traceName")}
    text = json.dumps({**doc, **tail, "distributedInfo": {"rank": 2, "ranks": [0, 1, 2]}}, indent=1).encode()
    assert text.index(b'"traceEvents"') < text.index(b'"deviceProperties"')
    path = tmp_path / f"moved{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    scanned = []
    real = kineto._scanned
    monkeypatch.setattr(kineto, "_scanned", lambda data, rd=None: scanned.append(real(data, rd)) or scanned[-1])
    fast = kineto.read(path)
    assert [c is not None for c in scanned] == [True]
    assert (fast["rank"] == 2).all()
    monkeypatch.setattr(kineto, "_scan", None)
    pd.testing.assert_frame_equal(fast, kineto.read(path), check_exact=True)


def test_kineto_string_args_are_scanned(monkeypatch):
    """ROCm traces write some numeric args as strings (``"bytes": "65536"`` in hipMemcpy events of
    TraceLens' vLLM trace): the scanner hands them over and a plain decimal integer is read as the
    number the typed path makes of it, so the file stays on the native path (it fell to the typed
    one). Any other text (``"stream": "0x0"`` in the MI250 trace) leaves the file to the typed path.
    Both give the typed path's records; the strings' numbers checked against the raw JSON."""
    import gzip
    from decimal import Decimal

    from kernelmap.adapters import kineto

    if kineto._scan is None:
        pytest.skip("the native helpers are not built here")
    real, scanned = kineto._scanned, []
    monkeypatch.setattr(kineto, "_scanned", lambda data, rd=None: scanned.append(real(data, rd)) or scanned[-1])
    for name, native in [("tracelens_rocm_vllm_piecewise_hipgraph.json.gz", True),
                         ("hta_mi250_train_rocm62.json.gz", False)]:
        path = DATA / "foreign" / name
        scanned.clear()
        fast = kineto.read(path)
        assert [c is not None for c in scanned] == [native], name
        with monkeypatch.context() as m:
            m.setattr(kineto, "_scan", None)
            pd.testing.assert_frame_equal(fast, kineto.read(path), check_exact=True)
    events = json.loads(gzip.decompress((DATA / "foreign" / "tracelens_rocm_vllm_piecewise_hipgraph.json.gz")
                                        .read_bytes()), parse_float=Decimal)["traceEvents"]
    odd = [e for e in events if e.get("ph") == "X" and isinstance((e.get("args") or {}).get("bytes"), str)]
    assert len(odd) == 10
    df = kineto.read(DATA / "foreign" / "tracelens_rocm_vllm_piecewise_hipgraph.json.gz")
    got = df.set_index(["start_ns", "op_name"])["bytes"]
    for e in odd:
        ns = int(e["ts"] * 1000)  # exact: Decimal microseconds with at most 3 decimals
        assert got.loc[(ns, e["name"])] == int(e["args"]["bytes"]), e


def _link_by_external_id_before(df, ext):
    """kineto._link_by_external_id as it was before issue 11 (whole-column object round trips; the
    op lookup is the one it had, now a function of its own)."""
    from kernelmap.adapters import _trace, kineto

    need = df["op_event_id"].isna().to_numpy() & df["kind"].isin(["runtime", *_trace.DEVICE_KINDS]).to_numpy() & ~np.isnan(ext)
    if not need.any():
        return
    rows, src = kineto._external_id_ops(df["kind"].eq("op").to_numpy(), ext, need)
    for col in ("canonical_op", "direction", "layer", "phase", "iteration"):
        vals = df[col].to_numpy(dtype=object, na_value=None)
        keep = df.loc[rows, col].isna().to_numpy()
        vals[rows[keep]] = vals[src[keep]]
        df[col] = pd.array(vals, dtype=df[col].dtype)
    df.loc[rows, "op_event_id"] = df["event_id"].to_numpy()[src]
    _trace.refine_direction(df)


def test_kineto_external_id_link_is_as_before(tmp_path, monkeypatch):
    """Launches and kernels outside their op's time range are linked to the op with their External
    id, with the same records as before the speed work (its code kept above as the reference)."""
    from kernelmap.adapters import kineto

    doc = _kineto_doc([
        {"ph": "X", "cat": "cpu_op", "name": "aten::cudnn_convolution_backward", "pid": 1, "tid": 1, "ts": 40.0,
         "dur": 5.0, "args": {"External id": 11, "Sequence number": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 46.0, "dur": 1.0,
         "args": {"correlation": 21, "External id": 11}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_dgrad_implicit_gemm", "pid": 0, "tid": 7, "ts": 48.0,
         "dur": 2.0, "args": {"correlation": 21, "External id": 11}},
        {"ph": "X", "cat": "kernel", "name": "convertTensor_kernel", "pid": 0, "tid": 7, "ts": 51.0, "dur": 1.0,
         "args": {"correlation": 22, "External id": 11}},
        {"ph": "X", "cat": "kernel", "name": "k_without_op", "pid": 0, "tid": 7, "ts": 52.0, "dur": 1.0,
         "args": {"correlation": 23, "External id": 99}},
    ])
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    now = read(f)
    monkeypatch.setattr(kineto, "_link_by_external_id", _link_by_external_id_before)
    before = read(f)
    pd.testing.assert_frame_equal(now, before, check_exact=True)
    linked = now[now["kernel_name"].eq("sm90_xmma_dgrad_implicit_gemm").fillna(False)]
    assert linked["op_event_id"].notna().all() and (linked["canonical_op"] == "conv2d").all()
