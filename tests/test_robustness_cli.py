"""Bad input, missing pieces and reruns through the CLI: one line on stderr naming the file (and
line/record), a non-zero exit, no traceback, and ``--json`` output that stays one JSON object."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import require_framework

from kernelmap import cli
from kernelmap.errors import KernelmapError, ParseError
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).resolve().parent / "data"


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"kernelmap {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _truncated_kineto(tmp_path) -> Path:
    raw = gzip.decompress((DATA / "cpu_torch_kineto.json.gz").read_bytes())
    p = tmp_path / "trace.json"
    p.write_bytes(raw[: len(raw) // 3])
    return p


def test_normalise_truncated_trace_json(tmp_path, capsys):
    p = _truncated_kineto(tmp_path)
    rc, out, err = _cli(capsys, "normalise", str(p), "-o", str(tmp_path / "r.parquet"), "--json")
    assert rc == 2
    line = _one_line_error(err, "normalise")
    payload = json.loads(out)
    assert payload["type"] == "ParseError" and payload["file"] == str(p) and payload["line"] > 1
    assert f"{p}:{payload['line']}: invalid JSON" in line
    assert not (tmp_path / "r.parquet").exists()


def test_console_script_has_no_traceback(tmp_path):
    """The same through a real process (what a user sees)."""
    p = _truncated_kineto(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "normalise", str(p), "-o", str(tmp_path / "r.parquet"),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["file"] == str(p)


def test_normalise_refuses_existing_output(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    out.write_text("mine")
    rc, _, err = _cli(capsys, "normalise", str(DATA / "cpu_torch_onednn.log.gz"), "-o", str(out))
    assert rc == 2 and "already exists" in _one_line_error(err, "normalise") and "--replace" in err
    assert out.read_text() == "mine"
    rc, _, _ = _cli(capsys, "normalise", str(DATA / "cpu_torch_onednn.log.gz"), "-o", str(out), "--replace")
    assert rc == 0 and pq.read_table(out).num_rows > 0
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]  # no temporary left


def _run_copy(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(DATA / "report_cpu_run", run)
    return run


def test_report_refuses_newer_schema_version(tmp_path, capsys):
    run = _run_copy(tmp_path)
    table = pq.read_table(run / "records.parquet")
    meta = dict(table.schema.metadata)
    meta[b"kernelmap.schema_version"] = b"3"
    pq.write_table(table.replace_schema_metadata(meta), run / "records.parquet")
    rc, out, err = _cli(capsys, "report", str(run), "-o", str(tmp_path / "rep"))
    assert rc == 2
    line = _one_line_error(err, "report")
    assert str(run / "records.parquet") in line and "newer" in line
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("missing", ["results.json", "manifest.json", "*"])
def test_report_of_incomplete_run_dir(tmp_path, capsys, missing):
    run = _run_copy(tmp_path)
    for f in run.glob(missing):
        f.unlink()
    rc, _, err = _cli(capsys, "report", str(run), "-o", str(tmp_path / "rep"))
    assert rc == 2
    line = _one_line_error(err, "report")
    assert str(run) in line and ("results.json" in line or "manifest.json" in line)
    assert not (tmp_path / "rep").exists()


def test_report_of_run_dir_with_results_not_a_list(tmp_path, capsys):
    run = _run_copy(tmp_path)
    (run / "results.json").write_text('{"results": []}')
    rc, _, err = _cli(capsys, "report", str(run), "-o", str(tmp_path / "rep"))
    assert rc == 2
    assert _one_line_error(err, "report") == (f"kernelmap report: error: {run / 'results.json'}: not a list of results "
                                              "(one per framework x batch size)")
    assert not (tmp_path / "rep").exists()


def test_report_refuses_existing_out(tmp_path, capsys):
    run = _run_copy(tmp_path)
    (tmp_path / "rep").mkdir()
    rc, _, err = _cli(capsys, "report", str(run), "-o", str(tmp_path / "rep"))
    assert rc == 2 and "already exists" in _one_line_error(err, "report")


def test_normalise_run_dir_with_missing_and_broken_pieces(tmp_path):
    run = tmp_path / "run"
    bs = run / "pytorch" / "bs64"
    bs.mkdir(parents=True)
    (bs / "clean.json").write_text("{}")
    (run / "mxnet" / "bs64").mkdir(parents=True)  # a framework folder with nothing in it
    with pytest.raises(KernelmapError, match="no results.json; not a complete kernelmap run directory"):
        normalise_run_dir(run)  # the cases are what results.json records, never the folders found
    (run / "results.json").write_text("[{")
    with pytest.raises(KernelmapError, match="results.json: not valid JSON"):
        normalise_run_dir(run)
    (run / "results.json").write_text(json.dumps([{"framework": fw, "mode": mode, "batch_size": 64, "dir": f"{fw}/bs64"}
                                                  for fw, mode in (("pytorch", "eager"), ("mxnet", "imperative"),
                                                                   ("jax", "jit"))]))  # jax: no folder
    s = normalise_run_dir(run)  # no manifest, no traces: empty records, the clean.json listed
    assert s["runs"] == {} and [x["file"] for x in s["not_records"]] == ["pytorch/bs64/clean.json"]
    assert pq.read_table(run / "records.parquet").num_rows == 0
    shutil.copy(_truncated_kineto(tmp_path), bs / "trace.json")
    with pytest.raises(ParseError) as ei:
        normalise_run_dir(run)
    assert ei.value.path == str(bs / "trace.json") and ei.value.line is not None
    (run / "manifest.json").write_text('{"frameworks": ')
    with pytest.raises(KernelmapError, match="manifest.json: not valid JSON"):
        normalise_run_dir(run)


# --- missing pieces -------------------------------------------------------------------------------

def test_device_gpu_without_gpu_names_the_fix(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA GPU")
    require_framework("pytorch")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "gpu",
                           "--out", str(out), "--json"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["type"] == "MissingToolError"
    assert "--device gpu" in payload["error"] and "fix:" in payload["error"]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _mxnet_shim(tmp_path) -> dict:
    shim = tmp_path / "shim" / "mxnet"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('libmxnet.so: cannot open shared object file')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")]),
                CUDA_VISIBLE_DEVICES="")


@pytest.mark.slow
def test_broken_mxnet_leaves_the_pytorch_half_of_the_run(tmp_path):
    require_framework("pytorch")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "all", "--device", "cpu",
                           "--steps", "2", "--warmup", "1", "--data", "synthetic", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=300, env=_mxnet_shim(tmp_path))
    assert proc.returncode == 3, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    ran = [r["framework"] for r in summary["results"]]
    assert ran[0] == "pytorch" and "mxnet" not in ran  # (jax too, where its environment is set)
    assert any("libmxnet.so" in n and "fix: pip install" in n for n in summary["notes"]), summary["notes"]
    names = {p.name for p in out.iterdir()}
    assert {"manifest.json", "pytorch", "results.json", "logs"} <= names and "mxnet" not in names
    # the failed worker's stderr is kept in the run's log, not lost with its folder
    assert any("libmxnet.so" in f.read_text() for f in (out / "logs").glob("mxnet-bs64-*.log"))


def test_mxnet_import_failing_in_the_worker(tmp_path):
    """A broken MXNet install (a module named mxnet that raises ImportError, put first on the
    worker's PYTHONPATH): the run fails with one line naming the import error, nothing kept."""
    shim = tmp_path / "shim" / "mxnet"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('libmxnet.so: cannot open shared object file')\n")
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "mxnet", "--device", "cpu",
                           "--steps", "2", "--data", "synthetic", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode != 0
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "libmxnet.so" in payload["error"], payload
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["shim"]
