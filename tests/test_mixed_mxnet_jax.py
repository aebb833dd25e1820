"""Mixed precision in MXNet (AMP) and JAX (a Flax dtype policy) on the CPU: `kernelmap run --math ...` end to end,
each framework in its own worker processes, and what really computed in low precision read back from the run's
own files by independent stdlib readers (docs/MIXED_PRECISION.md):

- MXNet: oneDNN's verbose log of the libs pass (``onednn.log``): the data types of every convolution and inner
  product it executed, counted exactly per step; fp16 on the CPU refused before any work, with its reason.
- JAX: the compiled step's HLO text the framework pass writes (``<module>.hlo.txt.gz``): the layers' values in
  bf16/f16, the convolutions and dots in f32 (XLA's CPU compiler upcasts them: the deviation the docs name), the
  parameters float32; fp16's dynamic loss scale skipping a step whose gradients are not finite.

Every assertion that says "low precision ran" is paired with the same count on an fp32 case of the same run,
which must come out the other way, so that a run that silently trained in fp32 fails here."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import require_framework
from kernelmap.frameworks.case import Case

from kernelmap import doctor, frameworks, parity
from kernelmap.errors import KernelmapError

STEPS, WARMUP = 3, 1
ONEDNN_PREFIXES = ("onednn_verbose,", "dnnl_verbose,", "mkldnn_verbose,")
# per training step of spec.LAYERS: (primitive, prop_kind) -> executions. conv1's input needs no gradient, so
# only conv2 runs backward_data; each inner product runs all three.
MXNET_PER_STEP = {("convolution", "forward_training"): 2, ("convolution", "backward_data"): 1,
                  ("convolution", "backward_weights"): 2, ("inner_product", "forward_training"): 2,
                  ("inner_product", "backward_data"): 2, ("inner_product", "backward_weights"): 2}


def _run(out: Path, *argv: str, timeout: float = 900, rc: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernelmap.cli", "run", "--device", "cpu", "--data", "synthetic", "--batch-size",
           "16", "--steps", str(STEPS), "--warmup", str(WARMUP), "--trials", "1", "--max-repeats", "0",
           "--out", str(out), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == rc, proc.stderr[-4000:]
    return proc


def _results(out: Path) -> dict[tuple[str, str], dict]:
    return {(r["mode"], r["math"]): r for r in json.loads((out / "results.json").read_text())}


def onednn_executions(path: Path) -> Counter:
    """(primitive, prop_kind, src data type, weights data type) -> executions, of the convolutions and inner
    products of a oneDNN verbose log (v1/v2 lines: PREFIX,exec,cpu,primitive,impl,prop_kind,memory descriptors,...)."""
    counts: Counter = Counter()
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith(ONEDNN_PREFIXES):
            continue
        f = line.split(",")
        if f[1] != "exec" or f[3] not in ("convolution", "inner_product"):
            continue
        dtypes = dict(re.findall(r"\b(src|wei)_([a-z0-9]+)::", f[6]))
        counts[(f[3], f[5], dtypes["src"], dtypes["wei"])] += 1
    return counts


# MXNet's bf16 needs a CPU with AVX-512 (frameworks/mxnet/descriptor.py BF16_CPU_FLAGS): this machine's answer
BF16_REFUSED_HERE = frameworks.math_refusal("mxnet", "bf16", "cpu")
needs_bf16_cpu = pytest.mark.skipif(BF16_REFUSED_HERE is not None, reason=f"here: {BF16_REFUSED_HERE}")


@pytest.mark.slow
def test_mxnet_fp16_is_refused_and_bf16_too_on_a_cpu_without_avx512(tmp_path):
    """fp16 on the CPU: refused before any work (exit 2, nothing written), with the reason. On a CPU without
    AVX-512 bf16 likewise (the CI runner's AMD EPYC with AVX2), and beside fp32 its cases are skipped with the reason
    while fp32's run; on a CPU with AVX-512 bf16 runs (test_mxnet_bf16_runs_onednn_bf16_in_both_modes)."""
    require_framework("mxnet")
    refused = _run(tmp_path / "refused", "--framework", "mxnet", "--math", "fp16", rc=2)
    assert "MXNet cannot run fp16 on the CPU" in refused.stderr and "FP16 gemm on cpu not implemented" in refused.stderr
    assert not (tmp_path / "refused").exists()
    if BF16_REFUSED_HERE is None:
        return
    refused = _run(tmp_path / "refused", "--framework", "mxnet", "--math", "bf16", rc=2)
    assert "--math bf16 --device cpu: MXNet cannot run bf16 on the CPU: this CPU lacks avx512f" in refused.stderr
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "run"  # the device left to the run (auto): the bf16 cases skipped, the fp32 ones run
    proc = _run(out, "--framework", "mxnet", "--mode", "all", "--math", "fp32", "bf16", "--device", "auto")
    assert ("math skipped (mxnet-bf16, mxnet-hybridized-bf16): MXNet cannot run bf16 on the CPU: this CPU lacks"
            in proc.stderr)
    assert "worker exited" not in proc.stderr
    assert sorted(_results(out)) == [("hybridized", "fp32"), ("imperative", "fp32")]


def test_mxnet_bf16_on_the_cpu_is_refused_by_the_cpu_flags(monkeypatch):
    """The machine's refusal comes from /proc/cpuinfo's flags through the registry, before any worker: AVX2 only
    refuses bf16 naming the flags missing, AVX-512 allows it, unread flags allow it (the worker then decides)."""
    from kernelmap.frameworks.mxnet import descriptor as mxd

    from kernelmap import gpuinfo

    for flags, refused in ((frozenset({"sse2", "avx2", "fma"}), True), (frozenset({"avx2", *mxd.BF16_CPU_FLAGS}), False),
                           (None, False)):
        monkeypatch.setattr(gpuinfo, "cpu_flags", lambda flags=flags: flags)
        why = frameworks.math_refusal("mxnet", "bf16", "cpu")
        assert (why is not None) is refused, (flags, why)
        if refused:
            assert why.startswith("MXNet cannot run bf16 on the CPU: this CPU lacks avx512f, avx512bw, avx512vl, "
                                  "avx512dq")
            with pytest.raises(KernelmapError, match="parity --math bf16: MXNet cannot run bf16 on the CPU"):
                parity.check_maths(("pytorch", "mxnet"), ("bf16",), "cpu")
        assert frameworks.math_refusal("mxnet", "bf16", "gpu") is not None  # never on its GPU, whatever the CPU
        assert frameworks.math_refusal("mxnet", "fp32", "cpu") is None  # fp32 needs nothing of the CPU


@pytest.mark.slow
@needs_bf16_cpu
def test_mxnet_bf16_runs_onednn_bf16_in_both_modes(tmp_path):
    require_framework("mxnet")
    out = tmp_path / "run"
    _run(out, "--framework", "mxnet", "--mode", "all", "--math", "fp32", "bf16", "--profile", "libs")
    results = _results(out)
    assert sorted(results) == sorted((mode, math) for mode in ("imperative", "hybridized") for math in ("fp32", "bf16"))
    executed = (STEPS + WARMUP)  # the libs pass logs its warm-up steps and its timed steps
    for (mode, math), r in results.items():
        case = Case("mxnet", mode, math).name
        counts = onednn_executions(out / case / "bs16" / "onednn.log")
        want = "bf16" if math == "bf16" else "f32"
        assert counts == Counter({(p, k, want, want): n * executed for (p, k), n in MXNET_PER_STEP.items()}), (
            case, counts)
        versions = r["versions"]
        assert versions["param_dtypes"] == ["float32"] and versions["loss_scale"] is None
        assert versions["compute_dtype"] == ("bfloat16" if math == "bf16" else "float32")
        assert versions["amp_target_dtype"] == ("bfloat16" if math == "bf16" else None)
    # bf16 trained: the loss of the last step is finite and near the fp32 case's (the same batches and weights)
    for mode in ("imperative", "hybridized"):
        lo, hi = results[(mode, "bf16")]["final_loss"], results[(mode, "fp32")]["final_loss"]
        assert abs(lo - hi) / hi < 0.02, (mode, lo, hi)


def hlo_counts(path: Path) -> dict[str, Counter]:
    """From an optimised HLO text: the result element types of its convolutions and dots, and of the
    instructions whose op_name says they are one of the layers (conv1, conv2, fc1, fc2)."""
    text = gzip.decompress(path.read_bytes()).decode()
    conv_dot: Counter = Counter()
    layer_values: Counter = Counter()
    bias_sums: Counter = Counter()  # the bias gradients: a layer's reduce_sum in the backward (transpose)
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%\S+ = \(?([a-z]+[0-9]*)\[[^=]*?\s(convolution|dot)\(", line)
        if m:
            conv_dot[f"{m[2]} {m[1]}"] += 1
        m = re.match(r"\s*(?:ROOT\s+)?%\S+ = ([a-z]+[0-9]*)\[[^=]*?\sreduce\(.*op_name=\"[^\"]*transpose\([^\"]*/"
                     r"(conv1|conv2|fc1|fc2)/reduce_sum\"", line)
        if m:
            bias_sums[f"{m[2]} {m[1]}"] += 1
        m = re.match(r"\s*(?:ROOT\s+)?%\S+ = ([a-z]+[0-9]*)\[", line)
        if m and re.search(r'op_name="[^"]*/(conv1|conv2|fc1|fc2)/', line):
            layer_values[m[1]] += 1
    return {"conv_dot": conv_dot, "layer_values": layer_values, "bias_sums": bias_sums}


def _jax_python() -> str:
    """The first interpreter the doctor would probe JAX with ($KERNELMAP_PYTHON_JAX, .nox/jax-workers, this one)
    that imports it and kernelmap's JAX workload; the test skips, saying why, where none does."""
    for python in doctor.interpreters("jax"):
        probe = subprocess.run([python, "-c", "import kernelmap.frameworks.jax.workload"], capture_output=True,
                               text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        if probe.returncode == 0:
            return python
    pytest.skip(f"no interpreter of {doctor.interpreters('jax')} imports jax, flax, optax and kernelmap")


@pytest.mark.slow
def test_jax_bf16_and_fp16_policies_on_the_cpu(tmp_path):
    python = _jax_python()
    out = tmp_path / "run"
    _run(out, "--framework", "jax", "--python", f"jax={python}", "--math", "fp32", "bf16", "fp16",
         "--profile", "framework")
    results = _results(out)
    assert sorted(results) == [("jit", "bf16"), ("jit", "fp16"), ("jit", "fp32")]
    low = {"fp32": None, "bf16": "bf16", "fp16": "f16"}
    for (_, math), r in results.items():
        [hlo] = list((out / Case("jax", "jit", math).name / "bs16").glob("*.hlo.txt.gz"))
        counts = hlo_counts(hlo)
        # the layers' values: low precision at bf16/fp16, none at fp32 (a run that silently kept fp32 fails here)
        if low[math] is None:
            assert not {"bf16", "f16"} & set(counts["layer_values"]), counts["layer_values"]
        else:
            assert counts["layer_values"][low[math]] >= 8, counts["layer_values"]  # each layer, fwd and bwd
        # XLA's CPU compiler: every convolution and dot in f32 at every math (the deviation docs/ names); the
        # workload's own count (versions) is the independent reader's
        assert set(counts["conv_dot"]) == {"convolution f32", "dot f32"}, counts["conv_dot"]
        # each bias gradient sums its layer's output gradient in f32 at every math (Flax's own bias add summed
        # them in bf16/f16: the recipe's fp32 accumulation broken; fp32_bias in the workload)
        assert counts["bias_sums"] == Counter({f"{n} f32": 1 for n in ("conv1", "conv2", "fc1", "fc2")}), \
            counts["bias_sums"]
        versions = r["versions"]
        assert versions["hlo_conv_dot"] == (None if math == "fp32" else dict(counts["conv_dot"]))
        assert versions["param_dtypes"] == ["float32"]
        assert versions["compute_dtype"] == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[math]
        assert versions["loss_scale"] == (65536.0 if math == "fp16" else None)  # no overflow in 4 steps
    fp32 = results[("jit", "fp32")]["final_loss"]
    for math in ("bf16", "fp16"):
        assert abs(results[("jit", math)]["final_loss"] - fp32) / fp32 < 0.02, math


LOSS_SCALE_SCRIPT = r"""
import json, numpy as np, jax, jax.numpy as jnp
from kernelmap.frameworks import spec
from kernelmap.frameworks.jax import workload as W
w = W.Workload(spec.TrainConfig(data="synthetic", math="fp16", batch_size=8))
x, y = next(w.batches("train", 8, np.arange(8)))
before = w.get_weights()
w.train_step(x.at[0, 0, 0, 0].set(jnp.inf), y)          # an inf input: every gradient inf or nan
skipped = {k: bool(np.array_equal(before[k], v)) for k, v in w.get_weights().items()}
momentum_zero = all(float(jnp.abs(t).max()) == 0 for t in jax.tree_util.tree_leaves(w.opt_state))
after_overflow = (float(w.loss_scale.scale), int(w.loss_scale.finite_steps))
w.train_step(x, y)
moved = sum(not np.array_equal(before[k], v) for k, v in w.get_weights().items())
ls = W.LossScale(jnp.float32(1024.0), jnp.int32(spec.LOSS_SCALE.interval - 1))
grown = ls.after(jnp.bool_(True))
print(json.dumps({"skipped": skipped, "momentum_zero": momentum_zero, "after_overflow": after_overflow,
                  "after_finite": [float(w.loss_scale.scale), int(w.loss_scale.finite_steps)], "moved": moved,
                  "grown": [float(grown.scale), int(grown.finite_steps)],
                  "interval": spec.LOSS_SCALE.interval}))
"""


@pytest.mark.slow
def test_jax_fp16_loss_scale_skips_a_step_with_non_finite_gradients_and_halves():
    python = _jax_python()
    proc = subprocess.run([python, "-c", LOSS_SCALE_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(r["skipped"].values()) and len(r["skipped"]) == 8  # no weight moved on the overflowing step
    assert r["momentum_zero"]  # nor did the optimizer's momentum
    assert r["after_overflow"] == [32768.0, 0]  # 2**16 halved
    assert r["after_finite"] == [32768.0, 1] and r["moved"] == 8  # a finite step trains and is counted
    assert r["grown"] == [2048.0, 0]  # the interval-th finite step in a row doubles the scale, the count restarts


@pytest.mark.slow
@pytest.mark.parametrize("other", ["mxnet", "jax"])
def test_bf16_parity_against_pytorch_on_the_cpu(tmp_path, other):
    """`kernelmap parity --frameworks pytorch,OTHER --math bf16`: within the derived bf16-against-bf16 tolerance,
    and farther apart than two fp32 implementations ever are (1e-4, parity's fp32 tolerance): both sides rounded."""
    require_framework("pytorch")
    python = {"jax": _jax_python()} if other == "jax" else {}
    if other == "mxnet":
        require_framework("mxnet")
        if BF16_REFUSED_HERE is not None:  # its refusal: test_mxnet_bf16_on_the_cpu_is_refused_by_the_cpu_flags
            pytest.skip(f"here: {BF16_REFUSED_HERE}")
    r = parity.compute_parity(data="synthetic", steps=8, batch_size=32, frameworks=("pytorch", other),
                              python=python, maths=("bf16",), workdir=tmp_path)
    [c] = r["comparisons"]
    assert c["sides"] == ["pytorch-bf16", f"{other}-bf16"] and c["passed"], c["failures"]
    assert c["tolerances"] == parity.tolerances(("bf16", "bf16"))
    for key, tol in c["tolerances"].items():
        assert 0 < c[key] <= tol, (key, c[key])
    assert c["forward_logits_max_rel_diff"] > parity.TOLERANCES["forward_logits_max_abs_diff"]
    assert r["versions"][f"{other}-bf16"]["compute_dtype"] == "bfloat16"
    assert r["versions"][f"{other}-bf16"]["param_dtypes"] == ["float32"]


def test_mxnet_bf16_cpu_refusal_names_the_missing_piece():
    from kernelmap.frameworks.mxnet import descriptor as mxd

    avx512 = frozenset({"sse2", "avx2", *mxd.BF16_CPU_FLAGS})
    assert mxd.bf16_cpu_refusal(True, avx512) is None and mxd.bf16_cpu_refusal(True, None) is None  # None: unread
    assert "built without oneDNN" in mxd.bf16_cpu_refusal(False, avx512)
    why = mxd.bf16_cpu_refusal(True, frozenset({"sse2", "avx2", "fma"}))
    assert why.startswith("this CPU lacks avx512f, avx512bw, avx512vl, avx512dq") and "AVX2" in why
    # the static refusals reach the runner through the registry, per device
    assert "FP16 gemm on cpu" in frameworks.math_refusal("mxnet", "fp16", "cpu")
    assert "no bfloat16" in frameworks.math_refusal("mxnet", "bf16", "gpu")
    assert frameworks.math_refusal("mxnet", "fp16", "gpu") is None  # bf16 on the CPU: by its flags (the test above)
    assert all(frameworks.math_refusal("jax", m, d) is None for m in ("bf16", "fp16") for d in ("cpu", "gpu"))


def test_hlo_conv_dot_counts_a_real_h200_step():
    """conv_dot_dtypes on the optimised HLO of a real JAX step on the H200 (fp32, tests/data/jax_gpu): its cuDNN
    convolutions and cuBLASLt GEMM custom calls and its (Triton-fused) dots, each by result type, agree with plain
    counts of the text's custom-call targets and dot instructions."""
    from kernelmap.frameworks.jax.hlo import conv_dot_dtypes

    text = gzip.decompress((Path(__file__).parent / "data" / "jax_gpu" / "jit__train_step.hlo.txt.gz").read_bytes()).decode()
    plain = {"conv f32": text.count('custom_call_target="__cudnn$conv'),
             "gemm f32": text.count('custom_call_target="__cublas$'),
             "dot f32": sum(" dot(" in line for line in text.splitlines())}
    assert plain == {"conv f32": 5, "gemm f32": 1, "dot f32": 5}
    assert conv_dot_dtypes(text) == plain
    assert conv_dot_dtypes(text.replace("f32[", "bf16[")) == {k.replace("f32", "bf16"): v for k, v in plain.items()}
