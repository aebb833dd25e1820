"""Bare mixed-precision training loops of the seed CNN: the reference kernelmap's clean step at --math bf16/fp16 is
held against (issue 38: within 5% at bs 1024). Plain code of each framework, no kernelmap workload in the loop;
the same recipe as kernelmap's (docs/MIXED_PRECISION.md), written again here so that the two share no code:

    python benches/bare_mixed_loop.py FRAMEWORK MATH [BS ...] [--device gpu|cpu] [--warmup N] [--blocks N]
        FRAMEWORK: pytorch, jax, mxnet, mxnet-hybridized      MATH: bf16 or fp16 (fp32 master weights)

The recipe, per framework (what kernelmap's workload does, each line checked against it):
- every framework: conv1 -> relu -> maxpool -> conv2 -> relu -> maxpool -> flatten -> fc1 -> relu -> fc2, the
  convs and linears in the low dtype with fp32 parameters; the logits cast to fp32 before log-softmax + NLL (mean);
  SGD lr 0.01, momentum 0.9 on the fp32 parameters; weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)); fp16: dynamic loss
  scaling from 2**16 (x0.5 on an inf/NaN gradient and the step skipped, x2 after 2000 finite steps); on the GPU
  NVIDIA_TF32_OVERRIDE=0 (what stays fp32 is strict fp32), set here before any framework loads.
- PyTorch: ``torch.autocast`` around the model's forward; SGD's default (foreach) implementation at bf16,
  ``SGD(fused=True)`` with ``torch.amp.GradScaler`` at fp16 (the fused step takes the scale and the inf flag as
  tensors: no ``.item()`` sync); ``allow_tf32`` off.
- JAX: NHWC images, HWIO kernels, each conv/dot on operands cast to the low dtype, the fp32 bias added in fp32 and
  the sum rounded to the low dtype (kernelmap's ``fp32_bias``), relu and max pool in the low dtype; ``optax.sgd``;
  one jitted step, parameters and optimizer state donated; fp16's scale a device scalar inside the step.
- MXNet (fp16 on the GPU, bf16 on the CPU: its CUDA operators have no bf16): ``mxnet.contrib.amp`` on the operators
  the loaded MXNet has (the sm_90 tree lacks legacy ones AMP's lists name: ``amp_ops.start``, the fix kernelmap's
  workload uses), fp16: ``amp.init_trainer`` + ``amp.scale_loss``; ``gluon.Trainer('sgd')``; hybridized: ``hybridize()`` as kernelmap's mode (no static_alloc);
  the step's loss as a scalar (``loss.mean()``, forward only), as kernelmap's step returns it. On the GPU it needs
  the sm_90 tree: MXTREE=<tree> PYTHONPATH=<tree>/python.

Data: ``BATCHES`` random batches put on the device before timing and cycled through, a different batch each step
(kernelmap's clean pass: batches on the device before the steps that use them). Timing as kernelmap's clean pass
(kernelmap/timing.py): ``--warmup`` steps (kernelmap's default 5), then ``--blocks`` blocks of ``BLOCK`` steps back
to back, each block ended by one device sync; a sample is a block's wall time / its steps. Unlike kernelmap's, the
garbage collector is left as a plain loop leaves it (kernelmap turns it off within each window of 50 steps and
collects between windows, outside its clocks). One JSON line per batch size: the median sample (ms/step), the
interquartile range, every sample, and the main thread's median CPU ms a step (``main_cpu_ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from math import sqrt
from typing import Any, NamedTuple

BLOCK, BATCHES = 10, 50  # kernelmap.timing.BLOCK_STEPS and WINDOW_STEPS (tests/test_harness_vs_bare.py checks)
LR, MOMENTUM = 0.01, 0.9
SCALE_INIT, SCALE_GROWTH, SCALE_BACKOFF, SCALE_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000
# (name, OIHW or (out, in) shape, fan_in) in model order
LAYERS = (("conv1", (32, 1, 3, 3), 9), ("conv2", (64, 32, 3, 3), 288), ("fc1", (128, 3136), 3136),
          ("fc2", (10, 128), 128))


class Loop(NamedTuple):
    """One framework's bare loop: ``step(x, y)`` trains one step and returns its loss (no sync), ``batches`` on the
    device, ``sync`` waits for the device, ``version`` says what ran; ``model``: its parameters' holder (tests)."""

    step: Callable
    batches: list
    sync: Callable
    version: str
    model: Any


