"""``kernelmap report`` on traces that are not a kernelmap run (reports/foreign.py): its tables
against an independent reading of the raw trace (stdlib json, Decimal numbers)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pandas as pd
import pytest
from kernelmap.reports import foreign
from test_foreign_traces import DATA, KERNEL_CATS, RUNTIME_CATS, _containing_step, complete, ns, raw

from kernelmap.errors import KernelmapError

DDP = "hta_ddp_nccl_step5.json.gz"
BERT = "tracelens_h100_bert_inference.json.gz"


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _independent(name):
    """Per step: the kernels launched inside the CPU step, their NCCL subset, and the time a NCCL
    and another kernel ran at once (unions intersected by brute force over 1 ns... of interval ends)."""
    doc = raw(name)
    steps = [e for e in complete(doc, {"user_annotation"}) if e["name"].startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: _containing_step(e["ts"], steps) for e in complete(doc, RUNTIME_CATS)}
    out = {}
    for e in complete(doc, KERNEL_CATS):
        it = launch.get(e["args"].get("correlation"))
        if it is not None:
            out.setdefault(it, []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), "nccl" in e["name"].lower()))
    res = {}
    for it, ks in out.items():
        coll = _union([(s, e) for s, e, c in ks if c])
        comp = _union([(s, e) for s, e, c in ks if not c])
        ov = sum(max(0, min(a[1], b[1]) - max(a[0], b[0])) for a in coll for b in comp)
        res[it] = {"kernels": len(ks), "kernel_ns": sum(e - s for s, e, _ in ks),
                   "collective_kernels": sum(c for *_, c in ks), "collective_ns": sum(e - s for s, e, c in ks if c),
                   "busy_ns": sum(e - s for s, e in _union([(s, e) for s, e, _ in ks])), "overlap_ns": ov}
    return res


@pytest.mark.parametrize("name", [DDP, BERT])
def test_step_table_is_the_independent_count(name):
    t = foreign.analyse(foreign.read_all([DATA / name]))
    want = _independent(name)
    steps = t["steps"].set_index("iteration")
    assert sorted(steps.index) == sorted(want)
    for it, w in want.items():
        r = steps.loc[it]
        assert r["kernels"] == w["kernels"] and r["collective_kernels"] == w["collective_kernels"]
        assert round(r["kernel_ms"] * 1e6) == w["kernel_ns"] and round(r["collective_ms"] * 1e6) == w["collective_ns"]
        assert round(r["gpu_busy_ms"] * 1e6) == w["busy_ns"] and round(r["overlap_ms"] * 1e6) == w["overlap_ns"]
    # every kernel of a step is in exactly one row of the by-op, by-kernel and library tables
    n = len(want)
    for tab in ("by_op", "by_kernel", "library_mix"):
        assert round(t[tab]["ms_per_step"].sum() * n * 1e6) == sum(w["kernel_ns"] for w in want.values())
        assert round(t[tab]["kernels_per_step"].sum() * n) == sum(w["kernels"] for w in want.values())
    nccl = t["library_mix"][t["library_mix"]["library"] == "NCCL"]
    assert round(nccl["ms_per_step"].sum() * n * 1e6) == sum(w["collective_ns"] for w in want.values())


def test_ddp_page_shows_collectives_and_leaves_cnn_sections_out(tmp_path):
    out = foreign.build([str(DATA / DDP)], tmp_path / "r")
    page = (out / "report.html").read_text()
    for h in ("Per step: compute and collectives", "Kernel time by launching op", "Library mix", "record_param_comms"):
        assert h in page
    for cnn in ("Parity", "per layer", "library-log"):
        assert cnn not in page
    by_op = pd.read_csv(out / "tables" / "by_op.csv")
    assert by_op.iloc[0]["launcher"] == "record_param_comms" and by_op.iloc[0]["canonical_op"] == "collective"


def test_cli_report_on_traces_and_refusals(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(DATA / BERT, d)
    r = subprocess.run([sys.executable, "-m", "kernelmap.cli", "report", str(d), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "report.html").is_file()
    bad = d / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "x", "dur": 1}], "schemaVersion": 1}')
    r = subprocess.run([sys.executable, "-m", "kernelmap.cli", "report", str(d), "-o", str(tmp_path / "out2")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "bad.json" in r.stderr and not (tmp_path / "out2").exists()
    with pytest.raises(KernelmapError, match="nor a directory of trace files"):
        foreign.trace_files([tmp_path / "out" / "tables"])
