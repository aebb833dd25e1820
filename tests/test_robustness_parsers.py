"""Property-based robustness of every parser against mutated real fixtures (tests/mutations.py).

A parser fed a mutated file may only raise the project's ParseError/SchemaError; when it returns
records they must pass ``schema.validate``. Budget: the ``ci`` profile (default; derandomized, so
CI is deterministic) keeps this file well under a minute on two cores; set
``KERNELMAP_HYPOTHESIS_PROFILE=thorough`` for 200 examples per parser, or run
``benches/mutation_campaign.py`` for a larger campaign with a summary table.
"""

from __future__ import annotations

import gzip
import os

import mutations as M
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelmap import adapters, schema
from kernelmap.adapters import FORMATS
from kernelmap.errors import ParseError, SchemaError

_COMMON = dict(derandomize=True, deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("kernelmap-ci", max_examples=12, **_COMMON)
settings.register_profile("kernelmap-thorough", max_examples=200, **_COMMON)
PROFILE = settings.get_profile("kernelmap-" + os.environ.get("KERNELMAP_HYPOTHESIS_PROFILE", "ci"))
TRUNCATIONS = max(4, PROFILE.max_examples // 2)

TARGETS = M.targets()


@pytest.fixture(scope="module")
def mut_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mutations")


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
@settings(PROFILE)
@given(data=st.data())
def test_mutated_fixture_is_parsed_or_refused(target, data, mut_dir):
    op = data.draw(st.sampled_from(target.ops), label="op")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    path = M.mutate(target, op, seed, M.fresh_dir(mut_dir / "m"))
    assert M.check(target, path) in ("error", "records")


# Mutations the 1,000-per-parser campaign (benches/mutation_campaign.py -n 1000 --seed 7) found
# escaping as other exceptions: a zlib.error from corrupt gzip, a UnicodeDecodeError from a
# non-UTF-8 SQLite text, a TypeError from an unattributed kernel's NA canonical op, an
# OverflowError and a ValueError.
CAMPAIGN_FINDS = [
    ("nsys:gpu_nsys.sqlite.gz", "delete_rows", 3843426609),
    ("nsys:gpu_nsys.sqlite.gz", "gzip_flip", 3024517369),
    ("nsys:gpu_nsys.sqlite.gz", "flip_many", 754314360),
    ("adapters.read:gpu_nsys.sqlite.gz", "null_values", 3591869756),
    ("adapters.read:gpu_nsys.sqlite.gz", "flip_many", 220014700),
    ("adapters.read:gpu_nsys.sqlite.gz", "gzip_flip", 3021864542),
    # and the full campaign: an MXNet timestamp beyond int64, a cuBLASLt layout with a broken number
    ("mxnet_profiler:cpu_mxnet_profile.json.gz", "event_field_junk", 4086465527),
    ("adapters.read:cpu_mxnet_profile.json.gz", "event_field_junk", 4265965867),
    ("adapters.read:gpu_cublaslt.log.gz", "flip_many", 2258147868),
]


@pytest.mark.parametrize(("name", "op", "seed"), CAMPAIGN_FINDS)
def test_campaign_finds_stay_handled(name, op, seed, mut_dir):
    target = next(t for t in TARGETS if t.name == name)
    path = M.mutate(target, op, seed, M.fresh_dir(mut_dir / "c"))
    assert M.check(target, path) in ("error", "records")


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
@settings(PROFILE, max_examples=TRUNCATIONS)
@given(data=st.data())
def test_truncation_at_any_byte(target, data, mut_dir):
    raw = M._raw(target.fixture)
    n = data.draw(st.integers(0, len(raw) - 1), label="keep bytes")
    d = M.fresh_dir(mut_dir / "t")
    path = d / target.fixture.name.removesuffix(".gz")
    path.write_bytes(raw[:n])
    assert M.check(target, path) in ("error", "records")


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("fixture", sorted({t.fixture for t in TARGETS}), ids=lambda p: p.name)
def test_adapter_given_another_format(fmt, fixture):
    """Each adapter called directly on every real fixture (its own included): records that pass
    validation, or ParseError — never another exception."""
    try:
        df = FORMATS[fmt].read(fixture)
    except ParseError:
        return
    schema.validate(df)


def test_unmutated_fixtures_parse():
    """The properties above mean something only if the fixtures themselves give records."""
    for t in TARGETS:
        assert len(t.parse(t.fixture)) > 0, t.name


# --- named bad inputs: the error names the file and the line or record ------------------------------

def _gz(path, data: bytes):
    path.write_bytes(gzip.compress(data))
    return path


def test_truncated_kineto_names_line(tmp_path):
    raw = M._raw(M.DATA / "cpu_torch_kineto.json.gz")
    p = _gz(tmp_path / "trace.json.gz", raw[: len(raw) // 2])
    with pytest.raises(ParseError) as ei:
        adapters.read(p)
    assert ei.value.path == str(p) and ei.value.line is not None and ei.value.line > 1
    assert str(ei.value).startswith(f"{p}:{ei.value.line}: invalid JSON")


def test_truncated_mxnet_profile_names_line(tmp_path):
    raw = M._raw(M.DATA / "cpu_mxnet_profile.json.gz")
    p = tmp_path / "profile.json"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(ParseError) as ei:
        adapters.read(p)
    assert ei.value.line is not None and ei.value.line > 1 and "invalid JSON" in ei.value.cause


def test_mxnet_unclosed_operator_names_record(tmp_path):
    """A trace cut between events (valid JSON): the B that never ends is named by its record."""
    import json

    doc = json.loads(M._raw(M.DATA / "cpu_mxnet_profile.json.gz"))
    ev = doc["traceEvents"]
    last_e = max(i for i, e in enumerate(ev) if e.get("ph") == "E" and e.get("cat") == "operator")
    del ev[last_e]
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ParseError) as ei:
        adapters.read(p)
    assert ei.value.record is not None and "never ends" in ei.value.cause


@pytest.mark.parametrize("fixture", ["gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz",
                                     "cpu_torch_onednn.log.gz"])
def test_empty_library_log(tmp_path, fixture):
    """An empty file has no content to sniff (ParseError naming it); each adapter called on it
    directly returns no records."""
    p = tmp_path / fixture.removesuffix(".gz")
    p.write_bytes(b"")
    with pytest.raises(ParseError, match="unrecognised content") as ei:
        adapters.read(p)
    assert ei.value.path == str(p)
    t = next(t for t in TARGETS if t.fixture.name == fixture and not t.name.startswith("adapters."))
    assert len(schema.validate(t.parse(p))) == 0


def test_truncated_cudnn_log_mid_header_names_line(tmp_path):
    raw = M._raw(M.DATA / "gpu_cudnn.log.gz").decode()
    lines = raw.splitlines()
    h = [i for i, ln in enumerate(lines) if ln.startswith("I! CuDNN")][5]
    p = tmp_path / "cudnn.log"
    p.write_text("\n".join(lines[:h] + [lines[h][:20]]) + "\n")
    with pytest.raises(ParseError) as ei:
        adapters.read(p)
    assert ei.value.line == h + 1 and "header" in ei.value.cause


def _blocks(text: str, head: str) -> list[list[str]]:
    lines = text.splitlines()
    hs = [i for i, ln in enumerate(lines) if ln.startswith(head)]
    return [lines[a:b] for a, b in zip(hs, [*hs[1:], len(lines)], strict=True)]


def test_interleaved_threads_cudnn_log(tmp_path):
    """Two threads' calls interleaved block by block (what a multi-threaded log looks like): the
    same calls are read, whatever the order."""
    raw = M._raw(M.DATA / "gpu_cudnn.log.gz").decode()
    blocks = _blocks(raw, "I! ")
    half = len(blocks) // 2
    mixed = [b for pair in zip(blocks[:half], blocks[half:2 * half], strict=True) for b in pair] + blocks[2 * half:]
    p = tmp_path / "cudnn.log"
    p.write_text("\n".join(ln for b in mixed for ln in b) + "\n")
    a, b = adapters.read(M.DATA / "gpu_cudnn.log.gz"), adapters.read(p)
    assert sorted(a["library_call"]) == sorted(b["library_call"])
    assert b.attrs["calls"] == a.attrs["calls"]


def test_cudnn_and_cublas_records_mixed_in_one_file(tmp_path):
    """cuBLAS blocks spliced into a cuDNN log (two libraries logging to one file): a ParseError
    naming the first foreign line, not a silent mis-read."""
    cudnn = M._raw(M.DATA / "gpu_cudnn.log.gz").decode().splitlines()
    cublas = M._raw(M.DATA / "gpu_cublas.log.gz").decode().splitlines()
    at = next(i for i, ln in enumerate(cudnn) if ln.startswith("I! ") and i > 100)
    p = tmp_path / "mixed.log"
    p.write_text("\n".join(cudnn[:at] + cublas[:40] + cudnn[at:]) + "\n")
    with pytest.raises(ParseError) as ei:
        adapters.read(p)
    assert ei.value.line == at + 1


@pytest.mark.parametrize("line, ok", [
    # v0.x (MKL-DNN 0.x): no prop_kind field layout we know -> refused with its line
    ("mkldnn_verbose,exec,reorder,simple:any,undef,in:f32_oihw out:f32_Ohwi8o,num:1,32x1x3x3,0.0151367", False),
    # a future version with an unknown operation word
    ("onednn_verbose,v2,primitive,execute,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:abcd::f0,,alg:convolution_direct,mb64_ic1oc32_ih28oh26kh3sh1dh0ph0_iw28ow26kw3sw1dw0pw0,0.2", False),
    # v3.x with timestamps: read
    ("onednn_verbose,1700000000000.5,primitive,exec,cpu,eltwise,jit:avx2,forward_training,data_f32::blocked:abcd::f0 diff_undef::undef::,,alg:eltwise_relu alpha:0 beta:0,64x32x26x26,0.05", True),
])
def test_onednn_other_versions(tmp_path, line, ok):
    p = tmp_path / "onednn.log"
    p.write_text("program output\n" + line + "\n")
    if ok:
        assert len(schema.validate(adapters.read(p))) == 1
    else:
        with pytest.raises(ParseError) as ei:
            adapters.read(p)
        assert ei.value.line == 2


def _nsys_db(tmp_path):
    import sqlite3

    p = tmp_path / "report.sqlite"
    p.write_bytes(M._raw(M.DATA / "gpu_nsys.sqlite.gz"))
    return p, sqlite3.connect(p)


@pytest.mark.parametrize("sql, needle", [
    ("DROP TABLE StringIds", "StringIds"),
    ("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN correlationId", "correlationId"),
    ("ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME RENAME COLUMN globalTid TO globalThreadId", "globalTid"),
    ("ALTER TABLE StringIds RENAME COLUMN value TO text", "value"),
])
def test_nsys_export_of_another_version(tmp_path, sql, needle):
    p, con = _nsys_db(tmp_path)
    con.execute(sql)
    con.commit()
    con.close()
    with pytest.raises(ParseError, match=needle) as ei:
        adapters.read(p)
    assert ei.value.path == str(p)


def test_not_sqlite_at_all(tmp_path):
    p = tmp_path / "report.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    with pytest.raises(ParseError, match="SQLite") as ei:
        adapters.read(p)
    assert ei.value.path == str(p)
    q = tmp_path / "other.sqlite"
    q.write_text("hello\n")
    with pytest.raises(ParseError, match="unrecognised content"):
        adapters.read(q)


@pytest.mark.parametrize("version, word", [(schema.SCHEMA_VERSION + 1, "newer"), (1, "older"), ("x", "not a number")])
def test_parquet_of_another_schema_version(tmp_path, version, word):
    t = next(t for t in TARGETS if t.kind == "parquet")
    p = tmp_path / "records.parquet"
    import pyarrow.parquet as pq

    table = pq.read_table(t.fixture)
    meta = dict(table.schema.metadata)
    meta[b"kernelmap.schema_version"] = str(version).encode()
    pq.write_table(table.replace_schema_metadata(meta), p)
    with pytest.raises(SchemaError, match=word) as ei:
        schema.read_parquet(p)
    assert str(p) in str(ei.value)


KINETO = next(t for t in TARGETS if t.name == "kineto:cpu_torch_kineto.json.gz")


@settings(PROFILE)
@given(data=st.data())
def test_mutated_kineto_in_small_chunks_is_the_whole_parse(data, mut_dir, monkeypatch_module):
    """A mutated Kineto trace read by the native scanner, or 2 KB of traceEvents at a time where it
    steps aside, gives what one whole-document parse gives: the same records, or a ParseError (the
    whole parse's own, for a broken document)."""
    import pandas as pd

    from kernelmap.adapters import _common, kineto

    op = data.draw(st.sampled_from(KINETO.ops), label="op")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    path = M.mutate(KINETO, op, seed, M.fresh_dir(mut_dir / "k"))

    def outcome():
        try:
            return kineto.read(path)
        except ParseError as exc:
            return str(exc)

    def unavailable(*args, **kwargs):
        raise _common.NoFastPath
        yield

    monkeypatch_module.setattr(kineto, "CHUNK_BYTES", 2000)
    chunked = outcome()
    monkeypatch_module.setattr(kineto, "trace_event_chunks", unavailable)
    monkeypatch_module.setattr(kineto, "_scan", None)
    whole = outcome()
    monkeypatch_module.undo()
    if isinstance(whole, str) or isinstance(chunked, str):
        assert type(chunked) is type(whole)  # both refuse (the first bad record may differ per chunk)
    else:
        pd.testing.assert_frame_equal(chunked, whole, check_exact=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