def init_weights(seed: int = 0) -> dict:
    """{layer: (weight, bias)} as numpy float32, OIHW / (out, in): torch's default initialisation's distribution."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, fan_in in LAYERS:
        b = 1.0 / sqrt(fan_in)  # correctly rounded, as spec.init_weights' np.sqrt
        out[name] = (rng.uniform(-b, b, shape).astype(np.float32), rng.uniform(-b, b, shape[0]).astype(np.float32))
    return out


def random_batches(bs: int, n: int, seed: int = 1):
    """``n`` batches of float32 images (bs, 1, 28, 28) and int32 labels, on the host."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((bs, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, bs).astype(np.int32))
            for _ in range(n)]


def timed(step, batches: list, sync, warmup: int, blocks: int) -> tuple[list[float], list[float]]:
    """Samples (ms/step): ``warmup`` steps, then ``blocks`` blocks of ``BLOCK`` steps, a sync ending each; beside
    each, the main thread's CPU time a step over the same block (``time.thread_time``, kernelmap's
    main_thread_median_step_s): a host-bound step's wall time is mostly this thread's work."""
    i = 0
    for _ in range(warmup):
        step(*batches[i % len(batches)])
        i += 1
    sync()
    out, cpu = [], []
    for _ in range(blocks):
        c = time.thread_time()
        t = time.perf_counter()
        for _ in range(BLOCK):
            step(*batches[i % len(batches)])
            i += 1
        sync()
        out.append((time.perf_counter() - t) / BLOCK * 1e3)
        cpu.append((time.thread_time() - c) / BLOCK * 1e3)
    return out, cpu


def pytorch(bs: int, math: str, device: str) -> Loop:
    import torch
    import torch.nn.functional as F
    from torch import nn
    if math == "fp16" and device == "cpu":
        raise SystemExit("pytorch fp16 runs on the GPU only (as kernelmap: oneDNN has no fp16 convolutions here)")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[math]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
            self.fc1, self.fc2 = nn.Linear(3136, 128), nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    net = Net()
    with torch.no_grad():
        for name, (w, b) in init_weights().items():
            getattr(net, name).weight.copy_(torch.from_numpy(w))
            getattr(net, name).bias.copy_(torch.from_numpy(b))
    net.to(dev).train()
    fp16 = math == "fp16"
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, fused=True if fp16 else None)
    scaler = (torch.amp.GradScaler(dev.type, init_scale=SCALE_INIT, growth_factor=SCALE_GROWTH,
                                   backoff_factor=SCALE_BACKOFF, growth_interval=SCALE_INTERVAL) if fp16 else None)
    batches = [(torch.from_numpy(x).to(dev), torch.from_numpy(y).long().to(dev)) for x, y in random_batches(bs, BATCHES)]

    def step(x, y):
        with torch.autocast(dev.type, dtype=dtype):
            logits = net(x)
        loss = F.nll_loss(F.log_softmax(logits.float(), dim=1), y)
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sgd = "SGD(fused=True) + GradScaler" if fp16 else "SGD (foreach)"
    return Loop(step, batches, sync, f"torch {torch.__version__}; autocast {math}; {sgd}", net)


