"""The framework-free workload spec: model, training recipe, weight file, data order.

Every framework's ``Workload`` implements ``WorkloadBase`` from this module and builds the model
described by ``LAYERS``. Nothing here imports torch or mxnet.

Weight file (docs/WEIGHTS.md): an ``.npz`` of float32 arrays named ``conv1.weight``,
``conv1.bias``, ... (``weight_names()``), in the neutral layout: conv weights OIHW
(out channels, in channels, kernel h, kernel w), linear weights (out features, in features),
biases 1-D. Both frameworks happen to store their parameters in exactly this layout
(``torch.nn.Conv2d``/``nn.Linear`` and Gluon ``Conv2D``/``Dense``), so no transposition is
needed on either side; the flatten before ``fc1`` is C, H, W order in both.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelmap.errors import KernelmapError

# --- the model -------------------------------------------------------------------------------
# conv 1->32 3x3 pad 1, relu, maxpool 2 -> conv 32->64 3x3 pad 1, relu, maxpool 2 -> flatten
# -> fc 3136->128, relu -> fc 128->10.
INPUT_SHAPE = (1, 28, 28)  # C, H, W
NUM_CLASSES = 10


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str  # conv2d | linear
    weight_shape: tuple[int, ...]  # neutral layout: conv OIHW, linear (out, in)
    bias_shape: tuple[int, ...]


LAYERS: tuple[Layer, ...] = (
    Layer("conv1", "conv2d", (32, 1, 3, 3), (32,)),
    Layer("conv2", "conv2d", (64, 32, 3, 3), (64,)),
    Layer("fc1", "linear", (128, 3136), (128,)),
    Layer("fc2", "linear", (10, 128), (10,)),
)
PARAM_COUNT = 421_642
assert sum(int(np.prod(x.weight_shape)) + int(np.prod(x.bias_shape)) for x in LAYERS) == PARAM_COUNT
POOL = 2  # each conv is followed by relu and a 2x2 max pool; each linear layer by relu (the last: log-softmax)


def activation_floats_per_image() -> int:
    """Values the forward pass makes per image: the input, each layer's output and its relu's, each pool's
    output and argmax indices (int64: two float32s each), the log-softmax. The base of the memory estimate
    of ``kernelmap/options.py`` (autograd keeps most of them for the backward, which makes their gradients)."""
    c, h, w = INPUT_SHAPE
    total = c * h * w
    for layer in LAYERS:
        if layer.kind == "conv2d":
            c = layer.weight_shape[0]
            total += 2 * c * h * w  # conv, relu
            h, w = h // POOL, w // POOL
            total += 3 * c * h * w  # pool output, its int64 indices
        else:
            total += 2 * layer.weight_shape[0]
    return total

# Normalisation applied to pixels after scaling to [0, 1] (the usual MNIST constants).
PIXEL_MEAN = 0.1307
PIXEL_STD = 0.3081


# --- the math mode ---------------------------------------------------------------------------
TF32_OVERRIDE = "NVIDIA_TF32_OVERRIDE"  # "0": cuBLAS, cuBLASLt and cuDNN never use TF32


@dataclass(frozen=True)
class LossScale:
    """Dynamic loss scaling, one rule for every framework's fp16 (docs/MIXED_PRECISION.md): the loss is
    multiplied by ``scale`` before the backward and the gradients divided by it before the update; a step whose
    gradients hold an inf or NaN is skipped and the scale multiplied by ``backoff``; after ``interval`` steps
    in a row without one it is multiplied by ``growth``. The values are PyTorch's GradScaler defaults, which
    MXNet's AMP (init 2**16, scale_window 2000, factor 2) and jmp's DynamicLossScale (period 2000, factor 2)
    share."""

    init: float = 2.0**16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000


LOSS_SCALE = LossScale()


class Math(enum.Enum):
    """The arithmetic every framework is held to, so that their convs and matmuls compare like with like.
    The frameworks' defaults differ (PyTorch: TF32 convs, fp32 matmuls; MXNet 1.9 on CUDA >= 11: TF32 cuBLAS
    GEMMs and cuDNN's default math; XLA: TF32 unless asked for "highest").

    ``FP32``: no TF32 anywhere: ``NVIDIA_TF32_OVERRIDE=0`` in every GPU worker's environment (cuBLAS,
    cuBLASLt and cuDNN honour it whatever the framework asks), and the switch of each framework that has
    one off (PyTorch's ``allow_tf32`` flags, XLA's ``highest`` precision; MXNet has none: the variable
    alone holds it). ``TF32``: TF32 allowed in every framework's convs and matmuls (PyTorch's and XLA's
    switches on, MXNet's defaults) and no ``NVIDIA_TF32_OVERRIDE`` in the worker's environment, even one
    inherited from the user's shell (``apply``). A GPU math: the CPU has no TF32.

    ``BF16`` and ``FP16``: mixed precision with fp32 master weights (docs/MIXED_PRECISION.md, one recipe for
    every framework): convs and linears compute in ``low_precision`` (bfloat16, float16), the loss, the
    log-softmax, the optimizer update and the weights stay float32; fp16 scales the loss (``loss_scaling``,
    ``LOSS_SCALE``), bf16 (fp32's exponent range) does not. Whatever is left in fp32 is held to strict fp32:
    ``apply`` sets ``NVIDIA_TF32_OVERRIDE=0`` as for ``FP32`` (the variable touches only fp32 operations, never
    a bf16 or fp16 GEMM or conv), and ``tf32`` is False, so that a tensor-core kernel in a bf16/fp16 case is of
    the precision asked for, and an fp32 GEMM that escaped the recipe shows as FP32, not TF32.

    The library logs' ``math_mode`` column shows what each call really ran; each result records the variable
    its worker saw (``tf32_override``). Which framework runs which math on which device: its descriptor's
    ``math_refusals`` (``frameworks.math_refusal``)."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def tf32(self) -> bool:
        """Whether the framework's TF32 switches are on (only ``TF32``)."""
        return self is Math.TF32

    @property
    def low_precision(self) -> str | None:
        """The dtype name convs and linears compute in under mixed precision (``bfloat16``, ``float16``: the
        name torch, numpy/ml_dtypes, JAX and MXNet share), None for fp32 and tf32 (float32 storage)."""
        return _LOW_PRECISION.get(self)

    @property
    def mixed(self) -> bool:
        """Mixed precision: low-precision compute with fp32 master weights."""
        return self.low_precision is not None

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is scaled (``LOSS_SCALE``): fp16 only (5 exponent bits: small gradients underflow)."""
        return self is Math.FP16

    @property
    def mantissa_bits(self) -> int:
        """Explicit mantissa bits of the convs' and linears' inputs (float32 23, TF32 10, bfloat16 7, float16 10):
        the unit roundoff is 2**-(bits + 1), the base of parity's tolerance (kernelmap/parity.py)."""
        return _MANTISSA_BITS[self]

    @property
    def gpu_only(self) -> bool:
        """A math no CPU has: TF32 (a tensor-core format). The runner skips it on the CPU with a note."""
        return self is Math.TF32

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as a GPU worker of this mode must get it (before any framework loads its libraries):
        fp32, bf16 and fp16 set ``NVIDIA_TF32_OVERRIDE=0`` (no TF32 for what runs in fp32); tf32 drops the
        variable, which would hold every library to fp32 under a tf32 label."""
        out = {k: v for k, v in env.items() if k != TF32_OVERRIDE}
        if self is not Math.TF32:
            out[TF32_OVERRIDE] = "0"
        return out


_LOW_PRECISION = {Math.BF16: "bfloat16", Math.FP16: "float16"}
_MANTISSA_BITS = {Math.FP32: 23, Math.TF32: 10, Math.BF16: 7, Math.FP16: 10}
MATH_DEFAULT = Math.FP32


# --- the training recipe ---------------------------------------------------------------------
@dataclass
class TrainConfig:
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    steps: int | None = 100  # training steps; None means run `epochs` epochs
    epochs: int | None = None
    warmup_steps: int = 5
    seed: int = 0
    data: str = "auto"  # auto | fashion-mnist | mnist | synthetic | a directory
    data_dir: str | None = None
    mode: str | None = None  # execution mode, one of the framework's descriptor's modes; None: its default
    device: str = "cpu"  # cpu | gpu (the device this worker actually uses)
    math: str = MATH_DEFAULT.value  # Math: what the convs and matmuls compute in (tf32: the GPU only)
    devices: int = 1  # devices the step is spread over (frameworks/dataparallel.py: each its slice of the batch)
    # this framework's own options (its descriptor's registry.Option names -> value), e.g. {"custom_op": "cmake"}
    options: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the framework interface -----------------------------------------------------------------
class WorkloadBase(abc.ABC):
    """What each framework implements, under the class name ``Workload``.

    Arrays crossing this interface are numpy (weights, logits); batches inside the training
    loop stay framework tensors on the device.
    """

    framework: str = ""
    # Whether ``region`` records its named ranges. The worker turns them off for the clean pass (no
    # profiler listens there, and four record_function + NVTX ranges a step cost PyTorch 5-8% of a
    # launch-bound step on an H200); capture passes keep them on (their traces need the ranges).
    trace_regions: bool = True

    def __init__(self, config: TrainConfig, data_info=None, cache_dir=None):
        """``data_info``: a ``data.DataInfo`` already resolved (else resolved from ``config`` on
        first use); ``cache_dir``: where ``data.prepare_dir`` lays the files out."""
        self.config = config
        self._data_info = data_info
        self._cache_dir = cache_dir

    @property
    def data_info(self):
        """The ``data.DataInfo`` this workload trains on (resolved lazily, raising if missing)."""
        if self._data_info is None:
            from .data import resolve_data

            self._data_info = resolve_data(self.config)
        return self._data_info

    def prepared_data(self):
        """The IDX files laid out for the framework loaders (``data.PreparedData``)."""
        from .data import prepare_dir

        return prepare_dir(self.data_info, self._cache_dir)

    def dataset(self, split: str):
        """The framework's dataset of ``split`` (train | test), built once by ``_make_dataset``."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be train or test, not {split!r}")
        cache = self.__dict__.setdefault("_datasets", {})
        if split not in cache:
            cache[split] = self._make_dataset(split)
        return cache[split]

    def _make_dataset(self, split: str):
        """Build the framework's dataset (its own loader over ``prepared_data()``, or synthetic arrays)."""
        raise NotImplementedError

    @abc.abstractmethod
    def versions(self) -> dict[str, Any]:
        """Framework, CUDA, cuDNN, cuBLAS versions as this framework reports them."""

    @abc.abstractmethod
    def profile(self, out_dir):
        """Context manager: the framework profiler around the timed steps of the framework pass; on
        exit it writes ``out_dir/trace.json.gz`` (and any companion file its adapter reads)."""

    def libs_trace(self, out_dir):
        """Context manager: in the libs pass (library logs on), the framework's own record of the kernels
        its timed steps launch, written under ``out_dir`` (``rundir.LIBS_TRACE_DIR``) on exit, so that each
        logged call owns its kernels in one process (``kernelmap/calllink.py``). The default records
        nothing: such a framework's kernels link to the logs by signature only."""
        import contextlib

        return contextlib.nullcontext()

    def nsys_window(self):
        """Context manager: the nsys capture window around the timed steps, of the kind its descriptor's
        ``nsys_window`` names (``registry.NsysWindow``: cudaProfilerStart/Stop, or a ``kernelmap:capture``
        NVTX range), and any per-op NVTX ranges. The default opens no window: the runner skips such a
        framework's nsys pass and says so."""
        import contextlib

        return contextlib.nullcontext()

    @property
    def mode(self) -> str:
        """How this workload executes its step (one of its descriptor's ``modes``, e.g. eager, imperative,
        hybridized, jit, cuda-graph): ``config.mode``, else the descriptor's first mode."""
        from . import get

        d = get(self.framework)
        mode = self.config.mode
        if mode is None:
            return d.default_mode
        if mode not in d.modes:
            raise KernelmapError(f"{d.label} has no mode {mode!r}; its modes: {', '.join(d.modes)}")
        return mode

    def math_notes(self) -> list[str]:
        """Where this workload's math runs here outside the library route it names (a line each, for the run's
        notes): e.g. PyTorch's bf16 on a CPU whose oneDNN has no bfloat16 runs ATen's own kernels, which no library
        log shows. [] (the default) where it runs as named."""
        return []

    def allocator_bytes(self) -> int | None:
        """Device memory the framework's allocator holds (reserved or in use, as it reports), or None."""
        return None

    def threads(self) -> dict[str, Any]:
        """CPU threads the framework itself says it uses (intra-op, inter-op, ...); {} where it
        exposes none (the worker records the thread environment beside it)."""
        return {}

    @abc.abstractmethod
    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load weights in the neutral layout (see ``weight_names``)."""

    @abc.abstractmethod
    def get_weights(self) -> dict[str, np.ndarray]:
        """Return weights in the neutral layout."""

    @abc.abstractmethod
    def batches(self, split: str, batch_size: int, order: np.ndarray) -> Iterator[tuple[Any, Any]]:
        """Yield (images, labels) on the device, in exactly the sample ``order`` given."""

    @abc.abstractmethod
    def forward(self, images: Any) -> np.ndarray:
        """Logits for a batch, as numpy (no gradient)."""

    @abc.abstractmethod
    def region(self, name: str):
        """Context manager: a named range in the framework profiler's trace (record_function /
        mx.profiler) and, on the GPU, an NVTX range. Names used: ``kernelmap:step#N``,
        ``kernelmap:forward``, ``kernelmap:backward``, ``kernelmap:optimizer``. A no-op
        (``contextlib.nullcontext()``) while ``trace_regions`` is False."""

    @abc.abstractmethod
    def train_step(self, images: Any, labels: Any) -> Any:
        """One SGD step, its phases wrapped in ``region('kernelmap:forward'|'kernelmap:backward'|
        'kernelmap:optimizer')``; returns the loss as a framework scalar (not synchronised)."""

    def to_float(self, value: Any) -> float:
        """A framework scalar (``train_step``'s loss) as a Python float, waiting for it: the array
        protocol here (numpy, JAX); a framework whose scalars are not arrays overrides it."""
        return float(np.asarray(value))

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all queued device work (torch.cuda.synchronize / mx.nd.waitall)."""

    @abc.abstractmethod
    def evaluate(self, batch_size: int = 1000) -> float:
        """Test-set accuracy in [0, 1]."""


def weight_names() -> list[str]:
    """Neutral weight names: conv1.weight, conv1.bias, ... in model order."""
    return [f"{layer.name}.{p}" for layer in LAYERS for p in ("weight", "bias")]


# --- initial weights and the weight file ----------------------------------------------------
WEIGHT_DTYPE = np.float32


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """Neutral weight name -> shape, in model order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in LAYERS:
        shapes[f"{layer.name}.weight"] = layer.weight_shape
        shapes[f"{layer.name}.bias"] = layer.bias_shape
    return shapes


def init_weights(seed: int) -> dict[str, np.ndarray]:
    """Deterministic initial weights, the distribution of torch's default initialisation.

    ``nn.Conv2d``/``nn.Linear`` use ``kaiming_uniform_(a=sqrt(5))`` for weights, which is
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases. fan_in is in*kh*kw for a
    conv and in_features for a linear layer. Drawn with numpy's PCG64 from ``seed`` in model order.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for layer in LAYERS:
        fan_in = int(np.prod(layer.weight_shape[1:]))
        bound = 1.0 / np.sqrt(fan_in)
        weights[f"{layer.name}.weight"] = rng.uniform(-bound, bound, layer.weight_shape).astype(WEIGHT_DTYPE)
        weights[f"{layer.name}.bias"] = rng.uniform(-bound, bound, layer.bias_shape).astype(WEIGHT_DTYPE)
    return weights


def check_weights(weights: dict[str, np.ndarray], source: str = "weights") -> dict[str, np.ndarray]:
    """Raise ``KernelmapError`` naming ``source`` unless names, shapes and dtype are the spec's."""
    shapes = weight_shapes()
    missing = [n for n in shapes if n not in weights]
    extra = sorted(n for n in weights if n not in shapes)
    if missing or extra:
        raise KernelmapError(
            f"{source}: weight names do not match the spec (missing {missing}, unexpected {extra})"
        )
    for name, shape in shapes.items():
        a = weights[name]
        if tuple(a.shape) != shape:
            raise KernelmapError(f"{source}: {name} has shape {tuple(a.shape)}, the spec says {shape}")
        if a.dtype != WEIGHT_DTYPE:
            raise KernelmapError(f"{source}: {name} has dtype {a.dtype}, the spec says float32")
        if not np.all(np.isfinite(a)):
            raise KernelmapError(f"{source}: {name} holds non-finite values")
    return {n: weights[n] for n in shapes}


def save_weights(path, weights: dict[str, np.ndarray]) -> None:
    """Write the weight file (``.npz``) atomically, after checking it against the spec."""
    from kernelmap.atomic import atomic_file

    weights = check_weights(weights, str(path))
    with atomic_file(path, "wb") as fh:
        np.savez(fh, **weights)


def load_weights(path) -> dict[str, np.ndarray]:
    """Read and validate a weight file; any problem raises ``KernelmapError`` naming the file."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            weights = {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise KernelmapError(f"{path}: weight file not found") from None
    except (OSError, ValueError) as exc:
        raise KernelmapError(f"{path}: not a readable .npz weight file ({exc})") from exc
    return check_weights(weights, str(path))


# --- data order ------------------------------------------------------------------------------
def sample_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``range(n)`` both frameworks visit in ``epoch`` (int64)."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def training_order(n: int, seed: int, n_samples: int) -> np.ndarray:
    """The first ``n_samples`` sample indices of training: epoch 0's order, then epoch 1's, ... Within epoch
    0's full batches the same samples as ``training_batches``, which runs and parity train on (it drops each
    epoch's partial batch); this one is for a first batch or a few."""
    if n <= 0:
        raise KernelmapError("the training set is empty")
    epochs = -(-n_samples // n)
    return np.concatenate([sample_order(n, seed, e) for e in range(max(epochs, 1))])[:n_samples]


# The partial-batch rule, one for every framework and mode (so that all see the same batches):
PARTIAL_BATCH_RULE = "dropped"
PARTIAL_BATCH_NOTE = ("each epoch's last partial batch is dropped, as DataLoader(drop_last=True) does: every step "
                      "trains on exactly --batch-size images, the shape CUDA graphs and compiled steps were made for")


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Full batches of ``batch_size`` in an epoch of ``n`` samples; KernelmapError where there is none."""
    if n <= 0:
        raise KernelmapError("the training set is empty")
    if not 1 <= batch_size <= n:
        raise KernelmapError(f"batch size {batch_size}: an epoch of {n:,} training images holds no full batch")
    return n // batch_size


def epoch_plan(n: int, batch_size: int) -> dict[str, Any]:
    """What the partial-batch rule makes of an epoch of ``n`` samples at ``batch_size`` (the manifest's record)."""
    per = steps_per_epoch(n, batch_size)
    return {"batch_size": batch_size, "steps_per_epoch": per, "images_per_epoch": per * batch_size,
            "dropped_per_epoch": n - per * batch_size, "train_images": n}


def training_batches(n: int, seed: int, batch_size: int, n_batches: int) -> np.ndarray:
    """The sample indices of the first ``n_batches`` training batches, one row each ((n_batches, batch_size)
    int64): epoch e's order (``sample_order``) cut into ``steps_per_epoch`` full batches, the last
    ``n % batch_size`` samples of each epoch dropped (``PARTIAL_BATCH_NOTE``); then epoch e + 1's."""
    per = steps_per_epoch(n, batch_size)
    used = per * batch_size
    epochs = max(-(-n_batches // per), 1)
    rows = [sample_order(n, seed, e)[:used].reshape(per, batch_size) for e in range(epochs)]
    return np.concatenate(rows)[:n_batches]
