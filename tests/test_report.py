"""kernelmap report on a real (trimmed) CPU run directory: sections, numbers, figures, timeline."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import gpu_run_dir, report
from kernelmap.reports import analysis as A
from kernelmap.reports.html import fmt

from kernelmap.errors import KernelmapError

RUN = Path(__file__).parent / "data" / "report_cpu_run"
FIGURES = ("op_time", "library_mix", "timeline", "busy_share", "overhead")  # CPU: no kernels, no FLOP peak


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rep") / "report"
    assert report(str(RUN), "-o", str(d)) == 0
    return d


@pytest.fixture(scope="module")
def page(out) -> str:
    return (out / "report.html").read_text()


def _section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def test_all_sections_present(page):
    for sid in ("summary", "ops", "layers", "figures", "coverage", "timeline"):
        assert _section(page, sid).strip()


def test_self_contained(page):
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page.replace('href="https://ui.perfetto.dev"', ""))
    assert "<link" not in page


def test_summary_carries_results_json(page):
    summ = _section(page, "summary")
    results = json.loads((RUN / "results.json").read_text())
    assert len(results) == 4
    for r in results:
        med_ms = float(np.median(r["step_times_s"])) * 1e3
        assert fmt(med_ms) in summ, (r["framework"], r["batch_size"], med_ms)
        assert fmt(r["images_per_s"]) in summ
        assert fmt(r["test_accuracy"], "test_accuracy") in summ
        q1, q3 = np.percentile(r["step_times_s"], [25, 75])
        assert fmt(float(q3 - q1) * 1e3) in summ


def test_parity_and_environment(page):
    summ = _section(page, "summary")
    parity = json.loads((RUN / "parity.json").read_text())
    assert fmt(parity["forward_logits_max_abs_diff"]) in summ
    assert fmt(parity["loss_max_rel_diff"]) in summ
    manifest = json.loads((RUN / "manifest.json").read_text())
    assert manifest["git_commit"]["commit"] in summ
    assert manifest["frameworks"]["pytorch"]["versions"]["version"] in summ
    assert manifest["frameworks"]["mxnet"]["versions"]["version"] in summ


def test_op_table_side_by_side(page):
    ops = _section(page, "ops")
    assert "batch size 256" in ops and "batch size 64" in ops
    assert "PyTorch (op time)" in ops and "MXNet (op time)" in ops
    # the frameworks' own op names and the library their calls went to
    for name in ("aten::conv2d", "Convolution", "FullyConnected", "oneDNN", "convolution forward_training"):
        assert name in ops
    run = A.load_run(RUN)
    table, fws = A.op_table(run, 256)
    assert set(fws) == {"pytorch", "mxnet"}
    row = table[(table["canonical_op"] == "conv2d") & (table["direction"] == "fwd")].iloc[0]
    for fw in fws:
        assert fmt(row[f"{fw}.ms_per_step"]) in ops
    # differences are stated, e.g. linear fwd: MXNet -> oneDNN inner_product, PyTorch -> native addmm
    lin = table[(table["canonical_op"] == "linear") & (table["direction"] == "fwd")].iloc[0]
    assert any("library differs" in d for d in lin["differences"])
    assert "library differs: MXNet: oneDNN, PyTorch: native" in ops


def test_layer_table_splits_the_op_table_by_layer(page):
    """Per layer x direction x framework: time per step sums to the op table's conv2d/linear row,
    FLOPs are the spec's, and the library calls are what each framework's log recorded."""
    from kernelmap.flops import layer_flops

    run = A.load_run(RUN)
    lt = A.layer_table([run])
    assert len(lt) == 2 * 4 * 2 * 2  # batch sizes x layers x (fwd, op-level bwd) x frameworks
    for bs in (64, 256):
        table, fws = A.op_table(run, bs)
        for op, d in (("conv2d", "fwd"), ("conv2d", "bwd"), ("linear", "fwd"), ("linear", "bwd")):
            row = table[(table["canonical_op"] == op) & (table["direction"] == d)].iloc[0]
            for fw in fws:
                part = lt[(lt["batch_size"] == bs) & (lt["framework"] == fw) & (lt["canonical_op"] == op)
                          & (lt["direction"] == d)]
                assert part["op_ms_per_step"].sum() == pytest.approx(row[f"{fw}.ms_per_step"], rel=1e-9)
    fwd = lt[lt["direction"] == "fwd"]
    assert all(f == layer_flops(la, "fwd", bs) for f, la, bs in zip(fwd["flops_per_step"], fwd["layer"],
                                                                   fwd["batch_size"], strict=True))
    one = lt.set_index(["batch_size", "layer", "direction", "framework"])
    assert one.loc[(64, "fc1", "fwd", "mxnet"), "library_calls"] == ["inner_product forward_training"]
    assert one.loc[(64, "fc1", "fwd", "pytorch"), "libraries"] == ["native"]
    assert one.loc[(64, "conv1", "bwd", "pytorch"), "library_calls"] == ["convolution backward_weights"]
    # conv1's input needs no gradient: its backward is the weight gradient only
    assert one.loc[(64, "conv1", "bwd", "pytorch"), "flops_per_step"] == layer_flops("conv1", "bwd_weight", 64)
    assert one.loc[(64, "conv2", "bwd", "mxnet"), "flops_per_step"] == 2 * layer_flops("conv2", "fwd", 64)
    # on the CPU the layer's time is its primitives' own, from the oneDNN log (libs pass, per logged step)
    from kernelmap import schema

    rec = schema.read_parquet(RUN / "records.parquet")
    prim = rec[(rec["framework"] == "pytorch") & (rec["batch_size"] == 64) & (rec["library_call"]
                                                                             == "convolution forward_training")
               & (rec["layer"] == "conv2")].sort_values("event_id")
    libs = json.loads((RUN / "results.json").read_text())[0]["passes"]["libs"]
    # one call per logged step, in log order: the timed steps' calls follow the warm-up's
    assert len(prim) == libs["steps"] + libs["warmup_steps"]
    assert one.loc[(64, "conv2", "fwd", "pytorch"), "ms_per_step"] == pytest.approx(
        prim["dur_ns"].iloc[libs["warmup_steps"]:].mean() / 1e6, rel=1e-12)
    assert "libs pass: its 3 timed steps" in one.loc[(64, "conv2", "fwd", "pytorch"), "time_source"]
    layers = _section(page, "layers")
    assert "inner_product forward_training" in layers and fmt(one.loc[(64, "conv2", "fwd", "pytorch"),
                                                                      "ms_per_step"], "ms_per_step") in layers


def test_op_time_matches_records(page):
    """Outermost conv2d forward op time per step, recomputed by hand from records.parquet."""
    from kernelmap import schema

    rec = schema.read_parquet(RUN / "records.parquet")
    r = rec[(rec["framework"] == "pytorch") & (rec["batch_size"] == 64) & (rec["source"] == "kineto")]
    conv = r[(r["kind"] == "op") & (r["op_name"] == "aten::conv2d")]
    steps = r[r["kind"] == "step"]
    want_ms = float(conv["dur_ns"].sum()) / len(steps) / 1e6
    ot = A.op_time([A.load_run(RUN)])
    got = ot[(ot["framework"] == "pytorch") & (ot["batch_size"] == 64) & (ot["canonical_op"] == "conv2d")
             & (ot["direction"] == "fwd")]["ms_per_step"].sum()
    assert got == pytest.approx(want_ms, rel=1e-9)


def test_figures_decode_and_are_not_blank(out, page):
    import matplotlib.image as mpimg

    for stem in FIGURES:
        png = out / f"{stem}.png"
        assert png.is_file(), stem
        img = mpimg.imread(png)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
        rgb = img[..., :3].reshape(-1, 3)
        assert rgb.var() > 0, stem
        assert len(np.unique((rgb * 255).astype(np.uint8), axis=0)) > 10, stem
        uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
        assert uri in page, f"{stem}.png is not embedded"


def test_missing_figures_say_why(page):
    figs = _section(page, "figures")
    # CPU records have no kernels and no GPU peak: those figures say so instead of drawing nothing
    assert "no kernels recorded" in figs
    assert "peak unknown" in figs


def test_timeline_has_both_frameworks(out, page):
    trace = json.loads((out / "timeline.json").read_text())
    ev = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"PyTorch bs256", "PyTorch bs64", "MXNet bs256", "MXNet bs64"} <= set(procs.values())
    for pid in procs:
        xs = [e for e in ev if e["ph"] == "X" and e["pid"] == pid]
        assert xs and min(e["ts"] for e in xs) == 0
        assert all(e["dur"] > 0 for e in xs)
    lanes = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(name.startswith("framework ops") for name in lanes)
    assert any(name.startswith("step / phase") for name in lanes)
    assert str(sum(1 for e in ev if e["ph"] == "X")) in _section(page, "timeline")


def test_coverage_reads_attribution(page):
    cov = _section(page, "coverage")
    attribution = json.loads((RUN / "attribution.json").read_text())
    for entry in attribution["runs"].values():  # a CPU run: the oneDNN figures per framework x bs
        assert fmt(entry["onednn_linked_share"], "onednn_linked_share") in cov
        assert fmt(sum(entry["onednn_primitives"].values()), "onednn_primitives") in cov


def test_existing_out_refused_and_replaced(tmp_path):
    d = tmp_path / "r"
    assert report(str(RUN), "-o", str(d)) == 0
    with pytest.raises(KernelmapError, match="already exists"):
        report(str(RUN), "-o", str(d))
    assert report(str(RUN), "-o", str(d), "--replace") == 0
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []


def test_device_fallback_is_marked(tmp_path):
    """The runner marks a framework that ran elsewhere than asked (MXNet on the CPU on Hopper) in
    manifest.json. No such real run exists on this CPU machine, so a copy of the real run gets
    that marking (devices only; every number stays the run's own)."""
    run = tmp_path / "fallback_run"
    shutil.copytree(RUN, run)
    m = json.loads((run / "manifest.json").read_text())
    m["frameworks"]["mxnet"].update(device_requested="gpu", device_note="mxnet-cu112 has no kernels for sm_90")
    (run / "manifest.json").write_text(json.dumps(m))
    d = tmp_path / "rep"
    assert report(str(run), "-o", str(d)) == 0
    page = (d / "report.html").read_text()
    assert "⚠ MXNet ran on cpu, not gpu" in page
    assert "no kernels for sm_90" in page
    assert page.count('class="fallback"') >= 1 + 2 + 2  # banner, summary rows (2 batch sizes), op tables


def test_peak_table():
    assert A.peak_flops("NVIDIA H200")["fp32"] == 67e12
    assert A.peak_flops("NVIDIA H100 80GB HBM3")["tf32"] == 494.5e12
    assert A.peak_flops("NVIDIA H100 PCIe")["fp32"] == 51e12
    assert A.peak_flops(None) is None and A.peak_flops("AMD EPYC") is None


def test_not_a_run_dir(tmp_path):
    with pytest.raises(KernelmapError, match="manifest.json"):
        report(str(tmp_path), "-o", str(tmp_path / "out"))


def test_trend_from_benchmark_storage(tmp_path):
    """--storage: real pytest-benchmark storage (two autosaved runs of a tiny benchmark) -> trend."""
    import subprocess
    import sys

    import matplotlib.image as mpimg
    from test_history import TINY

    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    st = tmp_path / "st"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py",
                               "--benchmark-autosave", f"--benchmark-storage={st}",
                               "--benchmark-min-rounds=3", "--benchmark-max-time=0.01"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    d = tmp_path / "rep"
    assert report(str(RUN), "-o", str(d), "--storage", str(st)) == 0
    page = (d / "report.html").read_text()
    hist = _section(page, "history")
    assert "0001" in hist and "0002" in hist
    img = mpimg.imread(d / "trend.png")[..., :3]
    assert img.var() > 0
    # times in ms, in columns named by their unit: no seconds without a unit beside them
    import pandas as pd
    from test_report_answer import _report_texts

    from kernelmap.history.keys import TIME_STATS
    from kernelmap.history.trend import load_history

    saved = load_history(st)
    table = pd.read_csv(d / "tables" / "trend.csv")
    assert not set(TIME_STATS) & set(table.columns)
    for stat in TIME_STATS:
        assert table[f"{stat}_ms"].tolist() == pytest.approx((saved[stat] * 1e3).tolist(), rel=1e-9), stat
    assert "median (ms)" in hist
    leaks = [name for name, text in _report_texts(d).items() if str(tmp_path) in text]  # the storage by name
    assert not leaks and f"<code>{st.name}</code>" in hist, leaks


def test_layer_table_on_real_gpu_records(tmp_path):
    """On the H200 recording: every conv/linear gradient is its own row with its cuDNN or cuBLAS
    call, engine and kernels; layer rows sum to the op table; FLOPs are the spec's; the bias gradient's reduction
    (``bwd_bias``) is not given the gradients' calls or FLOPs."""
    from kernelmap.flops import layer_flops
    from kernelmap.normalise import normalise_run_dir

    run_dir = tmp_path / "gpu"
    bs = gpu_run_dir(run_dir)
    assert normalise_run_dir(run_dir)["runs"][f"pytorch/bs{bs}"]["attributed_kernel_time_share"] == 1.0
    run = A.load_run(run_dir)
    lt = A.layer_table([run])
    table, _ = A.op_table(run, bs)
    assert set(lt["level"]) == {"kernel"} and len(lt) == 15
    for op in ("conv2d", "linear"):
        for d in ("fwd", "bwd_data", "bwd_weight"):
            part = lt[(lt["canonical_op"] == op) & (lt["direction"] == d)]
            want = {"conv2d": {"conv1", "conv2"}, "linear": {"fc1", "fc2"}}[op]
            assert set(part["layer"]) == (want - {"conv1"} if (op, d) == ("conv2d", "bwd_data") else want)
            row = table[(table["canonical_op"] == op) & (table["direction"] == d)].iloc[0]
            assert part["ms_per_step"].sum() == pytest.approx(row["pytorch.ms_per_step"], rel=1e-9)
            for _, r in part.iterrows():
                assert r["kernels"] and r["flops_per_step"] == layer_flops(r["layer"], d, bs)
                assert r["library_calls"] == (["cudnnBackendExecute"] if op == "conv2d" else
                                              ["cublasLtMatmul"] if d == "fwd" else ["cublasSgemm_v2"])
    conv = lt[(lt["canonical_op"] == "conv2d") & lt["direction"].isin(["fwd", "bwd_data", "bwd_weight"])]
    assert all(len(a) == 1 and a[0].startswith("eng") for a in conv["algos"])  # the cuDNN engine chosen
    assert not lt["direction"].eq("bwd").any()  # every backward kernel split
    bias = lt[lt["direction"] == "bwd_bias"]
    assert len(bias) == 4 and bias["flops_per_step"].isna().all() and all(c == [] for c in bias["library_calls"])
