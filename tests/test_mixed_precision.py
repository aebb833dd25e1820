"""Mixed precision (issue 38): the math contract (``spec.Math``: bf16, fp16), which framework runs which math on
which device (refused up front or skipped per case, never fp32 under the label), one case per ``--math`` value
through the runner, the report's case names and the run's math."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from kernelmap.frameworks import spec
from kernelmap.frameworks.case import Case, by_name, registered
from kernelmap.reports.analyses.base import with_case_column

from kernelmap import frameworks, options, parity, rundir
from kernelmap.errors import KernelmapError
from kernelmap.run import cli as run_cli
from kernelmap.run.devices import Decision


# --- the contract ------------------------------------------------------------------------------------
def test_each_math_says_its_compute_dtype_scaling_and_tf32():
    M = spec.Math
    assert [m.value for m in M] == ["fp32", "tf32", "bf16", "fp16"]
    assert {m: m.low_precision for m in M} == {M.FP32: None, M.TF32: None, M.BF16: "bfloat16", M.FP16: "float16"}
    assert [m for m in M if m.mixed] == [M.BF16, M.FP16]
    assert [m for m in M if m.loss_scaling] == [M.FP16]
    assert [m for m in M if m.tf32] == [M.TF32]  # what stays fp32 in a mixed case is strict fp32
    assert [m for m in M if m.gpu_only] == [M.TF32]
    # unit roundoff 2**-(bits + 1): bfloat16 8 significant bits, float16 11, TF32 11, float32 24
    assert {m: m.mantissa_bits for m in M} == {M.FP32: 23, M.TF32: 10, M.BF16: 7, M.FP16: 10}
    assert spec.LOSS_SCALE == spec.LossScale(init=65536.0, growth=2.0, backoff=0.5, interval=2000)


def test_math_refusals_cpu_tf32_and_a_framework_without_mixed_precision():
    assert "GPU math" in frameworks.math_refusal("pytorch", "tf32", "cpu")
    assert frameworks.math_refusal("pytorch", "tf32", "gpu") is None
    for fw in frameworks.FRAMEWORKS:
        assert frameworks.math_refusal(fw, "fp32", "cpu") is None
    # a descriptor that says nothing refuses every mixed math on both devices (the registry's default)
    from kernelmap.frameworks.registry import mixed_not_implemented

    default = mixed_not_implemented()
    assert {d: sorted(v) for d, v in default.items()} == {"cpu": ["bf16", "fp16"], "gpu": ["bf16", "fp16"]}


def test_pytorch_refuses_fp16_on_the_cpu_and_runs_bf16_there():
    why = frameworks.math_refusal("pytorch", "fp16", "cpu")
    assert why is not None and "fp16" in why and "bf16" in why
    assert frameworks.math_refusal("pytorch", "bf16", "cpu") is None
    assert all(frameworks.math_refusal("pytorch", m.value, "gpu") is None for m in spec.Math)


# --- case names: one per math --------------------------------------------------------------------------
def test_case_names_are_unique_per_math_and_the_default_math_keeps_its_name():
    assert Case("pytorch", "eager").name == "pytorch"  # runs made before several maths read the same
    assert Case("pytorch", "eager", "bf16").name == "pytorch-bf16"
    assert Case("pytorch", "compile", "fp16").name == "pytorch-compile-fp16"
    assert Case("pytorch", "compile", "fp16").label == "PyTorch compile fp16"
    names = [c.name for c in registered().values()]
    assert len(names) == len(set(names)) == sum(len(d.modes) for d in frameworks.REGISTRY.values()) * len(spec.Math)
    assert by_name("pytorch-compile-bf16") == Case("pytorch", "compile", "bf16")


def test_the_records_case_column_tells_the_maths_apart():
    rec = pd.DataFrame({"framework": ["pytorch", "pytorch", "pytorch"], "mode": ["eager"] * 3,
                        "math": ["fp32", "bf16", None], "devices": [1, 1, 1]})
    assert list(with_case_column(rec)["case"]) == ["pytorch", "pytorch-bf16", "pytorch"]


def test_run_math_of_one_and_of_several():
    def man(math):
        return {"config": {"train": {"math": math}}}

    assert rundir.run_math(man("tf32")) == "tf32"  # version 1: a string
    assert rundir.run_math(man(["bf16"])) == "bf16"
    assert rundir.run_math(man(["fp32", "bf16"])) is None  # each case records its own
    assert rundir.run_math({}) == "fp32"


# --- refused up front, skipped per case ----------------------------------------------------------------
def _args(**kw) -> argparse.Namespace:
    d = dict(framework="pytorch", batch_size=[64], steps=10, epochs=None, warmup=1, trials=1, threads=None,
             max_repeats=0, repeat_budget=None, seed=0, lr=0.01, mode=None, device="cpu", math=["fp32"])
    return argparse.Namespace(**{**d, **kw})


def test_options_refuse_a_math_no_chosen_framework_can_run_on_the_device_given():
    options.check_args(_args(math=["fp32", "bf16"]))
    with pytest.raises(KernelmapError, match="--math fp16 --device cpu: PyTorch cannot run fp16 on the CPU"):
        options.check_args(_args(math=["bf16", "fp16"]))
    with pytest.raises(KernelmapError, match="--math tf32 --device cpu: tf32 is a GPU math"):
        options.check_args(_args(framework="all", math=["tf32"]))
    with pytest.raises(KernelmapError, match="--math bf16 bf16: bf16 given twice"):
        options.check_args(_args(math=["bf16", "bf16"]))
    options.check_args(_args(math=["fp16"], device="gpu"))
    options.check_args(_args(math=["fp16"], device="auto"))  # decided per framework after its probe: math_cases


def test_math_cases_one_case_per_math_and_a_refused_one_skipped_with_its_reason(capsys):
    decisions = {"pytorch": Decision("pytorch", "auto", "cpu", None)}
    cases, skips = run_cli.math_cases([Case("pytorch", "eager")], ["fp32", "bf16", "fp16"], decisions)
    assert cases == [Case("pytorch", "eager", "fp32"), Case("pytorch", "eager", "bf16")]
    assert list(skips) == [Case("pytorch", "eager", "fp16")]
    assert "PyTorch cannot run fp16 on the CPU" in skips[Case("pytorch", "eager", "fp16")]
    assert "math skipped (pytorch-fp16)" in capsys.readouterr().err
    gpu = {"pytorch": Decision("pytorch", "auto", "gpu", None)}
    cases, skips = run_cli.math_cases([Case("pytorch", "eager")], ["fp16", "tf32"], gpu)
    assert [c.math for c in cases] == ["fp16", "tf32"] and not skips


# --- PyTorch: bf16 really computes in bf16, fp16's loss scaling (CPU, real workloads in subprocesses) --------------
WORKLOAD_PROBE = r"""
import json, sys
import numpy as np, torch
from kernelmap.frameworks import spec, load_workload
from kernelmap.errors import KernelmapError
W = load_workload("pytorch")
out = {}
def run(math, scaled=False, poison=False, steps=5):
    w = W(spec.TrainConfig(device="cpu", math=math, data="synthetic", batch_size=32, steps=steps))
    if scaled:
        w.use_loss_scaling(True)
    order = spec.training_order(len(w.dataset("train")), 0, 32 * steps)
    losses, weights = [], [w.get_weights()]
    for x, y in w.batches("train", 32, order):
        if poison:  # one NaN pixel: NaN gradients, as an overflow of the scaled loss's gradients makes inf ones
            x = x.clone()
            x[0, 0, 0, 0] = float("nan")
        losses.append(w.to_float(w.train_step(x, y)))
        weights.append(w.get_weights())
    x, _ = next(w.batches("train", 32, order[:32]))
    return w, losses, weights, w.activation_dtypes(x)
