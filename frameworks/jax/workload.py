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

Mixed precision (``--math bf16|fp16``, docs/MIXED_PRECISION.md): the Flax layers compute in the math's
dtype (``nn.Conv``/``nn.Dense`` ``dtype=bfloat16|float16``: their inputs, kernels and biases cast at each
call) while the parameters, their gradients and the optimizer state stay float32 (``param_dtype``); relu
and max pool run in the low dtype between layers; the logits are cast to float32 before the log-softmax,
so the loss is float32. fp16 adds dynamic loss scaling by hand (``LossScale``: the loss times the scale,
the gradients divided by it, the step skipped and the scale halved where a gradient is not finite, doubled
after ``spec.LOSS_SCALE.interval`` finite steps), the policy of MXNet's AMP and PyTorch's GradScaler.
XLA's CPU compiler runs bf16 and fp16 convolutions and dots in float32 (it converts their rounded
operands): ``versions()['hlo_conv_dot']`` counts what the compiled step's convolutions and dots compute in.

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
from typing import Any, NamedTuple

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
from ..peakrate import CPU_CASE
from . import parallel
from .hlo import conv_dot_dtypes

# per spec.Math: fp32 computes convs and dots in fp32 ("highest": no TF32 on the GPU, no bf16 passes on
# the CPU); tf32 lets XLA use TF32 on the GPU (its own default; the CPU gets fp32). bf16 and fp16: the
# layers' operands are already of the low dtype, for which the flag asks nothing; XLA's default, as a JAX
# user of a mixed-precision policy has it.
MATMUL_PRECISION = {spec.Math.FP32: "highest", spec.Math.TF32: "tensorfloat32", spec.Math.BF16: "default",
                    spec.Math.FP16: "default"}
COMPUTE_DTYPES = {None: None, "bfloat16": jnp.bfloat16, "float16": jnp.float16}  # Math.low_precision
OPTIMIZER_SCOPE = "kernelmap:optimizer"
_FC1_CHW = (64, 7, 7)  # the spec's fc1 input: conv2's channels x pooled height x width


class CNN(nn.Module):
    """frameworks/spec.LAYERS, NHWC; ``dtype``: what the layers compute in (None: their inputs', float32),
    the parameters float32 whatever it is."""

    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        lp = {"dtype": self.dtype, "param_dtype": jnp.float32, "promote_dtype": fp32_bias}
        out = jnp.float32 if self.dtype is None else self.dtype  # each layer's output: the bias added in fp32, then this

        def conv(features: int, name: str, x: jax.Array) -> jax.Array:
            y = nn.Conv(features, (3, 3), padding=1, name=name, **lp)(x).astype(out)
            return nn.max_pool(nn.relu(y), (2, 2), strides=(2, 2))

        x = conv(64, "conv2", conv(32, "conv1", x))
        x = x.reshape((x.shape[0], -1))  # H, W, C order (see the module docstring)
        x = nn.relu(nn.Dense(128, name="fc1", **lp)(x).astype(out))
        return nn.Dense(spec.NUM_CLASSES, name="fc2", **lp)(x).astype(out)


def fp32_bias(inputs, kernel, bias, dtype=None):
    """Flax's ``promote_dtype`` hook of every layer: the input and the kernel cast to the compute ``dtype`` (None:
    float32, as they are), the float32 bias left float32. Flax's own casts the bias too and adds it to the rounded
    conv/dot output in the low dtype, so the transpose of that add, the bias gradient, is a ``reduce_sum`` of the
    low-precision output gradient accumulated in the low dtype (the HLO's ``reduce(f16[...])`` with an f16 add:
    50,176 terms for conv1 at batch 64), against the recipe's fp32 accumulation of every weight gradient. With the
    bias float32 the add is float32 (JAX promotes bf16 + f32), its transpose sums in float32, and the layer's
    output is rounded to ``dtype`` by the caller; the conv/dot and their gradients are of ``dtype`` as before."""
    if dtype is None:
        return inputs, kernel, bias
    return jnp.asarray(inputs, dtype), jnp.asarray(kernel, dtype), bias


