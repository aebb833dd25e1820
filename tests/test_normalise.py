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


def test_gpu_run_summary(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    assert cli(["normalise", *map(str, GPU), "-o", str(out), "--json", "--run", "h200"]) == 0
    s = json.loads(capsys.readouterr().out)
    db = tmp_path / "x.sqlite"
    db.write_bytes(gzip.open(GPU[0]).read())
    n, total = sqlite3.connect(db).execute('select count(*), sum("end"-start) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    assert (s["kernels"], s["kernel_time_ns"]) == (n, total)
    assert s["library_calls"] == {"cublasLtMatmul": 18, "cublasSgemm_v2": 24, "cudnnBackendExecute": 30}
    assert 0 < s["attributed_kernel_time_share"] < 1  # the probe ran 3 of its 6 steps outside emit_nvtx
    assert sum(u["count"] for u in s["runs"]["h200"]["unattributed_top"]) <= s["unattributed_kernels"]
    assert s["runs"]["h200"]["library_kernels_linked"] > 0
    df = schema.read_parquet(out)
    assert len(df) == s["events"]
    assert schema.read_meta(out)["summary"]["kernels"] == n
    assert not df.duplicated(["run", "event_id"]).any()
    linked = df[df["call_event_id"].notna()]
    calls = df.set_index("event_id").loc[linked["call_event_id"].astype(int)]
    assert (calls["kind"] == "library_call").all()
    # a linked kernel and its call agree on what they compute
    assert (calls["layer"].to_numpy() == linked["layer"].to_numpy()).all()


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
    assert s["runs"]["pt"]["onednn_linked"] == 15  # every convolution primitive to its aten op
    _, s2 = normalise([DATA / "cpu_mxnet_onednn.log.gz"], run="mx")
    assert s2["runs"]["mx"]["onednn_linked_share"] == 0.0 and s2["runs"]["mx"]["onednn_link_reason"]


def test_run_dir(tmp_path):
    for fw, files in (("pytorch", GPU), ("mxnet", [DATA / "cpu_mxnet_profile.json.gz", DATA / "cpu_mxnet_onednn.log.gz"])):
        d = tmp_path / fw / "bs64"
        d.mkdir(parents=True)
        for f in files:
            shutil.copy(f, d / f.name)
        (d / "clean.json").write_text('{"step_times": []}')
    (tmp_path / "manifest.json").write_text(json.dumps({"frameworks": {"mxnet": {"device_used": "cpu"}}}))
    s = normalise_run_dir(tmp_path)
    assert set(s["runs"]) == {"pytorch/bs64", "mxnet/bs64"}
    assert {x["file"] for x in s["not_records"]} == {"pytorch/bs64/clean.json", "mxnet/bs64/clean.json"}
    df = schema.read_parquet(tmp_path / "records.parquet")
    assert set(df["framework"]) == {"pytorch", "mxnet"} and set(df["batch_size"]) == {64}
    assert set(df.loc[df["framework"].eq("mxnet"), "device"]) == {"cpu"}
    assert json.loads((tmp_path / "attribution.json").read_text())["runs"]["mxnet/bs64"]["ops"] > 0


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
