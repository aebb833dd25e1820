"""PyTorch on N devices: ``DistributedDataParallel``, one process per device (issue 39).

The worker launches the N ranks (``frameworks/dataparallel.py``: ``launch``); each joins the process group
from the rendezvous variables (``env://``) over **gloo** on the CPU and **NCCL** on the GPU, where rank ``r``
trains on ``cuda:r``. Each rank reads its slice of every global batch (``dataparallel.rank_slice``) and
runs the model through DDP, whose bucketed all-reduces (hooks on the gradients) average the gradients over
the ranks during the backward; every rank then takes the same SGD step. Modes: eager and ``compile``
(torch.compile of the loss through DDP: TorchDynamo splits the graph at DDP's buckets). The CUDA-graph modes
are not run on N > 1 (``WHY_NOT``).

Kineto records each collective as a ``record_param_comms`` op (``c10d::allreduce_`` beneath it, with the
bucket's bytes in ``In msg nelems``) and names the rank in the trace's ``distributedInfo``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kernelmap.errors import KernelmapError

from .. import dataparallel

BACKEND = {"cpu": "gloo", "gpu": "nccl"}


def device(kind: str) -> torch.device:
    """This rank's device: ``cuda:<rank>`` on the GPU (every GPU visible to every rank, as NCCL's peer
    paths want), the CPU else."""
    return torch.device("cuda", dataparallel.rank()) if kind == "gpu" else torch.device("cpu")


def wrap(model: nn.Module, devices: int, kind: str) -> nn.Module:
    """``model`` in DDP over the process group of this rank (joined here, once)."""
    if dataparallel.world() != devices:
        raise KernelmapError(f"PyTorch on {devices} devices runs one process per device: this process is one of "
                             f"{dataparallel.world()} (start it through kernelmap's worker, which launches the ranks)")
    if not dist.is_initialized():
        dist.init_process_group(BACKEND[kind], init_method="env://", rank=dataparallel.rank(), world_size=devices)
    if kind == "gpu":
        torch.cuda.set_device(device(kind))
        return DistributedDataParallel(model, device_ids=[device(kind).index])
    return DistributedDataParallel(model)


def leave() -> None:
    """This rank out of the process group ``wrap`` joined (``dist.destroy_process_group``, as PyTorch asks before
    exit), where it is in one; called by the worker on a finished pass only (``worker.leave_group``)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _local_only(state, bucket):  # no annotations: DDP compares them to dist.GradBucket (these would be strings)
    """A DDP communication hook that reduces nothing: the default hook's division by the world size (kept, so
    that the step runs every kernel but the collective) and the bucket's own gradients as the result."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer().div_(dataparallel.world()))
    return fut


def drop_reduction(workload) -> None:
    """``workload``'s step without DDP's all-reduce (``dataparallel.NO_REDUCTION``): a communication hook that
    returns each bucket unreduced (``_local_only``); DDP's bucketing, its copies and the hooks still run.
    Registered before the first step (DDP allows one hook, set before any forward)."""
    module = workload.train_module
    if not isinstance(module, DistributedDataParallel):
        raise KernelmapError("the step without reduction needs several devices: this one trains on one")
    module.register_comm_hook(None, _local_only)


def global_mean(value: torch.Tensor) -> float:
    """A rank's loss (its slice's mean) as the global batch's mean loss: the mean over the ranks (an
    all-reduce outside the timed steps: the worker reads the loss after them)."""
    t = value.detach().clone().reshape(1).to(torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def backend_info() -> dict[str, Any]:
    return {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "rank": dist.get_rank()}
