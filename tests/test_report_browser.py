"""Render the report in headless Chromium and look at the screenshot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from kernelmap.reports import cli as report_cli

RUN = Path(__file__).parent / "data" / "report_cpu_run"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="headless chromium not installed")]


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'profile'}", *args],
        capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium(tmp_path):
    out = tmp_path / "report"
    report_cli.build([str(RUN)], out)
    url = (out / "report.html").resolve().as_uri()
    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,3000", url)
    assert shot.is_file(), proc.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (3000, 1400)
    assert img.var() > 0
    # content all the way down: the page is longer than the window, so every band of rows has ink
    dark = (img.mean(axis=2) < 0.5)
    bands = dark.reshape(30, 100, 1400).any(axis=(1, 2))
    assert bands.mean() > 0.8, f"blank bands: {np.flatnonzero(~bands)}"
    # colour: embedded figures decoded (not only black text on white)
    sat = img.max(axis=2) - img.min(axis=2)
    assert (sat > 0.3).sum() > 1000

    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for heading in ("Summary", "Side-by-side op table", "Figures", "Coverage", "Timeline export"):
        assert f">{heading}</h2>" in dom.stdout
    assert dom.stdout.count("data:image/png;base64,") >= 5
