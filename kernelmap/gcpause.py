"""Python's cyclic garbage collector paused for a section (standard library only)."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def no_gc(collect: bool = False):
    """The cyclic GC off inside the section, back as it was after it; ``collect`` runs a collection
    first. Timed steps (``collect=True``, as ``timeit`` does): a collection inside a block of
    launch-bound steps is host jitter, not the step's cost. Adapters: building millions of
    containers (JSON events, column lists) otherwise triggers full collections over them again and
    again, and they make no reference cycles."""
    if collect:
        gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
