"""The GPU's peaks through JAX/XLA (frameworks/jax/peaks.py) for the counters pass's roofline, on the CPU.

The measurement itself runs on JAX's CPU backend at small sizes through ``measure_on`` (the entry without the GPU
check): its figures are the work over the median (and the fastest) of the times it returns, in the shape PyTorch's
``measure`` returns; ``measure`` refuses a CPU device; the workload's ``measure_peaks`` on the CPU says not measured.
The report's side: a real JAX-only counters run (tests/data/gpu_jax_fp32_counters_run, 4x H100) has no peaks and so
no roofline position; with a peaks dict PLANTED in its results (labelled so: no GPU measured it here) its fp32
kernels get one. The GPU measurement itself: docs/COUNTERS.md "Verify on a GPU".
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelmap.frameworks import spec
from kernelmap.reports import cli as report_cli
from kernelmap.reports.analyses import roofline as R
from kernelmap.reports.analyses.base import load_run

from kernelmap import doctor

RUN = Path(__file__).parent / "data" / "gpu_jax_fp32_counters_run"
N, NBYTES, WARMUP, REPEATS = 48, 1 << 16, 1, 4
PLANTED_MARK = "PLANTED by tests/test_jax_peaks.py: no GPU measured these figures"


def _planted(unit: str, per_s: float, work_key: str, size: int, work: float) -> dict:
    """One PLANTED entry, its time the work over the planted rate (as a measurement's would be)."""
    ms = work / per_s * 1e3
    return {unit: per_s, f"{unit}_best": per_s, "ms_median": ms, "ms": [ms], work_key: size}


def _gemm(per_s: float) -> dict:
    return _planted("flops_per_s", per_s, "n", 8192, 2.0 * 8192**3)


# the shape frameworks/jax/peaks.py returns (test_the_measurement_has_the_planted_shape checks it), figures PLANTED
PLANTED = {"gemm": {"fp32": _gemm(5.0e13), "tf32": {"not_measured": PLANTED_MARK}, "bf16": _gemm(7.0e14),
                    "fp16": _gemm(7.0e14)},
           "dram": _planted("bytes_per_s", 3.0e12, "bytes", 1 << 30, 2.0 * (1 << 30)),
           "method": PLANTED_MARK, "gpu": PLANTED_MARK}

SCRIPT = r"""
import json, os, sys, jax
from kernelmap.errors import KernelmapError
from kernelmap.frameworks import spec
from kernelmap.frameworks.jax import peaks, workload as W
n, nbytes, warmup, repeats = map(int, sys.argv[1:5])
cpu = jax.devices("cpu")[0]
out = {"allowed": peaks.measure_on(cpu, W.MATMUL_PRECISION, n, nbytes, warmup, repeats)}
os.environ[spec.TF32_OVERRIDE] = "0"
out["held_off"] = peaks.measure_on(cpu, W.MATMUL_PRECISION, n, nbytes, warmup, repeats)["gemm"]["tf32"]
try:
    peaks.measure(cpu, W.MATMUL_PRECISION)
    out["refused"] = None
except KernelmapError as exc:
    out["refused"] = str(exc)
out["workload"] = W.Workload(spec.TrainConfig(data="synthetic", batch_size=8)).measure_peaks()
print(json.dumps(out))
"""


def _jax_python() -> str:
    """The first interpreter the doctor would probe JAX with that imports kernelmap's JAX peaks; else skip (why)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    probe = ["-c", "import kernelmap.frameworks.jax.peaks"]
    found = next((p for p in doctor.interpreters("jax")
                  if subprocess.run([p, *probe], capture_output=True, env=env).returncode == 0), None)
    if found is None:
        pytest.skip(f"no interpreter of {doctor.interpreters('jax')} imports jax, flax, optax and kernelmap")
    return found


@pytest.fixture(scope="module")
def measured() -> dict:
    env = {k: v for k, v in os.environ.items() if k != spec.TF32_OVERRIDE}
    proc = subprocess.run([_jax_python(), "-c", SCRIPT, *map(str, (N, NBYTES, WARMUP, REPEATS))], capture_output=True,
                          text=True, timeout=300, env=dict(env, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _shape(d):
    """Keys all the way down (a list's values are figures, not shape)."""
    return {k: _shape(v) for k, v in d.items()} if isinstance(d, dict) else type(d).__name__


def figures_hold(entry: dict, unit: str, work: float, repeats: int) -> None:
    """A measured entry's figures are ``work`` over the median and the fastest of the ``repeats`` times it holds."""
    ms = entry["ms"]
    assert len(ms) == repeats and all(t > 0 for t in ms) and entry["ms_median"] == statistics.median(ms)
    assert entry[unit] == pytest.approx(work / (statistics.median(ms) / 1e3), rel=1e-12)
    assert entry[f"{unit}_best"] == pytest.approx(work / (min(ms) / 1e3), rel=1e-12)


@pytest.mark.slow
def test_each_figure_is_the_work_over_the_median_of_its_times(measured):
    p = measured["allowed"]
    assert set(p["gemm"]) == {m.value for m in spec.Math}
    for g in p["gemm"].values():
        assert g["n"] == N
        figures_hold(g, "flops_per_s", 2.0 * N**3, REPEATS)
    assert p["dram"]["bytes"] == NBYTES
    figures_hold(p["dram"], "bytes_per_s", 2.0 * NBYTES, REPEATS)
    assert "host-timed" in p["method"] and f"{N}x{N}" in p["method"] and f"median of {REPEATS}" in p["method"]
    assert "fp32 at precision highest" in p["method"] and "tf32 at tensorfloat32" in p["method"]
    assert p["gpu"] == "cpu"  # the device's kind, as XLA names it


@pytest.mark.slow
def test_the_measurement_has_the_planted_shape(measured):
    """The shape the report reads (PyTorch's: peaks.py's ``measure``) is the one planted below."""
    got = measured["allowed"]
    got_shape = {**_shape(got), "gemm": {**_shape(got["gemm"]), "tf32": _shape(PLANTED["gemm"]["tf32"])}}
    assert got_shape == _shape(PLANTED)


@pytest.mark.slow
def test_tf32_not_measured_where_the_process_holds_it_off(measured):
    why = measured["held_off"]["not_measured"]
    assert list(measured["held_off"]) == ["not_measured"] and f"{spec.TF32_OVERRIDE}=0" in why and "cuBLAS" in why
    assert "flops_per_s" in measured["allowed"]["gemm"]["tf32"]  # measured where the variable is not set


@pytest.mark.slow
def test_the_gpu_entry_refuses_the_cpu_and_the_workload_says_not_measured(measured):
    assert "is no GPU" in measured["refused"]
    assert list(measured["workload"]) == ["not_measured"] and "CPU case" in measured["workload"]["not_measured"]


GPU_SCRIPT = r"""
import json, jax
from kernelmap.frameworks.jax import peaks, workload as W
print(json.dumps(peaks.measure(jax.devices("gpu")[0], W.MATMUL_PRECISION)))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("override", ["0", None])
def test_peaks_measured_through_xla_on_the_gpu(override):
    """On a GPU (the next hold): every precision's GEMM and the copy at full size, bf16 above twice fp32 (tensor
    cores against fp32 at precision highest); tf32 not measured, with its reason, where NVIDIA_TF32_OVERRIDE=0."""
    env = {k: v for k, v in os.environ.items() if k not in (spec.TF32_OVERRIDE, "JAX_PLATFORMS")}
    if override is not None:
        env[spec.TF32_OVERRIDE] = override
    proc = subprocess.run([_jax_python(), "-c", GPU_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=dict(env, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    p = json.loads(proc.stdout.strip().splitlines()[-1])
    g = p["gemm"]
    assert g["bf16"]["flops_per_s"] > 2 * g["fp32"]["flops_per_s"] > 0 and g["fp16"]["flops_per_s"] > 0
    assert ("not_measured" in g["tf32"]) == (override == "0")
    assert p["dram"]["bytes_per_s"] > 1e11 and len(p["dram"]["ms"]) == 10 and "host-timed" in p["method"]


def _planted_run(tmp_path: Path) -> Path:
    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    results = json.loads((run / "results.json").read_text())
    (entry,) = results
    assert entry["counters"]["peaks"] == {"not_measured": "JAX's workload measures no peaks"}  # as the run wrote
    entry["counters"]["peaks"] = PLANTED
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_a_jax_only_run_gets_roofline_positions_from_its_peaks(tmp_path):
    """Without peaks (the run as recorded) no kernel has a roof; with the PLANTED ones every fp32 kernel with FLOPs
    and bytes (42 of 56) sits at achieved / min(fp32 peak, intensity x copy bandwidth)."""
    before, _, no_peaks = R.counter_kernels([load_run(RUN)])
    assert no_peaks == {RUN.name: {}} and before["roofline_share"].isna().all()
    kernels, _, peaks = R.counter_kernels([load_run(_planted_run(tmp_path))])
    fp32 = PLANTED["gemm"]["fp32"]["flops_per_s"]
    assert peaks[RUN.name]["gemm"]["fp32"]["flops_per_s"] == fp32 and "tf32" not in peaks[RUN.name]["gemm"]
    assert peaks[RUN.name]["gemm"]["fp32"]["method"] == PLANTED_MARK
    assert peaks[RUN.name]["dram"]["bytes_per_s"] == PLANTED["dram"]["bytes_per_s"]
    placed = kernels[kernels["roofline_share"].notna()]
    assert len(kernels) == 56 and len(placed) == 42 and set(placed["counter_math"]) == {"fp32"}
    flops, nbytes = (pd.to_numeric(placed[c]) for c in ("flops", "bytes"))
    roof = np.minimum(fp32, flops / nbytes * PLANTED["dram"]["bytes_per_s"])
    achieved = flops / (pd.to_numeric(placed["ncu_ns"]) / 1e9)
    assert np.allclose(placed["roofline_share"], achieved / roof, rtol=1e-12)
    assert set(placed.loc[placed["layer"].notna(), "layer"]) == {"conv1", "conv2", "fc1", "fc2", "loss"}


def test_the_report_tables_the_roofs_and_how_they_were_measured(tmp_path):
    """`report` on the planted run: tables/counter_peaks.csv names each roof, the case that measured it and the
    method (here the PLANTED mark), and counter_kernels.csv places the 42 fp32 kernels."""
    out, _ = report_cli.build([str(_planted_run(tmp_path))], tmp_path / "report")
    roofs = pd.read_csv(out / "tables" / "counter_peaks.csv")
    assert list(roofs["roof"]) == ["gemm fp32", "gemm bf16", "gemm fp16", "device copy"]  # tf32: not measured
    assert set(roofs["method"]) == {PLANTED_MARK} and set(roofs["case"]) == {"jax"}
    assert list(roofs["per_s"]) == [5.0e13, 7.0e14, 7.0e14, 3.0e12] and set(roofs["timed_runs"]) == {1}
    assert pd.read_csv(out / "tables" / "counter_kernels.csv")["roofline_share"].notna().sum() == 42


def test_a_measurement_that_raises_is_recorded_as_not_measured_not_lost():
    """The worker keeps its counters record when a framework's peaks measurement raises (new GPU code: XLA's
    autotuner has crashed under ncu before): results.json's counters.peaks names the error."""
    from kernelmap.worker import peaks_of

    class Failing:
        def measure_peaks(self):
            raise RuntimeError("XLA compilation failed")

    assert peaks_of(Failing(), "jax") == {
        "not_measured": "the peaks' measurement failed: RuntimeError: XLA compilation failed"}
    assert "measures no peaks" in peaks_of(object(), "jax")["not_measured"]


