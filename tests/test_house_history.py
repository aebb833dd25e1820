"""`kernelmap compare` calls a change only where the samples differ beyond their noise."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_history import storage  # noqa: F401  (real pytest-benchmark runs, samples saved)

from kernelmap.history import compare as history
from kernelmap.history.storage import list_runs, pick_runs

pytest.importorskip("pytest_benchmark")


def test_mann_whitney_p_matches_the_textbook():
    # 5 vs 5 without overlap: U = 0; normal approximation with continuity correction (scipy's
    # mannwhitneyu(method="asymptotic") gives 0.012186)
    assert history.mann_whitney_p(np.arange(1.0, 6), np.arange(6.0, 11)) == pytest.approx(0.012186, abs=1e-6)
    assert history.mann_whitney_p(np.arange(1.0, 6), np.arange(1.0, 6)) == 1.0
    same = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    assert history.mann_whitney_p(same, same) == 1.0  # all tied: no variance, no change


def _variant(st, src: str, number: str, stat_scale: float, data) -> None:
    """A copy of saved run ``src`` as ``number`` with the mean and median scaled and ``data(samples)``
    as each benchmark's samples."""
    (path,) = st.glob(f"*/{src}_*.json")
    d = json.loads(path.read_text())
    for b in d["benchmarks"]:
        for k in ("mean", "median"):
            b["stats"][k] *= stat_scale
        b["stats"]["data"] = data(b["stats"]["data"])
    path.with_name(number + path.name[4:]).write_text(json.dumps(d))


def test_a_change_within_the_samples_noise_is_not_called(storage, tmp_path):  # noqa: F811
    import shutil

    st = tmp_path / "st"
    shutil.copytree(storage, st)
    # the mean 10% higher, the samples the same (reordered): past mean:5%, but no change in the samples
    _variant(st, "0002", "0005", 1.1, lambda d: d[::-1])
    runs = list_runs(st)
    cmp = history.compare_runs(pick_runs(runs, "0002"), pick_runs(runs, "0005"),
                               [history.Threshold.parse("mean:5%")])
    assert not cmp.failed and len(cmp.within_noise) == 2
    assert all("within the samples' noise (Mann-Whitney U p=1" in w for w in cmp.within_noise)
    assert (cmp.table["p_value"] == 1.0).all()
    out = history.format_comparison(cmp)
    assert "ok: no benchmark beyond mean:5%" in out and "not called a change" in out
    # every sample 20% slower (0003): called
    slow = history.compare_runs(pick_runs(runs, "0002"), pick_runs(runs, "0003"),
                                [history.Threshold.parse("mean:5%")])
    assert slow.failed and not slow.within_noise and (slow.table["p_value"] < history.NOISE_ALPHA).all()
    # too few samples to judge: the threshold alone decides, and the failure says so
    _variant(st, "0002", "0006", 1.1, lambda d: d[:2])
    few = history.compare_runs(pick_runs(list_runs(st), "0002"),
                               pick_runs(list_runs(st), "0006"), [history.Threshold.parse("mean:5%")])
    assert few.failed and all("noise not judged (" in f for f in few.failures)
