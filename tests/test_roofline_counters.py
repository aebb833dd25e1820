"""The counters pass's analysis (reports/analyses/roofline.py: counter_kernels, match_kernels, layer_counters) on
the real bf16 capture (tests/data/ncu/README.md). The timing side is a stand-in: a step of kernel records made here
from the capture's own kernel names, layers and durations assigned below (the bf16 library logs and traces of that
probe were lost), so what is tested is the join and the figures, not a second measurement."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports.analyses import roofline
from kernelmap.reports.analyses.base import Run

from kernelmap import gemmwork
from kernelmap.adapters import ncu

DATA = Path(__file__).parent / "data" / "ncu"
BF16 = DATA / "ncu-torch-bf16.csv.xz"
# the forward of the capture by position (README): conv1 0-6 ... stand-in labels for the join
LAYERS = {3: ("conv1", "conv2d", "fwd"), 4: ("conv1", "conv2d", "fwd"), 9: ("conv2", "conv2d", "fwd"),
          10: ("conv2", "conv2d", "fwd"), 11: ("conv2", "conv2d", "fwd"), 12: ("conv2", "conv2d", "fwd"),
          13: ("conv2", "conv2d", "fwd"), 18: ("fc1", "linear", "fwd"), 19: ("fc1", "linear", "fwd"),
          23: ("fc2", "linear", "fwd")}
MATH = {11: "bf16", 18: "bf16", 23: "bf16"}
CORRELATION: dict[int, int] = {}  # launch order of the stand-in kernels (default: their position)  # the stand-in log math of the tensor-core kernels
PEAKS = {"gemm": {"bf16": {"flops_per_s": 7.0e14}, "fp32": {"flops_per_s": 5.0e13}},
         "dram": {"bytes_per_s": 4.0e12}, "method": "stand-in figures for the test"}


def _timed(names: list[str]) -> pd.DataFrame:
    rows = []
    for i, n in enumerate(names):
        layer, op, d = LAYERS.get(i, (None, "other", "none"))
        rows.append({"run": "pytorch/bs64", "case": "pytorch", "kind": "kernel", "iteration": 7, "source": "kineto",
                     "start_ns": 1000 * i, "event_id": i, "correlation_id": CORRELATION.get(i, 10 + i), "kernel_name": n, "dur_ns": 100 + i,
                     "layer": layer, "canonical_op": op, "direction": d, "library": None, "library_call": None,
                     "math_mode": MATH.get(i)})
    return pd.DataFrame(rows)


def _run(tmp_path: Path, names: list[str], counters: dict | None = None) -> Run:
    d = tmp_path / "run" / "pytorch" / "bs64" / "counters"
    d.mkdir(parents=True)
    shutil.copy(BF16, d / "ncu.csv")  # xz content: the adapter reads it through
    entry = {"case": "pytorch", "framework": "pytorch", "batch_size": 64, "dir": "pytorch/bs64",
             "counters": counters or {"csv": "pytorch/bs64/counters/ncu.csv", "peaks": PEAKS}}
    return Run(tmp_path / "run", {}, [entry], records=_timed(names))


def _names() -> list[str]:
    return [str(n) for n in ncu.read(BF16)["kernel_name"]]


def test_every_kernel_paired_where_the_steps_agree(tmp_path):
    kernels, status, peaks = roofline.counter_kernels([_run(tmp_path, _names())])
    assert len(kernels) == 31 and kernels["matched"].all() and kernels["reason"].isna().all()
    assert status.iloc[0][["kernels", "timed_kernels", "matched", "source", "iteration"]].tolist() == [
        31, 31, 31, "kineto", 7]
    assert status.iloc[0]["paired_time_share"] == 1.0
    # the log's math (stand-in: bf16 on the three tensor-core kernels; FP32 by the compute type in the names of
    # cuDNN's three layout transforms) against the counters': all six agree
    assert status.iloc[0][["math_compared", "math_agree", "math_disagree"]].tolist() == [6, 6, []]
    assert status.iloc[0]["ncu_wall_s"] is None and status.iloc[0]["within_budget"] is None
    assert peaks["run"]["gemm"]["bf16"]["flops_per_s"] == 7.0e14
    conv2 = kernels[kernels["kernel_name"].str.contains("bf16_s16816fprop")].iloc[0]
    assert (conv2["layer"], conv2["counter_math"], conv2["log_math"], conv2["math_agrees"]) == (
        "conv2", "bf16", "bf16", True)
    assert conv2["ncu_ns"] == 9408 and conv2["timed_ns"] == 111
    assert conv2["flops_per_s"] == pytest.approx(conv2["flops"] / 9408e-9)
    assert conv2["intensity"] == pytest.approx(conv2["flops"] / 863_232)
    # compute-bound here: min(7e14, intensity x 4e12) is the bf16 peak
    assert conv2["attainable_flops_per_s"] == 7.0e14
    assert conv2["roofline_share"] == pytest.approx(conv2["flops"] / 9408e-9 / 7.0e14)


def test_counts_that_differ_pair_nothing(tmp_path):
    names = _names()
    kernels, status, _ = roofline.counter_kernels([_run(tmp_path, names[:-1])])
    assert not kernels["matched"].any() and kernels["layer"].isna().all()
    why = "the counters step ran 31 kernels, the kineto step 30: kernels are paired only where both ran the same"
    assert kernels["reason"].str.startswith(why).all() and status.iloc[0]["matched"] == 0
    assert status.iloc[0]["reason"].startswith(why)


def test_a_name_that_differs_is_left_unpaired(tmp_path):
    names = _names()
    names[11] = "cutlass__5x_cudnn::Kernel<something_else>"
    kernels, status, _ = roofline.counter_kernels([_run(tmp_path, names)])
    assert kernels["matched"].sum() == 30 and not kernels.loc[11, "matched"]
    # the function names agree (cutlass__5x_cudnn::Kernel): the first template argument tells the kernels apart
    assert kernels.loc[11, "reason"] == ("name differs at position 11: counters Kernel<cutlass_tensorop_bf16_s16816"
                                         "fprop_optimized_bf16_64x64_32x10_nhwc_align8, kineto Kernel<something_else")
    assert status.iloc[0]["matched"] == 30 and status.iloc[0]["reason"] == kernels.loc[11, "reason"]
    assert status.iloc[0]["paired_time_share"] == pytest.approx(1 - 111 / sum(100 + i for i in range(31)))
    assert roofline.layer_counters(kernels).set_index("layer").loc["conv2", "kernels"] == 4  # the fprop unpaired


def test_refused_and_unreadable_passes_are_said_per_case(tmp_path):
    run = _run(tmp_path, _names(), {"skipped": "Nsight Compute reads an NVIDIA GPU's counters; this case runs on "
                                               "the CPU"})
    kernels, status, _ = roofline.counter_kernels([run])
    assert kernels.empty and status.iloc[0]["reason"].endswith("this case runs on the CPU")
    run = _run(tmp_path / "b", _names())
    (run.path / "pytorch" / "bs64" / "counters" / "ncu.csv").write_text("==ERROR== ERR_NVGPUCTRPERM\n")
    kernels, status, _ = roofline.counter_kernels([run])
    assert kernels.empty and "no ncu CSV header" in status.iloc[0]["reason"]
    assert "ncu.csv" in status.iloc[0]["reason"]


def test_layer_figures_tensor_share_and_flop_model(tmp_path):
    kernels, _, _ = roofline.counter_kernels([_run(tmp_path, _names())])
    lay = roofline.layer_counters(kernels).set_index(["layer", "direction"])
    conv2 = lay.loc[("conv2", "fwd")]
    # 5 kernels: 2 layout, the bf16 tensor-core fprop, 1 layout back, the bias add; tensor time = the fprop's
    assert conv2["kernels"] == 5
    assert conv2["tensor_share"] == pytest.approx(111 / (109 + 110 + 111 + 112 + 113))
    assert conv2["model_flops"] == 462_422_016
    assert conv2["ratio"] == pytest.approx(conv2["counter_flops"] / 462_422_016)
    # the capture lacks the fp16 tensor count and HFMA2.MMA (README): FLOPs a lower bound, no verdict
    assert not conv2["flops_complete"] and conv2["within_tolerance"] is None
    fc1 = lay.loc[("fc1", "fwd")]
    assert fc1["counter_flops"] >= 52_428_800 and fc1["model_flops"] == 2 * 64 * 3136 * 128


def test_flop_verdict_where_counted_fully():
    """The ±10% rule itself, against the executed FLOPs (kernelmap/gemmwork.py), not the shapes': the 2x H200 run's
    fc1 forward (nvjet, 64x32 tiles, 8 blocks = 2 x 2 output tiles x 2 splits of K: 2 x 1600 of 3136) and fc2's
    (16x16 tiles, 10 outputs run as 16): within; the same kernels counting 12% more: beyond; a name without a tile:
    no verdict, and why."""
    def kern(layer, flops, name, grid):
        return {"run": "r", "case": "pytorch", "batch_size": 64, "layer": layer, "canonical_op": "linear",
                "direction": "fwd", "matched": True, "timed_ns": 100, "counter_math": "bf16", "flops": flops,
                "flops_complete": True, "library": "cuBLASLt", "kernel_name": name, "grid": grid}
    fc1 = ("nvjet_sm90_tst_64x32_64x16_2x2_h_bz_splitK_bias_TNT", "(4, 2, 1)")
    fc2 = ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2>(T1::Params)",
           "(4, 1, 1)")

    def verdicts(f1, f2, name2=fc2[0]):
        k = pd.DataFrame([kern("fc1", f1, *fc1), kern("fc2", f2, name2, fc2[1])])
        k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
        return roofline.layer_counters(k).set_index("layer")
    lay = verdicts(52_428_800, 265_216)
    assert list(lay["expected_flops"]) == [52_428_800, 262_144]
    assert [bool(x) for x in lay["within_tolerance"]] == [True, True]
    assert lay.loc["fc2", "ratio"] == pytest.approx(265_216 / 163_840)  # the shapes' ratio stays, as a measurement
    lay = verdicts(52_428_800 * 1.12, 262_144 * 0.88)
    assert [bool(x) for x in lay["within_tolerance"]] == [False, False]
    lay = verdicts(52_428_800, 265_216, name2="void sgemm_largek_lds64<1, 0, 5, 5, 4, 4, 4, 34>(float *)")
    assert lay.loc["fc2", "within_tolerance"] is None and pd.isna(lay.loc["fc2", "expected_flops"])
    assert lay.loc["fc2", "expected_from"] == f"sgemm_largek_lds64: {gemmwork.NO_TILE}"


def test_roofline_figure_names_the_layers(tmp_path, monkeypatch):
    from kernelmap.reports import figures as F

    kept = []
    monkeypatch.setattr(F, "save_png", lambda fig, path: kept.append(fig) or fig.savefig(path) or Path(path))
    kernels, _, peaks = roofline.counter_kernels([_run(tmp_path, _names())])
    assert F.counters_roofline_figure(kernels, peaks, tmp_path / "c.png").is_file()
    (ax,) = [a for a in kept[0].axes if a.get_visible()]
    texts = {t.get_text() for t in ax.texts}
    assert {"conv1 fwd", "conv2 fwd", "fc1 fwd", "fc2 fwd", "bf16 700", "fp32 50", "DRAM 4.00 TB/s"} <= texts
    assert "one training step" in kept[0]._suptitle.get_text()
    assert ax.get_title() == "PyTorch, bs 64 (run): 31 of 31 kernels paired; 10 without FLOPs or bytes not drawn"
    F.plt.close(kept[0])
    assert F.counters_roofline_figure(kernels.iloc[0:0], peaks, tmp_path / "none.png") is None


def test_math_disagreement_and_budget_are_said(tmp_path, monkeypatch):
    """A log that says tf32 where the counters counted bf16 ops: named; a pass over 60 s: out of budget."""
    monkeypatch.setitem(MATH, 18, "tf32")
    run = _run(tmp_path, _names(), {"csv": "pytorch/bs64/counters/ncu.csv", "peaks": PEAKS, "ncu_wall_s": 61.5})
    _, status, _ = roofline.counter_kernels([run])
    s = status.iloc[0]
    assert (s["math_compared"], s["math_agree"]) == (6, 5)
    assert s["math_disagree"] == ["nvjet_sm90_tst_64x32_64x16_2x2_h_bz_splitK_bias_TNT: log tf32, counters bf16"]
    assert s["ncu_wall_s"] == 61.5 and not s["within_budget"]


def test_kernel_key_reads_both_demanglers_alike():
    """The same kernels as ncu 2025.3 (the bf16 capture) and Kineto (today's H200 fp32 run, tests/data/gpu_modes_run,
    PyTorch eager bs 64) spell them: the optimizer's, the loss's, the softmax's kernels get one key each."""
    from kernelmap.reports.analyses.base import load_run
    from kernelmap.reports.analyses.timed import records_of

    ncu_names = [str(n) for n in ncu.read(BF16)["kernel_name"]]
    step, source, _ = roofline.timed_step(records_of(load_run(DATA.parent / "gpu_modes_run")), "pytorch/bs64")
    kineto = [str(n) for n in step["kernel_name"]]
    assert source == "kineto" and len(kineto) == 44
    for mark in ("multi_tensor_apply_kernel<at::<unnamed>::TensorListMetadata<2>", "nll_loss_forward_reduce_cuda",
                 "softmax_warp_forward<float"):
        a = next(n for n in ncu_names if mark in n)
        b = next(n for n in kineto if mark.replace("at::<unnamed>::", "at::native::(anonymous namespace)::") in n)
        assert a != b and roofline.kernel_key(a) == roofline.kernel_key(b), mark
    assert roofline.kernel_key("void vectorized_elementwise_kernel<(int)4, X>(int)") == "vectorized_elementwise_kernel<4"
    assert roofline.kernel_key("void k<2ul, float>(float)") == "k<2"
    # the fp32 and the bf16 convolution are told apart by their first template argument
    assert roofline.kernel_key(kineto[0]) == "implicit_convolve_sgemm<float" != roofline.kernel_key(ncu_names[3])


