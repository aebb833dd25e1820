"""The page a reader scans (issue 42), built from a real busy three-framework CPU run
(tests/data/cpu_run_cputime): the banner names every busy figure, every figure carries its contention
mark, the self-checks show their failures with the whole table folded, details are folded, the timeline
gives each op its own colour, and in headless Chromium at 1,400 px the page is under 15,000 px tall, the
answer on CPU time is on the first screen and nothing scrolls sideways."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import cli as report_cli
from kernelmap.reports import figures as F
from kernelmap.reports import html as H
from kernelmap.reports.analyses.basis import UNEVEN_STRETCH

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_run_cputime"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
WIDTH, HEIGHT, MAX_PAGE = 1400, 900, 15_000
MARKED = ("op_time", "library_mix", "busy_share", "timeline")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("page")
    run = tmp / "cpu_run_cputime"
    shutil.copytree(DATA, run)
    normalise_run_dir(run)
    out, _ = report_cli.build([str(run)], tmp / "report")
    return out


def test_every_op_has_its_own_timeline_colour():
    colours = [F.lane_color(op) for op in schema.CANONICAL_OPS]
    assert len(set(colours)) == len(colours) == len(schema.CANONICAL_OPS)
    assert F.NO_OP_COLOR not in colours and F.lane_color(None) == F.NO_OP_COLOR


def test_the_banner_names_every_busy_figure(page):
    html = (page / "report.html").read_text()
    banner = re.search(r'<div class="alarm" id="alarm">(.*?)</div>', html, re.S).group(1)
    n = int(re.search(r"⚠ (\d+) figure\(s\) of this run were measured while the machine was busy", banner).group(1))
    items = re.findall(r"<li>(.*?)</li>", re.search(r'<ul class="busy-list">(.*?)</ul>', banner, re.S).group(1))
    assert len(items) == n and "more (" not in banner
    over = pd.read_csv(page / "tables" / "overhead.csv")
    # every capture pass of every case ran busy here: each is named
    for _, r in over[(over["pass"] != "clean") & over["contended"].eq(True)].iterrows():
        assert any(f"bs {r['batch_size']} {r['pass']} pass: BUSY" in i for i in items), (r["framework"], r["pass"])


BANNER_LINE = re.compile(r'<li><a href="#(fail-[a-z0-9-]+)">(.*?)</a> \((\d+)\): (.*?)</li>'
                         r'|<li><details><summary><a href="#(fail-[a-z0-9-]+)">(.*?)</a> \((\d+)\): (.*?) and (\d+) more:'
                         r"</summary>(.*?)</details></li>", re.S)


def banner_lines(banner: str) -> list[dict]:
    """The banner's failed-check lines: a line each, its subjects whole, or its first ones with the rest folded."""
    out = []
    for m in BANNER_LINE.finditer(banner):
        g = m.groups()
        if g[0]:
            out.append({"anchor": g[0], "check": g[1], "rows": int(g[2]), "head": g[3], "more": 0, "subjects": g[3]})
        else:
            out.append({"anchor": g[4], "check": g[5], "rows": int(g[6]), "head": g[7], "more": int(g[8]),
                        "subjects": g[9]})
    return out


def test_the_banner_lists_every_failed_check_a_line_each_linked_to_its_row(page):
    html = (page / "report.html").read_text()
    banner = re.search(r'<div class="alarm" id="alarm">(.*?)</div>', html, re.S).group(1)
    checks = pd.read_csv(page / "tables" / "self_checks.csv")
    bad = checks[checks["status"] == "FAIL"]
    lines = banner_lines(banner)
    assert len(bad) > 0 and len(lines) == bad["check"].nunique()
    assert {(x["check"], x["rows"]) for x in lines} == {(k, len(g)) for k, g in bad.groupby("check")}
    said = {x["check"]: x["subjects"] for x in lines}
    for _, r in bad.iterrows():  # every failed row is named: its framework and batch size on its check's line
        assert f"{report_cli.A.fw_label(r['framework'])} bs {int(r['batch_size'])}" in said[r["check"]], r.to_dict()
    for x in lines:  # a long line shows its first subjects and folds the whole list, the count of the rest said
        assert x["subjects"].startswith(x["head"].split(" (")[0])
        assert x["more"] == 0 or len(x["head"]) <= H.LINE_CHARS < len(x["subjects"])
    assert any(x["more"] for x in lines)  # this fixture has a check that failed on more rows than a line holds
    short = re.search(r'<section id="checks">(.*?)<details id="checks-all">', html, re.S).group(1)
    for x in lines:  # the link goes to the check's first row in the short table of failures
        assert re.search(rf'<tr id="{x["anchor"]}"><td>[^<]*</td><td>[^<]*</td><td[^>]*>[^<]*</td><td>{x["check"]}</td>',
                         short)
    # the details are folded, not dropped
    assert re.search(r'<details class="fail-head"><summary><b>⚠ \d+ self-check\(s\) failed</b>.*?Why:</summary>', banner,
                     re.S)


