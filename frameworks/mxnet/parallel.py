"""MXNet Gluon on N devices: one process, N contexts, the Trainer's KVStore sums the gradients (issue 39).

Every parameter lives on each of the N contexts (``mx.cpu(i)`` on the CPU, ``mx.gpu(i)`` on the GPU); a
training batch is cut into N contiguous slices, one per context (``gluon.utils.split_and_load``: context
``r`` its slice ``[r * B/N, (r + 1) * B/N)`` of the global batch, ``frameworks/dataparallel.py``). Each
context computes its slice's losses and gradients; ``Trainer.step(B)`` pushes the N gradients of each
parameter into the KVStore, which sums them, and pulls the sum back to every context; each context then updates
its own copy from it (``update_on_kvstore=False``; Gluon's default for a ``device`` KVStore updates once in the
KVStore and pulls the weights). So the step without the KVStore (``drop_reduction``: each context updates from its
own gradients) is this step less the reduction alone: the same update kernels on every context, which issue 39's
independent measure of exposed communication needs (with the update in the KVStore, 4x H100 session 12 timed
the step without reduction at 8.56 ms against 5.07 ms with it: the update moved, not the communication).
The KVStore (``KVSTORE_OPTION``, MXNet's option ``--kvstore``): ``local`` on the CPU (sums in host memory);
on the GPU ``device`` (the default: peer copies and sum kernels on the GPUs, no NCCL) or ``nccl``, only
where the MXNet build has NCCL (``mx.runtime.Features``; ``kernelmap build-mxnet`` builds with
``USE_NCCL=OFF`` today, and the published cu112 wheel's build says what it has).

Everything here that runs on the device contexts uses only operators whose GPU kernels the sm_90 tree compiles
(``build.GPU_OPERATOR_SOURCES``, plus the .cu files outside ``src/operator``: the KVStore's copies and sums);
``tests/test_mxnet_fp16_gpu_ops.py`` records the operators the steps run on the CPU and checks each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernelmap.errors import KernelmapError

from .descriptor import KVSTORE_DEFAULT, KVSTORE_OPTION, KVSTORES

# isort: off
from .loaded import mx  # first: mxnet after its libraries (loaded.py)
from mxnet import autograd, gluon
# isort: on


def contexts(ctx: mx.Context, n: int) -> list[mx.Context]:
    """The ``n`` contexts of ``ctx``'s kind (``[ctx]`` for one)."""
    if n == 1:
        return [ctx]
    if ctx.device_type == "gpu":
        if mx.context.num_gpus() < n:
            raise KernelmapError(f"MXNet on {n} GPUs: it sees {mx.context.num_gpus()} (mx.context.num_gpus())")
        return [mx.gpu(i) for i in range(n)]
    return [mx.cpu(i) for i in range(n)]


def kvstore(options: dict[str, str], ctxs: list[mx.Context]) -> dict[str, Any]:
    """The Trainer's KVStore argument for ``ctxs``: {} on one context (Gluon's default, which makes none)."""
    if len(ctxs) == 1:
        return {}
    kind = ctxs[0].device_type
    name = options.get(KVSTORE_OPTION) or KVSTORE_DEFAULT[kind]
    if name not in KVSTORES[kind]:
        raise KernelmapError(f"MXNet --kvstore {name} on the {kind.upper()}: choose {' or '.join(KVSTORES[kind])}")
    if name == "nccl" and not mx.runtime.Features().is_enabled("NCCL"):
        raise KernelmapError("MXNet --kvstore nccl: this MXNet build has no NCCL (mx.runtime.Features: NCCL off; "
                             "kernelmap build-mxnet builds with USE_NCCL=OFF); use --kvstore device")
    return {"kvstore": name, "update_on_kvstore": False}


def drop_reduction(workload) -> None:
    """``workload``'s step without the KVStore (``dataparallel.NO_REDUCTION``): its Trainer made again with
    ``kvstore=None`` over the same parameters, optimizer and settings, so that ``Trainer.step`` pushes and pulls
    nothing and updates each context's copy from that context's own gradients (Gluon's per-context updaters)."""
    if len(workload.ctxs) == 1:
        raise KernelmapError("the step without reduction needs several devices: this one trains on one")
    workload.trainer = gluon.Trainer(workload.net.collect_params(), "sgd",
                                     {"learning_rate": workload.config.lr, "momentum": workload.config.momentum},
                                     kvstore=None)
    if workload.math.loss_scaling:  # fp16: AMP's loss scaling on the new Trainer too (as the workload's)
        from mxnet.contrib import amp

        amp.init_trainer(workload.trainer)


def split(loader, ctxs: list[mx.Context]):
    """(images, labels) of each global batch of ``loader`` as lists of slices, one per context."""
    for images, labels in loader:
        yield (gluon.utils.split_and_load(images, ctxs, even_split=True),
               gluon.utils.split_and_load(labels, ctxs, even_split=True))


def forward(net, images: list) -> np.ndarray:
    """Logits of a batch given as its slices (one per context; one slice on one device) as float32 on the host, the
    slices' in order: each context's logits cast there (AMP's are of its low dtype), copied to the host and joined by
    numpy. No ``Concat`` on a device context: the sm_90 tree has no GPU kernels for it (docs/mxnet-sm90.md)."""
    return np.concatenate([net(x).astype("float32", copy=False).asnumpy() for x in images], axis=0)


def train_step(w, images: list, labels: list):
    """One SGD step of workload ``w`` over the slices: each context's forward and backward, then the KVStore's
    sum and the update (``Trainer.step`` of the global batch: the summed gradients over B images)."""
    with w.region("kernelmap:forward"):
        with autograd.record():
            losses = [w.loss_fn(w.net(x), y) for x, y in zip(images, labels, strict=True)]
            scaled = [w.scaled_loss(loss) for loss in losses]  # times AMP's loss scale at fp16 (workload)
    with w.region("kernelmap:backward"):
        autograd.backward(scaled)
    with w.region("kernelmap:optimizer"):
        w.trainer.step(sum(x.shape[0] for x in images))
    return global_mean(losses, w.ctx)


def global_mean(losses: list, ctx: mx.Context):
    """The mean of the per-image ``losses`` of every context (one array each, its slice's), on ``ctx``: each context's
    sum (``sum``) copied to ``ctx`` and added there (``add_n``), over the global batch (``_div_scalar``); the mean of
    the slices joined, up to the order of the float32 additions. Only operators the sm_90 tree has GPU kernels for
    (docs/mxnet-sm90.md): ``Concat`` has none there, and the old ``concat(...).mean()`` stopped every MXNet
    case on N > 1 GPUs at its first step (4x H200, session 11: "Operator Concat is not implemented for GPU")."""
    total = mx.nd.add_n(*[loss.sum().as_in_context(ctx) for loss in losses])
    return total / sum(loss.shape[0] for loss in losses)
