"""``mxnet``, imported once, after the libraries of the MXNet it is are loaded: every module of this package that
needs mxnet at import takes it from here (``from .loaded import mx``), never by its own ``import mxnet`` first.

An MXNet built by `kernelmap build-mxnet` (the runner names its tree in the environment and puts its python/
first on PYTHONPATH) gets its CUDA/cuDNN/BLAS libraries loaded by path (``built.preload``); otherwise the CUDA 11
libraries of the nvidia-*-cu11 wheels (``cuda11.preload``, a no-op without them). Imported before that, libmxnet.so
resolves its libraries by the loader's search: on the 2-GPU H200s, whose system holds a cuDNN 9.14 in
/usr/lib/x86_64-linux-gnu, a tree compiled against pip's cuDNN 9.19 then bound to 9.14 ("cuDNN lib mismatch:
linked-against version 91400 != compiled-against version 91900") and every GPU worker crashed at its first
operator (parallel.py imported mxnet ahead of workload.py's preload).
"""

from __future__ import annotations

import os

from . import built, cuda11

BUILT_TREE = os.environ.get(built.ENV_TREE)
PRELOAD = built.preload(BUILT_TREE) if BUILT_TREE else cuda11.preload()

import mxnet as mx  # noqa: E402

__all__ = ["BUILT_TREE", "PRELOAD", "mx"]
