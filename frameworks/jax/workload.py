"""The MNIST CNN in JAX: a Flax linen module, optax SGD with momentum, one jitted train step.

Written as JAX users write it: NHWC images, Flax ``nn.Conv``/``nn.Dense`` (kernels HWIO and
(in, out)), ``jax.value_and_grad`` of a loss function, ``optax.sgd`` and a ``jax.jit``-ed step
that returns the new parameters and optimizer state (their buffers donated).

The spec's neutral weights (docs/WEIGHTS.md) convert as follows, exactly and in both directions
(``_to_flax`` / ``_from_flax``):

- conv weights OIHW -> Flax HWIO (``transpose(2, 3, 1, 0)``);
- linear weights (out, in) -> Flax (in, out) (``.T``);
- fc1's inputs: the spec flattens C, H, W; the NHWC model flattens H, W, C. Instead of a runtime
  transpose, fc1's kernel rows are permuted once from (c, h, w) to (h, w, c) order, so the model
  computes the same function as the spec's with JAX's natural reshape.

Recipe: ``optax.sgd(lr, momentum)`` is ``trace(decay=momentum)`` then ``scale(-lr)``: t = g + m*t
(t starts at 0, so the first step's t is g), p -= lr*t: torch.optim.SGD's update (dampening 0, no
Nesterov). Loss: ``log_softmax`` then the mean negative log-likelihood of the labels.

Precision: ``jax_default_matmul_precision`` is set when a Workload is built from ``config.math``
(``spec.Math``): ``highest`` for fp32 (no TF32 on the GPU, no bf16 passes on the CPU, whatever the
mode), ``tensorfloat32`` for tf32 on the GPU; the setting is recorded in ``versions()``.

Regions: ``region()`` is a ``jax.profiler.TraceAnnotation`` (the host span ``kernelmap:step#N``).
The forward, backward and optimizer phases run inside one compiled XLA program: they are not host
regions and cannot be separated in time by the host. ``train_step`` therefore opens no phase
regions; the trace's XLA op metadata says the phase instead: ``jvp(...)`` forward,
``transpose(jvp(...))`` backward, and the update is wrapped in ``jax.named_scope(OPTIMIZER_SCOPE)``
(``kernelmap:optimizer`` in the op's name path).
"""

from __future__ import annotations

import contextlib
import gzip
import struct
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

from kernelmap.errors import KernelmapError

from .. import spec
from ..data import IMAGE_MAGIC, LABEL_MAGIC, SPLIT_FILES, synthetic_arrays
from . import parallel

# per spec.Math: fp32 computes convs and dots in fp32 ("highest": no TF32 on the GPU, no bf16 passes on
# the CPU); tf32 lets XLA use TF32 on the GPU (its own default). The CPU always gets fp32.
MATMUL_PRECISION = {spec.Math.FP32: "highest", spec.Math.TF32: "tensorfloat32"}
OPTIMIZER_SCOPE = "kernelmap:optimizer"
_FC1_CHW = (64, 7, 7)  # the spec's fc1 input: conv2's channels x pooled height x width


class CNN(nn.Module):
    """frameworks/spec.LAYERS, NHWC."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.max_pool(nn.relu(nn.Conv(32, (3, 3), padding=1, name="conv1")(x)), (2, 2), strides=(2, 2))
        x = nn.max_pool(nn.relu(nn.Conv(64, (3, 3), padding=1, name="conv2")(x)), (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # H, W, C order (see the module docstring)
        x = nn.relu(nn.Dense(128, name="fc1")(x))
        return nn.Dense(spec.NUM_CLASSES, name="fc2")(x)


def loss_fn(params, model: CNN, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, images)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


def _to_flax(weights: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    params: dict[str, dict[str, np.ndarray]] = {}
    for layer in spec.LAYERS:
        w = weights[f"{layer.name}.weight"]
        if layer.kind == "conv2d":
            kernel = w.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif layer.name == "fc1":
            out = w.shape[0]
            kernel = w.reshape(out, *_FC1_CHW).transpose(2, 3, 1, 0).reshape(-1, out)  # rows (h, w, c)
        else:
            kernel = w.T
        params[layer.name] = {"kernel": np.ascontiguousarray(kernel), "bias": weights[f"{layer.name}.bias"]}
    return params


def _from_flax(params) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for layer in spec.LAYERS:
        kernel = np.asarray(params[layer.name]["kernel"])
        if layer.kind == "conv2d":
            w = kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW
        elif layer.name == "fc1":
            c, h, wd = _FC1_CHW
            w = kernel.reshape(h, wd, c, -1).transpose(3, 2, 0, 1).reshape(kernel.shape[1], -1)
        else:
            w = kernel.T
        weights[f"{layer.name}.weight"] = np.ascontiguousarray(w, dtype=spec.WEIGHT_DTYPE)
        weights[f"{layer.name}.bias"] = np.array(params[layer.name]["bias"], dtype=spec.WEIGHT_DTYPE)
    return weights


def read_idx(path: Path) -> np.ndarray:
    """An MNIST IDX file (gzipped or not) as a uint8 array: images (N, 28, 28), labels (N,)."""
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as fh:
        data = fh.read()
    magic = struct.unpack(">I", data[:4])[0]
    if magic == IMAGE_MAGIC:
        n, rows, cols = struct.unpack(">III", data[4:16])
        shape, offset = (n, rows, cols), 16
    elif magic == LABEL_MAGIC:
        shape, offset = (struct.unpack(">I", data[4:8])[0],), 8
    else:
        raise KernelmapError(f"{path}: not an MNIST-format IDX file (magic {magic})")
    count = int(np.prod(shape))
    if len(data) - offset != count:
        raise KernelmapError(f"{path}: {len(data) - offset} bytes of data, the header says {count}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def normalise_images(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 NHWC, scaled to [0, 1] then normalised, in torchvision's order
    of float32 operations (ToTensor's ``/255``, Normalize's ``(x - mean) / std``)."""
    x = images.astype(np.float32) / np.float32(255)
    x = (x - np.float32(spec.PIXEL_MEAN)) / np.float32(spec.PIXEL_STD)
    return x[..., None]


