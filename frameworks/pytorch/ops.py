"""PyTorch's names as its traces spell them (Kineto, nsys' emit_nvtx ranges): aten ops, autograd nodes,
optimizer annotations, its collective ranges, and kernelmap's custom op (``custom_op``). No torch here:
the adapters read these rules through the registry (``Framework.vocabulary``).
"""

from __future__ import annotations

from ..registry import Vocabulary, add_names
from . import custom_op

OPS: dict[str, tuple[str, str]] = {}
add_names(OPS, "aten::conv2d aten::convolution aten::_convolution aten::cudnn_convolution "
               "aten::mkldnn_convolution aten::thnn_conv2d aten::_slow_conv2d_forward", "conv2d", "fwd")
add_names(OPS, "aten::convolution_backward ConvolutionBackward0 aten::cudnn_convolution_backward "
               "aten::cudnn_convolution_backward_input aten::cudnn_convolution_backward_weight", "conv2d", "bwd")
add_names(OPS, "aten::relu aten::relu_ aten::clamp_min", "relu", "fwd")
add_names(OPS, "ReluBackward0 aten::threshold_backward", "relu", "bwd")
add_names(OPS, "aten::max_pool2d aten::max_pool2d_with_indices", "max_pool2d", "fwd")
add_names(OPS, "MaxPool2DWithIndicesBackward0 aten::max_pool2d_with_indices_backward", "max_pool2d", "bwd")
add_names(OPS, "aten::flatten aten::reshape aten::view", "flatten", "fwd")
add_names(OPS, "ViewBackward0 ReshapeAliasBackward0 UnsafeViewBackward0", "flatten", "bwd")
add_names(OPS, "aten::linear aten::addmm aten::matmul aten::mm", "linear", "fwd")
add_names(OPS, "AddmmBackward0 MmBackward0 TBackward0", "linear", "bwd")
add_names(OPS, "aten::log_softmax aten::_log_softmax", "log_softmax", "fwd")
add_names(OPS, "LogSoftmaxBackward0 aten::_log_softmax_backward_data", "log_softmax", "bwd")
add_names(OPS, "aten::nll_loss aten::nll_loss_nd aten::nll_loss2d aten::nll_loss_forward", "nll_loss", "fwd")
add_names(OPS, "NllLossBackward0 aten::nll_loss_backward", "nll_loss", "bwd")
add_names(OPS, "aten::cross_entropy_loss", "softmax_cross_entropy", "fwd")
add_names(OPS, "Optimizer.step#SGD.step", "sgd_update", "update")
add_names(OPS, "Optimizer.zero_grad#SGD.zero_grad aten::zero_", "zero_grad", "none")
# GradScaler (fp16): the gradients' finite check and unscale, then the scale's update (docs/MIXED_PRECISION.md)
add_names(OPS, "aten::_amp_foreach_non_finite_check_and_unscale_ aten::_amp_update_scale_", "loss_scale", "update")
add_names(OPS, "aten::fill_ aten::ones_like aten::zeros_like aten::zeros aten::ones", "fill", "none")
# aten::_foreach_copy_: torch.compile's CUDA-graph trees copy a replayed graph's non-static inputs into
# its static buffers with it (cudagraph_trees: _copy_inputs_and_remove_from_src)
add_names(OPS, "aten::copy_ aten::_foreach_copy_ aten::to aten::_to_copy aten::clone aten::contiguous", "copy", "none")
add_names(OPS, "torch::autograd::AccumulateGrad", "add", "bwd")
add_names(OPS, "aten::add aten::add_ aten::_foreach_add_ aten::_foreach_add", "add", "none")
add_names(OPS, "aten::mul aten::mul_ aten::_foreach_mul_ aten::_foreach_mul", "mul", "none")
add_names(OPS, "aten::sum", "sum", "none")
add_names(OPS, "aten::mean", "mean", "none")
add_names(OPS, "aten::batch_norm aten::_batch_norm_impl_index aten::cudnn_batch_norm aten::native_batch_norm "
               "aten::_native_batch_norm_legit aten::miopen_batch_norm", "batch_norm", "fwd")
add_names(OPS, "CudnnBatchNormBackward0 NativeBatchNormBackward0 MiopenBatchNormBackward0 "
               "aten::cudnn_batch_norm_backward aten::native_batch_norm_backward", "batch_norm", "bwd")
add_names(OPS, "record_param_comms", "collective", "none")
# kernelmap's own op (frameworks/pytorch/custom_op): its autograd.Function is the linear layer it replaces
# (its forward record holds the weight at position 1, as aten::linear), its dispatcher ops (cmake route)
# or record_function ranges (jit, setuptools) what they compute where nothing maps them from above
add_names(OPS, custom_op.FUNCTION, "linear", "fwd")
add_names(OPS, custom_op.FUNCTION_BACKWARD, "linear", "bwd")
add_names(OPS, custom_op.OP_NAMES["bias_add"], "linear", "fwd")
add_names(OPS, custom_op.OP_NAMES["bias_grad"], "linear", "bwd")
add_names(OPS, f"{custom_op.ADD2_FUNCTION} {custom_op.OP_NAMES['add2']}", "add", "fwd")
add_names(OPS, f"{custom_op.ADD2_FUNCTION}Backward", "add", "bwd")

# Collective communication (NCCL/RCCL, gloo): a category of its own, whatever op launches it (DDP's
# all-reduce runs inside the AccumulateGrad of a gradient hook; that is not an add). The op names:
# ``record_param_comms`` (the table above), ``nccl:<collective>`` / ``gloo:<collective>`` (the
# process-group ranges) and ``c10d::<collective>_`` (its dispatcher ops).
COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "c10d::", "ProcessGroupNCCL::", "ProcessGroupGloo::")
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function: "

# gemm ops with no weight argument of their own: ``aten::mm(a, b)`` where torch.compile's generated code
# calls it directly (no linear or autograd node above it to name the layer); the layer whose two weight
# dims are among a's and b's (``canonical.linear_layer``: a unique match only)
GEMM_OPS = ("aten::mm",)
# (op name -> position of the weight among the inputs, transposed?)
WEIGHT_ARGS = {
    "aten::conv2d": (1, False), "aten::convolution": (1, False), "aten::_convolution": (1, False),
    "aten::cudnn_convolution": (1, False), "aten::mkldnn_convolution": (1, False),
    "aten::convolution_backward": (2, False), "aten::linear": (1, False), "aten::addmm": (2, True),
    custom_op.FUNCTION: (1, False),  # KernelmapLinear(x, weight, bias)
}

VOCABULARY = Vocabulary(
    ops=OPS, backward_prefix=AUTOGRAD_PREFIX, collective_prefixes=COLLECTIVE_PREFIXES, weight_args=WEIGHT_ARGS,
    gemm_ops=GEMM_OPS,
    # linear's backward computes its gradients with aten::mm: not a recompute of the forward
    not_recompute=frozenset({"aten::mm", "aten::matmul"}),
    native_kernel_marks=("at::native",),  # ATen's own kernels
    custom_kernel_marks=(custom_op.KERNEL_MARK,),
    nvtx_op_fields=(", seq = ", ", op_id = "),  # emit_nvtx's op ranges carry these fields
    op_prefixes=("aten::",),
)
