"""MXNet's names as its traces spell them (its profiler's ``operator`` category; the NVTX ranges of a
build with NVTX). No mxnet here: the adapters read these rules through the registry
(``Framework.vocabulary``).
"""

from __future__ import annotations

from ..registry import Vocabulary, add_names

OPS: dict[str, tuple[str, str]] = {}
add_names(OPS, "Convolution", "conv2d", "fwd")
add_names(OPS, "_backward_Convolution", "conv2d", "bwd")
# Activation / Pooling carry no act_type / pool_type in the trace; in this workload they are the
# relu and the max pool of frameworks/spec.py, which is what the mapping states.
add_names(OPS, "Activation relu", "relu", "fwd")
add_names(OPS, "_backward_Activation _backward_relu", "relu", "bwd")
add_names(OPS, "Pooling", "max_pool2d", "fwd")
add_names(OPS, "_backward_Pooling", "max_pool2d", "bwd")
add_names(OPS, "Flatten flatten Reshape reshape", "flatten", "fwd")
add_names(OPS, "_backward_copy _backward_Flatten _backward_reshape", "flatten", "bwd")
add_names(OPS, "FullyConnected", "linear", "fwd")
add_names(OPS, "_backward_FullyConnected", "linear", "bwd")
add_names(OPS, "log_softmax", "log_softmax", "fwd")
add_names(OPS, "_backward_log_softmax", "log_softmax", "bwd")
add_names(OPS, "pick", "pick", "fwd")
add_names(OPS, "_backward_pick", "pick", "bwd")
add_names(OPS, "mean", "mean", "fwd")
add_names(OPS, "_backward_mean", "mean", "bwd")
add_names(OPS, "softmax_cross_entropy", "softmax_cross_entropy", "fwd")
add_names(OPS, "_backward_softmax_cross_entropy", "softmax_cross_entropy", "bwd")
add_names(OPS, "_mul_scalar elemwise_mul broadcast_mul", "mul", "fwd")
add_names(OPS, "_backward_mul_scalar _backward_mul", "mul", "bwd")
add_names(OPS, "sgd_update sgd_mom_update multi_sgd_update multi_sgd_mom_update "
               "preloaded_multi_sgd_update preloaded_multi_sgd_mom_update", "sgd_update", "update")
add_names(OPS, "_zeros _zeros_without_dtype SetValueOp _ones _full", "fill", "none")
add_names(OPS, "_copyto _copy", "copy", "none")
add_names(OPS, "elemwise_add _plus _grad_add add_n ElementWiseSum", "add", "none")
add_names(OPS, "sum", "sum", "none")
# AMP (--math bf16|fp16): its casts into and out of the low dtype, and fp16's overflow check of the gradients
add_names(OPS, "amp_cast amp_multicast _backward_amp_cast _backward_amp_multicast", "copy", "none")
add_names(OPS, "multi_all_finite all_finite", "loss_scale", "update")  # AMP's finite check of the scaled gradients

VOCABULARY = Vocabulary(
    ops=OPS,
    # its operators run on its engine threads, after the host thread that issued them has left the region
    # (kernelmap:forward|backward|optimizer, kernelmap:step#N) around the issuing call; the loop waits for
    # each step before issuing the next (canonical.ASYNC_FRAMEWORKS)
    asynchronous=True,
    native_kernel_marks=("mxnet::op::", "FusedKernel_"),  # its operators' own kernels; its fused ops' (below)
    nvtx_not_ops=r"MX[A-Z]",  # its C API calls (profile_api) are NVTX ranges too, named MX*: never an operator's
    # issue 39: the KVStore's sum (KVStoreReduce: `local`'s, CommCPU; DenseElementwiseSum: `device`'s on the GPU,
    # CommDevice's ndarray::ElementwiseSum, 1.9.1's src/ndarray/ndarray.cc), and the copies its push and pull make
    collective_prefixes=("KVStore", "DenseElementwiseSum"),
    collective_copies=("CopyCPU2CPU", "CopyGPU2GPU", "CopyCPU2GPU", "CopyGPU2CPU"),
    # hybridized on the GPU (MXNET_USE_FUSION, on by default) its pointwise fusion runs elementwise chains as one
    # ``_FusedOp`` whose NVRTC kernel is "FusedKernel_" + each fused operator's name + "_" (1.9.1:
    # src/executor/pointwise_fusion_pass.cc names the subgraph, src/operator/fusion/fused_op.cu the kernel); at fp16
    # fc1's ReLU and AMP's cast of fc2's input run as FusedKernel_Activation_amp_cast_
    fused_ops={"_FusedOp": "FusedKernel_"},
)
