"""The JAX profiler capture of a ``kernelmap run`` framework pass.

``profiler_trace(out_dir, workload)`` wraps the timed steps in ``jax.profiler.trace``. On exit it
moves the one Chrome trace that jax writes (``plugins/profile/<time>/<host>.trace.json.gz``) to
``out_dir/trace.json.gz``, unchanged, and writes beside it the optimised HLO text of the jitted
train step, ``out_dir/<hlo_module>.hlo.txt.gz``: XLA's CPU trace names only the HLO op of each
thunk (``hlo_op``, ``hlo_module``), and the HLO text holds what each op is (its fused
instructions, their JAX name paths, cuDNN/cuBLAS custom-call targets). The xla_trace adapter
reads the companion file where it is present (kernelmap/adapters/xla_trace.py).

Beside them ``out_dir/pool_tasks.json`` (``POOL_TASKS_FILE``): which op handed XLA's thread pool each task its
threads ran (``pool_tasks``). The Chrome trace holds the pool's task regions (``ThreadpoolListener::StartRegion`` /
``StopRegion`` on the thread that ran the task) and where each task was handed over (``ThreadpoolListener::Record``
on the thread that scheduled it) but not which record started which region: the profiler's own XSpace
(``<host>.xplane.pb``, jax writes it beside the trace) pairs them by a context id (the record's ``_p``, the region's
``_c``). The report gives a task's threads' CPU time to the op that scheduled it (kernelmap/poolcpu.py).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import jax

from kernelmap.errors import KernelmapError

TRACE_GLOB = "plugins/profile/*/*.trace.json.gz"
XSPACE_GLOB = "plugins/profile/*/*.xplane.pb"
POOL_TASKS_FILE = "pool_tasks.json"  # also named in kernelmap.poolcpu (the reader)
RECORD, START, STOP = ("ThreadpoolListener::Record", "ThreadpoolListener::StartRegion",
                       "ThreadpoolListener::StopRegion")
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
        spaces = sorted(tmp.glob(XSPACE_GLOB))
        if workload.device.platform == "cpu":  # the CPU sampler's pass (kernelmap.poolcpu); a GPU's XSpace is not read
            if len(spaces) != 1:
                raise KernelmapError(f"jax.profiler wrote {len(spaces)} XSpace files under {tmp}, expected one")
            write_pool_tasks(out_dir / POOL_TASKS_FILE, spaces[0], out_dir / "trace.json.gz")
    finally:
        shutil.rmtree(tmp)


def _thread_ids(trace: Path) -> dict[str, int]:
    """The Chrome trace's thread id of each thread name (jax names each XSpace line's thread uniquely; a name
    two threads share is left out: its tasks count as unpaired)."""
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh).get("traceEvents") or []
    named = [(str((e.get("args") or {}).get("name")), int(e["tid"])) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"]
    twice = {n for n, _ in named if sum(m == n for m, _ in named) > 1}
    return {n: t for n, t in named if n not in twice}


def pool_tasks(space: Path, trace: Path) -> dict:
    """Each pool task region of the XSpace at ``space`` with the record that scheduled it: ``regions`` of
    [thread id, start ns, stop ns, scheduling thread id, record ns] (the Chrome trace's thread ids and clock: its
    ``ts`` x 1000; -1, -1 where the trace holds no record of that context id: counted as ``unpaired``), and
    ``unstopped`` regions still open at its end; ``threads`` the trace's thread names by id."""
    from jax.profiler import ProfileData

    tids = _thread_ids(trace)
    records: dict[int, tuple[int, int]] = {}
    starts: list[tuple[int, int, int, int]] = []  # thread, start, stop, context
    unstopped = 0
    for plane in ProfileData.from_file(str(space)).planes:
        for line in plane.lines:
            tid = tids.get(line.name)
            open_: tuple[int, int] | None = None
            for e in line.events:
                if tid is None or e.name not in (RECORD, START, STOP):
                    continue
                stats = dict(e.stats)
                if e.name == RECORD and "_p" in stats:
                    records[int(stats["_p"])] = (tid, int(e.start_ns))
                elif e.name == START:
                    unstopped += open_ is not None
                    open_ = (int(e.start_ns), int(stats.get("_c", -1)))
                elif open_ is not None:
                    starts.append((tid, open_[0], int(e.start_ns), open_[1]))
                    open_ = None
            unstopped += open_ is not None
    regions = [[t, a, b, *records.get(c, (-1, -1))] for t, a, b, c in starts]
    return {"clock": "the Chrome trace's ts x 1000 (ns)", "regions": regions,
            "threads": {str(t): n for n, t in tids.items()},
            "unpaired": sum(c not in records for *_, c in starts), "unstopped": unstopped}


def write_pool_tasks(path: Path, space: Path, trace: Path) -> None:
    """``pool_tasks`` into ``path`` (atomically)."""
    from kernelmap.atomic import atomic_file

    with atomic_file(path, "w") as fh:
        json.dump(pool_tasks(space, trace), fh)
