// The op's C++ side: argument checks, the CPU kernels, and its two front doors:
//  - built as a Python extension (JIT load / setuptools: TORCH_EXTENSION_NAME defined): a pybind11
//    module whose functions are called directly (the dispatcher never sees them);
//  - built as a plain shared library (CMake: KERNELMAP_TORCH_LIBRARY defined): ops registered with
//    the dispatcher under the namespace kernelmap_custom (torch.ops.kernelmap_custom.*), which the
//    profiler records like any aten op.
#include "kernelmap_custom.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#ifdef TORCH_EXTENSION_NAME
#include <torch/csrc/utils/pybind.h>  // pybind11 with torch's Tensor casters (lighter than torch/extension.h)
#endif
#ifdef KERNELMAP_TORCH_LIBRARY
#include <torch/library.h>
#endif

namespace kernelmap_custom {

namespace {

void check_float(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "kernelmap_custom: ", what, " must be float32, not ", t.scalar_type());
}

// The CPU kernels: plain loops, each a "kernel" of its own, as the CUDA ones are.
void add2_cpu(float* c, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

void bias_add_cpu(float* out, const float* y, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = y[r * cols + j] + bias[j];
}

void bias_grad_cpu(float* out, const float* grad, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) out[j] = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[j] += grad[r * cols + j];
}

}  // namespace

at::Tensor torch_launch_add2(const at::Tensor& a_, const at::Tensor& b_) {
  check_float(a_, "a");
  check_float(b_, "b");
  TORCH_CHECK(a_.sizes() == b_.sizes(), "kernelmap_custom: add2 needs tensors of one shape, not ", a_.sizes(),
              " and ", b_.sizes());
  TORCH_CHECK(a_.device() == b_.device(), "kernelmap_custom: add2 needs both tensors on one device");
  auto a = a_.contiguous(), b = b_.contiguous();
  auto c = at::empty_like(a);
  if (a.is_cuda()) {
#ifdef WITH_CUDA
    add2_cuda(c.data_ptr<float>(), a.data_ptr<float>(), b.data_ptr<float>(), a.numel());
#else
    TORCH_CHECK(false, "kernelmap_custom was built without CUDA (no nvcc at build time)");
#endif
  } else {
    add2_cpu(c.data_ptr<float>(), a.data_ptr<float>(), b.data_ptr<float>(), a.numel());
  }
  return c;
}

at::Tensor torch_launch_bias_add(const at::Tensor& y_, const at::Tensor& bias_) {
  check_float(y_, "y");
  check_float(bias_, "bias");
  TORCH_CHECK(y_.dim() == 2 && bias_.dim() == 1 && y_.size(1) == bias_.size(0),
              "kernelmap_custom: bias_add needs y [n, c] and bias [c], not ", y_.sizes(), " and ", bias_.sizes());
  TORCH_CHECK(y_.device() == bias_.device(), "kernelmap_custom: bias_add needs both tensors on one device");
  auto y = y_.contiguous(), bias = bias_.contiguous();
  auto out = at::empty_like(y);
  if (y.is_cuda()) {
#ifdef WITH_CUDA
    bias_add_cuda(out.data_ptr<float>(), y.data_ptr<float>(), bias.data_ptr<float>(), y.size(0), y.size(1));
#else
    TORCH_CHECK(false, "kernelmap_custom was built without CUDA (no nvcc at build time)");
#endif
  } else {
    bias_add_cpu(out.data_ptr<float>(), y.data_ptr<float>(), bias.data_ptr<float>(), y.size(0), y.size(1));
  }
  return out;
}

at::Tensor torch_launch_bias_grad(const at::Tensor& grad_) {
  check_float(grad_, "grad");
  TORCH_CHECK(grad_.dim() == 2, "kernelmap_custom: bias_grad needs grad [n, c], not ", grad_.sizes());
  auto grad = grad_.contiguous();
  auto out = at::empty({grad.size(1)}, grad.options());
  if (grad.is_cuda()) {
#ifdef WITH_CUDA
    bias_grad_cuda(out.data_ptr<float>(), grad.data_ptr<float>(), grad.size(0), grad.size(1));
#else
    TORCH_CHECK(false, "kernelmap_custom was built without CUDA (no nvcc at build time)");
#endif
  } else {
    bias_grad_cpu(out.data_ptr<float>(), grad.data_ptr<float>(), grad.size(0), grad.size(1));
  }
  return out;
}

}  // namespace kernelmap_custom

#ifdef TORCH_EXTENSION_NAME
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("torch_launch_add2", &kernelmap_custom::torch_launch_add2, "a + b (kernelmap_custom add2)");
  m.def("torch_launch_bias_add", &kernelmap_custom::torch_launch_bias_add, "y + bias (rows)");
  m.def("torch_launch_bias_grad", &kernelmap_custom::torch_launch_bias_grad, "sum of grad over rows");
}
#endif

#ifdef KERNELMAP_TORCH_LIBRARY
TORCH_LIBRARY(kernelmap_custom, m) {
  m.def("add2(Tensor a, Tensor b) -> Tensor");
  m.def("bias_add(Tensor y, Tensor bias) -> Tensor");
  m.def("bias_grad(Tensor grad) -> Tensor");
}

TORCH_LIBRARY_IMPL(kernelmap_custom, CPU, m) {
  m.impl("add2", &kernelmap_custom::torch_launch_add2);
  m.impl("bias_add", &kernelmap_custom::torch_launch_bias_add);
  m.impl("bias_grad", &kernelmap_custom::torch_launch_bias_grad);
}

#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(kernelmap_custom, CUDA, m) {
  m.impl("add2", &kernelmap_custom::torch_launch_add2);
  m.impl("bias_add", &kernelmap_custom::torch_launch_bias_add);
  m.impl("bias_grad", &kernelmap_custom::torch_launch_bias_grad);
}
#endif
#endif
