"""The JAX profiler capture of a ``kernelmap run`` framework pass.

``profiler_trace(out_dir, workload)`` wraps the timed steps in ``jax.profiler.trace``. On exit it
moves the one Chrome trace that jax writes (``plugins/profile/<time>/<host>.trace.json.gz``) to
``out_dir/trace.json.gz``, unchanged, and writes beside it the optimised HLO text of the jitted
train step, ``out_dir/<hlo_module>.hlo.txt.gz``: XLA's CPU trace names only the HLO op of each
thunk (``hlo_op``, ``hlo_module``), and the HLO text holds what each op is (its fused
instructions, their JAX name paths, cuDNN/cuBLAS custom-call targets). The xla_trace adapter
reads the companion file where it is present (kernelmap/adapters/xla_trace.py).
"""

from __future__ import annotations

import contextlib
import gzip
import shutil
import tempfile
from pathlib import Path

import jax

from kernelmap.errors import KernelmapError

TRACE_GLOB = "plugins/profile/*/*.trace.json.gz"
HLO_SUFFIX = ".hlo.txt.gz"


def write_hlo(out_dir: Path, modules: dict[str, str]) -> list[Path]:
    """``<module>.hlo.txt.gz`` for each HLO module text; returns the paths."""
    paths = []
    for module, text in modules.items():
        path = Path(out_dir) / f"{module}{HLO_SUFFIX}"
        with gzip.GzipFile(path, "wb", mtime=0) as fh:
            fh.write(text.encode())
        paths.append(path)
    return paths


@contextlib.contextmanager
def profiler_trace(out_dir: Path, workload):
    """Trace the body with ``jax.profiler``; then ``out_dir/trace.json.gz`` and the HLO text(s)."""
    out_dir = Path(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".jax-profile-", dir=out_dir))
    try:
        jax.profiler.start_trace(str(tmp))
        try:
            yield
            workload.synchronize()
        finally:
            jax.profiler.stop_trace()
        traces = sorted(tmp.glob(TRACE_GLOB))
        if len(traces) != 1:
            raise KernelmapError(f"jax.profiler wrote {len(traces)} Chrome traces under {tmp}, expected one")
        shutil.move(traces[0], out_dir / "trace.json.gz")
        write_hlo(out_dir, workload.compiled_hlo())
    finally:
        shutil.rmtree(tmp)
