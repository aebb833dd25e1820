"""The op's ``autograd.Function``s: fc1 with our bias add and bias gradient (``KernelmapLinear``), and
the seed's element-wise add (``KernelmapAdd2``). Each takes the loaded op (``build.Ops``) of its route.

The class names are what the profiler records (``custom_op.FUNCTION``): keep them in step."""

from __future__ import annotations

import torch
from torch import nn

from . import ADD2_FUNCTION, FUNCTION
from .build import Ops


class KernelmapLinear(torch.autograd.Function):
    """y = x @ W.T + b: the gemm is ATen's ``mm``, the bias add our kernel; backward: ATen's two ``mm``
    (dx = g @ W, dW = g.T @ x) and our bias gradient (db = sum of g over the batch)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, ops: Ops) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.ops = ops
        return ops.bias_add(x.mm(weight.t()), bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        return grad.mm(weight), grad.t().mm(x), ctx.ops.bias_grad(grad), None


class KernelmapAdd2(torch.autograd.Function):
    """c = a + b by our add2 kernel (the seed's ``AddModelFunction``); the gradient passes to both."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, ops: Ops) -> torch.Tensor:
        return ops.add2(a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad, None


assert KernelmapLinear.__name__ == FUNCTION and KernelmapAdd2.__name__ == ADD2_FUNCTION


class CustomLinear(nn.Linear):
    """``nn.Linear`` (same parameters, names and initialisation) whose forward is ``KernelmapLinear``."""

    def __init__(self, in_features: int, out_features: int, ops: Ops):
        super().__init__(in_features, out_features)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return KernelmapLinear.apply(x, self.weight, self.bias, self.ops)
