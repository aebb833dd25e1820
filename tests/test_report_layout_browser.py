"""The report's layout in headless Chromium at 1400x900: the per-layer answer is on the first
screen and no table is wider than the page.

Positions are measured by the browser itself: a copy of the page gets a script that writes the
bounding boxes as JSON into the DOM, read back with ``--dump-dom``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from kernelmap.reports import cli as report_cli

RUN = Path(__file__).parent / "data" / "report_cpu_run"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
WIDTH, HEIGHT = 1400, 900

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="headless chromium not installed")]

MEASURE = """<script>
window.addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {top: r.top + window.scrollY, left: r.left, right: r.right, bottom: r.bottom + window.scrollY}; };
  const out = {viewport: document.documentElement.clientWidth,
               page: document.documentElement.scrollWidth,
               answer: document.querySelector('#answer') ? box(document.querySelector('#answer')) : null,
               answer_table: document.querySelector('#answer table') ? box(document.querySelector('#answer table')) : null,
               answer_row: document.querySelector('#answer table tbody tr') ? box(document.querySelector('#answer table tbody tr')) : null,
               tables: [...document.querySelectorAll('table')].map(t => {
                 const s = t.closest('section'); const d = t.closest('details');
                 if (d) d.open = true;
                 return {section: s ? s.id : '', ...box(t)}; })};
  const pre = document.createElement('pre'); pre.id = 'layout-measure';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _measure(tmp: Path, html: Path) -> dict:
    page = html.with_name("measured.html")
    page.write_text(html.read_text().replace("</body>", MEASURE + "</body>"))
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
         "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="layout-measure">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the measuring script wrote nothing: " + proc.stderr[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def layout(request, tmp_path_factory):
    """The CPU run fixture (PyTorch + MXNet), and the real H200 recording (long cuDNN kernel names)."""
    tmp = tmp_path_factory.mktemp(f"layout-{request.param}")
    run = RUN
    if request.param == "gpu":
        from conftest import gpu_run_dir

        from kernelmap.normalise import normalise_run_dir

        run = tmp / "gpu"
        gpu_run_dir(run)
        normalise_run_dir(run)
    report_cli.build([str(run)], tmp / "report")
    return _measure(tmp, tmp / "report" / "report.html")


def test_answer_is_on_the_first_screen(layout):
    assert layout["answer"] is not None, "no #answer section"
    assert layout["answer_table"] is not None, "the answer section has no table"
    # the section's heading and at least its first row are above the fold
    assert layout["answer"]["top"] < HEIGHT
    assert layout["answer_row"]["bottom"] <= HEIGHT, layout["answer_row"]


def test_no_table_is_wider_than_the_page(layout):
    assert layout["page"] <= layout["viewport"], f"page scrolls sideways: {layout['page']} > {layout['viewport']}"
    wide = [t for t in layout["tables"] if t["right"] > layout["viewport"] + 0.5]
    assert not wide, wide
    assert len(layout["tables"]) >= 5
