"""The report leads with its answer: per layer x direction, frameworks side by side."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import report
from kernelmap.reports import analysis as A
from kernelmap.reports import answer as ANS
from kernelmap.reports.analyses import basis as B

from kernelmap.errors import KernelmapError

RUN = Path(__file__).parent / "data" / "report_cpu_run"


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    from kernelmap.reports.cli import build

    return build([str(RUN)], tmp_path_factory.mktemp("answer") / "report")[0]


@pytest.fixture(scope="module")
def layers() -> pd.DataFrame:
    return A.layer_table([A.load_run(RUN)])


def _quiet(states: dict) -> dict:
    """Every pass made quiet and within noise of its clean pass (what a run on a quiet machine
    records), the figures themselves the run's own."""
    q = B.Busy(False, "quiet: other processes used 0.0 of 2 cores")
    return {k: dataclasses.replace(s, agreement=B.Agreement.AGREES, busy=q, clean_busy=q) for k, s in states.items()}


def test_answer_has_every_layer_and_both_frameworks_on_one_row(layers):
    run = A.load_run(RUN)
    ans, fws = ANS.answer_table(layers, _quiet(B.pass_states([run])))
    assert fws[0] == "pytorch" and "mxnet" in fws
    # one row per layer x direction that the layer table has, whatever framework has it
    want = set(zip(layers["batch_size"], layers["layer"], layers["direction"], strict=True))
    assert set(zip(ans["batch_size"], ans["layer"], ans["direction"], strict=True)) == want
    assert len(ans) == len(want)
    assert {"conv1", "conv2", "fc1", "fc2"} <= set(ans["layer"])
    # as recorded (5 and 3 timed capture steps, contention not measured): no ratio, and why
    recorded, _ = ANS.answer_table(layers, B.pass_states([run]))
    assert recorded["mxnet.vs_ref"].isna().all()
    for _, row in ans.iterrows():
        lt = layers[(layers["batch_size"] == row["batch_size"]) & (layers["layer"] == row["layer"])
                    & (layers["direction"] == row["direction"])]
        by_fw = {r["framework"]: r for _, r in lt.iterrows()}
        both_lib = all(pd.notna(r["ms_per_step"]) for r in by_fw.values())
        for fw, r in by_fw.items():
            want_ms = r["ms_per_step"] if both_lib else r["op_ms_per_step"]
            assert row[f"{fw}.ms_per_step"] == pytest.approx(want_ms)
            assert row[f"{fw}.pass"] == ("libs" if both_lib else "framework")
            assert row[f"{fw}.time_kind"] == row["compared_on"]
            assert row[f"{fw}.library_calls"] == r["library_calls"] and row[f"{fw}.kernels"] == r["kernels"]
        assert row["compared_on"] == (ANS.LIBRARY_TIME if both_lib else ANS.OP_TIME)
        if {"pytorch", "mxnet"} <= set(by_fw):
            assert row["mxnet.vs_ref"] == pytest.approx(row["mxnet.ms_per_step"] / row["pytorch.ms_per_step"])
            assert pd.isna(row["mxnet.no_ratio"])
            rec = recorded[(recorded["batch_size"] == row["batch_size"]) & (recorded["layer"] == row["layer"])
                           & (recorded["direction"] == row["direction"])].iloc[0]
            p = row["pytorch.pass"]
            steps = {"framework": 5, "libs": 3}[p]
            assert rec["mxnet.no_ratio"].startswith(f"no ratio: PyTorch's {p} pass ran ")
            assert (f"over {steps} steps, too few to judge (< 20), was not measured for contention (nor its clean "
                    f"pass); MXNet's {p} pass") in \
                rec["mxnet.no_ratio"]


def _kernel_state(fw: str, agreement=B.Agreement.SLOWER, contended: bool | None = False) -> B.PassState:
    return B.PassState("r", fw, 64, "framework", 20, 0.01, (0.009, 0.011), 0.005, (0.0049, 0.0051), agreement,
                       B.BY_INTERVALS, B.Busy(contended, "busy" if contended else "quiet"), B.Busy(None, "not measured"))


