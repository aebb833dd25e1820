"""The MNIST CNN in MXNet Gluon: a ``HybridSequential`` run imperatively (``hybridize()`` in its
hybridized mode), SoftmaxCrossEntropyLoss, ``gluon.Trainer('sgd')``, Gluon's MNIST datasets."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kernelmap.errors import KernelmapError, MissingToolError

from .. import spec
from ..data import file_digest, synthetic_arrays
from . import built, cuda11, parallel
from .descriptor import HYBRIDIZED

# Before mxnet loads: an MXNet built by `kernelmap build-mxnet` (the runner names its tree in the
# environment, and has put its python/ first on PYTHONPATH) gets its CUDA/cuDNN/BLAS libraries
# loaded; otherwise the CUDA 11 libraries of the nvidia-*-cu11 wheels (a no-op without them).
BUILT_TREE = os.environ.get(built.ENV_TREE)
PRELOAD = built.preload(BUILT_TREE) if BUILT_TREE else cuda11.preload()

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402
from mxnet.gluon.data.vision import transforms  # noqa: E402

_SPLIT_ATTRS = ("_train_data", "_train_label", "_test_data", "_test_label")


@contextlib.contextmanager
def profiler_scratch_file() -> Iterator[Path]:
    """A file for MXNet's profiler output where none is kept (the nsys and libs passes: nsys records the
    operator ranges), in a fresh private folder removed afterwards. Never ``os.devnull``: MXNet's
    ``profiler.set_config`` unlinks the file it is given (``Profiler::SetConfig``: ``::unlink(filename_)``),
    so as root it deleted /dev/null, and every process that opened /dev/null then failed (seen on the
    GPU machine: a torch.compile worker's ``FileNotFoundError: '/dev/null'``)."""
    folder = Path(tempfile.mkdtemp(prefix="kernelmap-mxprofile-"))
    try:
        yield folder / "profile.json"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def offline_dataset(cls, root: str, train: bool):
    """``cls`` (gluon FashionMNIST or MNIST) reading the local .gz files, never downloading.

    Gluon's ``_get_data`` calls ``gluon.utils.download`` with the SHA1 of the upstream .gz files and
    downloads on any mismatch. Local copies legitimately differ (Debian recompresses them; tests
    write their own), and the content is pinned by ``DataInfo.sha256`` instead, so the expected
    SHA1 is set to the local files' own before gluon's parser runs. A missing file raises here.
    """

    class Offline(cls):
        def _get_data(self):
            needed = _SPLIT_ATTRS[:2] if self._train else _SPLIT_ATTRS[2:]
            for attr in needed:
                name, _upstream_sha1 = getattr(self, attr)
                path = os.path.join(self._root, name)
                if not os.path.isfile(path):
                    raise KernelmapError(f"{path}: missing; gluon would try to download it")
                setattr(self, attr, (name, file_digest(path, "sha1")))
            super()._get_data()

    Offline.__name__ = Offline.__qualname__ = f"Offline{cls.__name__}"
    return Offline(root=root, train=train)


def _compute_capability(ctx) -> tuple[int, int] | None:
    """(major, minor) of ``ctx``'s GPU as mxnet reads it from the driver; None where mxnet cannot
    load the driver library under the name it tries (``libcuda.so``, a dev symlink)."""
    try:
        value = mx.util.get_cuda_compute_capability(ctx)
    except OSError:
        return None
    return divmod(int(value), 10)


class OrderSampler(gluon.data.Sampler):
    """Yields the sample indices of ``order``, as given."""

    def __init__(self, order: np.ndarray):
        self._order = [int(i) for i in order]

    def __iter__(self):
        return iter(self._order)

    def __len__(self):
        return len(self._order)


def build_net() -> nn.HybridSequential:
    net = nn.HybridSequential()
    net.add(
        nn.Conv2D(32, kernel_size=3, padding=1, in_channels=1, activation="relu"),
        nn.MaxPool2D(pool_size=2),
        nn.Conv2D(64, kernel_size=3, padding=1, in_channels=32, activation="relu"),
        nn.MaxPool2D(pool_size=2),
        nn.Flatten(),
        nn.Dense(128, in_units=64 * 7 * 7, activation="relu"),
        nn.Dense(spec.NUM_CLASSES, in_units=128),
    )
    return net


class Workload(spec.WorkloadBase):
    framework = "mxnet"

    def __init__(self, config: spec.TrainConfig, data_info=None, cache_dir=None):
        super().__init__(config, data_info, cache_dir)
        if config.device == "gpu":
            if mx.context.num_gpus() < 1:
                raise KernelmapError(
                    "device gpu asked for, but mxnet sees no GPU (mx.context.num_gpus() == 0)"
                )
            self.ctx = mx.gpu(0)
            self.compute_capability = _compute_capability(self.ctx)
            if self.compute_capability is not None:
                # the MXNet loaded here: the built tree (judged by its own library's archs), else the
                # cu11x wheel (sm <= 86)
                ok, message = built.loaded_verdict(self.compute_capability, BUILT_TREE)
                if not ok:
                    raise MissingToolError(f"mxnet on the GPU: {message}")
        else:
            self.ctx = mx.cpu()
            self.compute_capability = None
        self.ctxs = parallel.contexts(self.ctx, config.devices)  # issue 39: N contexts, each its slice
        self.net = build_net()
        self.net.initialize(ctx=self.ctxs)
        if self.mode == HYBRIDIZED:
            self.net.hybridize()
        self._layers = {"conv1": self.net[0], "conv2": self.net[2], "fc1": self.net[5], "fc2": self.net[6]}
        self.set_weights(spec.init_weights(config.seed))
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.trainer = gluon.Trainer(
            self.net.collect_params(), "sgd", {"learning_rate": config.lr, "momentum": config.momentum},
            **parallel.kvstore(config.options, self.ctxs),
        )

    # --- versions, weights ---------------------------------------------------------------------
    def versions(self) -> dict[str, Any]:
        features = mx.runtime.Features()
        libs = built.library_versions() if BUILT_TREE else cuda11.library_versions()
        return {
            "framework": "mxnet",
            "version": mx.__version__,
            "cuda_enabled": features.is_enabled("CUDA"),
            "cudnn_enabled": features.is_enabled("CUDNN"),
            "mkldnn": features.is_enabled("MKLDNN"),
            # reported by the preloaded CUDA libraries (built tree or CUDA 11 wheels); None without them
            "cuda": libs["cudart"],
            "cudnn": libs["cudnn"],
            "cublas": libs["cublas"],
            "preload": PRELOAD.describe(),
            "built_tree": BUILT_TREE,
            "compute_capability": list(self.compute_capability) if self.compute_capability else None,
        }

    def _params(self) -> dict[str, gluon.Parameter]:
        return {
            f"{layer}.{kind}": getattr(block, kind)
            for layer, block in self._layers.items()
            for kind in ("weight", "bias")
        }

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        weights = spec.check_weights(weights)
        for name, param in self._params().items():
            param.set_data(mx.nd.array(weights[name], ctx=self.ctx, dtype="float32"))

    def get_weights(self) -> dict[str, np.ndarray]:
        return {name: p.data(self.ctx).asnumpy() for name, p in self._params().items()}

    def param_count(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.net.collect_params().values())

    # --- data ---------------------------------------------------------------------------------
    def _make_dataset(self, split: str):
        info = self.data_info
        if info.synthetic:
            images, labels = synthetic_arrays(info.seed, split)
            dataset = gluon.data.ArrayDataset(
                mx.nd.array(images[..., None], dtype="uint8"), labels.astype(np.int32)
            )
        else:
            prepared = self.prepared_data()
            cls = gluon.data.vision.FashionMNIST if info.kind == "fashion-mnist" else gluon.data.vision.MNIST
            dataset = offline_dataset(cls, str(prepared.gluon_root), train=split == "train")
        transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize(spec.PIXEL_MEAN, spec.PIXEL_STD)]
        )
        return dataset.transform_first(transform)

    def batches(self, split: str, batch_size: int, order: np.ndarray) -> Iterator[tuple[Any, Any]]:
        loader = gluon.data.DataLoader(
            self.dataset(split), batch_size=batch_size, sampler=OrderSampler(order), last_batch="keep"
        )
        if split == "train" and len(self.ctxs) > 1:  # a list of slices, one per context
            yield from parallel.split(loader, self.ctxs)
            return
        for images, labels in loader:
            yield images.as_in_context(self.ctx), labels.as_in_context(self.ctx)

    # --- compute ------------------------------------------------------------------------------
    def forward(self, images) -> np.ndarray:
        if isinstance(images, list):
            return parallel.forward(self.net, images).asnumpy()
        return self.net(images).asnumpy()

    def region(self, name: str):
        return self._event(name) if self.trace_regions else contextlib.nullcontext()

    @contextlib.contextmanager
    def _event(self, name: str):
        # mx.profiler.Event is the range that shows as a named duration span ("ph": "B"/"E") on
        # the calling thread in the dumped chrome trace; Task gives async "b"/"e" events and Frame
        # "("/")" ones. It times the host thread: MXNet's engine runs the ops asynchronously.
        # On the GPU, MXNet emits NVTX ranges for its operators itself.
        event = mx.profiler.Event(name)
        event.start()
        try:
            yield
        finally:
            event.stop()

    def train_step(self, images, labels):
        if len(self.ctxs) > 1:
            return parallel.train_step(self, images, labels)
        with self.region("kernelmap:forward"):
            with autograd.record():
                loss = self.loss_fn(self.net(images), labels)
        with self.region("kernelmap:backward"):
            loss.backward()
        with self.region("kernelmap:optimizer"):
            self.trainer.step(images.shape[0])
        return loss.mean()

    def to_float(self, value: Any) -> float:
        return float(value.asscalar()) if hasattr(value, "asscalar") else super().to_float(value)

    def synchronize(self) -> None:
        mx.nd.waitall()

    def allocator_bytes(self) -> int | None:
        if self.ctx.device_type != "gpu":
            return None
        free, total = mx.context.gpu_memory_info(self.ctx.device_id)
        return int(total - free)

    @contextlib.contextmanager
    def nsys_window(self):
        """The ``kernelmap:capture`` NVTX range around the timed steps on the GPU (registry.NsysWindow.
        NVTX_RANGE: nsys records the whole process, the adapter keeps what starts inside it), with
        MXNet's profiler running: an MXNet built with NVTX by build-mxnet then opens one NVTX range per
        operator. The range closes after the last kernel has finished (waitall inside it)."""
        from kernelmap.adapters.canonical import CAPTURE_RANGE

        from . import built

        if self.ctx.device_type != "gpu" or not os.environ.get(built.ENV_TREE):
            yield  # no window: the runner skips MXNet's nsys pass without a built tree (descriptor)
            return

        with profiler_scratch_file() as sink:
            mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=str(sink))
            mx.nd.waitall()
            mx.profiler.set_state("run")
            try:
                with self._event(CAPTURE_RANGE):  # the window itself, whatever trace_regions says
                    yield
                    mx.nd.waitall()
            finally:
                mx.profiler.set_state("stop")

    def libs_trace(self, out_dir):
        """The libs pass runs under nsys (descriptor ``libs_under_nsys``): the same window as the nsys
        pass, so that its kernels and operator ranges are recorded beside the library logs."""
        return self.nsys_window()

    @contextlib.contextmanager
    def profile(self, out_dir):
        out_dir = Path(out_dir)
        raw = out_dir / "mxnet_profile.json"
        mx.profiler.set_config(profile_all=True, aggregate_stats=False, continuous_dump=False, filename=str(raw))
        mx.nd.waitall()
        mx.profiler.set_state("run")
        try:
            yield
            mx.nd.waitall()
        finally:
            mx.profiler.set_state("stop")
        mx.profiler.dump(finished=True)
        # One name for every framework's trace (the adapters sniff the format from the content).
        with open(raw, "rb") as fin, gzip.open(out_dir / "trace.json.gz", "wb") as fout:
            shutil.copyfileobj(fin, fout)
        raw.unlink()

    def evaluate(self, batch_size: int = 1000) -> float:
        dataset = self.dataset("test")
        correct = 0
        for images, labels in self.batches("test", batch_size, np.arange(len(dataset))):
            pred = self.net(images).argmax(axis=1).astype("int32")
            correct += int((pred == labels.astype("int32")).sum().asscalar())
        return correct / len(dataset)
