"""The MNIST CNN in PyTorch: an ``nn.Module`` run eagerly, SGD with momentum, torchvision data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import transforms

from kernelmap.errors import KernelmapError

from .. import spec
from ..data import synthetic_arrays
from . import custom_op


class Net(nn.Module):
    def __init__(self, custom=None):
        """``custom``: the loaded custom op (``custom_op.build.Ops``): fc1 then does its bias add and
        bias gradient by our kernels (``custom_op.function.CustomLinear``, same parameters)."""
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        if custom is None:
            self.fc1 = nn.Linear(64 * 7 * 7, 128)
        else:
            from .custom_op.function import CustomLinear

            self.fc1 = CustomLinear(64 * 7 * 7, 128, custom)
        self.fc2 = nn.Linear(128, spec.NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class Workload(spec.WorkloadBase):
    framework = "pytorch"

    def __init__(self, config: spec.TrainConfig, data_info=None, cache_dir=None):
        super().__init__(config, data_info, cache_dir)
        if config.device == "gpu":
            if not torch.cuda.is_available():
                raise KernelmapError("device gpu asked for, but torch.cuda.is_available() is False")
            self.device = torch.device("cuda", 0)
            tf32 = spec.Math(config.math).tf32  # PyTorch's defaults: TF32 convs, fp32 matmuls
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        else:
            self.device = torch.device("cpu")
        # issue 26: --custom-op ROUTE builds (once, cached) and loads kernelmap's own op for fc1
        route = config.options.get(custom_op.OPTION)
        self.custom = None
        if route:
            from .custom_op.build import load

            self.custom = load(route, cuda=self.device.type == "cuda")
        self.model = Net(self.custom).to(self.device)
        self.set_weights(spec.init_weights(config.seed))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)

    # --- versions, weights ---------------------------------------------------------------------
    def versions(self) -> dict[str, Any]:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "framework": "pytorch",
            "version": torch.__version__,
            "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
            "allow_tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
            "cublas": None,  # torch exposes no cuBLAS version
            "mkldnn": torch.backends.mkldnn.is_available(),
            "custom_op": self.custom.info() if self.custom is not None else None,
        }

    @contextlib.contextmanager
    def profile(self, out_dir):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as prof:
            yield
        prof.export_chrome_trace(str(Path(out_dir) / "trace.json.gz"))

    @contextlib.contextmanager
    def nsys_window(self):
        """cudaProfilerStart/Stop around the timed steps, and per-op NVTX ranges from emit_nvtx."""
        if self.device.type != "cuda":
            yield
            return
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        try:
            with torch.autograd.profiler.emit_nvtx(record_shapes=True):
                yield
            torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()

    def allocator_bytes(self) -> int | None:
        return int(torch.cuda.memory_reserved(self.device)) if self.device.type == "cuda" else None

    def threads(self) -> dict[str, Any]:
        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}

    def _params(self) -> dict[str, torch.Tensor]:
        named = dict(self.model.named_parameters())
        return {name: named[name] for name in spec.weight_names()}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        weights = spec.check_weights(weights)
        with torch.no_grad():
            for name, p in self._params().items():
                p.copy_(torch.from_numpy(np.ascontiguousarray(weights[name])))

    def get_weights(self) -> dict[str, np.ndarray]:
        return {name: p.detach().cpu().numpy().copy() for name, p in self._params().items()}

    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # --- data ---------------------------------------------------------------------------------
    def _make_dataset(self, split: str):
        info = self.data_info
        if info.synthetic:
            images, labels = synthetic_arrays(info.seed, split)
            x = torch.from_numpy(images).unsqueeze(1).float().div(255)
            return TensorDataset(x.sub(spec.PIXEL_MEAN).div(spec.PIXEL_STD), torch.from_numpy(labels))
        prepared = self.prepared_data()
        cls = getattr(torchvision.datasets, prepared.torchvision_class)
        transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize((spec.PIXEL_MEAN,), (spec.PIXEL_STD,))]
        )
        return cls(
            str(prepared.torchvision_root), train=split == "train", transform=transform, download=False
        )

    def batches(self, split: str, batch_size: int, order: np.ndarray) -> Iterator[tuple[Any, Any]]:
        loader = DataLoader(
            self.dataset(split),
            batch_size=batch_size,
            sampler=[int(i) for i in order],
            drop_last=False,
            pin_memory=self.device.type == "cuda",
        )
        for images, labels in loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    # --- compute ------------------------------------------------------------------------------
    def forward(self, images: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return self.model(images).cpu().numpy()

    def region(self, name: str):
        return self._ranges(name) if self.trace_regions else contextlib.nullcontext()

    @contextlib.contextmanager
    def _ranges(self, name: str):
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.profiler.record_function(name))
            if self.device.type == "cuda":
                stack.enter_context(torch.cuda.nvtx.range(name))
            yield

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.model.training:  # evaluate() leaves it in eval mode; a per-step train() walks every module
            self.model.train()
        with self.region("kernelmap:forward"):
            logits = self.model(images)
            loss = F.nll_loss(F.log_softmax(logits, dim=1), labels)
        with self.region("kernelmap:backward"):
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with self.region("kernelmap:optimizer"):
            self.optimizer.step()
        return loss.detach()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def evaluate(self, batch_size: int = 1000) -> float:
        self.model.eval()
        dataset = self.dataset("test")
        correct = 0
        with torch.no_grad():
            for images, labels in self.batches("test", batch_size, np.arange(len(dataset))):
                correct += int((self.model(images).argmax(dim=1) == labels).sum())
        return correct / len(dataset)
