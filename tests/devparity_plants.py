"""A parity worker with a data-parallel fault planted in its N-device runs (tests/test_devices.py): run as
``python -m devparity_plants`` (``devparity.WORKER_MODULE``) with this folder on PYTHONPATH and the fault named
by ``PLANT_ENV``; it patches the framework in this process, then runs ``kernelmap.parity``'s worker as
``python -m kernelmap.parity`` would. A worker on one device (``--params``' devices 1) runs unchanged, so the
1-device run stays the reference.

The faults (``PLANTS``):
- ``scaled``: the step N x or 1/N of the right one, as each framework's API invites: PyTorch's DDP gradients summed
  by a communication hook that leaves out the division by the world size (N x); MXNet's ``Trainer.step`` told the
  slices' mean of the KVStore's sum, B x N images (1/N); JAX's step under ``shard_map`` with ``psum`` of the
  gradients where ``pmean`` belongs (N x);
- ``dropped``: the other ranks' gradients left out of the reduction, every rank stepping by rank 0's alone: DDP's
  hook broadcasts rank 0's bucket, MXNet's contexts get the first context's gradients before the KVStore's sum,
  JAX's step under ``shard_map`` sums device 0's gradients only;
- ``unread``: the last rank's slice of every global batch never read (that rank trains on rank 0's slice);
- ``late``: the last rank's slice taken from the next global batch (its data order one step ahead).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from functools import partial

PLANT_ENV = "KERNELMAP_TEST_DEVPARITY_PLANT"
PLANTS = ("scaled", "dropped", "unread", "late")


def _devices() -> int:
    return int(json.loads(sys.argv[sys.argv.index("--params") + 1]).get("devices", 1))


def _framework() -> str:
    return sys.argv[sys.argv.index("--worker") + 1]


def _plant_data(which: str, n: int) -> None:
    """Every global batch's last slice replaced (``unread``: by the first slice; ``late``: by the next batch's)."""
    from kernelmap.frameworks import spec

    real = spec.training_batches

    def batches(n_train, seed, batch_size, n_batches):
        rows = real(n_train, seed, batch_size, n_batches + 1).copy()
        b = batch_size // n
        last = slice((n - 1) * b, n * b)
        rows[:-1, last] = rows[:-1, :b] if which == "unread" else rows[1:, last]
        return rows[:-1]

    spec.training_batches = batches


def _summed_hook(state, bucket):  # DDP's allreduce_hook without its division by the world size
    import torch.distributed as dist

    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def _rank0_hook(state, bucket):  # rank 0's bucket to every rank: the others' gradients dropped
    import torch.distributed as dist

    return dist.broadcast(bucket.buffer(), src=0, async_op=True).get_future().then(lambda f: f.value()[0])


def _mxnet_first_context(w, step):
    """``Trainer.step`` after every context's gradients are overwritten by the first context's."""

    def first(batch_size, *a, **k):
        for p in w.net.collect_params().values():
            if p.grad_req != "null":
                grads = p.list_grad()
                for g in grads[1:]:
                    grads[0].copyto(g)
        return step(batch_size, *a, **k)

    return first


def _jax_step(w, n_state, which):
    import jax
    import optax
    from jax.sharding import PartitionSpec
    from kernelmap.frameworks.jax import parallel, workload

    def step(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(partial(workload.loss_fn, model=w.model, images=images,
                                                 labels=labels))(params)
        if which == "dropped":  # device 0's gradients alone
            first = jax.lax.axis_index(parallel.AXIS) == 0
            grads = jax.tree.map(lambda g: jax.lax.psum(jax.numpy.where(first, g, 0), parallel.AXIS), grads)
        else:
            grads = jax.lax.psum(grads, parallel.AXIS)  # the fault: pmean belongs here
        updates, opt_state = w.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, parallel.AXIS)

    spec_ = PartitionSpec()
    local = jax.shard_map(step, mesh=w.placement.train.mesh,
                          in_specs=(*(spec_,) * n_state, PartitionSpec(parallel.AXIS), PartitionSpec(parallel.AXIS)),
                          out_specs=spec_, check_vma=False)
    return jax.jit(local, donate_argnums=tuple(range(n_state)))


def _plant_step(framework: str, n: int, which: str) -> None:
    """Patch the framework's workload so that, once built, its step is ``which`` (``scaled``, ``dropped``)."""
    from kernelmap.frameworks import load_workload

    cls = load_workload(framework)
    real_init = cls.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if framework == "pytorch":
            self.train_module.register_comm_hook(None, _summed_hook if which == "scaled" else _rank0_hook)
        elif framework == "mxnet":
            step = self.trainer.step
            self.trainer.step = (_mxnet_first_context(self, step) if which == "dropped"
                                 else lambda batch_size, *a, **k: step(batch_size * n, *a, **k))
        else:
            self._train_step = _jax_step(self, 2, which)

    cls.__init__ = init


def main() -> None:
    which = os.environ.get(PLANT_ENV, "")
    if which not in PLANTS:
        raise SystemExit(f"{PLANT_ENV}={which!r}: choose from {PLANTS}")
    n = _devices()
    if n > 1:
        if which in ("scaled", "dropped"):
            _plant_step(_framework(), n, which)
        else:
            _plant_data(which, n)
    sys.argv[0] = "kernelmap.parity"
    runpy.run_module("kernelmap.parity", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
