"""JAX under Nsight Compute on the 4x H200 (tests/data/gpu_jax_counters_run: run set r1 of 2026-11-27, commit
e953021, trimmed by tests/data/gpu_mxnet_fp16_run/trim.py.txt): `kernelmap run --framework jax --device gpu --math
fp32 bf16 --profile counters --batch-size 64 --steps 20 --trials 1`. bf16 was counted (53 kernels, 22.6 s under
ncu); fp32's ncu died (exit 139, a segfault with ncu's rule module ``_NvRules`` loaded).

What the job's `report --strict` met, each fixed here: the timeline figure crashed (the XLA trace has no op rows:
no ``outermost`` column); no kernel was paired (the XLA step's three ``memcpy32_post``, its command buffers' copies,
are no kernel ncu profiles: 53 against 56); the xmma weight gradient's split-K reduction kernel was read as a bf16
tensor-core GEMM ("log math vs counter math": 8 of 9) and its executed FLOPs derived as the GEMM's; the GEMM
itself, whose blocks share K in segments, was derived as 99 tiles each over all of K (11x its counters): now no figure,
and why.
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import counterchecks
from kernelmap.reports import figures as F
from kernelmap.reports.analyses import roofline as R
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.analyses.timeline import timeline_events

from kernelmap import gemmwork, kernelmath

RUN = Path(__file__).parent / "data" / "gpu_jax_counters_run"
CSV = RUN / "jax-bf16" / "bs64" / "counters" / "ncu.csv"
GEMM = ("sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warpgroupsize1x1x1"
        "_g1_execute_segment_k_on_kernel__5x_cudnn")
SPLIT_K = GEMM.replace("execute_segment_k_on_kernel", "execute_split_k_kernel")


def _ncu_rows() -> list[dict]:
    """ncu's raw page read with the stdlib: its kernels (the row after the header holds the units)."""
    lines = gzip.decompress(CSV.read_bytes()).decode().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    return [r for r in rows if r["ID"].isdigit()]


def _num(text: str) -> float:
    return float(text.replace(",", ""))  # ncu's raw page writes thousands separators


@pytest.fixture(scope="module")
def counted():
    return R.counter_kernels([load_run(RUN)])


def test_the_timeline_of_a_source_without_op_rows(tmp_path):
    ev = timeline_events(load_run(RUN))
    assert "outermost" in ev.columns and not ev["outermost"].any()  # XLA's trace: no op rows
    assert set(ev["lane"]) == {"phase", "library_call", "kernel"}
    assert F.timeline_figure(ev, None, tmp_path / "timeline.png").is_file()


def test_every_kernel_is_paired_less_the_graphs_copies(counted):
    kernels, status, _ = counted
    ncu_rows = _ncu_rows()
    assert len(ncu_rows) == 53 and not any("memcpy" in r["Kernel Name"] for r in ncu_rows)
    rec = load_run(RUN).records
    step = rec[(rec["run"] == "jax-bf16/bs64") & (rec["kind"] == "kernel") & (rec["iteration"] == 24)]
    assert len(step) == 56 and (step["kernel_name"] == "memcpy32_post").sum() == 3
    s = status.set_index("case")
    assert s.loc["jax-bf16", ["kernels", "timed_kernels", "matched", "copy_nodes"]].tolist() == [53, 53, 53, 3]
    assert s.loc["jax-bf16", "paired_time_share"] == 1.0 and s.loc["jax-bf16", "pairing"] == R.BY_ORDER
    assert s.loc["jax-bf16", "copy_nodes_ms"] == pytest.approx(
        step.loc[step["kernel_name"] == "memcpy32_post", "dur_ns"].sum() / 1e6)
    assert s.loc["jax", "reason"].startswith("ncu failed: jax bs 64 (counters pass under ncu, gpu): worker exited 139")
    rows = pd.DataFrame(counterchecks.counter_checks(load_run(RUN)))
    cover = rows[(rows["check"] == "counters cover the step") & (rows["framework"] == "jax-bf16")].iloc[0]
    assert cover["status"] == "pass" and "3 graph memcpy/memset node(s), 0.0028 ms, left out" in cover["detail"]


