"""JAX on N devices: one process, the jitted step partitioned over a 1-D mesh of N devices (issue 39).

The weights and the optimizer state are replicated on every device of the mesh, a training batch is
sharded along its first axis (device ``r`` holds rows ``[r * B/N, (r + 1) * B/N)``: its slice of the global
batch, ``frameworks/dataparallel.py``). The train step is the 1-device step, jitted as before: XLA's SPMD
partitioner computes each device's part of the loss and gradients and inserts the all-reduce that sums the
gradients (a ``all-reduce`` HLO instruction in the compiled step, ``compiled_hlo``), so that every device
takes the same update. On the CPU the devices are XLA's host platform devices
(``--xla_force_host_platform_device_count=N`` in ``XLA_FLAGS``, set by the worker before jax is imported:
``HOST_DEVICES_FLAG``); on the GPU the first N GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernelmap.errors import KernelmapError

AXIS = "data"  # the mesh's one axis: the batch


@dataclass(frozen=True)
class Placement:
    """Where the workload puts its arrays: ``params`` (weights, optimizer state, evaluation batches) and
    ``train`` (a training batch). One device: both that device."""

    params: Any
    train: Any


def placement(devices: list, n: int) -> Placement:
    """The placements on the first ``n`` of ``devices`` (the platform's, in order)."""
    if n == 1:
        return Placement(devices[0], devices[0])
    if len(devices) < n:
        raise KernelmapError(f"JAX on {n} devices: this process sees {len(devices)} {devices[0].platform} device(s) "
                             "(on the CPU the worker sets XLA's host device count before jax is imported)")
    mesh = Mesh(np.array(devices[:n]), (AXIS,))
    return Placement(NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec(AXIS)))


def drop_reduction(workload) -> None:
    """``workload``'s step without XLA's all-reduce (``dataparallel.NO_REDUCTION``): the same step function,
    jitted under ``jax.shard_map`` over the same mesh (the weights and optimizer state replicated, the batch
    split along ``AXIS``) with no ``psum``, so that each device computes its slice's gradients and applies
    them to its own copy, and XLA inserts no collective (``check_vma=False``: the replicated outputs are taken
    as each device left them). The step's state arguments stay donated."""
    train = workload.placement.train
    if not isinstance(train, NamedSharding):
        raise KernelmapError("the step without reduction needs several devices: this one trains on one")
    # the workload's jitted step (``_train_step``: the only handle it keeps) and the function it jits
    step = workload._train_step.__wrapped__
    n_state = 2 if workload.loss_scale is None else 3  # params, optimizer state (, fp16's loss scale)
    local = jax.shard_map(step, mesh=train.mesh, in_specs=(*(PartitionSpec(),) * n_state, PartitionSpec(AXIS),
                                                            PartitionSpec(AXIS)),
                          out_specs=PartitionSpec(), check_vma=False)
    workload._train_step = jax.jit(local, donate_argnums=tuple(range(n_state)))
