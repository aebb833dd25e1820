// The op's CUDA kernels (namespace kernelmap_custom: the records tell them by it, library "custom").
#include <cuda_runtime.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include "kernelmap_custom.h"

namespace kernelmap_custom {

__global__ void add2_kernel(float* __restrict__ c, const float* __restrict__ a, const float* __restrict__ b,
                            int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    c[i] = a[i] + b[i];
}

__global__ void bias_add_kernel(float* __restrict__ out, const float* __restrict__ y,
                                const float* __restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = y[i] + bias[i % cols];
}

// one block per column: a shared-memory tree sum over the rows
__global__ void bias_grad_kernel(float* __restrict__ out, const float* __restrict__ grad, int64_t rows,
                                 int64_t cols) {
  __shared__ float part[256];
  const int64_t j = blockIdx.x;
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += grad[r * cols + j];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[j] = part[0];
}

namespace {
int blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (int)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}
}  // namespace

void add2_cuda(float* c, const float* a, const float* b, int64_t n) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  add2_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(c, a, b, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bias_add_cuda(float* out, const float* y, const float* bias, int64_t rows, int64_t cols) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  bias_add_kernel<<<blocks_for(rows * cols, 256), 256, 0, stream>>>(out, y, bias, rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bias_grad_cuda(float* out, const float* grad, int64_t rows, int64_t cols) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  bias_grad_kernel<<<(unsigned)cols, 256, 0, stream>>>(out, grad, rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kernelmap_custom
