"""The C heap between phases of a large job (standard library only)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterator

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_uses_c_heap() -> None:
    """Arrow's default allocator, for this process and its children: the C library's ``malloc``
    (Arrow's ``system`` pool). What Arrow's own code frees (the Parquet writer's buffers, which take
    the default pool whatever pool the writer is given) then goes back to the heap whose freed pages
    the next phase reuses (``freed_pages_kept``), not into mimalloc's or jemalloc's arenas, which
    keep it: on the 1M-event nsys file, peak RSS 5.04x -> 4.79x of the file. Arrow reads the choice
    once, when it first allocates, so this runs before pyarrow is imported (the console script's
    first import); a value the user set is kept."""
    os.environ.setdefault(ARROW_POOL_ENV, "system")


@functools.cache
def _libc_function(name: str):
    """The C library's function ``name``, or None where it has none (glibc's ``malloc_trim`` and
    ``mallopt`` are missing on musl, macOS, Windows)."""
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name, None) if lib else None
    except OSError:  # pragma: no cover - no loadable C library
        return None


def _malloc_trim():
    return _libc_function("malloc_trim")


def _mallopt():
    return _libc_function("mallopt")


# mallopt's parameters (glibc's malloc.h) and the values used here
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
GLIBC_DEFAULT_THRESHOLD = 128 << 10  # both thresholds' defaults
KEPT_MMAP_THRESHOLD = 32 << 20  # the largest mmap threshold every glibc takes on 64-bit (HEAP_MAX_SIZE / 2)
KEPT_TRIM_THRESHOLD = (1 << 31) - 1  # mallopt's int: no automatic trim


def set_mmap_threshold(value: int) -> bool:
    """glibc's mmap threshold of this process set to ``value`` with mallopt; whether glibc took it. An older
    glibc refuses a value above 32 MiB (``do_set_mmap_threshold``: ``value <= HEAP_MAX_SIZE / 2``) and keeps the one
    it had; 2.36 (the 2-core VM) took 64 and 256 MiB. Where ``MALLOC_MMAP_THRESHOLD_`` names such a value, a glibc that
    refuses it runs with no fixed threshold at all, hence mallopt, after start, beside a 32 MiB variable."""
    mallopt = _mallopt()
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, int(value)) == 1


@contextlib.contextmanager
def freed_pages_kept() -> Iterator[bool]:
    """Within: the C heap keeps the pages of the blocks it frees for the next blocks, rather than
    handing them back to the OS and faulting fresh zeroed pages in for the next phase's arrays
    (glibc: blocks up to 32 MiB come from the heap rather than each from an mmap of its own, and
    the heap is not trimmed on free). Yields whether the C library can (glibc's ``mallopt``).

    ``release_freed`` still hands the free pages back where it is called. On exit they are handed
    back, and glibc's default thresholds (128 KiB) are set: its adaptive mmap threshold, which any
    ``mallopt`` of these turns off, cannot be turned on again. ``kernelmap normalise`` of the
    1M-event Kineto file (benches/bench_normalise.py, 2-core VM): 25% fewer page faults, 4–9% less
    time in three A/B runs, the same peak RSS (the native scanner's columns are pages of their own)."""
    mallopt = _mallopt()
    # the mmap threshold first: a trim threshold alone would fix the mmap threshold at 128 KiB
    kept = mallopt is not None and mallopt(M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD) == 1
    if kept and mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD) != 1:  # pragma: no cover - glibc takes it
        mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
        kept = False
    try:
        yield kept
    finally:
        if kept:
            mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
            mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
            release_freed()


def release_freed() -> bool:
    """Hand the free pages inside the C heap back to the OS; whether the C library can.

    numpy's arrays of a phase that is over (a parser's columns, a labeller's temporaries) are
    freed to glibc's heap, which keeps their pages resident: the next phase's own arrays then
    land beside them, and the process' peak RSS is the sum of the two. ``normalise`` calls this
    between reading the traces and writing the records (its peak on a 1M-event nsys export:
    6.5x the file before, 5.9x after; no time measured against it)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