def loss_fn(params, model: CNN, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, images).astype(jnp.float32)  # the loss in float32 at every math
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
        math = spec.Math(config.math)
        if config.device != "gpu" and math is spec.Math.TF32:
            math = spec.Math.FP32  # TF32 is the GPU's
        self.math = math
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[math])
        platform = "gpu" if config.device == "gpu" else "cpu"
        try:
            devices = jax.devices(platform)
        except RuntimeError as exc:
            raise KernelmapError(f"device {platform} asked for, but jax has no {platform} backend ({exc})") from exc
        self.device = devices[0]
        self.placement = parallel.placement(devices, config.devices)  # issue 39: N devices, each its slice
        self.model = CNN(dtype=COMPUTE_DTYPES[math.low_precision])
        self.tx = optax.sgd(config.lr, momentum=config.momentum)
        self.loss_scale: LossScale | None = None  # fp16's dynamic loss scale (set_weights starts it)
        if math.loss_scaling:
            self._train_step = jax.jit(partial(_scaled_train_step, self.model, self.tx), donate_argnums=(0, 1, 2))
        else:
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
            **self._precision(),
        }

    def _precision(self) -> dict[str, Any]:
        """What the mixed-precision policy made of this run: the layers' compute dtype, the parameters'
        (float32), the loss scale now (fp16), and at bf16/fp16 what the compiled step's convolutions and dots
        compute in (``conv_dot_dtypes``: XLA's CPU compiler runs them in float32); None before any step, and
        at fp32/tf32 (their dtype is float32 by construction; counting costs a compile)."""
        leaves = jax.tree_util.tree_leaves(self.params)
        counted = None
        if self.math.mixed and self._last_batch is not None:
            counted = conv_dot_dtypes(next(iter(self.compiled_hlo().values())))
        return {"compute_dtype": self.math.low_precision or "float32",
                "param_dtypes": sorted({str(x.dtype) for x in leaves}),
                "loss_scale": None if self.loss_scale is None else float(self.loss_scale.scale),
                "hlo_conv_dot": counted}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        weights = spec.check_weights(weights)
        self.params = jax.device_put(_to_flax(weights), self.placement.params)
        self.opt_state = jax.device_put(self.tx.init(self.params), self.placement.params)
        if self.math.loss_scaling:  # a fresh start: the initial scale, no finite steps counted
            self.loss_scale = jax.device_put(LossScale.initial(), self.placement.params)

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
        return np.asarray(self._logits(self.params, images), dtype=np.float32)  # bf16/fp16 logits as float32

    def region(self, name: str):
        return jax.profiler.TraceAnnotation(name) if self.trace_regions else contextlib.nullcontext()

    def _state(self) -> tuple:
        """The train step's state arguments (donated): parameters, optimizer state (and fp16's loss scale)."""
        return (self.params, self.opt_state) if self.loss_scale is None else (
            self.params, self.opt_state, self.loss_scale)

    def train_step(self, images: jax.Array, labels: jax.Array) -> jax.Array:
        if self.loss_scale is None:
            self.params, self.opt_state, loss = self._train_step(*self._state(), images, labels)
        else:
            self.params, self.opt_state, self.loss_scale, loss = self._train_step(*self._state(), images, labels)
        self._last = (self._state(), loss)
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

    def measure_peaks(self) -> dict[str, Any]:
        """The GPU's GEMM and copy peaks through XLA (peaks.py; the counters pass's roofline)."""
        if self.device.platform != "gpu":
            return {"not_measured": CPU_CASE}
        from .peaks import measure

        return measure(self.device, MATMUL_PRECISION)

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
        text = self._train_step.lower(*self._state(), *self._last_batch).compile().as_text()
        name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule ") else "jit_train_step"
        return {name: text}


def _train_step(model: CNN, tx: optax.GradientTransformation, params, opt_state, images, labels):
    loss, grads = jax.value_and_grad(partial(loss_fn, model=model, images=images, labels=labels))(params)
    with jax.named_scope(OPTIMIZER_SCOPE):
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state, loss


class LossScale(NamedTuple):
    """fp16's dynamic loss scale (a pytree of two device scalars), the rule of PyTorch's GradScaler and MXNet's
    AMP with their constants (``spec.LOSS_SCALE``): start at ``init``; where a step's gradients are all finite,
    count it, and after ``interval`` such steps in a row multiply the scale by ``growth``; where one is
    not (inf or nan), skip the step's update and multiply the scale by ``backoff``."""

    scale: jax.Array  # float32
    finite_steps: jax.Array  # int32: finite steps in a row since the scale last changed

    @staticmethod
    def initial() -> LossScale:
        return LossScale(jnp.float32(spec.LOSS_SCALE.init), jnp.int32(0))

    def after(self, finite: jax.Array) -> LossScale:
        """The scale for the next step, given whether this step's gradients were all finite."""
        rule = spec.LOSS_SCALE
        count = jnp.where(finite, self.finite_steps + 1, 0)
        grow = count >= rule.interval
        scale = jnp.where(finite, jnp.where(grow, self.scale * rule.growth, self.scale), self.scale * rule.backoff)
        return LossScale(scale.astype(jnp.float32), jnp.where(grow, 0, count).astype(jnp.int32))


def _scaled_train_step(model: CNN, tx: optax.GradientTransformation, params, opt_state, loss_scale: LossScale,
                       images, labels):
    """``_train_step`` with dynamic loss scaling (fp16): the gradients of the loss times the scale, divided by
    it in float32; the update kept only where every gradient is finite (``LossScale``)."""
    def scaled(p):
        loss = loss_fn(p, model, images, labels)
        return loss * loss_scale.scale, loss

    (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(params)
    with jax.named_scope(OPTIMIZER_SCOPE):
        grads = jax.tree_util.tree_map(lambda g: g / loss_scale.scale, grads)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]))
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(finite, new, old), (new_params, new_opt_state), (params, opt_state))
    return params, opt_state, loss_scale.after(finite), loss
