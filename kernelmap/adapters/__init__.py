"""Adapters: pure functions file -> records DataFrame (docs/SCHEMA.md). The format is sniffed from
the content (gzip and xz are looked through), never from the name — except ``.nsys-rep``, nsys' own
binary report, which is recognised by its suffix as a last resort and converted with nsys.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from .. import strings
from ..errors import ParseError
from ..gcpause import no_gc
from . import (
    cublas_log,
    cublaslt_log,
    cudnn_log,
    kineto,
    mkl_verbose,
    mxnet_profiler,
    nsys,
    onednn,
    xla_trace,
)
from ._common import head

# marks in the names of kernels that no GPU library launched: a framework's own (native) and kernelmap's
# custom op's (attribution never links them to a library call)
OWN_KERNEL_MARKS = (*kineto.NATIVE_KERNEL_MARKS, *kineto.CUSTOM_MARKS)

# order matters: the most specific sniffers first
FORMATS = {
    "nsys": nsys,
    "xla_trace": xla_trace,
    "kineto": kineto,
    "mxnet_profiler": mxnet_profiler,
    "cudnn_log": cudnn_log,
    "cublas_log": cublas_log,
    "cublaslt_log": cublaslt_log,
    "onednn_verbose": onednn,
    "mkl_verbose": mkl_verbose,
}


# files an adapter reads beside a trace, never on their own: XLA's HLO text (the compiled program the
# trace's op names refer to), read with the trace beside it
HLO_COMPANION = "the compiled program's HLO text, read with the XLA trace beside it (adapters/xla_trace.py)"


NCCL_LOG = "nccl.log"  # NCCL's log in a rank's folder (the libs pass of a multi-GPU case: run/devices.libs_env)
NCCL_COMPANION = "NCCL's own log (NCCL_DEBUG=INFO), read by the report's communication tables (commlink.read_nccl_log)"


def companion(path: str | os.PathLike) -> str | None:
    """Why a file is an adapter's companion file, not a record source of its own; None for any other."""
    if Path(path).name == NCCL_LOG:
        return NCCL_COMPANION
    return HLO_COMPANION if str(path).endswith(xla_trace.HLO_SUFFIXES) else None


def detect(path: str | os.PathLike) -> str:
    """The format name of a file (a key of ``FORMATS``), from its first bytes."""
    try:
        first = head(path, 64 * 1024)
    except OSError as exc:
        raise ParseError(path, f"cannot read: {exc.strerror or exc}") from None
    for name, mod in FORMATS.items():
        if mod.sniff(first):
            return name
    if str(path).endswith(".nsys-rep"):
        return "nsys"
    raise ParseError(path, "unrecognised content: not a Kineto, MXNet profiler or XLA (jax.profiler) trace, nsys SQLite "
                           "export, cuDNN/cuBLAS/cuBLASLt log, oneDNN or MKL verbose output")


def read(path: str | os.PathLike, fmt: str | None = None) -> pd.DataFrame:
    """Records of one file; ``fmt`` overrides detection."""
    fmt = fmt or detect(path)
    if fmt not in FORMATS:
        raise ParseError(path, f"unknown format {fmt!r}")
    # an adapter's own frames keep object columns of shared str on every pandas (object_columns)
    with no_gc(), strings.object_columns():
        df = FORMATS[fmt].read(Path(path))
    df.attrs["format"] = fmt
    return df
