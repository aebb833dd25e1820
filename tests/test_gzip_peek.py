"""The gzip content every adapter reads (``_common.gunzip``, ``gunzip_blocks``: ISA-L where ``isal`` is
installed, else zlib) is ``gzip.decompress``'s, byte for byte, and corrupt or cut data is an error; the
unsupported-device peek's search (``kineto.first_device_category``: the native helper where built, else the
regex ``_DEVICE_CAT``) finds what the regex finds."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from kernelmap.adapters import _common, kineto
from kernelmap.errors import ParseError
from kernelmap.native import helpers

DATA = Path(__file__).parent / "data" / "foreign"
FIXTURE = DATA / "hta_mtia_inference_head.json.gz"

try:
    from isal import isal_zlib
except ImportError:  # pragma: no cover - depends on the environment
    isal_zlib = None
LIBS = [pytest.param(zlib, id="zlib"),
        pytest.param(isal_zlib, id="isal", marks=pytest.mark.skipif(isal_zlib is None, reason="isal not installed"))]


@pytest.fixture(params=LIBS)
def inflater(request, monkeypatch):
    monkeypatch.setattr(_common, "_inflate_lib", request.param)
    return request.param


def _members() -> tuple[bytes, bytes]:
    """A real trace's gzip bytes, and two members of parts of its content with zero padding between
    and after them (``gzip.decompress`` reads that as the parts joined)."""
    raw = FIXTURE.read_bytes()
    text = gzip.decompress(raw)
    multi = gzip.compress(text[:1000], 1) + b"\0\0\0" + gzip.compress(text[1000:], 9) + b"\0"
    return raw, multi


def test_gunzip_is_gzip_decompress(inflater, tmp_path):
    raw, multi = _members()
    for data in (raw, multi):
        assert _common.gunzip(data) == gzip.decompress(data)
    bad_crc = bytearray(raw)
    bad_crc[-8] ^= 1  # the CRC-32 of the content
    bad_len = bytearray(raw)
    bad_len[-2] ^= 1  # its length
    for bad in (bytes(bad_crc), bytes(bad_len), raw[:-10], raw[:len(raw) // 2], multi + b"junk"):
        with pytest.raises(_common.GZIP_ERRORS):
            _common.gunzip(bad)
        f = tmp_path / "bad.json.gz"
        f.write_bytes(bad)
        with pytest.raises(ParseError, match="corrupt gzip data"):
            _common.read_bytes(f)


def test_gunzip_blocks_are_the_content_in_blocks(inflater, tmp_path):
    raw, multi = _members()
    for data in (raw, multi):
        f = tmp_path / "t.gz"
        f.write_bytes(data)
        want = gzip.decompress(data)
        with open(f, "rb") as fh:
            blocks = list(_common.gunzip_blocks(fh, 4096, read=1000))
        assert b"".join(blocks) == want
        assert [len(b) for b in blocks[:-1]] == [4096] * (len(blocks) - 1) and 0 < len(blocks[-1]) <= 4096
    f.write_bytes(raw[:len(raw) // 2])
    with open(f, "rb") as fh, pytest.raises(EOFError):
        list(_common.gunzip_blocks(fh, 4096))


CASES = [
    (b'{"cat": "cpu_op"}, {"cat": "kernel", "name": "k"}', "kernel"),
    (b'{"cat":"cpu_op"},{"cat" :\n\t"mtia_ccp_events"}', "mtia_ccp_events"),
    (b'{"cat":\x0b\x0c"xpu_runtime"}', "xpu_runtime"),  # \v and \f: whitespace to the regex too
    (b'{"cat": "kernels"}, {"cat": "Kernel"}', "Kernel"),  # an exact name is the whole value
    (b'{"cat": "kern"}, {"name": "kernel", "cat": "gpu_memset"}', "gpu_memset"),  # a name is no category
    (b'{"cat": "cpu_op", "args": {"cat": "cuda_runtime"}}', "cuda_runtime"),  # any "cat" member, as the regex
    (b'{"cat": "hpu_', None),  # no closing quote
    (b'{"cat" = "kernel"}', None),
    (b'{"cat": "cpu_op"}, {"cat": "user_annotation"}', None),
    (b'"cat""cat": "privateuse1_x\\"y"', "privateuse1_x\\"),  # up to the first quote, escaped or not
    (b"", None),
]


@pytest.mark.parametrize(("text", "want"), CASES)
def test_first_device_category_is_the_regex_match(text, want, monkeypatch):
    m = kineto._DEVICE_CAT.search(text)
    assert (m.group(1).decode() if m else None) == want
    if helpers is None or not hasattr(helpers, "first_value"):
        pytest.skip("the native helper is not built")
    assert kineto.first_device_category(text) == want
    assert kineto.first_device_category(bytearray(text)) == want  # any buffer (a mapped file)
    monkeypatch.setattr(kineto, "_scan", None)  # the regex twin
    assert kineto.first_device_category(text) == want


def test_first_device_category_on_a_real_trace():
    """The real MTIA trace: the category of its first device event, by the native helper and by the regex."""
    text = gzip.decompress(FIXTURE.read_bytes())
    m = kineto._DEVICE_CAT.search(text)
    assert m is not None and m.group(1).startswith(b"mtia_")
    assert kineto.first_device_category(text) == m.group(1).decode()


def test_one_ahead_makes_the_items_in_order_one_ahead_at_most():
    """The peek's read-ahead (``kineto._one_ahead``): every item in order, the next made in a second thread
    while the caller has this one, never two ahead; the maker's error is raised to the caller; closed early,
    the maker is not asked for more."""
    import threading

    made, seen, where = [], [], set()

    def items(n):
        for i in range(n):
            made.append(i)
            where.add(threading.current_thread().name)
            yield i

    for x in kineto._one_ahead(items(6)):
        assert made[-1] <= x + 1
        seen.append(x)
    assert seen == list(range(6)) and all(w.startswith("kernelmap-peek") for w in where)

    def cut():
        yield b"block"
        raise EOFError("the gzip data ends before its end-of-stream marker")

    with pytest.raises(EOFError):
        list(kineto._one_ahead(cut()))
    made.clear()
    ahead = kineto._one_ahead(items(100))
    assert next(ahead) == 0
    ahead.close()
    assert made in ([0], [0, 1])