def test_real_run_with_other_kernels_pairs_nothing(tmp_path):
    """Today's H200 run (tests/data/gpu_modes_run: fp32, full steps of 44 kernels in PyTorch's Kineto trace) given
    the bf16 probe's counters (31 kernels, forward and optimizer only) as its PyTorch case's: loaded through the
    report's loader, the join refuses, and says why; the other cases have no counters pass and no row."""
    import json

    from kernelmap.reports.analyses.base import load_run

    run = tmp_path / "gpu_modes_run"
    shutil.copytree(DATA.parent / "gpu_modes_run", run)
    (run / "pytorch" / "bs64" / "counters").mkdir(parents=True)
    shutil.copy(BF16, run / "pytorch" / "bs64" / "counters" / "ncu.csv")
    results = json.loads((run / "results.json").read_text())
    entry = next(r for r in results if r["dir"] == "pytorch/bs64")
    said = "==WARNING== Kernel 32 could not be profiled (a stand-in line)"
    entry["counters"] = {"csv": "pytorch/bs64/counters/ncu.csv", "ncu_wall_s": 22.0, "peaks": PEAKS,
                         "profiler_messages": [said]}
    (run / "results.json").write_text(json.dumps(results))
    kernels, status, _ = roofline.counter_kernels([load_run(run)])
    assert len(status) == 1 and len(kernels) == 31 and not kernels["matched"].any()
    s = status.iloc[0]
    assert (s["case"], s["kernels"], s["timed_kernels"], s["matched"], s["source"]) == ("pytorch", 31, 44, 0, "kineto")
    assert s["reason"].startswith("the counters step ran 31 kernels, the kineto step 44")
    assert s["paired_time_share"] == 0 and bool(s["within_budget"])
    assert s["profiler_messages"] == [said]  # ncu's own words beside the refusal