def test_bias_rows_pair_and_an_unsplit_backward_keeps_its_own_row():
    """Bias gradients (PyTorch's reduction, XLA's reduce fusion) share the bwd_bias row; a
    kernel-level ``bwd`` (a backward not split into halves) is a row of its own, with no time ratio:
    before, every kernel-level bwd was shown as the bias row and compared with PyTorch's."""
    layers = pd.DataFrame([
        {"run": "r", "batch_size": 64, "layer": "fc1", "canonical_op": "linear", "direction": d, "framework": fw,
         "level": "kernel", "libraries": [], "library_calls": [], "algos": [], "kernels": [k],
         "ms_per_step": ms, "time_source": "kernels", "op_ms_per_step": ms, "pass": "framework",
         "op_pass": "framework"}
        for d, fw, k, ms in (("bwd_bias", "pytorch", "reduce_kernel", 0.004), ("bwd_bias", "jax", "fusion", 0.002),
                             ("bwd", "mxnet", "sgemm", 0.02), ("bwd", "pytorch", "fft2d_r2c", 0.03))])
    # GPU kernel time: a pass slower than its clean pass (profiler overhead on the host) still
    # compares, where it was not contended
    states = {("r", fw, 64, "framework"): _kernel_state(fw) for fw in ("pytorch", "mxnet", "jax")}
    ans, fws = ANS.answer_table(layers, states)
    assert fws == ["pytorch", "mxnet", "jax"] and len(ans) == 2
    rows = ans.set_index("direction")
    assert rows.loc["bwd_bias", "jax.vs_ref"] == pytest.approx(0.5) and pd.isna(rows.loc["bwd_bias", "mxnet.ms_per_step"])
    # both unsplit, but of different work (PyTorch: its FFT data gradient; MXNet: both halves): no ratio
    assert rows.loc["bwd", "mxnet.ms_per_step"] == 0.02 and pd.isna(rows.loc["bwd", "mxnet.vs_ref"])
    assert rows.loc["bwd", "mxnet.no_ratio"] == f"no ratio: {ANS.UNSPLIT_BWD}"
    assert rows.loc["bwd_bias", "compared_on"] == ANS.KERNEL_TIME == "GPU kernel time"
    # a contended pass: no ratio, and the cell says which pass was busy
    states[("r", "jax", 64, "framework")] = _kernel_state("jax", contended=True)
    rows = ANS.answer_table(layers, states)[0].set_index("direction")
    assert pd.isna(rows.loc["bwd_bias", "jax.vs_ref"])
    assert rows.loc["bwd_bias", "jax.no_ratio"] == "no ratio: JAX's framework pass ran on a busy machine (busy)"
    # contention not measured is not quiet
    states[("r", "jax", 64, "framework")] = _kernel_state("jax", contended=None)
    rows = ANS.answer_table(layers, states)[0].set_index("direction")
    assert rows.loc["bwd_bias", "jax.no_ratio"] == "no ratio: JAX's framework pass was not measured for contention"
    # no pass figures at all: nothing is compared
    assert ANS.answer_table(layers)[0]["jax.vs_ref"].isna().all()


def test_no_ratio_across_kinds_of_time():
    """PyTorch on the GPU (kernel time), MXNet on the CPU (library-call time): a mixed row, each
    time cell its own kind, no ratio though both passes are quiet and within noise."""
    layers = pd.DataFrame([
        {"run": "r", "batch_size": 64, "layer": "conv1", "canonical_op": "conv2d", "direction": "fwd",
         "framework": fw, "level": level, "libraries": [], "library_calls": [], "algos": [], "kernels": ["k"],
         "ms_per_step": ms, "time_source": "t", "op_ms_per_step": 2 * ms, "pass": pass_, "op_pass": "framework",
         "time_kind": kind}
        for fw, level, ms, pass_, kind in (("pytorch", "kernel", 0.1, "framework", ANS.KERNEL_TIME),
                                           ("mxnet", "op", 3.0, "libs", ANS.LIBRARY_TIME))])
    q = B.Busy(False, "quiet")
    states = {("r", fw, 64, p): dataclasses.replace(_kernel_state(fw), pass_name=p, agreement=B.Agreement.AGREES,
                                                     busy=q, clean_busy=q)
              for fw, p in (("pytorch", "framework"), ("mxnet", "libs"))}
    row = ANS.answer_table(layers, states)[0].iloc[0]
    assert row["compared_on"] == ANS.MIXED
    assert (row["pytorch.time_kind"], row["mxnet.time_kind"]) == (ANS.KERNEL_TIME, ANS.LIBRARY_TIME)
    assert row["pytorch.comparable"] and row["mxnet.comparable"] and pd.isna(row["mxnet.vs_ref"])
    assert row["mxnet.no_ratio"] == ("no ratio: different kinds of time (MXNet library-call time, PyTorch GPU "
                                     "kernel time)")


