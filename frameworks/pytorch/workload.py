"""The MNIST CNN in PyTorch: an ``nn.Module``, SGD with momentum, torchvision data; run in one of the
descriptor's modes: eager, the whole step as one CUDA graph (``cuda-graph``), ``torch.compile`` default
(``compile``) or reduce-overhead with the optimizer step compiled too (``compile-graphs``).

Mixed precision (``--math bf16|fp16``, docs/MIXED_PRECISION.md): the model's forward under ``torch.autocast``
(convs and linears in bfloat16/float16, their backward too), the logits cast to float32 before log-softmax and the
loss, float32 parameters and SGD update. fp16 scales the loss with ``torch.amp.GradScaler`` (``spec.LOSS_SCALE``)
and a fused SGD (``SGD(fused=True)``: its ``_step_supports_amp_scaling`` makes GradScaler hand it ``grad_scale`` and
``found_inf`` as tensors, so the unscale and the skip of a step with inf/NaN gradients run on the device, with no
``.item()`` sync; ``GradScaler.update`` is ``torch._amp_update_scale_``, a device op). The whole scaled step is
therefore free of host syncs and is captured as it is: in the cuda-graph mode's graph and in compile-graphs'
compiled optimizer step (scaler step and update), each replay checking, skipping and rescaling on the device."""

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
from kernelmap.rundir import GRAPH_REFERENCE as GRAPH_REFERENCE_FILE

from .. import dataparallel, spec
from ..data import synthetic_arrays
from ..peakrate import CPU_CASE
from . import custom_op, parallel
from .descriptor import COMPILE, COMPILE_GRAPHS, CUDA_GRAPH, GRAPH_WARMUP

GRAPH_REFERENCE = "kernelmap:graph-reference"  # the region of the eager reference step (GRAPH_REFERENCE_FILE)


