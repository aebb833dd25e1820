"""benches/bare_mixed_loop.py computes kernelmap's mixed-precision recipe, not a recipe of its own: from the same
weights on the same batches, each bare loop's losses and weights after three steps are bit-identical to kernelmap's
workload's (CPU: PyTorch bf16, JAX bf16 and fp16 with its loss scale, MXNet bf16 imperative and hybridized; MXNet's
fp16 is the GPU's). The loops share no code with the workloads (each probe imports both); a recipe that drifts
(a bias cast to the low dtype, another optimizer, NCHW) fails here. Its constants are kernelmap's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernelmap.frameworks import spec

from kernelmap import doctor, timing

BENCHES = Path(__file__).resolve().parents[1] / "benches"
sys.path.insert(0, str(BENCHES))
import bare_mixed_loop as B  # noqa: E402

# runs in the framework's interpreter: the bare loop and kernelmap's workload from the same weights (both
# spec.init_weights(0)'s draw), fed the bare loop's first three batches; prints each side's losses and the
# largest difference of any weight after them
PROBE = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import bare_mixed_loop as B
from kernelmap.frameworks import spec, load_workload
fw, math, mode = sys.argv[2], sys.argv[3], sys.argv[4] or None
loop = B.LOOPS[fw if mode is None else f"{fw}-{mode}"](16, math, "cpu")
w = load_workload(fw)(spec.TrainConfig(device="cpu", math=math, data="synthetic", batch_size=16, mode=mode))
lb, lk = [], []
for x, y in loop.batches[:3]:
    lb.append(w.to_float(loop.step(x, y)))
    lk.append(w.to_float(w.train_step(x, y)))
if fw == "jax":  # the bare loop's parameters are laid out as Flax's (HWIO, fc1's rows (h, w, c), fc2 (in, out))
    bare = loop.model["state"][0]
    pairs = [(w.params[k]["kernel"], bare[k][0]) for k in bare] + [(w.params[k]["bias"], bare[k][1]) for k in bare]
else:
    kw = w.get_weights()
    if fw == "pytorch":
        bw = {k: v.detach().numpy() for k, v in loop.model.state_dict().items()}
    else:
        net = loop.model
        bw = {f"{n}.{p}": getattr(b, p).data().asnumpy() for n, b in zip(("conv1", "conv2", "fc1", "fc2"),
              (net[0], net[2], net[5], net[6])) for p in ("weight", "bias")}
    pairs = [(kw[k], bw[k]) for k in kw]
diff = max(float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max()) for a, b in pairs)
print(json.dumps({"bare": lb, "kernelmap": lk, "max_weight_diff": diff, "tensors": len(pairs)}))
"""


def _python(framework: str) -> str:
    """The first interpreter the doctor would probe ``framework`` with that imports its workload; else skip."""
    for python in doctor.interpreters(framework):
        probe = subprocess.run([python, "-c", f"import kernelmap.frameworks.{framework}.workload"], capture_output=True,
                               text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        if probe.returncode == 0:
            return python
    pytest.skip(f"no interpreter of {doctor.interpreters(framework)} imports kernelmap's {framework} workload")


def _probe(framework: str, math: str, mode: str = "") -> dict:
    python = _python(framework)
    r = subprocess.run([python, "-c", PROBE, str(BENCHES), framework, math, mode], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd="/tmp", timeout=600)
    if framework == "mxnet" and "bf16" in math and "--math bf16:" in r.stderr:  # kernelmap's own refusal here
        pytest.skip(f"MXNet bf16 on this CPU: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("framework", "math", "mode"), [
    ("pytorch", "bf16", ""), ("jax", "bf16", ""), ("jax", "fp16", ""), ("mxnet", "bf16", ""),
    ("mxnet", "bf16", "hybridized")])
def test_the_bare_loop_trains_exactly_as_kernelmaps_workload(framework, math, mode):
    r = _probe(framework, math, mode)
    assert r["tensors"] == 8 and len(r["bare"]) == 3
    assert r["bare"] == r["kernelmap"], r  # bit-identical losses at every step
    assert r["max_weight_diff"] == 0.0, r  # and weights after them
    assert len(set(r["bare"])) == 3  # the steps trained (three different batches, moving weights)


def test_the_constants_are_kernelmaps():
    assert B.BLOCK == timing.BLOCK_STEPS and B.BATCHES == timing.WINDOW_STEPS
    cfg = spec.TrainConfig()
    assert (B.LR, B.MOMENTUM) == (cfg.lr, cfg.momentum)
    s = spec.LOSS_SCALE
    assert (B.SCALE_INIT, B.SCALE_GROWTH, B.SCALE_BACKOFF, B.SCALE_INTERVAL) == (s.init, s.growth, s.backoff, s.interval)
    ours, theirs = B.init_weights(0), spec.init_weights(0)
    import numpy as np
    for name, (w, b) in ours.items():
        assert np.array_equal(w, theirs[f"{name}.weight"]) and np.array_equal(b, theirs[f"{name}.bias"])


def test_one_json_line_per_batch_size_with_its_samples():
    python = _python("pytorch")
    r = subprocess.run([python, str(BENCHES / "bare_mixed_loop.py"), "pytorch", "bf16", "4", "8", "--device", "cpu",
                        "--warmup", "1", "--blocks", "2"], capture_output=True, text=True, cwd="/tmp", timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["bs"] for d in lines] == [4, 8]
    for d in lines:
        assert d["device"] == "cpu" and d["warmup"] == 1 and d["block_steps"] == B.BLOCK
        assert len(d["samples_ms"]) == 2 and d["iqr_ms"][0] <= d["median_ms"] <= d["iqr_ms"][1]


def test_what_kernelmap_refuses_the_bare_loop_refuses():
    python = _python("pytorch")
    r = subprocess.run([python, str(BENCHES / "bare_mixed_loop.py"), "pytorch", "fp16", "4", "--device", "cpu"],
                       capture_output=True, text=True, cwd="/tmp", timeout=300)
    assert r.returncode != 0 and "GPU only" in r.stderr and not r.stdout
    r = subprocess.run([python, str(BENCHES / "bare_mixed_loop.py"), "pytorch", "bf16", "4", "--blocks", "0"],
                       capture_output=True, text=True, cwd="/tmp", timeout=300)
    assert r.returncode == 2 and "--blocks" in r.stderr