def test_flop_model_compares_the_library_kernels():
    """A conv's bias add (native) is left out of the comparison where the records name the library's kernels; the
    verdict is the conv kernel's own (not its layout transform's), against its executed FLOPs."""
    fprop = "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_64x64_32x10_nhwc_align8>(T1::Params)"

    def kern(library, flops, name, grid="(1, 1, 1)"):
        return {"run": "r", "case": "pytorch", "batch_size": 64, "layer": "conv2", "canonical_op": "conv2d",
                "direction": "fwd", "matched": True, "timed_ns": 100, "counter_math": "bf16", "flops": flops,
                "flops_complete": True, "library": library, "kernel_name": name, "grid": grid}
    k = pd.DataFrame([kern("cuDNN", 462_422_016, fprop, "(196, 1, 1)"), kern("native", 6_422_528, "void at::add"),
                      kern("cuDNN", 401_408, "void cudnn::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, 0, 1, 0>")])
    k["expected_flops"], k["expected_from"] = gemmwork.expected_columns(k)
    row = roofline.layer_counters(k).iloc[0]
    assert row["counter_flops"] == 462_422_016 + 401_408 and row["flops_from"] == "library kernels"
    assert row["gemm_counter_flops"] == row["expected_flops"] == 462_422_016
    assert bool(row["within_tolerance"]) and row["kernels"] == 3
    row = roofline.layer_counters(k.assign(library=None)).iloc[0]
    assert row["counter_flops"] == 462_422_016 + 401_408 + 6_422_528 and row["flops_from"].startswith("all kernels")


def test_timing_step_in_launch_order(tmp_path, monkeypatch):
    """Kernels that started on the device out of their launch order (another stream) are paired in launch order,
    the correlation id, as ncu profiles them; by their start alone two would be out of place."""
    names = _names()
    swapped = names[:5] + [names[6], names[5]] + names[7:]  # listed as they started on the device
    monkeypatch.setitem(CORRELATION, 5, 10 + 6)  # ... but names[5] (row 6) was launched first
    monkeypatch.setitem(CORRELATION, 6, 10 + 5)
    _, status, _ = roofline.counter_kernels([_run(tmp_path, swapped)])
    assert status.iloc[0]["matched"] == 31
    monkeypatch.setitem(CORRELATION, 5, 10 + 5)  # launched as they started: the capture's order differs there
    monkeypatch.setitem(CORRELATION, 6, 10 + 6)
    kernels, status, _ = roofline.counter_kernels([_run(tmp_path / "b", swapped)])
    assert status.iloc[0]["matched"] == 29 and set(kernels.index[~kernels["matched"]]) == {5, 6}
