"""Record the CPU fixtures under tests/data/ (real traces of the MNIST CNN, a few training steps).

    python tests/data/record_cpu_fixtures.py            # all four
    python tests/data/record_cpu_fixtures.py torch-kineto|torch-onednn|mxnet-profiler|mxnet-onednn

The model is written inline (same layers as frameworks/spec.LAYERS, synthetic data) so that the
fixtures do not depend on the Workload classes. Each recording runs in its own subprocess, since
the oneDNN verbose level is read from the environment when the library loads.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 3
BATCH = 16


def _torch_model():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.fc1 = nn.Linear(3136, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            return F.log_softmax(self.fc2(x), dim=1)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    rf = torch.autograd.profiler.record_function

    def step(i):
        with rf(f"kernelmap:step#{i}"):
            opt.zero_grad()
            with rf("kernelmap:forward"):
                loss = F.nll_loss(model(x), y)
            with rf("kernelmap:backward"):
                loss.backward()
            with rf("kernelmap:optimizer"):
                opt.step()

    return step


def torch_kineto(out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = _torch_model()
    step(-1)  # warm-up outside the trace
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(STEPS):
            step(i)
            prof.step()
    tmp = out.with_suffix("")
    prof.export_chrome_trace(str(tmp))
    _gzip(tmp, out)
    del torch


def torch_onednn(out: Path) -> None:
    step = _torch_model()
    for i in range(STEPS):
        step(i)


def _mxnet_model():
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn

    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Conv2D(64, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    x = mx.nd.random.normal(shape=(BATCH, 1, 28, 28))
    y = mx.nd.random.randint(0, 10, shape=(BATCH,)).astype("float32")

    def step(i, region=None):
        def scope(name):
            return region(name) if region else _Null()

        with scope(f"kernelmap:step#{i}"):
            with scope("kernelmap:forward"), autograd.record():
                loss = loss_fn(net(x), y)
            with scope("kernelmap:backward"):
                loss.backward()
            with scope("kernelmap:optimizer"):
                trainer.step(BATCH)
            mx.nd.waitall()

    return mx, step


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def mxnet_profiler(out: Path) -> None:
    import contextlib

    mx, step = _mxnet_model()
    step(-1)
    tmp = out.with_suffix("")
    mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=str(tmp))

    @contextlib.contextmanager
    def region(name):
        task = mx.profiler.Task(mx.profiler.Domain("kernelmap"), name)
        task.start()
        try:
            yield
        finally:
            mx.nd.waitall()
            task.stop()

    mx.profiler.set_state("run")
    for i in range(STEPS):
        step(i, region)
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    mx.profiler.dump()
    _gzip(tmp, out)


def mxnet_onednn(out: Path) -> None:
    _, step = _mxnet_model()
    for i in range(STEPS):
        step(i)


def _gzip(src: Path, dst: Path) -> None:
    with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=9) as fo:
        shutil.copyfileobj(fi, fo)
    src.unlink()


RECORDINGS = {
    "torch-kineto": ("cpu_torch_kineto.json.gz", torch_kineto, {}),
    "torch-onednn": ("cpu_torch_onednn.log.gz", torch_onednn, {"ONEDNN_VERBOSE": "1", "DNNL_VERBOSE": "1"}),
    # bulk execution hides the backward ops inside one ImperativeBulk span: switch it off
    "mxnet-profiler": ("cpu_mxnet_profile.json.gz", mxnet_profiler, {"MXNET_EXEC_BULK_EXEC_TRAIN": "0"}),
    "mxnet-onednn": ("cpu_mxnet_onednn.log.gz", mxnet_onednn,
                     {"MKLDNN_VERBOSE": "1", "DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}),
}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        name, func, _ = RECORDINGS[argv[1]][0], RECORDINGS[argv[1]][1], None
        func(HERE / name)
        return 0
    for key in argv or list(RECORDINGS):
        name, _, env = RECORDINGS[key]
        print(f"recording {key} -> {name}", file=sys.stderr)
        if name.endswith(".log.gz"):  # the verbose output is the child's stdout
            with tempfile.TemporaryFile() as tf:
                subprocess.run([sys.executable, __file__, "--child", key], check=True, stdout=tf,
                               env={**os.environ, **env})
                tf.seek(0)
                with gzip.open(HERE / name, "wb", compresslevel=9) as fo:
                    shutil.copyfileobj(tf, fo)
        else:
            subprocess.run([sys.executable, __file__, "--child", key], check=True, env={**os.environ, **env})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
