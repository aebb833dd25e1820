"""Run in a subprocess by the tests (``conftest.framework_report``): one framework per process.

    python tests/framework_probe.py FRAMEWORK CASES_JSON

CASES_JSON: {"idx": DIR (gzipped small IDX), "cases": {name: [data, batch_size, n_samples]}}.
Prints one JSON object: ``loaders`` (first batches through the framework's own loader, per case),
``stock_gluon`` (mxnet only: what unmodified gluon MNIST does with the same files), ``workload``
(param count, weight round trip, profiler regions, versions, training and evaluation figures).
The network is blocked for the whole process, so any download attempt fails loudly.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

import numpy as np


def _no_network(*args, **kwargs):
    raise RuntimeError("network access attempted")


socket.socket.connect = socket.getaddrinfo = socket.create_connection = _no_network

from kernelmap.frameworks import data as data_mod  # noqa: E402
from kernelmap.frameworks import load_workload, spec  # noqa: E402


def to_np(x) -> np.ndarray:
    return x.asnumpy() if hasattr(x, "asnumpy") else x.detach().cpu().numpy()


def first_batches(fw: str, data: str, batch_size: int, n: int) -> dict:
    w = load_workload(fw)(spec.TrainConfig(data=data, seed=0))
    order = spec.sample_order(w.data_info.n_train, 0, 0)[:n]
    labels, first = [], None
    for images, y in w.batches("train", batch_size, order):
        if first is None:
            first = to_np(images)
        labels += [int(v) for v in to_np(y)]
    return {
        "labels": labels,
        "order": order.tolist(),
        "first_shape": list(first.shape),
        "first_sum": float(first.astype(np.float64).sum()),
        "first_pixel": float(first[0, 0, 0, 0]),
        "n_test": len(w.dataset("test")),
    }


def stock_gluon(idx_dir: str) -> str:
    import mxnet as mx

    info = data_mod.resolve_data(spec.TrainConfig(data=idx_dir))
    try:
        mx.gluon.data.vision.MNIST(root=str(data_mod.prepare_dir(info).gluon_root), train=False)
    except Exception as exc:  # reported to the test, which asserts on it
        return f"{type(exc).__name__}: {exc}"
    return "loaded"


def profiled_regions(fw: str, w, x, y) -> list[str]:
    if fw == "pytorch":
        import torch

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            w.train_step(x, y)
        names = {e.name for e in prof.events()}
    else:
        import mxnet as mx

        trace = os.path.join(tempfile.mkdtemp(), "profile.json")
        mx.profiler.set_config(profile_all=True, filename=trace)
        mx.profiler.set_state("run")
        w.train_step(x, y)
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        mx.profiler.dump()
        with open(trace) as fh:
            events = json.load(fh)["traceEvents"]
        names = {e["name"] for e in events if e.get("ph") in ("B", "X")}
    return sorted(n for n in names if n.startswith("kernelmap:"))


def train(fw: str, idx_dir: str, hybridize: bool = False, steps: int = 15):
    w = load_workload(fw)(spec.TrainConfig(data=idx_dir, seed=0, batch_size=32, mode="hybridized" if hybridize else None))
    order = spec.training_order(w.data_info.n_train, 0, steps * 32)
    losses = [float(to_np(w.train_step(x, y))) for x, y in w.batches("train", 32, order)]
    w.synchronize()
    return w, losses


def workload(fw: str, idx_dir: str) -> dict:
    out: dict = {}
    w = load_workload(fw)(spec.TrainConfig(data=idx_dir, seed=0))
    out["param_count"] = w.param_count()
    w7 = spec.init_weights(7)
    w.set_weights(w7)
    back = w.get_weights()
    out["round_trip_exact"] = list(back) == spec.weight_names() and all(
        np.array_equal(back[k], w7[k]) for k in w7
    )
    x, y = next(w.batches("test", 5, np.arange(5)))
    out["logits_shape"] = list(w.forward(x).shape)
    out["versions"] = w.versions()
    if fw == "pytorch":
        import torch

        out["module_version"] = torch.__version__
    else:
        import mxnet as mx

        out["module_version"] = mx.__version__
    out["regions"] = profiled_regions(fw, w, x, y)
    w, out["losses"] = train(fw, idx_dir)
    out["accuracy"] = w.evaluate(batch_size=16)
    if fw == "mxnet":
        out["hybrid_losses"] = train(fw, idx_dir, hybridize=True, steps=5)[1]
    return out


def main() -> None:
    fw, arg = sys.argv[1], json.loads(sys.argv[2])
    report = {"loaders": {name: first_batches(fw, *case) for name, case in arg["cases"].items()}}
    if fw == "mxnet":
        report["stock_gluon"] = stock_gluon(arg["idx"])
    report["workload"] = workload(fw, arg["idx"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