def test_the_split_k_reduction_is_an_fp32_sum(counted):
    row = next(r for r in _ncu_rows() if r["Kernel Name"] == SPLIT_K)
    assert _num(row["sm__ops_path_tensor_src_bf16_dst_fp32.sum"]) == 0
    assert _num(row["sm__sass_thread_inst_executed_op_fadd_pred_on.sum"]) == 405504
    assert kernelmath.name_unit(SPLIT_K) == "none" and kernelmath.counted_math(SPLIT_K, "bf16") == "fp32"
    assert kernelmath.counted_by_name(SPLIT_K) and not gemmwork.is_gemm_kernel(SPLIT_K)
    assert kernelmath.name_unit(GEMM) == "tensor" and kernelmath.counted_math(GEMM, "bf16") == "bf16"
    kernels, status, _ = counted
    s = status.set_index("case").loc["jax-bf16"]
    assert (s["math_compared"], s["math_agree"]) == (9, 9)
    rows = pd.DataFrame(counterchecks.counter_checks(load_run(RUN)))
    assert set(rows.loc[rows["framework"] == "jax-bf16", "status"]) == {"pass"}


def test_a_gemm_whose_blocks_share_k_in_segments_is_not_derived(counted):
    row = next(r for r in _ncu_rows() if r["Kernel Name"] == GEMM)
    # its tensor ops are 9 tiles of 64x64 over K's 196 tiles of 64 (conv2's 9 taps, C_in 32 under 64; 99 blocks =
    # 9 x 11 segments): the rule would read 99 tiles, each over all of K, 11x the work
    assert int(_num(row["sm__ops_path_tensor_src_bf16_dst_fp32.sum"])) == 924_844_032 == 2 * 64 * 64 * 64 * 9 * 196
    assert gemmwork.expected_flops(GEMM, row["Grid Size"], "conv2", "bwd_weight", 64) == (None, gemmwork.SEGMENTED)
    assert gemmwork.expected_flops(GEMM.replace("_on_", "_off_"), row["Grid Size"], "conv2", "bwd_weight", 64)[0] \
        == 2 * 99 * 64 * 64 * 12544  # segment_k_off: each block over all of K (PyTorch's, tests/test_gemmwork.py)
    kernels, _, _ = counted
    layers = R.layer_counters(kernels)
    wgrad = layers[(layers["case"] == "jax-bf16") & (layers["direction"] == "bwd_weight")].set_index("layer")
    assert pd.isna(wgrad.loc["conv2", "within_tolerance"]) and gemmwork.SEGMENTED in wgrad.loc["conv2", "expected_from"]
    assert bool(wgrad.loc["conv1", "within_tolerance"])  # CUTLASS GemmShape, split-K in z: derived, within 10%


def test_a_failed_pass_says_how_far_ncu_got(tmp_path):
    from kernelmap.errors import KernelmapError
    from kernelmap.run import counters

    exc = KernelmapError("jax bs 64 (counters pass under ncu, gpu): worker exited 139: Segmentation fault")
    why = counters.failure(RUN / "jax" / "bs64" / "counters", exc)  # the fp32 case's real log: connected, no more
    assert why == ("ncu failed: jax bs 64 (counters pass under ncu, gpu): worker exited 139: Segmentation fault; "
                   "ncu's log: connected to its target, 0 kernel(s) profiled, never disconnected (ncu said: "
                   "==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling "
                   "results may be inconsistent.)")
    # the bf16 case's log (53 profiled, disconnected), were its import to fail
    assert "; ncu's log: connected to its target, 53 kernel(s) profiled (ncu said:" in counters.failure(
        RUN / "jax-bf16" / "bs64" / "counters", exc)
    assert counters.failure(tmp_path, exc) == f"ncu failed: {exc}"  # no log: the error alone
