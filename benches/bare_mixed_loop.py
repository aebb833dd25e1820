"""Bare mixed-precision training loops of the seed CNN on one GPU: the reference kernelmap's clean step at
--math bf16/fp16 is held against (issue 38: within 5% at bs 1024). No kernelmap code runs in the loop; the batch
is on the GPU before timing, as in kernelmap's synthetic-data clean pass.

    python benches/bare_mixed_loop.py FRAMEWORK MATH [BS ...]     FRAMEWORK: pytorch, jax, mxnet, mxnet-hybridized
                                                                   MATH: bf16 or fp16 (fp32 master weights)

Each framework's own recipe, written here from its documentation: PyTorch ``torch.autocast`` (+ ``GradScaler``
for fp16) with SGD(momentum 0.9); JAX fp32 parameters cast to the compute dtype inside the jitted step, loss and
update in fp32 (fp16: a static loss scale of 2**12); MXNet ``contrib.amp`` (float16 only on the GPU) with its
dynamic loss scaling. MXNet needs the sm_90 tree: MXTREE=<tree> PYTHONPATH=<tree>/python.

Timing: WARM steps, then BLOCKS blocks of BLOCK steps, each block ended by a device sync; one JSON line per batch
size with the median block's ms/step and the interquartile range over blocks.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

WARM, BLOCK, BLOCKS = 30, 10, 30
LR, MOMENTUM, JAX_FP16_SCALE = 0.01, 0.9, 2.0 ** 12


def timed(step, sync) -> list[float]:
    for _ in range(WARM):
        step()
    sync()
    out = []
    for _ in range(BLOCKS):
        t = time.perf_counter()
        for _ in range(BLOCK):
            step()
        sync()
        out.append((time.perf_counter() - t) / BLOCK * 1e3)
    return out


def pytorch(bs: int, math: str):
    import torch
    import torch.nn.functional as F
    from torch import nn
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[math]
    m = nn.Sequential(nn.Conv2d(1, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler("cuda", enabled=math == "fp16")
    x = torch.randn(bs, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (bs,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = F.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return timed(step, torch.cuda.synchronize), f"torch {torch.__version__}"


def jax(bs: int, math: str):
    import jax as jx
    import jax.numpy as jnp
    import optax
    cd = {"bf16": jnp.bfloat16, "fp16": jnp.float16}[math]
    scale = JAX_FP16_SCALE if math == "fp16" else 1.0
    ks = jx.random.split(jx.random.PRNGKey(0), 6)

    def he(k, shape, fan_in):
        return jx.random.normal(k, shape) * (2.0 / fan_in) ** 0.5
    params = dict(c1=he(ks[0], (32, 1, 3, 3), 9), b1=jnp.zeros(32), c2=he(ks[1], (64, 32, 3, 3), 288),
                  b2=jnp.zeros(64), f1=he(ks[2], (3136, 128), 3136), g1=jnp.zeros(128),
                  f2=he(ks[3], (128, 10), 128), g2=jnp.zeros(10))

    def conv(x, w, b):
        y = jx.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[None, :, None, None]

    def pool(x):
        return jx.lax.reduce_window(x, -jnp.inf, jx.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss(p, x, y):
        q = jx.tree.map(lambda a: a.astype(cd), p)
        h = pool(jx.nn.relu(conv(x.astype(cd), q["c1"], q["b1"])))
        h = pool(jx.nn.relu(conv(h, q["c2"], q["b2"])))
        h = jx.nn.relu(h.reshape(h.shape[0], -1) @ q["f1"] + q["g1"])
        z = (h @ q["f2"] + q["g2"]).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jx.nn.log_softmax(z), y[:, None], 1)) * scale

    opt = optax.sgd(LR, momentum=MOMENTUM)

    @jx.jit
    def jstep(p, s, x, y):
        v, g = jx.value_and_grad(loss)(p, x, y)
        g = jx.tree.map(lambda a: a / scale, g)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, v

    st = {"p": params, "s": opt.init(params)}
    x = jx.random.normal(ks[4], (bs, 1, 28, 28))
    y = jx.random.randint(ks[5], (bs,), 0, 10)

    def step():
        st["p"], st["s"], st["l"] = jstep(st["p"], st["s"], x, y)
    return timed(step, lambda: st["l"].block_until_ready()), f"jax {jx.__version__}"


def mxnet(bs: int, math: str, hybridize: bool = False):
    if math != "fp16":
        raise SystemExit("mxnet: contrib.amp runs float16 on the GPU; bf16 is its CPU target")
    from kernelmap.frameworks.mxnet import amp_ops, built
    built.preload(os.environ["MXTREE"])
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon, nd
    from mxnet.contrib import amp
    from mxnet.gluon import nn
    dropped = amp_ops.start(mx, amp, "float16")  # amp.init on the operators this build has (the sm_90 tree lacks
    if dropped:                                   # the legacy ones AMP's lists name): said, never silently
        print(amp_ops.dropped_line(dropped), file=sys.stderr, flush=True)
    ctx = mx.gpu(0)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, 1, 1, activation="relu"), nn.MaxPool2D(2, 2), nn.Conv2D(64, 3, 1, 1, activation="relu"),
            nn.MaxPool2D(2, 2), nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    lf = gluon.loss.SoftmaxCrossEntropyLoss()
    tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    amp.init_trainer(tr)
    rs = np.random.RandomState(0)
    x = nd.array(rs.randn(bs, 1, 28, 28).astype("float32"), ctx=ctx)
    y = nd.array(rs.randint(0, 10, bs).astype("float32"), ctx=ctx)

    def step():
        with autograd.record():
            lo = lf(net(x), y)
            with amp.scale_loss(lo, tr) as scaled:
                autograd.backward(scaled)
        tr.step(bs)
    note = f" (amp.init without {sum(map(len, dropped.values()))} operators not in this build)" if dropped else ""
    return timed(step, nd.waitall), f"mxnet {mx.__version__}{' hybridized' if hybridize else ''}{note}"


LOOPS = {"pytorch": pytorch, "jax": jax, "mxnet": mxnet,
         "mxnet-hybridized": lambda bs, math: mxnet(bs, math, hybridize=True)}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in LOOPS or argv[1] not in ("bf16", "fp16"):
        print(__doc__, file=sys.stderr)
        return 2
    fw, math, sizes = argv[0], argv[1], [int(a) for a in argv[2:]] or [64, 1024]
    for bs in sizes:
        blocks, ver = LOOPS[fw](bs, math)
        q = statistics.quantiles(blocks, n=4)
        print(json.dumps({"fw": fw, "math": math, "bs": bs, "median_ms": round(statistics.median(blocks), 4),
                          "iqr_ms": [round(q[0], 4), round(q[2], 4)], "blocks": BLOCKS, "block_steps": BLOCK,
                          "version": ver}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