H200 = json.loads((Path(__file__).parent / "data" / "h200_jax_peaks.json").read_text())  # a real measurement


def test_a_tensor_core_rate_below_fp32_is_no_roof(tmp_path):
    """The peaks an H200 measured through XLA with autotuning off (session 13, as the worker wrote them): bf16 and
    fp16 GEMMs 10.4 TFLOP/s, below fp32's 26.7: not roofs. The run's fp32 roof and copy stay; the two rows are tabled
    with why; a bf16 rate above fp32's (the planted one) is a roof."""
    fp32, bf16 = H200["gemm"]["fp32"]["flops_per_s"], H200["gemm"]["bf16"]["flops_per_s"]
    assert bf16 < fp32 and set(R.not_a_roof(H200["gemm"])) == {"bf16", "fp16"}
    assert R.not_a_roof(PLANTED["gemm"]) == {}
    run = _planted_run(tmp_path)
    results = json.loads((run / "results.json").read_text())
    results[0]["counters"]["peaks"] = H200
    (run / "results.json").write_text(json.dumps(results))
    peaks = R.measured_peaks(load_run(run))
    assert set(peaks["gemm"]) == {"fp32"} and peaks["gemm"]["fp32"]["flops_per_s"] == fp32
    assert [g["precision"] for g in peaks["rejected"]] == ["bf16", "fp16"]
    table = R.peak_table({run.name: peaks})
    assert list(table["roof"]) == ["gemm fp32", "gemm bf16", "gemm fp16", "device copy"]
    said = table.set_index("roof")["not_a_roof"]
    assert pd.isna(said["gemm fp32"]) and pd.isna(said["device copy"])
    assert f"{bf16:.3g} FLOP/s, at or below the same case's fp32 {fp32:.3g}" in said["gemm bf16"]
