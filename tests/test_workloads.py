"""Each framework's Workload, exercised in its own subprocess (torch and mxnet never share one)."""

from __future__ import annotations

import pytest
from conftest import run_framework
from kernelmap.frameworks import spec

WORKLOAD_CODE = """
import json, os, tempfile
import numpy as np
from kernelmap.frameworks import load_workload, spec

def to_np(x):
    return x.asnumpy() if hasattr(x, "asnumpy") else x.detach().cpu().numpy()

def train(hybridize=False, steps=15):
    W = load_workload(FW)(spec.TrainConfig(data=DATA, seed=0, batch_size=32, hybridize=hybridize))
    order = spec.training_order(W.data_info.n_train, 0, steps * 32)
    losses = [float(to_np(W.train_step(x, y))) for x, y in W.batches("train", 32, order)]
    W.synchronize()
    return W, losses

out = {}
W = load_workload(FW)(spec.TrainConfig(data=DATA, seed=0))
out["param_count"] = W.param_count()
w7 = spec.init_weights(7)
W.set_weights(w7)
back = W.get_weights()
out["round_trip_exact"] = list(back) == spec.weight_names() and all(np.array_equal(back[k], w7[k]) for k in w7)
x, y = next(W.batches("test", 5, np.arange(5)))
out["logits_shape"] = list(W.forward(x).shape)
out["versions"] = W.versions()

names = set()
if FW == "pytorch":
    import torch
    out["module_version"] = torch.__version__
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        W.train_step(x, y)
    names = {e.name for e in prof.events()}
else:
    import mxnet as mx
    out["module_version"] = mx.__version__
    trace = os.path.join(tempfile.mkdtemp(), "profile.json")
    mx.profiler.set_config(profile_all=True, filename=trace)
    mx.profiler.set_state("run")
    W.train_step(x, y)
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    mx.profiler.dump()
    events = json.load(open(trace))["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") in ("B", "X")}
out["regions"] = sorted(n for n in names if n.startswith("kernelmap:"))

W, losses = train()
out["losses"] = losses
out["accuracy"] = W.evaluate(batch_size=16)
if FW == "mxnet":
    out["hybrid_losses"] = train(hybridize=True, steps=5)[1]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def workload_output(idx_dir_gz):
    cache: dict = {}

    def get(fw):
        if fw not in cache:
            cache[fw] = run_framework(fw, f"FW = {fw!r}\nDATA = {str(idx_dir_gz)!r}\n" + WORKLOAD_CODE)
        return cache[fw]

    return get


FRAMEWORKS = ["pytorch", pytest.param("mxnet", marks=pytest.mark.mxnet)]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_model_and_weights(workload_output, fw):
    out = workload_output(fw)
    assert out["param_count"] == spec.PARAM_COUNT == 421_642
    assert out["round_trip_exact"] is True
    assert out["logits_shape"] == [5, spec.NUM_CLASSES]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_regions_in_profiler_trace(workload_output, fw):
    assert workload_output(fw)["regions"] == [
        "kernelmap:backward",
        "kernelmap:forward",
        "kernelmap:optimizer",
    ]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_versions(workload_output, fw):
    out = workload_output(fw)
    v = out["versions"]
    assert v["framework"] == fw and v["version"] == out["module_version"]
    for key in ("cuda", "cudnn", "cublas"):
        assert key in v
    if fw == "mxnet":  # CPU wheel here: no CUDA 11 libraries, so nothing is claimed
        assert v["cuda_enabled"] or v["cuda"] is None


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_trains_and_evaluates(workload_output, fw):
    out = workload_output(fw)
    losses = out["losses"]
    assert len(losses) == 15
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert 0.5 < out["accuracy"] <= 1.0  # 40 test images of a learnable pattern; chance is 0.1


@pytest.mark.mxnet
def test_gluon_hybridized_matches_imperative(workload_output):
    out = workload_output("mxnet")
    assert out["hybrid_losses"] == pytest.approx(out["losses"][:5], rel=1e-5)


@pytest.mark.mxnet
def test_frameworks_train_alike(workload_output):
    pt, mx = workload_output("pytorch"), workload_output("mxnet")
    assert pt["losses"] == pytest.approx(mx["losses"], rel=1e-4)
    assert pt["accuracy"] == mx["accuracy"]