def test_answer_is_the_first_section_and_a_csv(out):
    page = (out / "report.html").read_text()
    first = re.search(r'<section id="([a-z_]+)">', page).group(1)
    assert first == "answer"
    sec = re.search(r'<section id="answer">(.*?)</section>', page, re.S).group(1)
    # the CPU run: 4 layers x (fwd, bwd) per batch size, one table per batch size
    sizes = sorted(A.load_run(RUN).results[i]["batch_size"] for i in range(len(A.load_run(RUN).results)))
    assert sec.count("<table") == len(set(sizes))
    # each in a box of its own that scrolls: 3 frameworks' calls, algorithms and kernels are wider than 1,400 px
    # (the sample report's H200 "Calls and kernels" tables: 1,778 px, the whole page as wide before the box)
    assert sec.count('<div class="wide"><table class="answer">') == len(set(sizes))
    assert sec.count('<td class="key">') == 2 * 8 * len(set(sizes))
    for layer in ("conv1", "conv2", "fc1", "fc2"):
        assert f'<td class="key">{layer}</td>' in sec
    assert "MXNet time / PyTorch" in sec and "batch size 64: PyTorch on CPU, MXNet on CPU" in sec
    csv = pd.read_csv(out / "tables" / "answer.csv")
    assert len(csv) == sec.count('<td class="key">') // 2
    assert {"pytorch.ms_per_step", "mxnet.ms_per_step", "mxnet.vs_ref"} <= set(csv.columns)
    assert "No capture passes" not in page


def test_long_names_are_cut_with_the_full_name_in_a_title():
    from kernelmap.reports.html import abbr, abbr_list

    name = "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32"
    cell = abbr(name, 20)
    assert f'title="{name}"' in cell and ">sm80_xmma_fprop_imp…<" in cell
    assert abbr("short", 20) == "short"
    cell = abbr_list(["a", "b", "c", "d"], 20, keep=2)
    assert cell.startswith("a<br>b<br>") and "+2 more" in cell and 'title="c\nd"' in cell


def test_run_without_capture_is_stated_once_at_the_top(tmp_path):
    run = tmp_path / "clean-only"
    run.mkdir()
    shutil.copy(RUN / "manifest.json", run / "manifest.json")
    results = json.loads((RUN / "results.json").read_text())
    for r in results:
        r["passes"] = {k: v for k, v in r.get("passes", {}).items() if k == "clean"}
    (run / "results.json").write_text(json.dumps(results))
    assert ANS.no_capture_runs([A.load_run(run)]) == ["clean-only"]
    assert ANS.no_capture_runs([A.load_run(RUN)]) == []
    assert report(str(run), "-o", str(tmp_path / "rep")) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.count("No capture passes") == 1
    assert page.index("No capture passes") < page.index('<section id="answer">')
    # said once: no section of per-op figures, and no advice to normalise what holds nothing to normalise
    assert '<section id="ops">' not in page and '<section id="figures">' not in page
    assert "kernelmap normalise" not in page and '<section id="summary">' in page


def test_report_of_a_missing_directory_says_it_does_not_exist(tmp_path):
    with pytest.raises(KernelmapError, match="does not exist"):
        A.load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(KernelmapError, match="not a run directory"):
        A.load_run(tmp_path / "file")


