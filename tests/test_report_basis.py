"""One time basis per comparison, and contention on the first screen (reports/analyses/basis.py,
reports/answer.py, the summary, the banner), on the real CPU run of both frameworks
(tests/data/cpu_run_all) as recorded and on doctored copies that carry the fields runs record
now (contention per pass, each capture pass's own 95% interval)."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import answer as ANS
from kernelmap.reports import checks as C
from kernelmap.reports.analyses import basis as B
from kernelmap.reports.analyses.summary import clean_stats
from kernelmap.reports.cli import build

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
BUSY_TEXT = "other processes used 1.7 of 2 cores"
QUIET_TEXT = "quiet: other processes used 0.1 of 2 cores"
SLOW = 5.14  # PyTorch's framework pass against its clean pass, in the doctored copy


def _section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, sid
    return m.group(1)


def _header(page: str) -> str:
    return page.split("</header>", 1)[0]


def _contention(contended: bool) -> dict:
    text = BUSY_TEXT if contended else QUIET_TEXT
    return {"contended": contended, "reasons": [text] if contended else [], "text": text, "windows": 3,
            "windows_contended": 3 if contended else 0, "ncpu": 2}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """tests/data/cpu_run_all as recorded, normalised."""
    d = tmp_path_factory.mktemp("rec") / "cpu_run_all"
    shutil.copytree(DATA / "cpu_run_all", d)
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> Path:
    """A copy whose results.json carries what runs record now: every pass quiet, every capture pass
    within noise of its clean pass but PyTorch's framework pass (5.14x its clean pass, beyond
    noise). PyTorch's oneMKL log is left out, so its linear layers have no library-call time and
    their rows compare framework-op time."""
    d = tmp_path_factory.mktemp("quiet") / "cpu_run_all"
    shutil.copytree(DATA / "cpu_run_all", d)
    (d / "pytorch" / "bs64" / "blas.log.gz").unlink()
    results = json.loads((d / "results.json").read_text())
    for r in results:
        c = clean_stats(r)
        r["contention"] = _contention(False)
        for name, p in r["passes"].items():
            if name == "clean" or "skipped" in p:
                continue
            p["contention"] = _contention(False)
            f = SLOW if (r["framework"], name) == ("pytorch", "framework") else 1.0
            p.update(median_step_s=c["median_step_s"] * f, ci95_low_s=c["ci95_low_s"] * f,
                     ci95_high_s=c["ci95_high_s"] * f)
    (d / "results.json").write_text(json.dumps(results))
    normalise_run_dir(d)
    return d


def _doctored(src: Path, tmp_path: Path, fn) -> Path:
    d = tmp_path / src.name
    shutil.copytree(src, d)
    results = json.loads((d / "results.json").read_text())
    fn({r["framework"]: r for r in results})
    (d / "results.json").write_text(json.dumps(results))
    return d


def test_recorded_cpu_run_draws_no_ratio_and_says_why(recorded, tmp_path):
    """The real CPU run: PyTorch's capture passes ran 0.79x and 0.77x its clean pass, MXNet's 1.57x
    and 1.83x, over 5 and 3 steps (too few to tell from noise), and no contention was recorded:
    the first table draws no ratio, and every ratio cell says why."""
    states = B.pass_states([A.load_run(recorded)])
    assert {k[1:]: (s.agreement, round(s.ratio, 3)) for k, s in states.items()} == {
        ("pytorch", 64, "framework"): (B.Agreement.TOO_FEW_STEPS, 0.788),
        ("pytorch", 64, "libs"): (B.Agreement.TOO_FEW_STEPS, 0.769),
        ("mxnet", 64, "framework"): (B.Agreement.TOO_FEW_STEPS, 1.57),
        ("mxnet", 64, "libs"): (B.Agreement.TOO_FEW_STEPS, 1.825)}
    ans, _ = ANS.answer_table(A.layer_table([A.load_run(recorded)]), states)
    assert ans["mxnet.vs_ref"].isna().all() and set(ans["compared_on"]) == {ANS.LIBRARY_TIME}
    conv1 = ans[(ans["layer"] == "conv1") & (ans["direction"] == "fwd")].iloc[0]
    want = ("no ratio: PyTorch's libs pass ran 0.769x its clean pass over 3 steps, too few to judge (< 20), was "
            "not measured for contention (nor its clean pass); MXNet's libs pass ran 1.83x its clean pass over 3 "
            "steps, too few to judge (< 20), was not measured for contention (nor its clean pass)")
    assert conv1["mxnet.no_ratio"] == want
    out = build([str(recorded)], tmp_path / "rep")[0]
    sec = _section((out / "report.html").read_text(), "answer")
    assert html.escape(want) in sec
    assert sec.count('<td class="kind">library-call time</td>') == len(ans)
    assert sec.count(">libs pass</span>") == 2 * len(ans)  # each time cell names its pass
    assert "(compared on library-call time; 0 of 8 figures with a ratio)" in sec
    assert 'class="alarm"' not in (out / "report.html").read_text()  # nothing was flagged contended


def test_ratio_only_between_comparable_passes(quiet, tmp_path):
    run = A.load_run(quiet)
    layers = A.layer_table([run])
    ans, _ = ANS.answer_table(layers, B.pass_states([run]))
    lib = ans[ans["compared_on"] == ANS.LIBRARY_TIME]
    op = ans[ans["compared_on"] == ANS.OP_TIME]
    assert set(lib["layer"]) == {"conv1", "conv2"} and set(op["layer"]) == {"fc1", "fc2"}
    # library-call time: both libs passes within noise and quiet -> the ratio
    assert (lib["mxnet.vs_ref"] == lib["mxnet.ms_per_step"] / lib["pytorch.ms_per_step"]).all()
    assert lib["mxnet.no_ratio"].isna().all()
    # framework-op time: PyTorch's framework pass ran 5.14x its clean pass -> no ratio, and why
    assert op["mxnet.vs_ref"].isna().all()
    assert set(op["mxnet.no_ratio"]) == {f"no ratio: PyTorch's framework pass ran {SLOW}x its clean pass"}
    assert set(op["pytorch.pass"]) == {"framework"} and set(lib["pytorch.pass"]) == {"libs"}
    # the op table (framework-op time throughout) says so instead of "time differs"
    table, _ = A.op_table(run, 64)
    conv = table[(table["canonical_op"] == "conv2d") & (table["direction"] == "fwd")].iloc[0]
    assert conv["pytorch.ms_per_step"] / conv["mxnet.ms_per_step"] >= A.TIME_GAP
    assert f"time not compared: PyTorch's framework pass ran {SLOW}x its clean pass" in conv["differences"]
    assert not any(x.startswith("time differs") for d in table["differences"] for x in d)
    out = build([str(quiet)], tmp_path / "rep")[0]
    page = (out / "report.html").read_text()
    why = html.escape(f"no ratio: PyTorch's framework pass ran {SLOW}x its clean pass")
    answer = _section(page, "answer")
    # each reason printed once, under its table; every cell without a ratio points at it
    assert answer.count(f'value="1">{why}</li>') == 1 and 'value="2"' not in answer
    n_cells = int(op["mxnet.no_ratio"].notna().sum())
    assert n_cells > 1 and answer.count(f'title="{why}">no ratio <a href="#noratio-') == n_cells
    ov = pd.read_csv(out / "tables" / "overhead.csv")
    assert set(ov[ov["pass"] != "clean"].dropna(subset=["step_ms_median"])["contention"]) == {QUIET_TEXT}


def test_op_table_states_time_differences_between_comparable_passes(quiet, tmp_path):
    def agree(r):
        p = r["pytorch"]["passes"]["framework"]
        p.update(median_step_s=p["median_step_s"] / SLOW, ci95_low_s=p["ci95_low_s"] / SLOW,
                 ci95_high_s=p["ci95_high_s"] / SLOW)
    run = A.load_run(_doctored(quiet, tmp_path, agree))
    table, _ = A.op_table(run, 64)
    conv = table[(table["canonical_op"] == "conv2d") & (table["direction"] == "fwd")].iloc[0]
    gap = conv["pytorch.ms_per_step"] / conv["mxnet.ms_per_step"]
    assert f"time differs {gap:.1f}x (framework-op time): MXNet {conv['mxnet.ms_per_step']:.3g} ms, PyTorch " \
           f"{conv['pytorch.ms_per_step']:.3g} ms" in conv["differences"]


def test_no_ratio_across_a_contended_and_a_quiet_pass(quiet, tmp_path, capsys):
    """MXNet's libs pass flagged contended: no library-call ratio, the cell naming the busy pass and
    its figure; the banner at the top counts it; the summary marks a busy clean pass."""
    def busy(r):
        r["mxnet"]["passes"]["libs"]["contention"] = _contention(True)
        r["pytorch"]["contention"] = _contention(True)  # PyTorch's clean pass
        r["pytorch"].update(trials_disagree=True, repeats=2)
    d = _doctored(quiet, tmp_path, busy)
    run = A.load_run(d)
    ans, _ = ANS.answer_table(A.layer_table([run]), B.pass_states([run]))
    lib = ans[ans["compared_on"] == ANS.LIBRARY_TIME]
    assert set(lib["mxnet.no_ratio"]) == {
        f"no ratio: PyTorch's libs pass has a clean pass that ran on a busy machine ({BUSY_TEXT}); "
        f"MXNet's libs pass ran on a busy machine ({BUSY_TEXT})"}
    out = build([str(d)], tmp_path / "rep")[0]
    page = (out / "report.html").read_text()
    head = _header(page)
    # trials that disagree are noise between processes, said apart from the busy figures (basis.noise_statements)
    assert "⚠ 2 figure(s) of this run were measured while the machine was busy" in head
    for item in (f"cpu_run_all: PyTorch bs 64 clean pass: BUSY: {BUSY_TEXT}",
                 f"cpu_run_all: MXNet bs 64 libs pass: BUSY: {BUSY_TEXT}"):
        assert html.escape(item) in head.split('id="noise"')[0], item
    noise = head.split('id="noise"')[1]
    assert html.escape("cpu_run_all: PyTorch bs 64 clean pass: its trials disagree beyond noise") in noise
    summ = _section(page, "summary")
    assert f'<span class="busy">BUSY: {BUSY_TEXT}</span>' in summ and QUIET_TEXT in summ
    assert "trials disagree after 2 repeat(s)" in summ
    csv = pd.read_csv(out / "tables" / "summary.csv").set_index("framework")
    assert bool(csv.loc["pytorch", "contended"]) and not bool(csv.loc["mxnet", "contended"])
    assert csv.loc["pytorch", "contention"] == f"BUSY: {BUSY_TEXT}"
    ov = pd.read_csv(out / "tables" / "overhead.csv")
    libs = ov[(ov["framework"] == "mxnet") & (ov["pass"] == "libs")].iloc[0]
    assert libs["contention"] == f"BUSY: {BUSY_TEXT}" and bool(libs["contended"])


def test_banner_names_failed_checks(quiet, tmp_path):
    """A capture pass faster than its clean pass beyond noise: the check fails and the banner says
    why before the first table."""
    def faster(r):
        p = r["mxnet"]["passes"]["framework"]
        p.update(median_step_s=p["median_step_s"] / 2, ci95_low_s=p["ci95_low_s"] / 2,
                 ci95_high_s=p["ci95_high_s"] / 2)
    d = _doctored(quiet, tmp_path, faster)
    page = (build([str(d)], tmp_path / "rep")[0] / "report.html").read_text()
    head = _header(page)
    assert "⚠ 1 self-check(s) failed" in head
    assert "capture not faster: MXNet bs 64: framework pass (" + C.BUSIER_CLEAN in \
        html.unescape(head)
    assert page.index('class="alarm"') < page.index('<section id="answer">')


def test_device_clock_needs_only_a_quiet_pass():
    s = B.PassState("r", "pytorch", 64, "nsys", 20, 0.01, (0.009, 0.011), 0.005, (0.0049, 0.0051),
                    B.Agreement.SLOWER, B.BY_INTERVALS, B.Busy(False, QUIET_TEXT), B.Busy(True, BUSY_TEXT))
    states = {("r", "pytorch", 64, "nsys"): s}
    assert B.comparable(states, "r", "pytorch", 64, "nsys", B.TimeKind.KERNEL) == (True, "")
    assert B.comparable(states, "r", "pytorch", 64, "nsys", B.TimeKind.OP) == (
        False, f"PyTorch's nsys pass ran 2x its clean pass, has a clean pass that ran on a busy machine ({BUSY_TEXT})")
    assert B.comparable(states, "r", "pytorch", 64, "framework", B.TimeKind.KERNEL) == (
        False, "PyTorch's framework pass has no step figures in results.json: not measured")
