"""A profiler window through the CUDA driver (``cuProfilerStart``/``cuProfilerStop``), for any framework.

The counters pass (kernelmap/run/counters.py) runs ``ncu --profile-from-start off``: ncu profiles the kernels
launched between the process's profiler start and stop. PyTorch opens that window itself
(``torch.cuda.profiler``); a framework that does not (JAX, whose XLA runtime uses the driver API on the primary
context) gets it here: the device's primary context (the one the CUDA runtime and XLA share) made current on the
calling thread for the two calls, via ctypes on ``libcuda.so.1``. A leaf: imports no framework.

Not yet run under ncu on a GPU (docs/COUNTERS.md says how to verify): where it fails, the worker fails with the
driver's error code and the counters pass records that reason.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator

from .errors import KernelmapError

LIBCUDA = "libcuda.so.1"


def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL(LIBCUDA)
    except OSError as exc:
        raise KernelmapError(f"no CUDA driver to open a profiler window ({LIBCUDA}: {exc})") from None


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise KernelmapError(f"CUDA driver {what} failed (CUresult {rc})")


@contextlib.contextmanager
def window(synchronize: Callable[[], None], device: int = 0) -> Iterator[None]:
    """cuProfilerStart before the block and cuProfilerStop after it, each after ``synchronize()`` (the
    framework's wait for its queued work), on ``device``'s primary context."""
    lib = _driver()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(lib.cuInit(0), "cuInit")
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        synchronize()
        _profiler(lib, ctx, "cuProfilerStart")
        try:
            yield
        finally:
            synchronize()
            _profiler(lib, ctx, "cuProfilerStop")
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)


def _profiler(lib: ctypes.CDLL, ctx: ctypes.c_void_p, call: str) -> None:
    _check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    try:
        _check(getattr(lib, call)(), call)
    finally:
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