def _jax_model(jx, jnp, cd):
    """The loss of the NHWC model with fp32 parameters computed in ``cd`` (the recipe above)."""
    lax = jx.lax

    def conv(x, k, b):
        y = lax.conv_general_dilated(x.astype(cd), k.astype(cd), (1, 1), ((1, 1), (1, 1)),
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jx.nn.relu((y + b).astype(cd))  # the fp32 bias added in fp32, the sum rounded
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def dense(x, k, b):
        return (lax.dot_general(x.astype(cd), k.astype(cd), (((1,), (0,)), ((), ()))) + b).astype(cd)

    def loss(p, x, y):
        h = conv(conv(x, *p["conv1"]), *p["conv2"])
        h = jx.nn.relu(dense(h.reshape(h.shape[0], -1), *p["fc1"]))
        z = dense(h, *p["fc2"]).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jx.nn.log_softmax(z, axis=-1), y[:, None], axis=1))
    return loss


def jax(bs: int, math: str, device: str) -> Loop:
    import jax as jx
    import jax.numpy as jnp
    import optax
    dev = jx.devices("gpu" if device == "gpu" else "cpu")[0]
    loss = _jax_model(jx, jnp, {"bf16": jnp.bfloat16, "fp16": jnp.float16}[math])
    w = init_weights()
    # HWIO kernels; fc1's rows permuted from the (c, h, w) flatten to NHWC's (h, w, c), as kernelmap's _to_flax
    fc1 = w["fc1"][0].reshape(128, 64, 7, 7).transpose(2, 3, 1, 0).reshape(3136, 128)
    params = jx.device_put({"conv1": (w["conv1"][0].transpose(2, 3, 1, 0), w["conv1"][1]),
                            "conv2": (w["conv2"][0].transpose(2, 3, 1, 0), w["conv2"][1]),
                            "fc1": (fc1, w["fc1"][1]), "fc2": (w["fc2"][0].T.copy(), w["fc2"][1])}, dev)
    opt = optax.sgd(LR, momentum=MOMENTUM)

    def plain(p, s, x, y):
        v, g = jx.value_and_grad(loss)(p, x, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, v

    def scaled(p, s, ls, x, y):
        scale, count = ls

        def scaled_loss(q):
            lo = loss(q, x, y)
            return lo * scale, lo
        (_, v), g = jx.value_and_grad(scaled_loss, has_aux=True)(p)
        g = jx.tree.map(lambda a: a / scale, g)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jx.tree.leaves(g)]))
        u, s2 = opt.update(g, s, p)
        p, s = jx.tree.map(lambda new, old: jnp.where(finite, new, old), (optax.apply_updates(p, u), s2), (p, s))
        count = jnp.where(finite, count + 1, 0)
        grow = count >= SCALE_INTERVAL
        scale = jnp.where(finite, jnp.where(grow, scale * SCALE_GROWTH, scale), scale * SCALE_BACKOFF)
        return p, s, (scale, jnp.where(grow, 0, count)), v

    st = {"state": (params, jx.device_put(opt.init(params), dev))}
    if math == "fp16":
        st["state"] += (jx.device_put((jnp.float32(SCALE_INIT), jnp.int32(0)), dev),)
        jstep = jx.jit(scaled, donate_argnums=(0, 1, 2))
    else:
        jstep = jx.jit(plain, donate_argnums=(0, 1))
    batches = [(jx.device_put(x.transpose(0, 2, 3, 1), dev), jx.device_put(y, dev)) for x, y in random_batches(bs, BATCHES)]

    def step(x, y):
        *state, st["loss"] = jstep(*st["state"], x, y)
        st["state"] = tuple(state)
        return st["loss"]
    return Loop(step, batches, lambda: jx.block_until_ready((st["state"], st["loss"])),
                f"jax {jx.__version__}; {math} compute, fp32 params and bias add; optax.sgd, jit, donated", st)