for math in ("fp32", "bf16"):
    w, losses, _, dtypes = run(math)
    out[math] = {"dtypes": dtypes, "params": sorted({str(p.dtype) for p in w.model.parameters()}),
                 "autocast": w.versions()["autocast"], "losses": losses}
_, plain, wp, _ = run("bf16")
w, scaled, ws, _ = run("bf16", scaled=True)
out["scaled_equal"] = plain == scaled and all(np.array_equal(wp[-1][k], ws[-1][k]) for k in wp[-1])
out["scaler"] = w.versions()["grad_scaler"]
# non-finite gradients: the step is skipped on the device (weights unchanged), the scale backed off
w, losses, weights, _ = run("bf16", scaled=True, poison=True, steps=1)
out["overflow_skipped"] = all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])
out["overflow_scale"] = w.scaler.get_scale()
w, losses, weights, _ = run("bf16", poison=True, steps=1)  # unscaled: the NaN reaches the weights
out["unscaled_poisoned"] = any(np.isnan(weights[1][k]).any() for k in weights[1])
try:
    W(spec.TrainConfig(device="cpu", math="fp16", data="synthetic"))
except KernelmapError as exc:
    out["fp16_cpu"] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", WORKLOAD_PROBE], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_bf16_computes_the_layers_in_bf16_and_keeps_the_loss_and_weights_fp32(probe):
    layers = [layer.name for layer in spec.LAYERS]
    assert probe["bf16"]["dtypes"] == {**dict.fromkeys(layers, "bfloat16"), "loss_input": "float32"}
    assert probe["fp32"]["dtypes"] == {**dict.fromkeys(layers, "float32"), "loss_input": "float32"}
    assert probe["bf16"]["params"] == probe["fp32"]["params"] == ["torch.float32"]  # fp32 master weights
    assert probe["bf16"]["autocast"] == "bfloat16" and probe["fp32"]["autocast"] is None
    # the same weights and batches: close, not equal (bf16 rounding), and not fp32 under a bf16 label
    a, b = np.array(probe["fp32"]["losses"]), np.array(probe["bf16"]["losses"])
    assert not np.array_equal(a, b) and np.max(np.abs(a - b) / a) < 0.05


