"""Execution modes (docs/MODES.md): the vocabulary the descriptors own, the keys, torch.compile's
kernels in a real CPU trace, and the launch-bound figures and their self-check."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.frameworks.case import Case, CaseKey, by_name, order_names
from kernelmap.reports import analysis as A
from kernelmap.reports.analyses.launch import best_modes, union_ns
from kernelmap.reports.checks import FAIL, PASS, launch_bound_checks

from kernelmap import frameworks
from kernelmap.adapters import inductor, kineto
from kernelmap.history.keys import Mode

DATA = Path(__file__).parent / "data"
# torch 2.14.1 on the CPU, mode compile, bs 16, synthetic data, Inductor's cpp.enable_kernel_profile on
# (as in a capture pass): two steps under Workload.profile, each in a kernelmap:step#N region
COMPILE_TRACE = DATA / "cpu_torch_compile_kineto.json.gz"


# --- the vocabulary ------------------------------------------------------------------------------
def test_every_mode_comes_from_a_descriptor_and_keys_round_trip():
    """The typed case key (frameworks/case.py): its fields round-trip through what results.json records; its
    name (the folder, the tables' name) is the framework's for its default mode, so runs made before modes
    read the same; a name is looked up among the registered cases, never split."""
    assert {m.value for m in Mode} == set(frameworks.MODES)
    for name, d in frameworks.REGISTRY.items():
        assert Case(name, d.default_mode).name == name
        for m in d.modes:
            key = CaseKey(name, m, "fp32", 1, 64)
            assert CaseKey.from_fields(json.loads(json.dumps(key.to_fields()))) == key
            assert by_name(key.name) == key.case
    assert Case("pytorch", "cuda-graph").name == "pytorch-cuda-graph"
    assert Case("pytorch", "eager", devices=2).name == "pytorch-x2"
    assert by_name("mxnet-cuda-graph") is None  # MXNet has no such mode
    with pytest.raises(ValueError, match="mode 'hybridized'"):
        Case("jax", "hybridized")
    for bad in ({"devices": 0}, {"math": "fp8"}, {"batch_size": 0}, {"framework": "torch"}, {"devices": True}):
        with pytest.raises(ValueError):
            CaseKey.from_fields({**key.to_fields(), **bad})
    with pytest.raises(ValueError, match="no devices recorded"):
        CaseKey.from_fields({k: v for k, v in key.to_fields().items() if k != "devices"})


def test_modes_to_run():
    on_cpu, skipped = frameworks.modes_to_run("pytorch", ["all"], "cpu")
    assert on_cpu == ["eager", "compile"] and set(skipped) == {"cuda-graph", "compile-graphs"}
    assert frameworks.modes_to_run("pytorch", ["all"], "gpu") == (list(frameworks.get("pytorch").modes), {})
    # a framework none of whose modes was asked runs its default
    assert frameworks.modes_to_run("pytorch", ["hybridized"], "gpu") == (["eager"], {})
    assert frameworks.modes_to_run("mxnet", ["hybridized"], "cpu") == (["hybridized"], {})
    assert frameworks.modes_to_run("jax", None, "cpu") == (["jit"], {})
    with pytest.raises(ValueError, match="--mode nope"):
        frameworks.modes_to_run("jax", ["nope"], "cpu")
    assert order_names(["jax", "pytorch-compile", "mxnet", "pytorch", "x"]) == [
        "pytorch", "pytorch-compile", "mxnet", "jax", "x"]


def test_the_run_options_come_from_the_registry():
    from kernelmap.run import cli as run_cli

    p = argparse.ArgumentParser()
    run_cli.add_arguments(p)
    assert p.parse_args(["--hybridize"]).mode == ["hybridized"]  # MXNet's descriptor's mode_flags
    assert p.parse_args(["--mode", "all"]).mode == ["all"]
    assert p.parse_args(["--mode", "cuda-graph", "jit"]).mode == ["cuda-graph", "jit"]
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "graph"])


# --- torch.compile's kernels in a real trace -----------------------------------------------------
def _raw():
    return [e for e in json.loads(gzip.open(COMPILE_TRACE).read())["traceEvents"] if e.get("ph") == "X"]


def test_compiled_kernels_are_attributed_and_wrappers_are_not_ops():
    raw = _raw()
    generated = [e for e in raw if e.get("cat") == "cpu_op" and inductor.GENERATED.match(e["name"])]
    wrappers = [e for e in raw if e.get("cat") == "cpu_op" and inductor.WRAPPER.match(e["name"])]
    assert len(generated) == 24 and len(wrappers) == 14  # a step: 12 generated kernels, 7 wrapper spans
    df = kineto.read(COMPILE_TRACE)
    gen = df[df["op_name"].map(lambda n: isinstance(n, str) and bool(inductor.GENERATED.match(n)))]
    assert len(gen) == len(generated) and (gen["kind"] == "op").all()
    assert gen["canonical_op"].notna().all()
    # each takes the op its name fuses first in PRIORITY, backward where it fuses a backward op
    for _, r in gen.iterrows():
        assert (r["canonical_op"], r["direction"]) == inductor.classify(r["op_name"], r["phase"])
    by = dict(zip(gen["op_name"], zip(gen["canonical_op"], gen["direction"], strict=True), strict=False))
    assert by["graph_0_cpp_fused_relu_3"] == ("relu", "fwd")
    # the forward graph's kernel keeps a mask for the backward: forward work, named with a backward op
    assert by["graph_0_cpp_fused_max_pool2d_with_indices_relu_threshold_backward_1"] == ("max_pool2d", "fwd")
    assert by["graph_0_cpp_fused_convolution_backward_max_pool2d_with_indices_backward_nll_loss_backward_"
              "threshold_backward_3"] == ("conv2d", "bwd")
    # the backward graph's extern matmuls (no autograd node around them) are backward
    mm = df[(df["op_name"] == "aten::mm") & (df["phase"] == "backward")]
    assert len(mm) == 8 and (mm["canonical_op"] == "linear").all() and mm["direction"].isin(["bwd", "bwd_data",
                                                                                                "bwd_weight"]).all()
    names = df.loc[df["op_name"].isin([e["name"] for e in wrappers]), "kind"]
    assert len(names) == len(wrappers) and (names != "op").all()


def test_classify_by_name_and_phase():
    assert inductor.classify("triton_poi_fused_convolution_relu_0", "forward") == ("conv2d", "fwd")
    assert inductor.classify("triton_red_fused_sum_6", "backward") == ("sum", "bwd")
    assert inductor.classify("triton_for_fused_0", "optimizer") == ("sgd_update", "update")
    assert inductor.classify("aten::mm", "forward") is None
    assert inductor.classify("triton_poi_fused_max_pool2d_with_indices_backward_2", None) == ("max_pool2d", "bwd")


# --- launch-bound figures ------------------------------------------------------------------------
def test_union_of_intervals():
    import numpy as np

    s, e = np.array([0, 5, 20, 21, 40]), np.array([10, 15, 30, 25, 41])
    assert union_ns(s, e) == 15 + 10 + 1  # [0,15) [20,30) [40,41): nested and overlapping counted once
    assert union_ns(s[:0], e[:0]) == 0


def _tables(busy_ms=0.30, ksum=0.32, clean=0.40, hi=0.42, share_step=0.40):
    lb = pd.DataFrame([{"run": "r", "framework": "pytorch-cuda-graph", "framework_name": "pytorch", "mode": "cuda-graph",
                        "batch_size": 64, "gpu_busy_ms": busy_ms, "kernel_sum_ms": ksum, "clean_step_ms": clean,
                        "idle_share": 1 - busy_ms / clean}])
    busy = pd.DataFrame([{"run": "r", "framework": "pytorch-cuda-graph", "batch_size": 64, "level": "kernel",
                          "step_ms": share_step, "busy_ms_per_step": ksum, "step_basis": "x"}])
    summ = pd.DataFrame([{"run": "r", "framework": "pytorch-cuda-graph", "batch_size": 64, "step_ms_ci95_high": hi}])
    return lb, busy, summ


def test_launch_bound_checks_pass_and_fail():
    assert {r["status"] for r in launch_bound_checks(*_tables())} == {PASS}
    bad_union = launch_bound_checks(*_tables(busy_ms=0.33, ksum=0.32))
    assert [r["status"] for r in bad_union][0] == FAIL
    outlasts = launch_bound_checks(*_tables(busy_ms=0.43, ksum=0.5))
    assert [r["status"] for r in outlasts][1] == FAIL
    # the defect: the busy share divided by the capture pass's step, not the clean one
    other_step = launch_bound_checks(*_tables(share_step=3.09))
    assert [r["status"] for r in other_step][2] == FAIL and "another step" in other_step[2]["detail"]


def test_best_mode_is_the_fastest_clean_step():
    lb = pd.DataFrame([
        {"run": "r", "framework": f, "framework_name": "pytorch", "mode": m, "batch_size": bs, "clean_step_ms": c,
         "gpu_busy_ms": b, "idle_share": 1 - b / c}
        for f, m, bs, c, b in [("pytorch", "eager", 64, 1.3, 0.3), ("pytorch-cuda-graph", "cuda-graph", 64, 0.4, 0.3),
                               ("pytorch-cuda-graph", "cuda-graph", 1024, 2.6, 2.5)]])
    best = best_modes(lb, 64)
    assert best[["best", "mode"]].values.tolist() == [["pytorch-cuda-graph", "cuda-graph"]]
    assert best["idle_share"].iloc[0] == pytest.approx(0.25)
    assert "eager 1.300 ms" in best["modes_compared"].iloc[0]


def test_cpu_busy_share_divides_by_the_same_pass_step():
    """On the CPU the busy share is op time over the step of the pass that traced it (issue 42: a contended
    capture pass over a quiet clean step read 360%); this run kept only each pass's median step."""
    run = A.load_run(DATA / "report_cpu_run")
    busy = A.busy_share([run])
    assert len(busy) == 4
    res = {(r["framework"], r["batch_size"]): r for r in run.results}
    for _, b in busy.iterrows():
        p = res[(b["framework"], b["batch_size"])]["passes"][b["pass"]]
        assert (b["pass"], b["step_pass"]) == ("framework", "framework")
        assert b["step_ms"] == p["median_step_s"] * 1e3 and b["busy_share"] == b["busy_ms_per_step"] / b["step_ms"]


def test_a_case_is_keyed_by_framework_and_mode(tmp_path):
    from kernelmap.run import case as run_case
    from kernelmap.run import devices as run_devices

    d = run_devices.Decision("pytorch", "gpu", "gpu", None)
    key = CaseKey("pytorch", "cuda-graph", "fp32", 1, 64)
    case = run_case.CaseRun(key, d, {"math": "fp32", "steps": 5}, "{}", tmp_path, None, None, 1, {})
    assert case.key == key and case.out_dir == tmp_path / "pytorch-cuda-graph" / "bs64"
    assert json.loads(case.base[case.base.index("--config") + 1])["mode"] == "cuda-graph"
    assert case.name == "pytorch-cuda-graph bs 64"
    default = run_case.CaseRun(CaseKey("pytorch", "eager", "fp32", 1, 64), d, {"math": "fp32", "steps": 5}, "{}",
                               tmp_path, None, None, 1, {})
    assert default.out_dir == tmp_path / "pytorch" / "bs64"



@pytest.mark.parametrize("mode", ["compile", "cuda-graph"])
def test_calls_per_step_are_not_counted_where_a_mode_fuses_or_replays(mode):
    """The real CPU run's PyTorch records keyed as another mode: its calls-per-step rows (16 pass as
    eager) are not checked, with the descriptor's reason."""
    from kernelmap.reports import checks as C

    def calls(run):
        ch = C.self_checks([run])
        return ch[(ch["check"] == C.Check.CALLS) & ch["framework"].isin(["pytorch", case.name])]

    case = Case("pytorch", mode)
    eager = calls(A.load_run(DATA / "report_cpu_run"))
    assert len(eager) > 1 and (eager["status"] == C.PASS).all()
    run = A.load_run(DATA / "report_cpu_run")
    pt = run.records["framework"] == "pytorch"  # the records and results typed as that mode's
    run.records["mode"] = run.records["mode"].astype(object).where(~pt, mode)
    run.records["case"] = run.records["case"].astype(object).where(~pt, case.name)
    for r in run.results:
        if r["framework"] == "pytorch":
            r.update(mode=mode, case=case.name)
    run.cases[case.name] = case
    got = calls(run)
    why = f"mode {mode}: {frameworks.get('pytorch').uncounted_call_modes[mode]}"
    assert got[["status", "detail"]].values.tolist() == [[C.NOT_CHECKED, why]] * eager["batch_size"].nunique()


def test_the_libs_pass_warms_up_as_long_as_the_mode_needs():
    """On the GPU the libs pass (1 warm-up step, to keep its logs short) of pytorch-cuda-graph failed at
    every batch size: the graph is captured at warm-up step 4. The descriptor says so, and the runner
    gives that pass what the mode needs; other modes keep LIBS_WARMUP, or fewer where the run asked."""
    from kernelmap.errors import KernelmapError
    from kernelmap.run import schedule as run_schedule

    pt, mx = frameworks.get("pytorch"), frameworks.get("mxnet")
    assert pt.min_warmup == {"cuda-graph": 4}
    assert run_schedule.libs_warmup(pt, "cuda-graph", 5) == 4
    assert run_schedule.libs_warmup(pt, "eager", 5) == run_schedule.LIBS_WARMUP == 1
    assert run_schedule.libs_warmup(pt, "eager", 0) == 0
    assert run_schedule.libs_warmup(mx, "hybridized", 5) == 1
    run_schedule.check_warmup(4, [Case("pytorch", "cuda-graph"), Case("mxnet", "imperative")])
    with pytest.raises(KernelmapError, match=r"--warmup 3: .*PyTorch's cuda-graph mode needs at least 4"):
        run_schedule.check_warmup(3, [Case("pytorch", "eager"), Case("pytorch", "cuda-graph")])
    run_schedule.check_warmup(0, [Case("pytorch", "eager"), Case("jax", "jit")])


def test_a_descriptor_cannot_name_a_warmup_for_a_mode_it_lacks():
    import dataclasses

    with pytest.raises(ValueError, match="not among its modes"):
        dataclasses.replace(frameworks.get("pytorch"), min_warmup={"no-such-mode": 2})


def test_zero_momentum_buffers_give_sgds_own_steps_bit_for_bit():
    """compile-graphs makes SGD's momentum buffers before the first step (workload.init_momentum_buffers):
    three steps with them equal three steps of plain SGD exactly (real torch, CPU, in a subprocess)."""
    from conftest import run_framework

    script = (
        "import json, torch\n"
        "from kernelmap.frameworks.pytorch.workload import init_momentum_buffers\n"
        "def run(pre):\n"
        "    torch.manual_seed(0); m = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))\n"
        "    o = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)\n"
        "    if pre: init_momentum_buffers(o)\n"
        "    g = torch.Generator().manual_seed(1)\n"
        "    for _ in range(3):\n"
        "        o.zero_grad(set_to_none=True); m(torch.randn(4, 7, generator=g)).square().sum().backward(); o.step()\n"
        "    return [p.detach().clone() for p in m.parameters()]\n"
        "a, b = run(False), run(True)\n"
        "print(json.dumps({'equal': all(torch.equal(x, y) for x, y in zip(a, b)), 'n': len(a)}))\n"
    )
    out = run_framework("pytorch", ["-c", script])
    assert out == {"equal": True, "n": 4}


def test_the_nsys_pass_of_a_graph_replay_mode_is_skipped_with_its_reason():
    """On the H200, compile-graphs' nsys pass recorded 40 kernels (the replays' were not there) and 38.5% of
    their time had an op; cuda-graph's recorded none. The framework pass attributes replays; nsys is skipped."""
    from kernelmap.run import schedule as run_schedule

    cases = [Case("pytorch", m) for m in ("eager", "cuda-graph", "compile", "compile-graphs")] + [Case("jax", "jit")]
    skips = {c.name: why for c, why in run_schedule.case_nsys_skips(cases, {"jax": "no window"}).items()}
    assert set(skips) == {"pytorch-cuda-graph", "pytorch-compile-graphs", "jax"}
    assert skips["jax"] == "no window"
    assert skips["pytorch-cuda-graph"].startswith("PyTorch cuda-graph replays CUDA graphs (the whole step is one")
    assert "the framework pass attributes them" in skips["pytorch-compile-graphs"]
    # the progress line counts them out: 5 cases x (1 trial + nsys) less 3 skipped nsys passes
    typed = run_schedule.case_nsys_skips(cases, {"jax": "no window"})
    assert run_schedule.planned_workers(cases, 1, 1, ("clean", "nsys"), typed) == 5 * 2 - 3
