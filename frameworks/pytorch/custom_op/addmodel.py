"""The seed's own example: ``AddModel`` trains two parameter vectors ``a`` and ``b`` with
loss = sum(a² + b²), the sum ``a² + b²`` taken by our ``add2`` kernel (``KernelmapAdd2``), SGD
(lr 0.01, no momentum) for 500 epochs, the loss read every 25. Each step multiplies both by
1 - 2·lr = 0.98, so after 500 epochs |a| and |b| are 0.98^500 ≈ 4.1e-5 of their start (N(0, 1)):
below ``CONVERGED`` = 1e-3 for every element of a vector of 2^20 (the seed's size).

Optionally the last ``profile_epochs`` epochs run under torch.profiler (``kernelmap:step#N`` ranges),
written to ``trace_dir/trace.json.gz``: the add2 kernel (GPU) or op (CPU) in the records.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import ADDMODEL_EPOCHS, ADDMODEL_N
from .build import load
from .function import KernelmapAdd2

N = ADDMODEL_N  # the seed's vector length
EPOCHS = ADDMODEL_EPOCHS
EVERY = 25
LR = 0.01
CONVERGED = 1e-3  # both parameters' largest |element| after training must be below it


class AddModel(nn.Module):
    def __init__(self, n: int, ops, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = nn.Parameter(torch.randn(n, generator=g))
        self.b = nn.Parameter(torch.randn(n, generator=g))
        self.ops = ops

    def forward(self) -> torch.Tensor:
        return KernelmapAdd2.apply(torch.square(self.a), torch.square(self.b), self.ops)


def train(route: str, device: str = "cpu", n: int = N, epochs: int = EPOCHS, every: int = EVERY,
          lr: float = LR, seed: int = 0, trace_dir: str | Path | None = None, profile_epochs: int = 5) -> dict[str, Any]:
    """Train AddModel with the op built by ``route``; returns the losses every ``every`` epochs, the
    parameters' largest |element| at the end, ``converged`` and the build's facts (prints nothing)."""
    cuda = device == "gpu"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device gpu asked for, but torch.cuda.is_available() is False")
    ops = load(route, cuda)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    model = AddModel(n, ops, seed).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses: list[dict[str, Any]] = []
    first_profiled = epochs - profile_epochs if trace_dir is not None else epochs
    profiler = contextlib.nullcontext()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        if epoch == first_profiled:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            profiler = profile(activities=acts, record_shapes=True)
            profiler.__enter__()
        with torch.profiler.record_function(f"kernelmap:step#{epoch}") if epoch >= first_profiled else \
                contextlib.nullcontext():
            opt.zero_grad()
            loss = model().sum()
            loss.backward()
            opt.step()
        if epoch % every == 0 or epoch == epochs - 1:
            losses.append({"epoch": epoch, "loss": float(loss.detach())})
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    trace = None
    if trace_dir is not None and epochs > first_profiled:
        profiler.__exit__(None, None, None)
        trace = Path(trace_dir) / "trace.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(trace))
    a_max = float(model.a.detach().abs().max())
    b_max = float(model.b.detach().abs().max())
    return {"route": route, "device": device, "n": n, "epochs": epochs, "lr": lr, "losses": losses,
            "a_max_abs": a_max, "b_max_abs": b_max, "threshold": CONVERGED,
            "converged": a_max < CONVERGED and b_max < CONVERGED, "train_wall_s": round(wall, 3),
            "profiled_epochs": max(epochs - first_profiled, 0), "trace": str(trace) if trace else None,
            "build": ops.info()}


def format_text(result: dict[str, Any]) -> str:
    """The seed's console: the loss every 25 epochs, then the verdict."""
    lines = [f"AddModel ({result['route']} route, {result['device']}, n = {result['n']}, lr {result['lr']}, "
             f"{'built now' if result['build']['built'] else 'build from the cache'}: {result['build']['artifact']})"]
    lines += [f"epoch {x['epoch']:>3d}: loss = {x['loss']:>12.6f}" for x in result["losses"]]
    lines.append(f"max |a| = {result['a_max_abs']:.3e}, max |b| = {result['b_max_abs']:.3e} "
                 f"(< {result['threshold']:g}: {'converged' if result['converged'] else 'NOT converged'}); "
                 f"{result['epochs']} epochs in {result['train_wall_s']:.2f} s wall")
    return "\n".join(lines)
