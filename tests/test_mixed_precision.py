"""Mixed precision (issue 38): the math contract (``spec.Math``: bf16, fp16), which framework runs which math on
which device (refused up front or skipped per case, never fp32 under the label), one case per ``--math`` value
through the runner, the report's case names and the run's math."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
from kernelmap.frameworks import spec
from kernelmap.frameworks.case import Case, by_name, registered
from kernelmap.reports.analyses.base import with_case_column

from kernelmap import frameworks, options, rundir
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
    options.check_args(_args(math=["fp32"]))
    with pytest.raises(KernelmapError, match="--math fp16 --device cpu: PyTorch cannot run fp16 on the CPU"):
        options.check_args(_args(math=["fp32", "fp16"]))
    with pytest.raises(KernelmapError, match="--math tf32 --device cpu: tf32 is a GPU math"):
        options.check_args(_args(framework="all", math=["tf32"]))
    with pytest.raises(KernelmapError, match="--math bf16 bf16: bf16 given twice"):
        options.check_args(_args(math=["bf16", "bf16"]))
    options.check_args(_args(math=["fp16"], device="auto"))  # decided per framework after its probe: math_cases


def test_math_cases_one_case_per_math_and_a_refused_one_skipped_with_its_reason(capsys):
    decisions = {"pytorch": Decision("pytorch", "auto", "cpu", None)}
    cases, skips = run_cli.math_cases([Case("pytorch", "eager")], ["fp32", "fp16"], decisions)
    assert cases == [Case("pytorch", "eager", "fp32")]
    assert list(skips) == [Case("pytorch", "eager", "fp16")]
    assert "PyTorch cannot run fp16 on the CPU" in skips[Case("pytorch", "eager", "fp16")]
    assert "math skipped (pytorch-fp16)" in capsys.readouterr().err
    gpu = {"pytorch": Decision("pytorch", "auto", "gpu", None)}
    cases, skips = run_cli.math_cases([Case("pytorch", "eager")], ["fp32", "tf32"], gpu)
    assert [c.math for c in cases] == ["fp32", "tf32"] and not skips
