"""JAX fp16 under Nsight Compute on a 1x H200 (tests/data/gpu_jax_h200_fp16_counters_run: run set 2 of session 16's
job, 2026-11-28, commit adbb54e, trimmed by its trim.py.txt): `kernelmap run --framework jax --device gpu --math fp16
--profile counters --batch-size 64 --steps 20 --trials 1 --max-repeats 0`. On an H100 the same case's worker died
under ncu (exit 139, tests/data/gpu_jax_h100_counters_run); here it was counted: 60 kernels in 23.7 s. The counts
below are read from ncu's raw page and the XLA trace's records with the stdlib and pandas, not through the code
under test."""

from __future__ import annotations

import csv
import gzip
import io
import shutil
from pathlib import Path

import pandas as pd
from kernelmap.reports import counterchecks
from kernelmap.reports.analyses import roofline as R
from kernelmap.reports.analyses.base import load_run

RUN = Path(__file__).parent / "data" / "gpu_jax_h200_fp16_counters_run"
CSV = RUN / "jax-fp16" / "bs64" / "counters" / "ncu.csv"
FP16_TENSOR = "sm__ops_path_tensor_src_fp16.sum"


def _ncu(text: str) -> tuple[list[str], list[dict]]:
    """ncu's raw page: the lines before its header, and its kernels (the row after the header holds the units)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    return lines[:head], rows


def _num(text: str) -> float:
    return float(text.replace(",", "")) if text else 0.0


def test_every_kernel_is_counted_and_paired_less_the_graphs_copies():
    _, rows = _ncu(gzip.decompress(CSV.read_bytes()).decode())
    kernels = [r for r in rows if r["ID"].isdigit()]
    assert len(kernels) == 60 and not any("memcpy" in r["Kernel Name"] for r in kernels)
    rec = load_run(RUN).records
    step = rec[(rec["run"] == "jax-fp16/bs64") & (rec["kind"] == "kernel") & (rec["iteration"] == 24)]
    copies = step["kernel_name"].str.contains("memcpy|memset")
    assert len(step) == 65 and copies.sum() == 5
    _, status, _ = R.counter_kernels([load_run(RUN)])
    s = status.set_index("case").loc["jax-fp16"]
    assert [s["kernels"], s["timed_kernels"], s["matched"], s["copy_nodes"]] == [60, 60, 60, 5]
    assert s["paired_time_share"] == 1.0 and s["within_budget"] and round(s["ncu_wall_s"], 1) == 23.7
    assert s["reason"] is None


def test_log_math_is_counter_math_for_each_compared_kernel():
    kernels, status, _ = R.counter_kernels([load_run(RUN)])
    s = status.set_index("case").loc["jax-fp16"]
    assert (s["math_compared"], s["math_agree"], list(s["math_disagree"])) == (6, 6, [])
    compared = kernels[kernels["math_agrees"].notna()]
    # the five fp16 cuDNN convolutions: fp16 tensor-core work in ncu's own counter; the split-K sum: none
    _, rows = _ncu(gzip.decompress(CSV.read_bytes()).decode())
    by_name = {}
    for r in rows:
        if r["ID"].isdigit():
            by_name.setdefault(r["Kernel Name"], []).append(_num(r[FP16_TENSOR]))
    tensor = compared[compared["counter_math"] == "fp16"]["kernel_name"]
    assert len(tensor) == 5 and all(min(by_name[n]) > 0 for n in tensor)
    split_k = compared[compared["kernel_name"].str.contains("split_k")]
    assert split_k["counter_math"].tolist() == ["fp32"] and max(by_name[split_k["kernel_name"].iloc[0]]) == 0
    checks = pd.DataFrame(counterchecks.counter_checks(load_run(RUN))).set_index("check")
    assert checks.loc["log math vs counter math", "status"] == "pass"
    assert checks.loc["counters cover the step", "status"] == "pass"


def test_a_convolution_whose_counters_show_no_fp16_tensor_work_fails(tmp_path):
    """Planted: the forward conv's fp16 tensor-pipe counter zeroed in a copy of ncu's page: the counters then say
    another math than the log's fp16, and the check fails naming the kernel."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    csv_path = run / "jax-fp16" / "bs64" / "counters" / "ncu.csv"
    pre, rows = _ncu(gzip.decompress(csv_path.read_bytes()).decode())
    victim = next(r for r in rows if r["ID"].isdigit() and "fprop_implicit_gemm_f16f16" in r["Kernel Name"])
    for col in [c for c in victim if c.startswith("sm__ops_path_tensor") or c.startswith("sm__inst_executed_pipe_tensor")]:
        victim[col] = "0"
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    csv_path.write_bytes(gzip.compress(("\n".join(pre) + ("\n" if pre else "") + out.getvalue()).encode(), mtime=0))
    _, status, _ = R.counter_kernels([load_run(run)])
    s = status.set_index("case").loc["jax-fp16"]
    assert s["math_agree"] == 5 and len(s["math_disagree"]) == 1
    checks = pd.DataFrame(counterchecks.counter_checks(load_run(run))).set_index("check")
    assert checks.loc["log math vs counter math", "status"] == "FAIL"