class Workload(spec.WorkloadBase):
    framework = "jax"

    def __init__(self, config: spec.TrainConfig, data_info=None, cache_dir=None):
        super().__init__(config, data_info, cache_dir)
        math = spec.Math(config.math) if config.device == "gpu" else spec.Math.FP32
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[math])
        platform = "gpu" if config.device == "gpu" else "cpu"
        try:
            devices = jax.devices(platform)
        except RuntimeError as exc:
            raise KernelmapError(f"device {platform} asked for, but jax has no {platform} backend ({exc})") from exc
        self.device = devices[0]
        self.placement = parallel.placement(devices, config.devices)  # issue 39: N devices, each its slice
        self.model = CNN()
        self.tx = optax.sgd(config.lr, momentum=config.momentum)
        self._train_step = jax.jit(partial(_train_step, self.model, self.tx), donate_argnums=(0, 1))
        self._logits = jax.jit(lambda params, x: self.model.apply({"params": params}, x))
        self.set_weights(spec.init_weights(config.seed))
        self._last: Any = None
        self._last_batch: tuple[jax.Array, jax.Array] | None = None

    # --- versions, weights ---------------------------------------------------------------------
    def versions(self) -> dict[str, Any]:
        from jax._src.lib import cuda_versions  # the CUDA plugin's version queries; None without it

        gpu = self.device.platform == "gpu"
        return {
            "framework": "jax",
            "version": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "flax": flax.__version__,
            "optax": optax.__version__,
            "backend": self.device.platform,
            "device_kind": self.device.device_kind,
            "cuda": cuda_versions.cuda_runtime_get_version() if gpu and cuda_versions else None,
            "cudnn": cuda_versions.cudnn_get_version() if gpu and cuda_versions else None,
            "cublas": cuda_versions.cublas_get_version() if gpu and cuda_versions else None,
            "matmul_precision": jax.config.jax_default_matmul_precision,
            "execution_mode": "jit",
        }

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        weights = spec.check_weights(weights)
        self.params = jax.device_put(_to_flax(weights), self.placement.params)
        self.opt_state = jax.device_put(self.tx.init(self.params), self.placement.params)

    def get_weights(self) -> dict[str, np.ndarray]:
        return _from_flax(jax.device_get(self.params))

    def param_count(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params))

    # --- data ---------------------------------------------------------------------------------
    def _make_dataset(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        info = self.data_info
        if info.synthetic:
            images, labels = synthetic_arrays(info.seed, split)
        else:
            images_base, labels_base = SPLIT_FILES[split]
            root = Path(info.path)
            images = read_idx(root / info.files[images_base])
            labels = read_idx(root / info.files[labels_base])
        return normalise_images(images), labels.astype(np.int32)

    def batches(self, split: str, batch_size: int, order: np.ndarray) -> Iterator[tuple[Any, Any]]:
        images, labels = self.dataset(split)
        place = self.placement.train if split == "train" else self.placement.params
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            yield jax.device_put(images[idx], place), jax.device_put(labels[idx], place)

    # --- compute ------------------------------------------------------------------------------
    def forward(self, images: jax.Array) -> np.ndarray:
        return np.asarray(self._logits(self.params, images))

    def region(self, name: str):
        return jax.profiler.TraceAnnotation(name) if self.trace_regions else contextlib.nullcontext()

    def train_step(self, images: jax.Array, labels: jax.Array) -> jax.Array:
        self.params, self.opt_state, loss = self._train_step(self.params, self.opt_state, images, labels)
        self._last = (self.params, self.opt_state, loss)
        self._last_batch = (images, labels)
        return loss

    def synchronize(self) -> None:
        if self._last is not None:
            jax.block_until_ready(self._last)

    def evaluate(self, batch_size: int = 1000) -> float:
        images, labels = self.dataset("test")
        correct = 0
        for x, y in self.batches("test", batch_size, np.arange(len(labels))):
            correct += int(jnp.sum(jnp.argmax(self._logits(self.params, x), axis=1) == y))
        return correct / len(labels)

    def profile(self, out_dir):
        from .capture import profiler_trace

        return profiler_trace(out_dir, self)

    def compiled_hlo(self) -> dict[str, str]:
        """The optimised HLO text of the jitted train step for the shapes of the last batch it
        ran, keyed by the module name the profiler writes (``hlo_module``: ``jit_<function>``).
        XLA's CPU trace names only the HLO op of each thunk; this text holds each op's JAX name
        path. Compiled again from the same program and flags as the executable that ran (the
        tests check that every op of a recorded trace is found in it)."""
        if self._last_batch is None:
            raise KernelmapError("compiled_hlo: no train step has run yet")
        text = self._train_step.lower(self.params, self.opt_state, *self._last_batch).compile().as_text()
        name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule ") else "jit_train_step"
        return {name: text}


def _train_step(model: CNN, tx: optax.GradientTransformation, params, opt_state, images, labels):
    loss, grads = jax.value_and_grad(partial(loss_fn, model=model, images=images, labels=labels))(params)
    with jax.named_scope(OPTIMIZER_SCOPE):
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state, loss