def test_banner_lines_put_a_math_failure_first_and_name_each_subject():
    from kernelmap.reports import checks as C

    rows = [C.check_row("r", "mxnet", 256, C.Check.CAPTURE_NOT_FASTER, "framework pass", 1, 2, C.FAIL, "d"),
            C.check_row("r", "mxnet", 64, C.Check.CALL_WITHIN_OP, "fc2 fwd", 1, 2, C.FAIL, "d"),
            C.check_row("r", "jax", 64, C.Check.CALL_WITHIN_OP, "conv1 bwd_data", 1, 2, C.FAIL, "d"),
            C.check_row("r", "jax", 64, C.Check.CALLS, "conv1 fwd", 1, 1, C.PASS, "ok"),
            C.check_row("r", "pytorch", 64, C.Check.MATH_AS_ASKED, "conv/linear products", "bf16", "fp32", C.FAIL, "d")]
    lines = H.failure_lines(pd.DataFrame(rows, columns=C.COLUMNS), C.FAIL, report_cli.A.fw_label, C.Check.MATH_AS_ASKED)
    assert [(x["check"], x["rows"], x["subjects"]) for x in lines] == [
        (C.Check.MATH_AS_ASKED, 1, "PyTorch bs 64 (conv/linear products)"),
        (C.Check.CAPTURE_NOT_FASTER, 1, "MXNet bs 256 (framework pass)"),
        (C.Check.CALL_WITHIN_OP, 2, "MXNet bs 64 fc2 fwd, JAX bs 64 conv1 bwd_data")]
    assert lines[1]["anchor"] == H.failure_anchor(C.Check.CAPTURE_NOT_FASTER) == "fail-capture-not-faster"


def test_every_figure_says_whether_the_machine_was_busy(page):
    html = (page / "report.html").read_text()
    for stem in MARKED:
        fig = re.search(rf'<figure id="fig-{stem}">(.*?)</figure>', html, re.S).group(1)
        cap = re.search(r"<figcaption>(.*?)</figcaption>", fig, re.S).group(1)
        assert '<span class="busy">BUSY: measured while the machine was busy: ' in cap, stem
        assert "framework pass (other processes used" in cap, stem


def test_self_checks_show_their_failures_and_fold_the_rest(page):
    html = (page / "report.html").read_text()
    checks = pd.read_csv(page / "tables" / "self_checks.csv")
    bad = checks[checks["status"] == "FAIL"]
    section = re.search(r'<section id="checks">(.*?)</section>', html, re.S).group(1)
    short, full = section.split('<details id="checks-all">')
    kinds, failed = short.split('<details id="checks-failed">')
    # a line per failed check (its first failed row and how many failed), then every failed row folded
    assert kinds.count('<td class="status">FAIL</td>') == bad["check"].nunique() > 0
    counts = [int(n) for n in re.findall(r'<td class="status">FAIL</td><td class="num">(\d+)</td></tr>', kinds)]
    assert counts == [int((bad["check"] == k).sum()) for k in dict.fromkeys(bad["check"])]
    assert failed.count('<td class="status">FAIL</td>') == len(bad) > len(counts)
    assert "<td class=\"status\">pass</td>" not in short
    assert full.count("<tr>") == len(checks) + 1


def test_details_are_folded_and_the_cpu_answer_is_a_table(page):
    html = (page / "report.html").read_text()
    for sec in ("ops", "layers", "libcalls", "coverage"):
        body = re.search(rf'<section id="{sec}">\s*<h2>.*?</h2>\s*(.*?)</section>', html, re.S).group(1)
        assert body.startswith('<details class="section">'), sec
    # with CPU time the answer is its table, the calls and kernels follow the summary (without: they are the answer)
    order = re.findall(r'<section id="([a-z_]+)">', html)
    assert order[:3] == ["answer", "summary", "calls"]
    assert re.search(r'<section id="answer">(.*?)</section>', html, re.S).group(1).count('<table class="answer cpu">') == 1
    cpu = pd.read_csv(page / "tables" / "cpu_answer.csv")
    # the whole step's CPU time has its ratios on this busy run; a layer's (its share of a busy pass's traced wall
    # time, which a neighbour stretches unevenly: basis.UNEVEN_STRETCH) none, each saying why
    whole = cpu["layer"] == "whole step"
    assert whole.sum() == 1 and cpu.loc[whole, ["mxnet.vs_ref", "jax.vs_ref"]].notna().all().all()
    assert cpu.loc[~whole, ["mxnet.vs_ref", "jax.vs_ref"]].isna().all().all() and (~whole).sum() == 8
    assert all(UNEVEN_STRETCH in w for w in cpu.loc[~whole, "jax.no_ratio"])
    assert "2 of 18 figures with a ratio" in html


def _measure(tmp: Path, html: Path) -> dict:
    probe = """<script>window.addEventListener('load', () => {
      const box = e => { const r = e.getBoundingClientRect(); return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY,
                                                                        right: r.right}; };
      const q = s => document.querySelector(s) ? box(document.querySelector(s)) : null;
      const out = {height: document.documentElement.scrollHeight, page: document.documentElement.scrollWidth,
                   viewport: document.documentElement.clientWidth, cpu_row: q('#answer table.cpu tbody tr'),
                   cpu_last_row: q('#answer table.cpu tbody tr:last-child'),
                   summary: q('#summary'), banner: q('#alarm')};
      const pre = document.createElement('pre'); pre.id = 'measure'; pre.textContent = JSON.stringify(out);
      document.body.appendChild(pre); });</script>"""
    page = html.with_name("measured.html")
    page.write_text(html.read_text().replace("</body>", probe + "</body>"))
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
                           "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="measure">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless chromium not installed")
def test_page_height_and_first_screen_in_chromium(page, tmp_path):
    m = _measure(tmp_path, page / "report.html")
    assert m["height"] < MAX_PAGE, m
    assert m["page"] <= m["viewport"], m
    assert m["banner"]["top"] < HEIGHT and m["cpu_last_row"]["bottom"] <= HEIGHT and m["summary"]["top"] < HEIGHT, m
