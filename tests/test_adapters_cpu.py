"""Kineto, MXNet profiler and oneDNN verbose adapters against the CPU fixtures recorded by
tests/data/record_cpu_fixtures.py (3 training steps, batch 16)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kernelmap.adapters import detect, kineto, mxnet_profiler, onednn
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data"
KINETO, MXPROF = DATA / "cpu_torch_kineto.json.gz", DATA / "cpu_mxnet_profile.json.gz"
TORCH_DNNL, MX_DNNL = DATA / "cpu_torch_onednn.log.gz", DATA / "cpu_mxnet_onednn.log.gz"


def _json(p):
    return json.loads(gzip.open(p, "rt").read())


def test_kineto_every_cpu_op_is_an_op():
    ev = _json(KINETO)["traceEvents"]
    df = kineto.read(KINETO)
    n_ops = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    ops = df[df["kind"].eq("op")]
    assert len(ops) == n_ops
    assert int(ops["dur_ns"].sum()) == pytest.approx(sum(e["dur"] for e in ev if e.get("cat") == "cpu_op") * 1000, abs=n_ops)
    assert ops["canonical_op"].notna().all()
    assert sorted(ops["iteration"].dropna().unique()) == [0, 1, 2]


def test_kineto_phases_and_layers():
    df = kineto.read(KINETO)
    ops = df[df["kind"].eq("op")]
    conv = ops[ops["op_name"].eq("aten::conv2d")]
    assert conv.groupby("layer").size().to_dict() == {"conv1": 3, "conv2": 3}
    assert set(conv["phase"]) == {"forward"}
    bwd = ops[ops["op_name"].eq("ConvolutionBackward0")]
    assert bwd.groupby("layer").size().to_dict() == {"conv1": 3, "conv2": 3}  # through the sequence number
    assert set(bwd["phase"]) == {"backward"} and set(bwd["direction"]) == {"bwd"}
    assert set(ops.loc[ops["canonical_op"].eq("sgd_update"), "phase"]) == {"optimizer"}


def test_kineto_truncated_json_names_line(tmp_path):
    text = gzip.open(KINETO, "rt").read()
    p = tmp_path / "t.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(ParseError) as e:
        kineto.read(p)
    assert e.value.line is not None and e.value.line > 1


def test_kineto_event_without_ts(tmp_path):
    doc = _json(KINETO)
    i = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    del doc["traceEvents"][i]["ts"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ParseError) as e:
        kineto.read(p)
    assert e.value.record == i


def test_mxnet_operator_spans():
    ev = _json(MXPROF)["traceEvents"]
    devices = {e["pid"] for e in ev if e.get("ph") == "M" and e["args"]["name"].startswith(("cpu/", "gpu/"))}
    n = sum(1 for e in ev if e.get("ph") == "B" and e.get("cat") == "operator" and e["pid"] in devices)
    df = mxnet_profiler.read(MXPROF)
    ops = df[df["kind"].eq("op")]
    assert len(ops) == n
    assert (df["framework"] == "mxnet").all() and (df["device"] == "cpu").all()
    g = ops[ops["canonical_op"].isin(["conv2d", "linear"])].groupby(["layer", "direction"]).size()
    assert set(g) == {3}  # every conv/linear layer, forward and backward, once per step
    loss = set(ops.loc[ops["layer"].eq("loss"), "canonical_op"])
    assert loss == {"log_softmax", "pick", "mean"}
    assert set(ops.loc[ops["op_name"].eq("multi_sgd_mom_update"), "phase"]) == {"optimizer"}


def test_mxnet_unmatched_end(tmp_path):
    doc = _json(MXPROF)
    i = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "B" and e.get("cat") == "operator")
    doc["traceEvents"][i]["ph"] = "E"
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ParseError) as e:
        mxnet_profiler.read(p)
    assert e.value.record == i


@pytest.mark.parametrize("path", [TORCH_DNNL, MX_DNNL])
def test_onednn_counts_exec_lines(path):
    lines = gzip.open(path, "rt").read().splitlines()
    execs = [ln for ln in lines if ",exec," in ln]
    df = onednn.read(path)
    assert len(df) == len(execs)
    assert df.attrs["non_exec_lines"] == sum(1 for ln in lines if ",info," in ln)
    prims = {}
    for ln in execs:
        f = ln.split(",")
        k = f.index("exec")
        prims[f[k + 2]] = prims.get(f[k + 2], 0) + 1
    assert df["op_name"].value_counts().to_dict() == prims
    assert int(df["dur_ns"].sum()) == pytest.approx(sum(float(ln.split(",")[-1]) for ln in execs) * 1e6, abs=len(execs))


def test_onednn_layers_from_problem():
    df = onednn.read(MX_DNNL)
    conv = df[df["canonical_op"].eq("conv2d")]
    assert conv.groupby(["layer", "direction"]).size().to_dict() == {
        ("conv1", "bwd_weight"): 3, ("conv1", "fwd"): 3, ("conv2", "bwd_data"): 3,
        ("conv2", "bwd_weight"): 3, ("conv2", "fwd"): 3}


def test_onednn_interleaved_stdout_and_garbage(tmp_path):
    lines = gzip.open(TORCH_DNNL, "rt").read().splitlines()
    p = tmp_path / "o.log"
    p.write_text("\n".join(lines[:8] + ["step 1 loss 2.3"] + lines[8:]))
    df = onednn.read(p)
    assert df.attrs["skipped_lines"] == 1 and len(df) == sum(",exec," in ln for ln in lines)
    p.write_text("\n".join(lines[:8] + ["onednn_verbose,v1,primitive,exec,cpu,convolution"]))
    with pytest.raises(ParseError) as e:
        onednn.read(p)
    assert e.value.line == 9


@pytest.mark.parametrize("path,fmt", [(KINETO, "kineto"), (MXPROF, "mxnet_profiler"),
                                      (TORCH_DNNL, "onednn_verbose"), (MX_DNNL, "onednn_verbose")])
def test_detect(tmp_path, path, fmt):
    assert detect(path) == fmt
    other = tmp_path / "noext"
    other.write_bytes(gzip.open(path).read())
    assert detect(other) == fmt


def test_detect_rejects_unknown(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(ParseError, match="unrecognised"):
        detect(p)
