"""The MNIST CNN in MXNet Gluon: a ``HybridSequential`` run imperatively (``hybridize()`` in its
hybridized mode), SoftmaxCrossEntropyLoss, ``gluon.Trainer('sgd')``, Gluon's MNIST datasets.

Mixed precision (``--math bf16|fp16``, docs/MIXED_PRECISION.md) is MXNet's AMP (``mxnet.contrib.amp``):
``amp.init(target_dtype)`` before the first forward wraps ``mx.nd``'s and ``mx.sym``'s operator functions, so
that Convolution and FullyConnected cast their inputs, weights and biases to the low dtype (``amp_cast``) in
both modes (imperative: the NDArray functions; hybridized: the symbol functions the CachedOp is traced from),
and its float32 list (log_softmax, softmax) casts back. The parameters stay float32 and amp_cast's backward
returns float32 gradients, so the optimizer updates float32 weights: the fp32 master weights that
``multi_precision`` keeps for ``net.cast('float16')`` networks, which this one is not. fp16 adds AMP's dynamic
loss scaling (``amp.init_trainer``; ``amp.scale_loss`` inside the recorded forward; ``Trainer.step`` checks
the gradients, skips the update and halves the scale on overflow). What this MXNet can run is decided by
its descriptor before any work (``MATH_REFUSALS``: bf16 is oneDNN's, the CPU's; fp16 CUDA's), and here
(``bf16_cpu_refusal``: bf16 needs an MXNet with oneDNN on a CPU with AVX-512).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kernelmap import gpuinfo
from kernelmap.errors import KernelmapError, MissingToolError

from .. import spec
from ..data import file_digest, synthetic_arrays
from ..peakrate import CPU_CASE
from . import amp_ops, built, cuda11
from .descriptor import HYBRIDIZED, MATH_REFUSALS, bf16_cpu_refusal

# isort: off
from .loaded import BUILT_TREE, PRELOAD, mx  # first: mxnet after its libraries (loaded.py)
from . import parallel  # imports mxnet
from mxnet import autograd, gluon
from mxnet.contrib import amp
from mxnet.gluon import nn
from mxnet.gluon.data.vision import transforms
# isort: on

_SPLIT_ATTRS = ("_train_data", "_train_label", "_test_data", "_test_label")
# AMP patches mxnet's operator functions for the whole process, once (amp.init ignores a second call): the
# target dtype it was started with, so that a Workload of another math in the same process is refused
AMP_STARTED: dict[str, str] = {}
# the operator names of AMP's lists this MXNet lacks (the sm_90 tree leaves legacy operators out), per list
AMP_DROPPED: dict[str, list[str]] = {}


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
        self.math = spec.Math(config.math)
        self._start_amp(config.device)
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
        if self.math.loss_scaling:
            amp.init_trainer(self.trainer)  # dynamic loss scaling: Trainer.step checks and skips on overflow

    def _start_amp(self, device: str) -> None:
        """AMP at this workload's math (nothing at fp32/tf32), or KernelmapError where this MXNet cannot run
        it here (``math_refusal``) or AMP already runs in this process at another dtype."""
        why = MATH_REFUSALS.get(device, {}).get(self.math.value)
        if self.math is spec.Math.BF16 and device == "cpu":
            why = why or bf16_cpu_refusal(mx.runtime.Features().is_enabled("MKLDNN"), gpuinfo.cpu_flags())
        if why:
            raise KernelmapError(f"--math {self.math.value}: {why}")
        target = self.math.low_precision
        started = AMP_STARTED.get("target_dtype")
        if started != target and started is not None:
            raise KernelmapError(f"--math {self.math.value}: MXNet's AMP already runs at {started} in this process "
                                 "(amp.init patches the operators process-wide, once): one math per process")
        if target is not None and started is None:
            AMP_DROPPED.update(amp_ops.start(mx, amp, target))  # the lists less what this MXNet lacks
            if AMP_DROPPED:
                print(amp_ops.dropped_line(AMP_DROPPED), file=sys.stderr, flush=True)
            AMP_STARTED["target_dtype"] = target

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
            **self._precision(),
        }

    def _precision(self) -> dict[str, Any]:
        """What the mixed-precision policy made of this run: AMP's target dtype (None: AMP off), the parameters'
        dtypes (float32), at fp16 the loss scale the next step will use, and the operators of AMP's lists this
        MXNet lacks (left out of amp.init: amp_ops)."""
        scaler = getattr(self.trainer, "_amp_loss_scaler", None)  # set by amp.init_trainer (fp16)
        return {"compute_dtype": self.math.low_precision or "float32", "amp_target_dtype": AMP_STARTED.get("target_dtype"),
                "param_dtypes": sorted({np.dtype(p.dtype).name for p in self.net.collect_params().values()}),
                "loss_scale": None if scaler is None else float(scaler.loss_scale),
                "amp_ops_not_in_build": {k: list(v) for k, v in AMP_DROPPED.items()}}

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
        # float32 on the host (AMP's logits are of its low dtype); a slice per context joined there (parallel.forward)
        return parallel.forward(self.net, images if isinstance(images, list) else [images])

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
                scaled = self.scaled_loss(loss)
        with self.region("kernelmap:backward"):
            scaled.backward()
        with self.region("kernelmap:optimizer"):
            self.trainer.step(images.shape[0])
        return loss.mean()

    def scaled_loss(self, loss):
        """``loss``, times AMP's loss scale at fp16 (``amp.scale_loss``, which also sets the Trainer's gradient
        rescale to 1/scale); called while recording, so that the product is differentiated."""
        if not self.math.loss_scaling:
            return loss
        with amp.scale_loss(loss, self.trainer) as scaled:
            return scaled

    def to_float(self, value: Any) -> float:
        return float(value.asscalar()) if hasattr(value, "asscalar") else super().to_float(value)

    def synchronize(self) -> None:
        mx.nd.waitall()

    def measure_peaks(self) -> dict[str, Any]:
        """The GPU's GEMM and copy peaks through MXNet (peaks.py; the counters pass's roofline)."""
        if self.ctx.device_type != "gpu":
            return {"not_measured": CPU_CASE}
        from .peaks import measure

        return measure(self.ctx)

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
