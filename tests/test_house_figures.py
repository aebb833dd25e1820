"""Figures a reader can read: no label drawn over another, every key told apart."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import figures as F

from kernelmap import timing
from kernelmap.history.job import save_job
from kernelmap.history.trend import load_history

DATA = Path(__file__).resolve().parent / "data" / "bench_jobs"


@pytest.fixture
def drawn(monkeypatch):
    """The figures each ``*_figure`` call drew, kept open and laid out (and written, as ``save_png`` does)."""
    figs = []

    def keep(fig, path):
        fig.canvas.draw()
        figs.append(fig)
        fig.savefig(path, dpi=F.DPI, bbox_inches="tight", format="png")
        return Path(path)

    monkeypatch.setattr(F, "save_png", keep)
    yield figs
    for fig in figs:
        F.plt.close(fig)


def _overlaps(texts) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts if t.get_visible() and t.get_text().strip()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_overhead_labels_do_not_overlap(drawn, tmp_path):
    """Two capture passes "below noise" side by side (the sample report's MXNet at bs 256 on the CPU)
    drew their labels over each other."""
    rows = []
    for fw in ("pytorch", "mxnet", "jax"):
        for p, ms, verdict in (("clean", 180.0, None), ("framework", 160.0, timing.OverheadVerdict.BELOW),
                               ("libs", 158.0, timing.OverheadVerdict.BELOW)):
            rows.append({"run": "cpu", "batch_size": 256, "framework": fw, "pass": p, "step_ms_median": ms,
                         "skipped": None, "overhead": None if p == "clean" else ms / 180 - 1,
                         "verdict": None if verdict is None else str(verdict)})
    assert F.overhead_figure(pd.DataFrame(rows), tmp_path / "overhead.png").is_file()
    (fig,) = drawn
    (ax,) = [a for a in fig.axes if a.get_visible()]
    labels = [t for t in ax.texts if t.get_text().strip()]
    assert len(labels) == 6 and all("below noise" in t.get_text() for t in labels)
    assert _overlaps(labels) == []
    top = ax.get_window_extent()
    assert all(t.get_window_extent().y1 <= top.y1 for t in labels)  # inside the panel


def _history_of_two_batch_sizes(tmp_path) -> pd.DataFrame:
    """One real bench job (tests/data/bench_jobs/job1), with PyTorch's benchmark also saved at batch
    size 256 (its times x4): two keys that differ only by batch size, one point each."""
    parts = []
    for fw in ("pytorch", "mxnet", "jax"):
        d = json.loads(gzip.decompress((DATA / "job1" / f"{fw}.json.gz").read_bytes()))
        if fw == "pytorch":
            b = copy.deepcopy(d["benchmarks"][0])
            b["extra_info"].update(batch_size=256, key="pytorch-eager-cpu-256")
            b["name"] = b["name"].replace("-64]", "-256]")
            b["fullname"] = b["fullname"].replace("-64]", "-256]")
            b["params"] = {**(b.get("params") or {}), "batch_size": 256}
            for k in ("min", "max", "mean", "median", "q1", "q3"):
                b["stats"][k] *= 4
            d["benchmarks"].append(b)
        path = tmp_path / f"{fw}.json"
        path.write_text(json.dumps(d))
        parts.append(path)
    st = tmp_path / "st"
    save_job(st, parts, "job-1", machine="m")
    return load_history(st)


def test_trend_tells_batch_sizes_apart_and_its_ticks_do_not_collide(drawn, tmp_path):
    h = _history_of_two_batch_sizes(tmp_path)
    assert F.trend_figure(h, tmp_path / "trend.png").is_file()
    (fig,) = drawn
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    bs64, bs256 = lines["pytorch eager cpu bs64"], lines["pytorch eager cpu bs256"]
    assert len(bs64.get_xdata()) == 1  # one point per key: only its marker tells it apart
    assert bs64.get_marker() != bs256.get_marker() and bs64.get_color() == bs256.get_color()
    ticks = [t for t in ax.get_yticklabels() + ax.yaxis.get_minorticklabels()
             if ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    assert len([t for t in ticks if t.get_text()]) >= 2
    assert _overlaps(ticks) == []
    assert all("e+" not in t.get_text() for t in ticks)
