"""Which GPU library a kernel belongs to, by its name: one table, read by every trace adapter (Kineto,
nsys, XLA) where its own records do not say (a library log's call, an XLA custom call's target).

The names are those current CUDA releases give their kernels, as real traces show them (tests/data/foreign/,
README.md there; tests/test_foreign_libraries.py):

* cuDNN: anything with ``cudnn`` in its name (``sm90_xmma_fprop_implicit_gemm_..._cudnn``,
  ``cutlass__5x_cudnn::Kernel<...>``, ``cudnn::engines_precompiled::...``), and the legacy convolution
  kernels cuDNN ships without that word (``implicit_convolve_sgemm``).
* cuBLASLt: its own namespace (``cublasLt::splitKreduce_kernel``, ``...cublasLt...``).
* cuBLAS: gemm kernels named ``..._cublas`` (``sm90_xmma_gemm_..._execute_segment_k_off_kernel__5x_cublas``);
  ``nvjet_*`` (the gemm kernels of CUDA 12.8+ cuBLAS on Hopper and Blackwell); the CUTLASS kernels cuBLAS
  ships, named with the SM they were built for (``cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_...>``,
  ``cutlass_75_wmma_tensorop_...``); the older arch-prefixed gemms (``ampere_sgemm_128x64_tn``,
  ``volta_h884gemm_...``, ``turing_fp16_s1688gemm_...``); level-1/2 and small-k kernels
  (``gemv2T_kernel_val``, ``internal::gemvx::kernel``, ``sgemm_largek_lds64``, ``gemmSN_*``, and any
  kernel whose parameters are cuBLAS types: ``cublasGemvParamsEx``, ``cublasDotParams``,
  ``cublasTransposeParams``).

A gemm kernel's name says the library that holds it, not the API the program called: cuBLAS's gemm calls
run on cuBLASLt's kernels, and cuDNN calls cuBLASLt too. So a name gives cuBLAS for the whole cuBLAS
family except where the name itself says cuBLASLt; a cuBLAS-named kernel launched inside a cuDNN op is
cuDNN's (``kineto.kernel_library``), and a library-log link overrides the name (``attribution``).

Not in the table, left unknown (NA): kernels built from CUTLASS templates into another program
(``cutlass::device_kernel<flash::...>``, ``cutlass3x_sm90_...``: the library is the program's, not a
CUDA release's), and vendor libraries outside the schema's vocabulary (ROCm's hipBLASLt ``Cijk_*``,
MIOpen). NCCL is by ``canonical.is_collective_kernel``.
"""

from __future__ import annotations

import re

from ..schema import Library

# (library, pattern searched in the kernel name, what it matches); the first row that matches wins
KERNEL_LIBRARIES: tuple[tuple[str, str, str], ...] = (
    (Library.CUDNN.value, r"(?i)cudnn", "cuDNN's name in the kernel's (engines, xmma convolutions, cuDNN's CUTLASS)"),
    (Library.CUDNN.value, r"^(?:void )?(?:implicit|explicit)_convolve_sgemm", "cuDNN's legacy convolution kernels"),
    (Library.CUBLASLT.value, r"cublasLt", "cuBLASLt's namespace (splitKreduce_kernel, epilogues)"),
    (Library.CUBLAS.value, r"(?i)cublas", "cuBLAS's name or parameter types (..._cublas, cublasGemvParamsEx)"),
    (Library.CUBLAS.value, r"^nvjet_", "nvJet gemms (CUDA 12.8+ cuBLAS, Hopper and Blackwell)"),
    (Library.CUBLAS.value, r"^(?:void )?cutlass::Kernel2?<cutlass_\d+_|^(?:void )?cutlass_\d+_",
     "the CUTLASS kernels cuBLAS ships, named with their SM (cutlass_80_tensorop_..., cutlass_75_wmma_...)"),
    (Library.CUBLAS.value, r"^(?:void )?(?:ampere|volta|turing|maxwell|kepler)_\w*gemm",
     "arch-prefixed gemms (ampere_sgemm_128x64_tn, volta_h884gemm_..., turing_fp16_s1688gemm_...)"),
    (Library.CUBLAS.value, r"^(?:void )?(?:internal::)?(?:gemv2T_kernel|gemv2N_kernel|gemvx::kernel|gemvNSP_kernel|"
                           r"gemmk1_kernel|gemmSN_\w*kernel|splitKreduce_kernel|sgemm_largek_lds64)\b",
     "cuBLAS's level-2 and small-k kernels (names without their template arguments)"),
)

_COMPILED = tuple((lib, re.compile(p)) for lib, p, _ in KERNEL_LIBRARIES)

# The kernels that finish the gemm launched just before them in the same library call, never a call's first
# kernel: split-K reductions, as real cuBLAS traces name them (cuBLASLt's ``cublasLt::splitKreduce_kernel``
# after ``cutlass::Kernel2<cutlass_80_simt_sgemm_...>``; xmma's ``..._execute_split_k_kernel__5x_cublas`` after
# its ``..._execute_kernel__5x_cublas``: MXNet's FullyConnected on an H200, tests/data/gpu_mxnet_h200_libs/)
GEMM_FOLLOWERS = re.compile(r"splitKreduce_kernel|_execute_split_k_kernel")


def follows_a_gemm(name) -> bool:
    """Whether a kernel only finishes the gemm before it in its library call (``GEMM_FOLLOWERS``)."""
    return isinstance(name, str) and GEMM_FOLLOWERS.search(name) is not None


def library_of(name) -> str | None:
    """The library of a kernel by its name (the first row of ``KERNEL_LIBRARIES`` that matches), else None."""
    if not isinstance(name, str):
        return None
    for lib, pat in _COMPILED:
        if pat.search(name):
            return lib
    return None
