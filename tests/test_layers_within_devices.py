"""``layer times within step`` on a real 2-GPU capture (tests/data/gpu_devices_run): a case on N devices sums its
layers over them, so it is bound by N steps (on 4x H100, JAX x4 bs 1024's kernels, 2.027 ms summed over its 4
devices, failed against its 1.666 ms step)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C

from kernelmap.normalise import normalise_run_dir

RUN = Path(__file__).parent / "data" / "gpu_devices_run"


def test_a_multi_device_case_is_bound_by_n_steps(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    normalise_run_dir(d)
    rows = C.self_checks([A.load_run(d)])
    sel = rows[(rows["check"] == C.Check.LAYERS_WITHIN_STEP) & rows["subject"].str.startswith("GPU kernel time")]
    by = {r["framework"]: r for r in sel.to_dict("records")}
    for fw in ("jax-x2", "pytorch-x2"):
        r = by[fw]
        step_ms = statistics.mean(json.loads((RUN / fw / "bs1024" / "framework.json").read_text())["step_times_s"]) * 1e3
        assert float(r["expected"]) == pytest.approx(2 * step_ms)  # was 1 x the step
        assert "and its 2 devices, at most 2 x the mean wall time" in r["detail"]
        assert r["status"] == C.PASS and float(r["measured"]) <= float(r["expected"])
