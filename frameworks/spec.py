"""The framework-free workload spec: model, training recipe, weight file, data order.

Every framework's ``Workload`` implements ``WorkloadBase`` from this module and builds the model
described by ``LAYERS``. Nothing here imports torch or mxnet.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
assert sum(int(np.prod(l.weight_shape)) + int(np.prod(l.bias_shape)) for l in LAYERS) == PARAM_COUNT

# Normalisation applied to pixels after scaling to [0, 1] (the usual MNIST constants).
PIXEL_MEAN = 0.1307
PIXEL_STD = 0.3081


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
    hybridize: bool = False  # Gluon only
    device: str = "cpu"  # cpu | gpu (the device this worker actually uses)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the framework interface -----------------------------------------------------------------
class WorkloadBase(abc.ABC):
    """What each framework implements, under the class name ``Workload``.

    Arrays crossing this interface are numpy (weights, logits); batches inside the training
    loop stay framework tensors on the device.
    """

    framework: str = ""

    def __init__(self, config: TrainConfig):
        self.config = config

    @abc.abstractmethod
    def versions(self) -> dict[str, Any]:
        """Framework, CUDA, cuDNN, cuBLAS versions as this framework reports them."""

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
        ``kernelmap:forward``, ``kernelmap:backward``, ``kernelmap:optimizer``."""

    @abc.abstractmethod
    def train_step(self, images: Any, labels: Any) -> Any:
        """One SGD step, its phases wrapped in ``region('kernelmap:forward'|'kernelmap:backward'|
        'kernelmap:optimizer')``; returns the loss as a framework scalar (not synchronised)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all queued device work (torch.cuda.synchronize / mx.nd.waitall)."""

    @abc.abstractmethod
    def evaluate(self, batch_size: int = 1000) -> float:
        """Test-set accuracy in [0, 1]."""


def weight_names() -> list[str]:
    """Neutral weight names: conv1.weight, conv1.bias, ... in model order."""
    return [f"{l.name}.{p}" for l in LAYERS for p in ("weight", "bias")]