def test_loss_scaling_scales_exactly_and_skips_an_overflowing_step(probe):
    # a power-of-two scale and its inverse are exact: the scaled step is the unscaled one, bit for bit
    assert probe["scaled_equal"] is True
    assert probe["scaler"] == {"init_scale": 65536.0, "scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                               "growth_interval": 2000, "optimizer": "SGD(fused=True)"}
    assert probe["overflow_skipped"] is True and probe["overflow_scale"] == 2.0 ** 15  # 2**16 backed off by 0.5
    assert probe["unscaled_poisoned"] is True  # the same batch without the scaler: the skip is the scaler's


def test_the_workload_refuses_fp16_on_the_cpu(probe):
    assert "runs on the GPU only" in probe["fp16_cpu"]


# --- kernelmap run --math fp32 bf16 fp16 on the CPU -------------------------------------------------------------
def _run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


def _onednn_exec(log: Path, primitive: str) -> list[str]:
    """The memory descriptors of every ``exec`` line of ``primitive`` in a oneDNN verbose log (stdlib reader; v1
    lines: onednn_verbose,v1,primitive,exec,engine,primitive,implementation,prop_kind,memory_descriptors,...)."""
    rows = [line.split(",") for line in log.read_text().splitlines() if line.startswith("onednn_verbose,v1,primitive,")]
    return [r[8] for r in rows if len(r) > 8 and r[3] == "exec" and r[5] == primitive]


def test_run_fp32_bf16_one_case_each_math_in_records_bf16_in_onednn_and_fp16_skipped(tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "run"
    proc = _run("--framework", "pytorch", "--math", "fp32", "bf16", "fp16", "--steps", "3", "--warmup", "1",
                "--trials", "1", "--data", "synthetic", "--profile", "libs", "--max-repeats", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "math skipped (pytorch-fp16): PyTorch cannot run fp16 on the CPU" in proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["math"], r["dir"], r["device"]) for r in results) == [
        ("bf16", "pytorch-bf16/bs64", "cpu"), ("fp32", "pytorch/bs64", "cpu")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["train"]["math"] == ["fp32", "bf16", "fp16"]
    assert sorted(c["math"] for c in manifest["config"]["cases"]) == ["bf16", "fp32"]
    assert any(n.startswith("pytorch-fp16: skipped: PyTorch cannot run fp16") for n in manifest["notes"])
    # the records' math column, read by pyarrow: filled on every record, each case its own
    table = pq.read_table(out / "records.parquet", columns=["framework", "mode", "math"]).to_pydict()
    # what oneDNN ran (its verbose log, the libs pass): bf16 operands in every bf16 convolution, none in fp32's
    bf16 = _onednn_exec(out / "pytorch-bf16" / "bs64" / "onednn.log", "convolution")
    fp32 = _onednn_exec(out / "pytorch" / "bs64" / "onednn.log", "convolution")
    assert fp32 and all("src:f32" in d and "wei:f32" in d and "bf16" not in d for d in fp32), fp32[:3]
    note = "pytorch-bf16 bs 64: bf16 on this CPU"
    bf16_case = next(r for r in results if r["math"] == "bf16")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # AVX-512 or AMX: oneDNN's bfloat16
        assert None not in table["math"] and set(zip(table["mode"], table["math"], strict=True)) == {
            ("eager", "fp32"), ("eager", "bf16")}
        assert bf16 and all("src:bf16" in d and "wei:bf16" in d for d in bf16), bf16[:3]
        assert not any(n.startswith(note) for n in manifest["notes"]) and bf16_case["math_notes"] == []
    else:  # AVX2 (the CI runner's AMD EPYC): PyTorch sends no bf16 to oneDNN; the run says so, the case still ran
        assert None not in table["math"] and set(zip(table["mode"], table["math"], strict=True)) == {("eager", "fp32")}
        assert bf16 == [], bf16[:3]
        [said] = [n for n in manifest["notes"] if n.startswith(note)]
        assert "runs outside oneDNN" in said and "_is_mkldnn_bf16_supported() is False" in said, said
        assert bf16_case["math_notes"] == [said.removeprefix("pytorch-bf16 bs 64: ")]


def test_run_fp16_on_the_cpu_is_refused_before_any_work(tmp_path):
    out = tmp_path / "run"
    proc = _run("--framework", "pytorch", "--device", "cpu", "--math", "fp16", "--data", "synthetic", "--out", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert "error: --math fp16 --device cpu: PyTorch cannot run fp16 on the CPU" in proc.stderr
    proc = _run("--framework", "pytorch", "--math", "fp16", "--data", "synthetic", "--out", str(out))  # auto: the CPU
    assert proc.returncode == 2 and not out.exists()
    assert "no case of pytorch can run here: pytorch-fp16: skipped: PyTorch cannot run fp16" in proc.stderr


# --- parity per math ----------------------------------------------------------------------------------------------
def test_parity_tolerance_is_derived_from_the_format():
    assert parity.mixed_tolerance(("fp32", "fp32")) is None
    assert parity.mixed_tolerance(("fp32", "bf16")) == 3 * 4 * 2.0**-8  # 3 roundings x 4 layers x bfloat16's u
    assert parity.mixed_tolerance(("bf16", "bf16")) == 2 * 3 * 4 * 2.0**-8
    assert parity.mixed_tolerance(("fp32", "fp16")) == 3 * 4 * 2.0**-11
    assert "weights_early_worst" in parity.tolerances(("fp32", "fp32"))  # fp32: its own rule (tests/test_parity.py)


def test_parity_compares_weights_against_the_distance_travelled():
    """The weights after the steps: ||a-b|| over the path, reported at a mixed math (no bound linear in u holds
    through ReLU's and max pool's step derivatives: parity's docstring), checked nowhere by it."""
    rng = np.random.default_rng(0)
    a = {"logits": rng.normal(size=(4, 10)), "losses": np.array([2.0, 1.5]), "weight/w": rng.normal(size=100),
         "path/w": np.float64(2.0)}
    tol = parity.mixed_tolerance(("fp32", "bf16"))
    b = dict(a, **{"weight/w": a["weight/w"] + np.r_[3 * tol * 2.0, np.zeros(99)]})
    r = parity.compare(a, b, ["w"], parity.tolerances(("fp32", "bf16")))
    assert r["weights_worst_per_path"] == pytest.approx(3 * tol) and r["passed"]
    assert set(parity.REPORTED_MIXED).isdisjoint(parity.tolerances(("fp32", "bf16")))
    assert set(parity.REPORTED_MIXED) <= set(r)


def test_parity_holds_the_first_loss_to_the_logits_bound():
    """The first step's loss moves at most 2 max|dz| (log-softmax + NLL): its difference over 2 max|logits| is held
    to the derived bound; beyond it the comparison fails."""
    logits = np.array([[0.5, -2.0], [1.0, 0.25]])
    tol = parity.mixed_tolerance(("fp32", "fp16"))
    a = {"logits": logits, "losses": np.array([2.0, 1.5]), "weight/w": np.ones(3), "path/w": np.float64(1.0)}
    for factor, passed in ((0.9, True), (1.1, False)):
        b = dict(a, losses=np.array([2.0 + factor * tol * 2 * 2.0, 1.5]))  # 2 max|logits| = 4
        r = parity.compare(a, b, ["w"], parity.tolerances(("fp32", "fp16")))
        assert r["loss_first_diff_over_logits"] == pytest.approx(factor * tol) and r["passed"] is passed
    assert r["failures"][0].startswith("loss_first_diff_over_logits")


def test_parity_refuses_what_it_cannot_compare():
    with pytest.raises(KernelmapError, match="tf32: not compared"):
        parity.check_maths(("pytorch", "mxnet"), ("tf32",), "gpu")
    with pytest.raises(KernelmapError, match="give --math fp32 and a mixed one"):
        parity.check_maths(("pytorch",), ("bf16",), "cpu")
    with pytest.raises(KernelmapError, match="PyTorch cannot run fp16 on the CPU"):
        parity.check_maths(("pytorch",), ("fp32", "fp16"), "cpu")


def test_parity_pytorch_bf16_against_fp32_on_the_cpu():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "parity", "--frameworks", "pytorch", "--math", "fp32",
                           "bf16", "--data", "synthetic", "--steps", "10", "--json"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    (c,) = result["comparisons"]
    assert c["sides"] == ["pytorch", "pytorch-bf16"] and c["passed"] and result["passed"]
    assert 0 < c["forward_logits_max_rel_diff"] <= c["tolerances"]["forward_logits_max_rel_diff"]
    assert result["versions"]["pytorch-bf16"]["autocast"] == "bfloat16" and result["versions"]["pytorch"]["autocast"] is None
    conv = {r["math"]: r for r in result["convergence"]}
    assert set(conv) == {"fp32", "bf16"} and all(0 <= r["test_accuracy"] <= 1 for r in conv.values())
    assert conv["bf16"]["loss_last"] < conv["bf16"]["loss_first"]


def test_the_runs_parity_is_at_fp32_and_each_mixed_math_both_frameworks_run():
    assert run_cli.parity_maths(["fp32"], ("pytorch", "mxnet"), "cpu") == ("fp32",)
    assert run_cli.parity_maths(["bf16", "tf32"], ("pytorch", "pytorch"), "cpu") == ("fp32", "bf16")
    assert run_cli.parity_maths(["fp16"], ("pytorch", "pytorch"), "cpu") == ("fp32",)  # fp16: not on the CPU
    assert run_cli.parity_maths(["bf16", "fp16"], ("pytorch", "pytorch"), "gpu") == ("fp32", "bf16", "fp16")


def test_options_refuse_the_custom_op_with_a_mixed_math():
    options.check_args(_args(math=["fp32"], custom_op="jit"))
    with pytest.raises(KernelmapError, match="--custom-op jit with --math bf16: kernelmap's custom op computes in float32"):
        options.check_args(_args(math=["fp32", "bf16"], custom_op="jit"))


# --- on the GPU (skipped without one): every mode at bf16 and fp16, parity per math ---------------------------------
@pytest.mark.gpu
def test_gpu_every_pytorch_mode_at_bf16_and_fp16(tmp_path):
    """fp16's scaled step in every mode, the graph modes' capture of GradScaler + fused SGD included: each case runs,
    computes in its precision with TF32 off for the rest, and learns (a scaler that skipped every step would leave
    the loss at ln 10 = 2.30 and its scale collapsed)."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "gpu",
                           "--math", "bf16", "fp16", "--mode", "all", "--steps", "30", "--warmup", "5", "--trials", "1",
                           "--data", "synthetic", "--max-repeats", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    modes = frameworks.get("pytorch").modes
    assert sorted((r["mode"], r["math"]) for r in results) == sorted((m, x) for m in modes for x in ("bf16", "fp16"))
    for r in results:
        assert r["device"] == "gpu" and r["tf32_override"] == "0"
        assert r["versions"]["autocast"] == spec.Math(r["math"]).low_precision
        assert r["final_loss"] < 1.5, (r["mode"], r["math"], r["final_loss"])
        scaler = r["versions"]["grad_scaler"]
        assert (scaler is None) == (r["math"] == "bf16")
        if scaler is not None:
            assert scaler["scale"] >= 2.0**10 and np.log2(scaler["scale"]).is_integer(), (r["mode"], scaler)


@pytest.mark.gpu
def test_gpu_parity_pytorch_bf16_fp16_against_fp32():
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "parity", "--device", "gpu", "--frameworks", "pytorch",
                           "--math", "fp32", "bf16", "fp16", "--data", "synthetic", "--json"],
                          capture_output=True, text=True, timeout=1800)
    result = json.loads(proc.stdout)
    assert [c["sides"] for c in result["comparisons"]] == [["pytorch", "pytorch-bf16"], ["pytorch", "pytorch-fp16"]]
    assert proc.returncode == 0 and result["passed"], result["failures"]


# --- oneDNN matmuls (PyTorch's bf16 linears on the CPU) get their layer and direction --------------------------------
def test_onednn_bf16_matmuls_get_their_linear_layer_and_direction():
    """A real bf16 run's oneDNN log (tests/data/cpu_bf16_run, batch 16): its matmuls say prop ``undef``; their
    ``MxK:KxN`` give the layer and, by the contraction, the direction, so that they link to aten::addmm/mm (the
    same run without: 36 of 156 bf16 oneDNN calls unlinked, 73.7% linked; with: 95.5%, fp32's 95.8%)."""
    from kernelmap.adapters import onednn

    log = Path(__file__).parent / "data" / "cpu_bf16_run" / "pytorch-bf16" / "bs16" / "onednn.log.gz"
    import gzip

    problems = [line.split(",")[-2] for line in gzip.open(log, "rt") if ",exec,cpu,matmul," in line]
    assert len(problems) == 24
    df = onednn.read(log)
    mm = df[df["op_name"].eq("matmul")]
    got = sorted(zip(mm["layer"], mm["direction"], strict=True))
    # by hand: fc1 (128, 3136), fc2 (10, 128); batch 16; K = in: fwd, K = out: bwd_data, K = batch: bwd_weight
    by_hand = {"16x3136:3136x128": ("fc1", "fwd"), "16x128:128x3136": ("fc1", "bwd_data"),
               "128x16:16x3136": ("fc1", "bwd_weight"), "16x128:128x10": ("fc2", "fwd"),
               "16x10:10x128": ("fc2", "bwd_data"), "10x16:16x128": ("fc2", "bwd_weight")}
    assert got == sorted(by_hand[p] for p in problems)
    assert onednn.matmul_layer("10x10:10x128") == (None, None)  # a batch of 10 = fc2's out: ambiguous, left
    assert onednn.matmul_layer("2x3:3x4") == (None, None)


def test_cases_order_each_framework_and_mode_by_math_fp32_first():
    from kernelmap.frameworks.case import order_names

    assert order_names(["pytorch-bf16", "pytorch-compile", "pytorch", "pytorch-fp16", "pytorch-tf32"]) == [
        "pytorch", "pytorch-tf32", "pytorch-bf16", "pytorch-fp16", "pytorch-compile"]
