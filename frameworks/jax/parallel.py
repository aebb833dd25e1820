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