def mxnet(bs: int, math: str, device: str, hybridize: bool = False) -> Loop:
    if (math, device) not in (("fp16", "gpu"), ("bf16", "cpu")):
        raise SystemExit("mxnet: its AMP runs float16 on the GPU and bfloat16 on the CPU (oneDNN) only, as kernelmap's")
    # kernelmap's loader of the tree's libraries, and AMP's lists less what the tree lacks (not the workload)
    from kernelmap.frameworks.mxnet import amp_ops, built
    if os.environ.get("MXTREE"):
        built.preload(os.environ["MXTREE"])
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    from mxnet.contrib import amp
    from mxnet.gluon import nn
    dropped = amp_ops.start(mx, amp, {"bf16": "bfloat16", "fp16": "float16"}[math])
    if dropped:  # said, never silently
        print(amp_ops.dropped_line(dropped), file=sys.stderr, flush=True)
    ctx = mx.gpu(0) if device == "gpu" else mx.cpu()
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1, in_channels=1, activation="relu"), nn.MaxPool2D(2),
            nn.Conv2D(64, 3, padding=1, in_channels=32, activation="relu"), nn.MaxPool2D(2), nn.Flatten(),
            nn.Dense(128, in_units=3136, activation="relu"), nn.Dense(10, in_units=128))
    net.initialize(ctx=ctx)
    for block, (w, b) in zip((net[0], net[2], net[5], net[6]), init_weights().values(), strict=True):
        block.weight.set_data(nd.array(w, ctx=ctx))
        block.bias.set_data(nd.array(b, ctx=ctx))
    if hybridize:
        net.hybridize()
    lf = gluon.loss.SoftmaxCrossEntropyLoss()
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    fp16 = math == "fp16"
    if fp16:
        amp.init_trainer(tr)  # dynamic loss scaling (its own constants: 2**16, x0.5, x2 after 2000)
    batches = [(nd.array(x, ctx=ctx), nd.array(y, ctx=ctx, dtype="int32")) for x, y in random_batches(bs, BATCHES)]

    def step(x, y):
        with autograd.record():
            lo = lf(net(x), y)
            if fp16:
                with amp.scale_loss(lo, tr) as scaled:
                    pass
            else:
                scaled = lo
        scaled.backward()
        tr.step(x.shape[0])
        return lo.mean()
    note = f"; amp.init without {sum(map(len, dropped.values()))} operators not in this build" if dropped else ""
    return Loop(step, batches, nd.waitall, f"mxnet {mx.__version__}{' hybridized' if hybridize else ''}; "
                f"contrib.amp {math}{note}", net)


LOOPS = {"pytorch": pytorch, "jax": jax, "mxnet": mxnet,
         "mxnet-hybridized": lambda *a: mxnet(*a, hybridize=True)}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="bare mixed-precision loops of the seed CNN (see the module docstring)")
    p.add_argument("framework", choices=sorted(LOOPS))
    p.add_argument("math", choices=("bf16", "fp16"))
    p.add_argument("batch_sizes", type=int, nargs="*", default=[64, 1024])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (default 5: kernelmap run's default)")
    p.add_argument("--blocks", type=int, default=30, help=f"timed blocks of {BLOCK} steps (default 30)")
    a = p.parse_args(argv)
    if a.blocks < 1 or a.warmup < 0 or any(b < 1 for b in a.batch_sizes):
        p.error("--blocks must be >= 1, --warmup >= 0, batch sizes >= 1")
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.device == "gpu":
        os.environ["NVIDIA_TF32_OVERRIDE"] = "0"  # before any framework loads its CUDA libraries (spec.Math.apply)
    for bs in a.batch_sizes:
        loop = LOOPS[a.framework](bs, a.math, a.device)
        (samples, cpu), ver = timed(loop.step, loop.batches, loop.sync, a.warmup, a.blocks), loop.version
        q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
        print(json.dumps({"fw": a.framework, "math": a.math, "bs": bs, "device": a.device,
                          "median_ms": round(statistics.median(samples), 4), "iqr_ms": [round(q[0], 4), round(q[2], 4)],
                          "main_cpu_ms": round(statistics.median(cpu), 4),
                          "blocks": a.blocks, "block_steps": BLOCK, "warmup": a.warmup,
                          "samples_ms": [round(s, 4) for s in samples], "version": ver}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
