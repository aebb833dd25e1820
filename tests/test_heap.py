"""kernelmap.heap: the free pages of the C heap handed back to the OS."""

from __future__ import annotations

import ctypes.util
import os
import platform

import pytest

from kernelmap import heap


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
                           or not ctypes.util.find_library("c"), reason="malloc_trim is glibc's")


@glibc
def test_release_freed_returns_the_freed_heap_pages():
    # 200 blocks of 96 KiB: malloc'ed on the heap (under glibc's 128 KiB mmap threshold), each
    # page touched; all freed but the last, which pins the heap's top, so that free() alone can
    # not shrink it: the pages stay resident until they are released
    blocks = [bytearray(96 << 10) for _ in range(200)]
    for b in blocks:
        b[::4096] = b"\x01" * len(b[::4096])
    last = blocks.pop()
    held = _rss()
    del blocks
    freed = _rss()
    assert heap.release_freed() is True
    released = _rss()
    assert held - freed < 4 << 20  # free() kept them
    assert freed - released > 12 << 20  # of the ~19 MiB freed
    del last


def test_release_freed_is_a_no_op_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release_freed() is False