def init_momentum_buffers(optimizer: torch.optim.SGD) -> None:
    """SGD's momentum buffers made before the first step, as zeros. SGD makes them lazily
    (``clone(grad)`` in the first step); inside a reduce-overhead compiled step that made them outputs
    of a CUDA graph, which the next step's replay overwrote, and the recompiled step then failed on the
    GPU ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"). The
    arithmetic is the same: with dampening 0 the first step's ``buf * momentum + grad`` is ``grad``."""
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        if group["dampening"] != 0:
            raise KernelmapError("init_momentum_buffers: zero buffers match SGD's first step only without dampening")
        for p in group["params"]:
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


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
        self.math = spec.Math(config.math)
        self.amp_dtype = getattr(torch, self.math.low_precision) if self.math.mixed else None  # autocast's dtype
        if config.device == "gpu":
            if not torch.cuda.is_available():
                raise KernelmapError("device gpu asked for, but torch.cuda.is_available() is False")
            self.device = torch.device("cuda", dataparallel.rank())  # rank r of a multi-GPU case: cuda:r
            tf32 = spec.Math(config.math).tf32  # PyTorch's defaults: TF32 convs, fp32 matmuls
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        else:
            self.device = torch.device("cpu")
        # issue 26: --custom-op ROUTE builds (once, cached) and loads kernelmap's own op for fc1
        route = config.options.get(custom_op.OPTION)
        self.custom = None
        if route and self.math.mixed:
            raise KernelmapError(f"--custom-op {route} with --math {self.math.value}: kernelmap's custom op computes in "
                                 "float32 only (kernelmap_custom.cpp: check_float)")
        if self.math.loss_scaling and self.device.type != "cuda":  # refused before (descriptor.MATH_REFUSALS)
            raise KernelmapError(f"PyTorch --math {self.math.value} runs on the GPU only; this worker runs on the CPU")
        if route:
            from .custom_op.build import load

            self.custom = load(route, cuda=self.device.type == "cuda")
        self.model = Net(self.custom).to(self.device)
        # issue 39: on N devices the step runs the model through DDP (parallel.py); the weights stay self.model's
        self.train_module = (parallel.wrap(self.model, config.devices, config.device) if config.devices > 1
                             else self.model)
        self.set_weights(spec.init_weights(config.seed))
        mode = self.mode
        if mode in (CUDA_GRAPH, COMPILE_GRAPHS) and self.device.type != "cuda":
            raise KernelmapError(f"PyTorch mode {mode} needs a GPU; this worker runs on the CPU")
        self._graph: torch.cuda.CUDAGraph | None = None  # cuda-graph: the captured step
        self._static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # its images, labels, loss
        self._eager_steps = 0  # cuda-graph: warm-up steps run before the capture
        self._loss_fn = self._loss
        self._compiled = False  # compile modes: whether the first (compiling) call was made
        self._twins = None  # compile-graphs: default-mode twins of the compiled loss and optimizer step
        self._last_batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.use_loss_scaling(self.math.loss_scaling)  # the optimizer (and fp16's GradScaler)
        if mode in (COMPILE, COMPILE_GRAPHS):
            self._loss_fn = torch.compile(self._loss, mode="reduce-overhead" if mode == COMPILE_GRAPHS else None)

    def use_loss_scaling(self, on: bool) -> None:
        """The optimizer, and with ``on`` fp16's loss scaling (``spec.LOSS_SCALE``): a GradScaler and a fused SGD that
        takes its scale and inf flag as tensors (the module's docstring), its step and update as one optimizer step.
        Made before the first step; fp16 turns it on, and on the CPU a test turns it on under bf16 (the scaler's
        arithmetic is the same; CPU fp16 is refused). compile-graphs compiles the optimizer step (reduce-overhead)."""
        if self._compiled or self._graph is not None or self._eager_steps:
            raise KernelmapError("use_loss_scaling: the optimizer is made before the first step")
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config.lr, momentum=self.config.momentum,
                                         fused=True if on else None)
        s = spec.LOSS_SCALE
        self.scaler = (torch.amp.GradScaler(self.device.type, init_scale=s.init, growth_factor=s.growth,
                                            backoff_factor=s.backoff, growth_interval=s.interval) if on else None)
        self._plain_opt_step = self._scaled_step if on else self.optimizer.step
        self._opt_step = self._plain_opt_step
        if self.mode == COMPILE_GRAPHS:  # the optimizer step inside a compiled region, replayed as graphs too
            self._opt_step = torch.compile(self._plain_opt_step, mode="reduce-overhead")
            init_momentum_buffers(self.optimizer)

    def _scaled_step(self) -> None:
        """fp16's optimizer step: unscale, skip on inf/NaN (in the fused SGD, on the device), rescale."""
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def autocast(self):
        """The mixed-precision region of the forward (``torch.autocast`` to ``amp_dtype``); none under fp32/tf32."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def activation_dtypes(self, images: torch.Tensor) -> dict[str, str]:
        """What each layer's forward output is computed in (a forward with hooks, no gradient): {layer: dtype}
        plus the logits after the cast before log-softmax (``loss_input``): the math asked for, measured."""
        seen: dict[str, str] = {}

        def hook(name):
            def record(module, inputs, output):
                seen[name] = str(output.dtype).removeprefix("torch.")
            return record

        handles = [getattr(self.model, layer.name).register_forward_hook(hook(layer.name)) for layer in spec.LAYERS]
        try:
            with torch.no_grad():
                seen["loss_input"] = str(self._logits(images).dtype).removeprefix("torch.")
        finally:
            for h in handles:
                h.remove()
        return seen

    def math_notes(self) -> list[str]:
        """bf16 on a CPU whose oneDNN has no bfloat16 (torch.ops.mkldnn._is_mkldnn_bf16_supported(): AVX-512
        (avx512_core) or AMX): autocast still casts, but PyTorch sends no bf16 convolution or matmul to oneDNN (its
        mkldnn_bf16_device_check), so the case's libs pass logs no call (seen on an AMD EPYC with AVX2: 0 oneDNN
        executions, the step 7x the fp32 one)."""
        if self.device.type != "cpu" or self.amp_dtype is not torch.bfloat16:
            return []
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return []
        return [f"bf16 on this CPU ({torch.backends.cpu.get_cpu_capability()}) runs outside oneDNN: PyTorch's oneDNN "
                "has no bfloat16 here (torch.ops.mkldnn._is_mkldnn_bf16_supported() is False: it needs AVX-512 "
                "(avx512_core) or AMX), so its bf16 convolutions and matmuls run ATen's own kernels, which no library "
                "log shows: this case has no library call"]

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
            "autocast": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype is not None else None,
            "grad_scaler": (None if self.scaler is None else  # its scale now: after the steps run so far
                            {"init_scale": spec.LOSS_SCALE.init, "scale": self.scaler.get_scale(),
                             "growth_factor": self.scaler.get_growth_factor(),
                             "backoff_factor": self.scaler.get_backoff_factor(),
                             "growth_interval": self.scaler.get_growth_interval(), "optimizer": "SGD(fused=True)"}),
        }

    @contextlib.contextmanager
    def profile(self, out_dir):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        if self.mode in (CUDA_GRAPH, COMPILE_GRAPHS):  # the replayed kernels' twins under their ops (graph_replay)
            self._prepare_reference()  # outside the profiler: nothing but the reference step in its file
            with profile(activities=activities, record_shapes=True) as ref:
                self.graph_reference_step()
            ref.export_chrome_trace(str(Path(out_dir) / GRAPH_REFERENCE_FILE))
        with profile(activities=activities, record_shapes=True) as prof:
            yield
        prof.export_chrome_trace(str(Path(out_dir) / "trace.json.gz"))

    def libs_trace(self, out_dir):
        """On the GPU, Kineto over the libs pass's timed steps (``out_dir/trace.json.gz``): its kernels and
        the cuDNN/cuBLAS log of the same process are linked call by call (kernelmap/calllink.py)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return self.profile(out_dir)

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

    def measure_peaks(self) -> dict[str, Any]:
        """The GPU's GEMM and copy peaks through PyTorch (peaks.py; the counters pass's roofline)."""
        if self.device.type != "cuda":
            return {"not_measured": CPU_CASE}
        from .peaks import measure

        return measure(self.device)

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
        if split == "train" and self.config.devices > 1:  # this rank's slice of each global batch
            order, batch_size = dataparallel.rank_slice(order, batch_size, dataparallel.rank(), self.config.devices)
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
    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        """The model's logits, its forward in the case's precision (``autocast``), cast to float32."""
        with self.autocast():
            logits = self.train_module(images) if self.model.training else self.model(images)
        return logits.float()

    def forward(self, images: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            with self.autocast():
                logits = self.model(images)
            return logits.float().cpu().numpy()

    def region(self, name: str):
        return self._ranges(name) if self.trace_regions else contextlib.nullcontext()

    @contextlib.contextmanager
    def _ranges(self, name: str):
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.profiler.record_function(name))
            if self.device.type == "cuda":
                stack.enter_context(torch.cuda.nvtx.range(name))
            yield

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss in float32: the forward in the case's precision, log-softmax and NLL on float32 logits."""
        return F.nll_loss(F.log_softmax(self._logits(images), dim=1), labels)

    def _step(self, images: torch.Tensor, labels: torch.Tensor, zero_grad: bool = True) -> torch.Tensor:
        """Forward, backward and the optimizer step (eager, or the compiled loss and optimizer step)."""
        with self.region("kernelmap:forward"):
            loss = self._loss_fn(images, labels)
        with self.region("kernelmap:backward"):
            if zero_grad:
                self.optimizer.zero_grad(set_to_none=True)
            self._backward(loss)
        with self.region("kernelmap:optimizer"):
            self._opt_step()
        return loss

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.model.training:  # evaluate() leaves it in eval mode; a per-step train() walks every module
            self.model.train()
        if self.mode == CUDA_GRAPH:
            return self._graph_step(images, labels)
        if self.mode in (COMPILE, COMPILE_GRAPHS) and not self._compiled:
            # the first call compiles: on the CPU, a capture pass's generated kernels each get a
            # profiler span (their names say the ops they fuse: adapters/inductor.py); the clean pass none
            import torch._inductor.config as inductor_config

            inductor_config.cpp.enable_kernel_profile = self.trace_regions
            self._compiled = True
        if self.mode == COMPILE_GRAPHS:
            self._last_batch = (images, labels)  # the reference step's batch (graph_reference_step)
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten
        return self._step(images, labels).detach()

    def _prepare_reference(self) -> None:
        """What ``graph_reference_step`` needs, done before its profiler starts: compile-graphs' twins
        compiled and run once; cuda-graph's graph captured (by the warm-up)."""
        if self.mode == COMPILE_GRAPHS:
            if self._last_batch is None:
                raise KernelmapError(f"PyTorch {COMPILE_GRAPHS}: no step ran before the profiler started")
            if self._twins is None:
                self._twins = (torch.compile(self._loss), torch.compile(self._plain_opt_step))
                self._twin_step(*self._last_batch)
                self.synchronize()
        elif self._graph is None:
            raise KernelmapError(f"PyTorch {CUDA_GRAPH}: no graph captured before the profiler started (the "
                                 f"capture is warm-up step {GRAPH_WARMUP + 1}: give at least {GRAPH_WARMUP + 1} "
                                 "warm-up steps)")

    def _twin_step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        loss_fn, opt_step = self._twins
        with self.region("kernelmap:forward"):
            loss = loss_fn(images, labels)
        with self.region("kernelmap:backward"):
            self.optimizer.zero_grad(set_to_none=True)
            self._backward(loss)
        with self.region("kernelmap:optimizer"):
            opt_step()

    def _graph_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """cuda-graph: the first ``GRAPH_WARMUP`` steps run eagerly on a side stream (on the static
        buffers), the next is captured with ``torch.cuda.graph`` and replayed, as is every later one; each
        step first copies its batch into the static buffers."""
        if self._static is None:
            self._static = (images.clone(), labels.clone(), torch.zeros((), device=self.device))
        x, y, _ = self._static
        if images.shape != x.shape:  # the worker never sends one (spec.training_batches); a caller that did
            raise KernelmapError(f"PyTorch {CUDA_GRAPH}: a batch of {images.shape[0]} images, and the step's static "
                                 f"buffers hold {x.shape[0]}: the graph replays one batch size "
                                 f"(spec.training_batches: {spec.PARTIAL_BATCH_NOTE})")
        x.copy_(images)
        y.copy_(labels)
        if self._graph is None and self._eager_steps < GRAPH_WARMUP:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                loss = self._step(x, y)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._eager_steps += 1
            return loss.detach()
        if self._graph is None:
            self.optimizer.zero_grad(set_to_none=True)  # the backward in the graph makes its own gradients
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = self._step(x, y, zero_grad=False)
            self._static = (x, y, loss)
            self._graph = graph
        self._graph.replay()
        return self._static[2].detach()

    def graph_reference_step(self) -> None:
        """Inside the framework profiler, one step that launches the graphs' kernels one by one, in a
        ``GRAPH_REFERENCE`` region; the Kineto adapter attributes each replayed kernel to the op that
        launched its twin here. cuda-graph: an eager step on the static buffers, the same kernels in the
        same order as the captured graph. compile-graphs: a step of twins of the compiled loss and
        optimizer step compiled in the default mode (the same generated kernels, no CUDA graphs), compiled
        and run once first, outside the profiler."""
        self.synchronize()
        if self.mode == COMPILE_GRAPHS:
            with self._ranges(GRAPH_REFERENCE):
                self._twin_step(*self._last_batch)
                self.synchronize()
            return
        x, y, _ = self._static
        self.synchronize()
        with self._ranges(GRAPH_REFERENCE):
            # gradients set to None first, as before the capture: the backward makes fresh ones (no
            # accumulation kernels), in eager memory; the graph keeps writing its own
            self._step(x, y, zero_grad=True)
            self.synchronize()

    def to_float(self, value: Any) -> float:
        if self.config.devices > 1 and isinstance(value, torch.Tensor):
            return parallel.global_mean(value)  # the global batch's loss, not this rank's slice's
        return float(value.detach().cpu().item()) if isinstance(value, torch.Tensor) else super().to_float(value)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def evaluate(self, batch_size: int = 1000) -> float:
        self.model.eval()
        dataset = self.dataset("test")
        correct = 0
        with torch.no_grad():
            for images, labels in self.batches("test", batch_size, np.arange(len(dataset))):
                with self.autocast():
                    logits = self.model(images)
                correct += int((logits.argmax(dim=1) == labels).sum())
        return correct / len(dataset)
