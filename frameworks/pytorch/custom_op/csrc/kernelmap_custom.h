// kernelmap's own PyTorch op: add2 (the seed's element-wise add of two vectors), and the bias add of
// a linear layer with its gradient. CPU kernels in kernelmap_custom.cpp, CUDA kernels in
// kernelmap_custom_cuda.cu (compiled only where WITH_CUDA is defined).
#pragma once
// (per-operator headers, not ATen/ATen.h: a build compiles in a third of the time)
#include <ATen/core/Tensor.h>

namespace kernelmap_custom {

at::Tensor torch_launch_add2(const at::Tensor& a, const at::Tensor& b);        // a + b, same shape
at::Tensor torch_launch_bias_add(const at::Tensor& y, const at::Tensor& bias); // y[n, c] + bias[c]
at::Tensor torch_launch_bias_grad(const at::Tensor& grad);                     // sum over n of grad[n, c]

#ifdef WITH_CUDA
void add2_cuda(float* c, const float* a, const float* b, int64_t n);
void bias_add_cuda(float* out, const float* y, const float* bias, int64_t rows, int64_t cols);
void bias_grad_cuda(float* out, const float* grad, int64_t rows, int64_t cols);
#endif

}  // namespace kernelmap_custom
