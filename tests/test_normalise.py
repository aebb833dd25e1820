"""`kernelmap normalise`: mixing files, run linking, summary figures, Parquet, run directories."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from kernelmap import schema
from kernelmap.cli import main as cli
from kernelmap.normalise import normalise, normalise_run_dir

DATA = Path(__file__).parent / "data"
GPU = [DATA / n for n in ("gpu_nsys.sqlite.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz")]
KINETO_GPU = DATA / "gpu_kineto.json.gz"


def test_gpu_run_summary(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    assert cli(["normalise", str(KINETO_GPU), *map(str, GPU), "-o", str(out), "--json", "--run", "h200"]) == 0
    s = json.loads(capsys.readouterr().out)
    db = tmp_path / "x.sqlite"
    db.write_bytes(gzip.open(GPU[0]).read())
    n, total = sqlite3.connect(db).execute('select count(*), sum("end"-start) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    ev = [e for e in json.loads(gzip.open(KINETO_GPU).read())["traceEvents"] if e.get("cat") == "kernel"]
    k_n, k_total = len(ev), sum(round(e["dur"] * 1000) for e in ev)
    # top level: every kernel event read; per source: each capture pass on its own
    assert (s["kernels"], s["kernel_time_ns"]) == (n + k_n, total + k_total)
    src = s["runs"]["h200"]["by_source"]
    assert (src["nsys"]["kernels"], src["nsys"]["kernel_time_ns"]) == (n, total)
    assert (src["kineto"]["kernels"], src["kineto"]["kernel_time_ns"]) == (k_n, k_total)
    assert s["library_calls"] == {"cublasLtMatmul": 12, "cublasSgemm_v2": 16, "cudnnBackendExecute": 20}
    for key in ("kernels", "kernel_time_ns", "attributed_kernel_time_share", "ops", "canonical_ops",
                "library_calls", "onednn_primitives"):
        assert key in s
    # attribution to a canonical op, per source (measured: 100% in both)
    assert src["kineto"]["attributed_kernel_time_share"] >= 0.99
    assert (src["nsys"]["steps"], src["nsys"]["op_steps"]) == (10, 10)
    assert src["nsys"]["attributed_kernel_time_share"] >= 0.99
    assert sum(u["count"] for u in s["runs"]["h200"]["unattributed_top"]) <= s["unattributed_kernels"]
    # library kernels linked to a log call by signature: all of them, 22 per step in both sources
    assert (src["kineto"]["library_kernels"], src["kineto"]["library_kernels_linked"]) == (110, 110)
    assert (src["nsys"]["library_kernels"], src["nsys"]["library_kernels_linked"]) == (220, 220)
    for x in ("kineto", "nsys"):
        assert src[x]["library_kernel_time_linked_share"] == 1.0 and src[x]["library_unlinked_top"] == []
    assert [c["shapes"] for c in s["runs"]["h200"]["library_calls_without_signature"]] == ["[[36,32,1024],[36,64,1024]]"]
    df = schema.read_parquet(out)
    assert len(df) == s["events"]
    assert schema.read_meta(out)["summary"]["kernels"] == n + k_n
    assert not df.duplicated(["run", "event_id"]).any()
    linked = df[df["call_event_id"].notna()]
    calls = df.set_index("event_id").loc[linked["call_event_id"].astype(int)]
    assert (calls["kind"] == "library_call").all()
    # a linked kernel and its call agree on what they compute, and it carries the call's API/algo/math
    for col in ("canonical_op", "layer", "direction", "library", "library_call", "algo", "math_mode"):
        assert (calls[col].fillna("-").to_numpy() == linked[col].fillna("-").to_numpy()).all(), col
    # the library is the call's, not the kernel name's: cuBLAS' sgemm runs a cublasLt:: split-K reduce
    split_k = linked[linked["kernel_name"].str.contains("splitKreduce", na=False)]
    assert set(split_k["library_call"]) == {"cublasSgemm_v2"} and set(split_k["layer"]) == {"fc2"}
    # Winograd wgrad's gemm (a ..._cublas kernel) belongs to cuDNN's conv2 bwd_weight call, engine 17
    wg = linked[linked["kernel_name"].str.endswith("_cublas", na=False) & linked["canonical_op"].eq("conv2d")]
    assert set(zip(wg["library"], wg["layer"], wg["direction"], wg["algo"], strict=True)) == {
        ("cuDNN", "conv2", "bwd_weight", "eng17")}


def test_gpu_calls_per_step(tmp_path):
    _, s = normalise([KINETO_GPU, *GPU[1:]], run="k", log_steps=4)
    links = s["runs"]["k"]["library_links"]
    assert len(links) == 11  # 5 cuDNN + 4 cuBLAS + 2 cuBLASLt signatures
    assert {x["log_calls_per_step"] for x in links} == {1.0}
    assert {x["launching_ops_per_step"] for x in links} == {1.0}
    by = {(x["layer"], x["direction"]): x for x in links}
    assert by[("conv2", "bwd_weight")]["kernels_per_step"] == 4.0
    assert by[("fc2", "fwd")]["library"] == "cuBLASLt" and by[("fc2", "fwd")]["algo"] == "10"


def test_unrelated_files_are_not_linked(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    shutil.copy(GPU[0], a / "nsys.sqlite.gz")
    shutil.copy(GPU[1], b / "cudnn.log.gz")
    df, s = normalise([a / "nsys.sqlite.gz", b / "cudnn.log.gz"])
    assert set(s["runs"]) == {"a", "b"}
    assert df["call_event_id"].isna().all()


def test_cpu_runs(tmp_path):
    df, s = normalise([DATA / "cpu_torch_kineto.json.gz", DATA / "cpu_torch_onednn.log.gz"], run="pt")
    ev = json.loads(gzip.open(DATA / "cpu_torch_kineto.json.gz").read())["traceEvents"]
    assert s["ops"] == sum(1 for e in ev if e.get("cat") == "cpu_op" and e.get("ph") == "X")
    assert s["onednn_primitives"] == {"convolution": 15, "reorder": 48}
    # every convolution primitive to its aten op, and each layout reorder to the op of the
    # convolution it feeds (PyTorch uses oneDNN only for convolutions here)
    assert s["runs"]["pt"]["onednn_linked"] == 15 + 48
    prims = df[df["library"].eq("oneDNN")]
    ops = df.set_index("event_id")
    for _, r in prims[prims["canonical_op"].eq("reorder")].iterrows():
        assert ops.loc[r["op_event_id"], "canonical_op"] == "conv2d"
    _, s2 = normalise([DATA / "cpu_mxnet_onednn.log.gz"], run="mx")
    assert s2["runs"]["mx"]["onednn_linked_share"] == 0.0 and s2["runs"]["mx"]["onednn_link_reason"]


def test_run_dir(tmp_path):
    for fw, files in (("pytorch", GPU), ("mxnet", [DATA / "cpu_mxnet_profile.json.gz", DATA / "cpu_mxnet_onednn.log.gz"])):
        d = tmp_path / fw / "bs64"
        d.mkdir(parents=True)
        for f in files:
            shutil.copy(f, d / f.name)
        (d / "clean.json").write_text('{"step_times": []}')
    (tmp_path / "pytorch" / "bs64" / "libs.json").write_text('{"warmup_steps": 1, "steps": 3}')
    (tmp_path / "manifest.json").write_text(json.dumps({"frameworks": {"mxnet": {"device_used": "cpu"}}}))
    # results.json as the runner wrote it before the key was typed (no devices; the case's folder in dir)
    (tmp_path / "results.json").write_text(json.dumps([{"framework": fw, "mode": mode, "batch_size": 64,
                                                        "dir": f"{fw}/bs64"}
                                                       for fw, mode in (("pytorch", "eager"), ("mxnet", "imperative"))]))
    s = normalise_run_dir(tmp_path)
    assert set(s["runs"]) == {"pytorch/bs64", "mxnet/bs64"}
    assert {x["file"] for x in s["not_records"]} == {"pytorch/bs64/clean.json", "mxnet/bs64/clean.json",
                                                    "pytorch/bs64/libs.json"}
    df = schema.read_parquet(tmp_path / "records.parquet")
    assert set(df["framework"]) == {"pytorch", "mxnet"} and set(df["batch_size"]) == {64}
    assert set(zip(df["framework"], df["mode"], df["math"], df["devices"], strict=True)) == {
        ("pytorch", "eager", "fp32", 1), ("mxnet", "imperative", "fp32", 1)}  # typed, every row
    assert set(df.loc[df["framework"].eq("mxnet"), "device"]) == {"cpu"}
    a = json.loads((tmp_path / "attribution.json").read_text())
    assert a["runs"]["mxnet/bs64"]["ops"] > 0
    assert [(r["framework"], r["mode"], r["batch_size"], r["source"]) for r in a["by_source"]] == [
        ("pytorch", "eager", 64, "nsys")]
    links = a["runs"]["pytorch/bs64"]["library_links"]
    assert links and {x["log_calls_per_step"] for x in links} == {1.0}  # 4 calls over the 1 + 3 logged steps


def test_bad_file_is_a_one_line_error(tmp_path, capsys):
    p = tmp_path / "x.log"
    p.write_text("onednn_verbose,v1,primitive,exec,cpu\n")
    assert cli(["normalise", str(p), "-o", str(tmp_path / "o.parquet"), "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["type"] == "ParseError" and err["line"] == 1
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("bad", [b"", b"\x1f\x8bnot gzip at all"])
def test_empty_or_corrupt(tmp_path, bad):
    from kernelmap.errors import ParseError

    p = tmp_path / "f"
    p.write_bytes(bad)
    with pytest.raises(ParseError):
        normalise([p])


def test_kernels_without_a_logged_call_are_counted_with_the_reason():
    # without the cuBLAS log, the fc backward gemms (cublasSgemm_v2 in the run) have no call to link to
    _, s = normalise([KINETO_GPU, GPU[1], GPU[3]], run="k")
    b = s["runs"]["k"]["by_source"]["kineto"]
    un = b["library_unlinked_top"]
    # per step: fc1 dgrad 1, fc1 wgrad 1, fc2 dgrad 2 (cutlass gemm + split-K reduce), fc2 wgrad 1
    assert b["library_kernels"] == 110 and b["library_kernels_unlinked"] == sum(u["count"] for u in un) == 25
    assert {u["reason"] for u in un} == {"no library-log call with its signature (canonical op, layer, direction)"}
    assert 0 < b["library_kernel_time_linked_share"] < 1


def test_run_dir_reads_one_nsys_capture_once(tmp_path):
    """The runner keeps nsys.nsys-rep beside its export nsys.sqlite: the capture is read once."""
    import gzip
    import sqlite3

    d = tmp_path / "pytorch" / "bs64"
    d.mkdir(parents=True)
    with gzip.open(DATA / "gpu_nsys.sqlite.gz", "rb") as fin:
        (d / "nsys.sqlite").write_bytes(fin.read())
    (d / "nsys.nsys-rep").write_bytes(b"stands in for the binary report; must not be read")
    (tmp_path / "results.json").write_text(json.dumps([{"framework": "pytorch", "mode": "eager", "batch_size": 64,
                                                        "dir": "pytorch/bs64"}]))
    s = normalise_run_dir(tmp_path)
    with sqlite3.connect(d / "nsys.sqlite") as con:
        (n_kernels,) = con.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    assert s["runs"]["pytorch/bs64"]["kernels"] == n_kernels
    assert {x["file"] for x in s["not_records"]} == {"pytorch/bs64/nsys.nsys-rep"}


def test_normalise_a_run_directory_in_place(tmp_path, capsys):
    """``kernelmap normalise RUN_DIR`` (what the runner and the report tell users to run): the run's
    records and attribution rewritten in place, kernel counts those of the recorded files."""
    from conftest import gpu_run_dir

    from kernelmap import cli, schema
    from kernelmap.adapters import read

    run = tmp_path / "run"
    bs = gpu_run_dir(run)
    assert cli.main(["normalise", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    r = summary["runs"][f"pytorch/bs{bs}"]
    want = {src: int((read(DATA / f)["kind"] == "kernel").sum())
            for src, f in (("kineto", "gpu_kineto.json.gz"), ("nsys", "gpu_nsys.sqlite.gz"))}
    assert {src: b["kernels"] for src, b in r["by_source"].items()} == want
    assert r["kernels"] == sum(want.values())
    assert r["library_calls"] == {"cudnnBackendExecute": 20, "cublasSgemm_v2": 16, "cublasLtMatmul": 12}
    assert json.loads((run / "attribution.json").read_text())["runs"] == json.loads(json.dumps(summary["runs"]))
    assert int((schema.read_parquet(run / "records.parquet")["kind"] == "kernel").sum()) == sum(want.values())
    assert cli.main(["normalise", str(run)]) == 0  # again, in place, as the runner's note says
    assert "file(s) of 1 framework x batch size run(s)" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "why"), [
    (["{data}/gpu_cudnn.log.gz"], "a run directory is normalised on its own"),
    (["-o", "x.parquet"], "-o, --run and --framework apply to files"),
])
def test_normalise_run_directory_misuse(tmp_path, capsys, extra, why):
    from conftest import gpu_run_dir

    from kernelmap import cli

    run = tmp_path / "run"
    gpu_run_dir(run)
    rc = cli.main(["normalise", str(run), *[e.format(data=DATA) for e in extra]])
    err = capsys.readouterr().err
    assert rc == 2 and why in err and "Traceback" not in err
    assert not (run / "records.parquet").exists()
    rc = cli.main(["normalise", str(tmp_path)])
    assert rc == 2 and "not a kernelmap run directory (no manifest.json)" in capsys.readouterr().err


def test_normalise_run_directory_without_captures_keeps_its_records(tmp_path, capsys):
    """A run directory whose raw captures were removed (tests/data/report_cpu_run: kept for its
    report): `kernelmap normalise RUN_DIR` refuses, and its records and attribution stay byte for byte
    (they were once replaced by an empty table)."""
    from kernelmap import cli

    run = tmp_path / "run"
    shutil.copytree(DATA / "report_cpu_run", run)
    before = {n: (run / n).read_bytes() for n in ("records.parquet", "attribution.json")}
    rc = cli.main(["normalise", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "no trace or log file under RUN_DIR/<framework>/bs<N>/" in err and "Traceback" not in err
    assert str(run) in err
    assert {n: (run / n).read_bytes() for n in before} == before
    assert len(schema.read_parquet(run / "records.parquet")) == 3744


def test_broken_pipe_exits_quietly(tmp_path):
    """``kernelmap normalise RUN_DIR | head``: the reader is gone before anything is printed (its
    end of the pipe closed at once); exit 141, no BrokenPipeError traceback, also where the output is
    smaller than stdout's buffer (it meets the closed pipe only when flushed)."""
    import os
    import subprocess
    import sys

    from conftest import gpu_run_dir

    run = tmp_path / "run"
    gpu_run_dir(run)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as for most users
    proc = subprocess.Popen([sys.executable, "-m", "kernelmap.cli", "normalise", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and (run / "records.parquet").is_file()


@pytest.mark.parametrize(("change", "word"), [
    ({"kind": "bogus"}, "outside the vocabulary"),
    ({"phase": "bogus"}, "outside the vocabulary"),
    ({"kind": None}, "have no kind"),
    ({"dur_ns": -1}, "negative duration"),
])
def test_validate_refuses(change, word):
    """``schema.validate``'s checks of vocabularies, kinds and durations (on a row of a real table)."""
    from kernelmap.errors import SchemaError

    df, _ = normalise([DATA / "gpu_kineto.json.gz"])
    ok = schema.validate(df.copy())
    assert ok is not None
    (col, value), = change.items()
    df.loc[3, col] = value
    with pytest.raises(SchemaError, match=word):
        schema.validate(df)


def test_parquet_pipeline_order_and_errors():
    """``schema._pipelined``: every item consumed in order in the second thread; an error of
    either side reaches the caller and stops the production."""
    got = []
    schema._pipelined(iter(range(50)), got.append)
    assert got == list(range(50))

    def bad_consumer(item):
        if item == 3:
            raise OSError("disk full")
        got.append(item)

    made = []

    def producer():
        for i in range(100):
            made.append(i)
            yield i

    got.clear()
    with pytest.raises(OSError, match="disk full"):
        schema._pipelined(producer(), bad_consumer)
    assert got == [0, 1, 2] and len(made) < 100

    def bad_producer():
        yield 1
        raise ValueError("bad row group")

    got.clear()
    with pytest.raises(ValueError, match="bad row group"):
        schema._pipelined(bad_producer(), got.append)
    assert got == [1]


def test_parquet_layout_strings_dictionary_numbers_statistics(tmp_path, monkeypatch):
    """String columns are written as dictionary pages without min/max statistics, the others with
    statistics and without dictionary pages; several row groups; the records read back unchanged."""
    monkeypatch.setattr(schema, "ROW_GROUP", 500)
    df, _ = normalise([KINETO_GPU])
    assert len(df) > 1000  # more than two row groups
    out = tmp_path / "r.parquet"
    schema.write_parquet(df, out)
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(out).metadata
    assert meta.num_row_groups == -(-len(df) // 500)
    for g in range(meta.num_row_groups):
        for i in range(meta.num_columns):
            col = meta.row_group(g).column(i)
            is_string = schema.COLUMNS[col.path_in_schema] == "string"
            assert ("RLE_DICTIONARY" in col.encodings or "PLAIN_DICTIONARY" in col.encodings) == is_string, col.path_in_schema
            assert (col.statistics is None) == is_string, col.path_in_schema
    import pandas as pd

    pd.testing.assert_frame_equal(schema.read_parquet(out), df)


def test_parquet_string_columns_written_from_codes_read_as_strings(tmp_path, monkeypatch):
    """The string columns go to the writer as dictionary arrays of their codes, with the Arrow
    schema written by hand: the file reads back as the file pyarrow writes from plain string
    arrays (``store_schema``, the path of a pyarrow without ``add_key_value_metadata``): the same
    footer entries byte for byte (ARROW:schema, pandas, schema_version), string types (not
    dictionary), the same Arrow table and records."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(schema, "ROW_GROUP", 500)
    df, summary = normalise([KINETO_GPU])
    coded, plain = tmp_path / "coded.parquet", tmp_path / "plain.parquet"
    schema.write_parquet(df, coded, extra_meta={"summary": summary})
    with monkeypatch.context() as m:
        m.delattr(pq.ParquetWriter, "add_key_value_metadata")
        schema.write_parquet(df, plain, extra_meta={"summary": summary})
    a, b = pq.read_metadata(coded), pq.read_metadata(plain)
    assert a.metadata == b.metadata and a.num_row_groups == b.num_row_groups > 2
    types = pq.read_schema(coded).types
    assert pa.types.is_string(types[list(schema.COLUMNS).index("kernel_name")]) and not any(map(pa.types.is_dictionary, types))
    assert pq.read_table(coded).equals(pq.read_table(plain), check_metadata=True)
    pd.testing.assert_frame_equal(schema.read_parquet(coded), df)
    assert schema.read_meta(coded) == {"summary": summary}


def _no_file_when_the_summary_fails(tmp_path, monkeypatch, kept: list[Path]) -> None:
    """``kernelmap normalise -o`` with a summary that raises: the error, and no file (nor temporary) beside ``kept``."""
    from kernelmap import attribution

    def broken(*a, **k):
        raise RuntimeError("summary failed")

    monkeypatch.setattr(attribution, "summarise", broken)
    bad = tmp_path / "bad.parquet"
    with pytest.raises(RuntimeError, match="summary failed"):
        cli(["normalise", str(KINETO_GPU), "-o", str(bad)])
    assert not bad.exists() and sorted(tmp_path.iterdir()) == sorted(kept)


def test_summary_written_beside_the_records(tmp_path, capsys, monkeypatch):
    """``kernelmap normalise -o`` summarises while the row groups are written: the footer holds the
    summary the command prints (read_meta), as the Arrow schema held it before (a file written that
    way still reads); a summary that fails leaves no file, and an old pyarrow without
    ``add_key_value_metadata`` summarises first."""
    import pyarrow.parquet as pq


    monkeypatch.setattr(schema, "ROW_GROUP", 500)  # several groups written while it summarises
    out = tmp_path / "r.parquet"
    assert cli(["normalise", str(KINETO_GPU), "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kernels"] > 0 and schema.read_meta(out) == {"summary": printed}
    assert b"kernelmap.meta" not in (pq.read_schema(out).metadata or {})  # in the footer's key-values
    df, summary = normalise([KINETO_GPU])
    assert summary == printed
    old = tmp_path / "old.parquet"  # the summary in the schema's metadata, as before
    schema.write_parquet(df, old, extra_meta={"summary": summary})
    assert b"kernelmap.meta" in pq.read_schema(old).metadata and schema.read_meta(old) == {"summary": printed}

    _no_file_when_the_summary_fails(tmp_path, monkeypatch, [out, old])
    monkeypatch.undo()
    monkeypatch.delattr(pq.ParquetWriter, "add_key_value_metadata")
    first = tmp_path / "first.parquet"
    assert cli(["normalise", str(KINETO_GPU), "-o", str(first), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == printed
    assert schema.read_meta(first) == {"summary": printed}
    assert b"kernelmap.meta" in pq.read_schema(first).metadata


def test_records_of_one_row_group_summarised_while_written(tmp_path, capsys, monkeypatch):
    """Records of one row group (``SUMMARY_BESIDE_WRITE``) are summarised in a second thread while the group is
    converted and encoded: the same file, byte for byte, and the same summary as summarised first; a summary
    that fails leaves no file."""
    import threading

    from kernelmap import attribution
    from kernelmap import normalise as N

    summarise, threads = attribution.summarise, []

    def watched(*a, **k):
        threads.append(threading.current_thread().name)
        return summarise(*a, **k)

    monkeypatch.setattr(attribution, "summarise", watched)
    files = {}
    for name, rows in (("first", 0), ("beside", N.SUMMARY_BESIDE_WRITE)):
        monkeypatch.setattr(N, "SUMMARY_BESIDE_WRITE", rows)
        files[name] = tmp_path / f"{name}.parquet"
        assert cli(["normalise", str(KINETO_GPU), "-o", str(files[name]), "--json"]) == 0
        files[name + " summary"] = json.loads(capsys.readouterr().out)
    assert threads[0] == threading.main_thread().name and threads[1].startswith("kernelmap-summary")
    assert files["first"].read_bytes() == files["beside"].read_bytes()
    assert files["first summary"] == files["beside summary"] == schema.read_meta(files["beside"])["summary"]

    _no_file_when_the_summary_fails(tmp_path, monkeypatch, [files["first"], files["beside"]])


@pytest.mark.parametrize(("files", "saved"), [([KINETO_GPU], 1), ([KINETO_GPU, *GPU], 0)], ids=["one source", "two sources"])
def test_by_source_takes_the_whole_runs_figures_where_a_source_is_all_of_it(files, saved, monkeypatch):
    """``by_source`` given ``summarise``'s own figures of all kernels (``whole``) takes them where a source's
    kernels (or its op steps' kernels) are all of them, instead of counting them again: the same summary as
    counting every selection; one source: its kernels are the run's (one count saved; its op steps' kernels,
    the same rows, are counted once either way); two sources: neither is all of them."""
    from kernelmap import attribution

    counted, by_source = [], attribution.by_source
    figures = attribution._kernel_figures
    monkeypatch.setattr(attribution, "_kernel_figures", lambda k: counted.append(len(k)) or figures(k))
    summaries = []
    for whole in (True, False):
        monkeypatch.setattr(attribution, "by_source",
                            lambda df, lk=None, w=None, whole=whole: by_source(df, lk, w if whole else None))
        counted.clear()
        summaries.append((normalise(files)[1], len(counted)))
    (reused, n_reused), (recounted, n_recounted) = summaries
    assert json.dumps(reused, sort_keys=True, default=str) == json.dumps(recounted, sort_keys=True, default=str)
    assert n_recounted - n_reused == saved


@pytest.mark.parametrize("keys", [["kernel_name"], ["kernel_name", "canonical_op"], ["layer"], ["canonical_op", "direction"]])
def test_top_groups_is_pandas_groupby(keys):
    """The summary's top-N table grouped by string codes is pandas' groupby table (same groups, order,
    values, dtypes and index), also with NA keys (left out) and NA durations (counted as nothing);
    on the real GPU fixture's kernels, repeated so that the coded path (4096 rows or more) runs."""
    import pandas as pd

    from kernelmap import attribution

    df, _ = normalise([KINETO_GPU])
    k = df[df["kind"].eq("kernel").fillna(False).to_numpy()]
    k = pd.concat([k] * (4096 // len(k) + 1), ignore_index=True)
    k.loc[k.index[::7], "dur_ns"] = pd.NA
    k.loc[k.index[::11], keys[-1]] = pd.NA
    assert len(k) >= 4096 and k[keys[-1]].isna().sum() >= len(k[::11])
    want = k.groupby(keys)["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False).head(attribution.TOP_N)
    got = attribution._top_groups(k, keys)
    pd.testing.assert_frame_equal(got, want)
    assert len(got) > 1


def test_rows_is_loc():
    """The summary's row selection a column at a time is pandas' ``df.loc[mask, cols]``: same rows,
    index labels, columns and dtypes; on the real GPU fixture's records under a shuffled index, and
    with no row selected."""
    import numpy as np
    import pandas as pd

    from kernelmap import attribution

    df, _ = normalise([KINETO_GPU])
    df.index = np.random.default_rng(0).permutation(len(df)) + 1000
    cols = attribution._LIBRARY_KERNEL_COLS
    for mask in (df["kind"].eq("kernel").fillna(False).to_numpy(), np.zeros(len(df), dtype=bool)):
        got = attribution._rows(df, mask, cols)
        pd.testing.assert_frame_equal(got, df.loc[mask, cols])
    assert len(attribution._rows(df, df["kind"].eq("kernel").fillna(False).to_numpy(), cols)) > 100


def _listing_run(run: Path) -> str:
    """``gpu_run_dir`` with its results.json entry listing its case folder's files, as the runner writes it."""
    from conftest import gpu_run_dir

    bs = gpu_run_dir(run)
    case = f"pytorch/bs{bs}"
    entries = json.loads((run / "results.json").read_text())
    entries[0].update(dir=case, files=sorted(f"{case}/{f.name}" for f in (run / case).iterdir()))
    (run / "results.json").write_text(json.dumps(entries))
    return case


def test_normalise_run_directory_whose_listed_traces_are_all_absent_is_an_error(tmp_path, capsys):
    """Its Kineto trace and nsys export gone, the run's records were its library logs alone, exit 0, naming no
    file: now an error naming the run and each absent trace, nothing written."""
    from kernelmap import cli

    run = tmp_path / "run"
    case = _listing_run(run)
    for name in ("trace.json.gz", "nsys.sqlite"):
        (run / case / name).unlink()
    rc = cli.main(["normalise", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert str(run) in err and f"{case}/nsys.sqlite" in err and f"{case}/trace.json.gz" in err and "absent" in err
    assert not (run / "records.parquet").exists() and not (run / "attribution.json").exists()


def test_normalise_run_directory_names_a_listed_trace_that_is_absent(tmp_path, capsys):
    """One trace of two gone (the Kineto trace; the nsys export there): the records are the rest's, and the absent
    one is named on the console and under not_records with its reason (it was left out unsaid)."""
    from kernelmap import cli, normalise

    run = tmp_path / "run"
    case = _listing_run(run)
    (run / case / "trace.json.gz").unlink()
    assert cli.main(["normalise", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"1 trace(s) results.json lists are absent, their cases' records hold none of their rows: {case}/trace.json.gz" in out
    a = json.loads((run / "attribution.json").read_text())
    assert {"file": f"{case}/trace.json.gz", "reason": normalise.ABSENT} in a["not_records"]
    assert set(a["runs"][case]["by_source"]) == {"nsys"}