def test_help_imports_no_subcommand_module():
    code = ("import sys, contextlib, io\nimport kernelmap.cli as c\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as o:\n"
            "    c.main(['--help'])\n"
            "assert 'report' in o.getvalue(), o.getvalue()\n"
            "bad = [m for m in ('pandas', 'matplotlib', 'numpy', 'kernelmap.reports.cli', 'kernelmap.run.cli')"
            " if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_subcommand_help_still_lists_its_options():
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "report", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--strict" in proc.stdout


def _cell(ms: float, calls: float, basis: str = "framework-op calls", why_not: str = "",
          kind: str = ANS.OP_TIME) -> dict:
    return {"libraries": ["oneDNN"], "math_modes": [], "kernels": ["k"], "ms_per_step": ms,
            "calls_per_step": calls, "calls_basis": basis, "time_kind": kind, "comparable": not why_not,
            "why_not": why_not}


def test_differences_name_time_gaps_and_call_count_mismatches():
    fws = ["pytorch", "mxnet"]
    diff = A.differences({"pytorch": _cell(1.0, 2), "mxnet": _cell(5.0, 2)}, fws)
    assert diff == ["time differs 5.0x (framework-op time): PyTorch 1 ms, MXNet 5 ms"]
    assert A.differences({"pytorch": _cell(1.0, 2), "mxnet": _cell(1.4, 2)}, fws) == []
    assert A.differences({"pytorch": _cell(3.0, 2), "mxnet": _cell(1.0, 2)}, fws)[0].startswith("time differs 3.0x")
    # a figure whose pass cannot be compared: no "time differs", the reason instead
    slow = "PyTorch's framework pass ran 5.14x its clean pass"
    assert A.differences({"pytorch": _cell(1.0, 2, why_not=slow), "mxnet": _cell(4737.6, 2)}, fws) == [
        f"time not compared: {slow}"]
    # of different kinds (a framework that ran on another device): not compared
    assert A.differences({"pytorch": _cell(1.0, 2, kind=ANS.KERNEL_TIME), "mxnet": _cell(5.0, 2)}, fws) == [
        "time not compared: different kinds of time: PyTorch GPU kernel time, MXNet framework-op time"]
    # no gap among the figures that compare: nothing said of the one that does not, below the gap
    assert A.differences({"pytorch": _cell(1.0, 2, why_not=slow), "mxnet": _cell(1.2, 2)}, fws) == []
    diff = A.differences({"pytorch": _cell(1.0, 2), "mxnet": _cell(1.0, 4)}, fws)
    assert diff == ["framework-op calls per step differ: PyTorch 2, MXNet 4"]
    # counted differently (kernel launches against framework-op calls): not compared
    assert A.differences({"pytorch": _cell(1.0, 2), "mxnet": _cell(1.0, 4, "kernels")}, fws) == []


def test_near_zero_op_rows_are_folded_with_a_count(out):
    page = (out / "report.html").read_text()
    sec = re.search(r'<section id="ops">(.*?)</section>', page, re.S).group(1)
    run = A.load_run(RUN)
    for bs in sorted({r["batch_size"] for r in run.results}):
        df, fws = A.op_table(run, bs)
        shares = pd.DataFrame({fw: df[f"{fw}.ms_per_step"] / df[f"{fw}.ms_per_step"].sum() for fw in fws})
        small = int((shares.max(axis=1) < 0.01).sum())
        part = sec.split(f"batch size {bs}</h3>", 1)[1].split("<h3>", 1)[0]
        if small:
            assert f"<summary>{small} more row(s), each under 1%" in part
            shown = part.split("<details>")[0]
        else:
            assert "<details>" not in part
            shown = part
        assert shown.count("<tr>") - 2 == len(df) - small


def test_cpu_figures_say_what_is_not_there():
    run = A.load_run(RUN)
    roof, peaks = A.roofline([run])
    if (roof["level"] == "op").any():  # a CPU trace: forward only, and the figure data says why
        assert set(roof[roof["level"] == "op"]["direction"]) == {"fwd"}
        named = peaks[run.name]["not_shown"].partition(":")[0]  # the frameworks it holds for, by name
        assert named.startswith("backward not shown for ")
        assert all(A.fw_label(fw) in named for fw in set(roof[roof["level"] == "op"]["framework"])), named
    tl = A.timeline_events(run)
    for fw in set(tl["framework"]):  # every framework's step marks reach the phase lane
        assert (tl[(tl["framework"] == fw) & (tl["lane"] == "phase")]["kind"] == "step").any(), fw
    from kernelmap.reports.figures import _empty_lane

    libcalls = A.library_calls([run])
    sub = tl[tl["framework"] == "mxnet"]
    bs = sub["batch_size"].iloc[0]
    text = _empty_lane("library_call", sub, libcalls, run.name, bs, "mxnet")
    n = libcalls[(libcalls["framework"] == "mxnet") & (libcalls["batch_size"] == bs)]["calls_per_step"].sum()
    assert "not on this trace's clock" in text and f"{n:.0f} oneDNN" in text
    assert "no device kernels" in _empty_lane("kernel", sub, libcalls, run.name, bs, "mxnet")
    # MXNet's ops run on its engine threads after the host's step mark: the figure says so, and only there
    from kernelmap.reports.figures import _step_note

    one = sub[sub["batch_size"] == bs]
    ops_end = (one.loc[one["lane"] == "op", "rel_ns"] + one.loc[one["lane"] == "op", "dur_ns"]).max()
    mark_end = (one.loc[one["kind"] == "step", "rel_ns"] + one.loc[one["kind"] == "step", "dur_ns"]).max()
    assert ops_end > mark_end  # what the real run shows
    note = _step_note(one, "mxnet")
    assert note and "after it on its engine threads" in note and f"{mark_end / 1e6:.1f} ms" in note
    torch_sub = tl[(tl["framework"] == "pytorch") & (tl["batch_size"] == bs)]
    assert _step_note(torch_sub, "pytorch") is None


def test_no_gpu_is_said_once(tmp_path, monkeypatch, capsys):
    import argparse

    from kernelmap import gpuinfo
    from kernelmap.errors import KernelmapError
    from kernelmap.run import cli as run_cli

    if gpuinfo.query().gpus:
        pytest.skip("a GPU is here")
    pytest.importorskip("torch", reason="with no framework installed the run stops before its device decisions")

    def stop(*_a, **_k):  # the plan is made and said; no worker starts
        raise KernelmapError("stopped before any work")

    monkeypatch.setattr(run_cli, "run_cases", stop)
    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    args = parser.parse_args(["--framework", "all", "--device", "auto", "--profile", "all", "--data", "synthetic",
                              "--out", str(tmp_path / "run")])
    with pytest.raises(KernelmapError, match="stopped before any work"):
        run_cli.execute(args)
    proc = argparse.Namespace(stderr=capsys.readouterr().err)
    assert proc.stderr.count("no NVIDIA GPU here") == 1, proc.stderr
    assert "runs on the CPU: no NVIDIA GPU" not in proc.stderr
    assert proc.stderr.count("nsys pass skipped") == 1, proc.stderr  # not once per framework x batch size
    assert "nsys not found" not in proc.stderr  # on the CPU nsys would record nothing: no install advice


def test_page_shows_no_local_paths(out):
    page = (out / "report.html").read_text()
    assert str(RUN.resolve()) not in page and str(RUN.resolve().parent) not in page
    assert str(out.resolve().parent) not in page


def _report_texts(report_dir: Path) -> dict[str, str]:
    """Every text file of a report (page, tables, timeline), images' data URIs left out (base64 holds '/')."""
    return {str(p.relative_to(report_dir)): re.sub(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+", "", p.read_text())
            for p in sorted(report_dir.rglob("*")) if p.suffix in (".html", ".csv", ".json")}


def test_no_report_file_shows_the_paths_the_run_recorded(out):
    """The manifest records where the run was written and where its data came from (paths on the machine
    that ran it); the page, the CSV tables and the timeline name the run by its name only."""
    man = json.loads((RUN / "manifest.json").read_text())
    local = {man["config"]["out"], man["data"]["path"], str(RUN.resolve()), str(out.resolve())}
    assert all(p.startswith("/") for p in local)  # absolute paths, each of them
    leaks = {name: p for name, text in _report_texts(out).items() for p in local if p in text}
    assert not leaks, leaks


def test_sample_report_shows_no_local_paths():
    """docs/sample-report once showed /tmp/sample/...: no absolute path of the machines that made it."""
    sample = Path(__file__).resolve().parents[1] / "docs" / "sample-report"
    texts = _report_texts(sample)
    assert "report.html" in texts and any(n.startswith("tables") for n in texts)
    local = re.compile(r"(?<![\w.:/])/(?:tmp|work|root|home|Users|opt|mnt|scratch|var|usr)/[\w.+-]+")
    leaks = {name: local.findall(text) for name, text in texts.items() if local.search(text)}
    assert not leaks, leaks


def test_compact_table_leaves_out_empty_columns_and_cuts_lists():
    from kernelmap.reports.html import table

    df = pd.DataFrame({"a": ["x", "y"], "empty": [None, None], "names": [["n" * 50, "b", "c", "d"], []]})
    html = table(df, {"a": "A", "empty": "E", "names": "N"}, compact=True)
    assert "<th>E</th>" not in html and "<th>A</th>" in html and "+1 more" in html
    assert f'title="{"n" * 50}"' in html
    full = table(df, {"a": "A", "empty": "E", "names": "N"})
    assert "<th>E</th>" in full and "more" not in full
