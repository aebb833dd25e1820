"""kernelmap.heap: the free pages of the C heap handed back to the OS."""

from __future__ import annotations

import ctypes.util
import os
import platform
import subprocess
import sys

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


_KEPT_AND_HANDED_BACK = """
import os
from kernelmap import heap

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def touched(size):
    b = bytearray(size)
    b[::4096] = b"\\x01" * len(b[::4096])
    return b

# 16 MiB: above glibc's default mmap threshold (128 KiB), so by default a block of its own,
# unmapped on free; within, a heap block whose pages stay resident once freed
with heap.freed_pages_kept() as kept:
    assert kept is True
    block = touched(16 << 20)
    held = rss()
    del block
    freed = rss()
    assert held - freed < 4 << 20, ("kept for the next blocks", held, freed)
released = rss()
assert freed - released > 12 << 20, ("handed back on exit", freed, released)
# glibc's default thresholds again: such a block is unmapped as it is freed
block = touched(16 << 20)
held = rss()
del block
assert held - rss() > 12 << 20, ("unmapped on free again", held)
"""


@glibc
def test_freed_pages_kept_within_and_handed_back_on_exit():
    # a fresh interpreter: in a long test process a free chunk of 16 MiB or more left in the heap by
    # earlier tests serves the last block from the heap whatever the mmap threshold (CI saw it)
    proc = subprocess.run([sys.executable, "-c", _KEPT_AND_HANDED_BACK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_freed_pages_kept_is_a_no_op_without_mallopt(monkeypatch):
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    with heap.freed_pages_kept() as kept:
        assert kept is False


def _arrow_pool_in_a_fresh_process(env_value: str | None) -> str:
    """The default pool pyarrow chooses in a fresh interpreter that imports the console script first."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != heap.ARROW_POOL_ENV}
    if env_value is not None:
        env[heap.ARROW_POOL_ENV] = env_value
    code = "import kernelmap.cli, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_console_script_gives_arrow_the_c_heap():
    pa = pytest.importorskip("pyarrow")
    assert "system" in pa.supported_memory_backends()
    # pyarrow's own default is mimalloc or jemalloc on its wheels; kernelmap's process takes malloc
    assert _arrow_pool_in_a_fresh_process(None) == "system"


def test_an_arrow_pool_the_user_chose_is_kept():
    pa = pytest.importorskip("pyarrow")
    others = [b for b in pa.supported_memory_backends() if b != "system"]
    if not others:
        pytest.skip("this pyarrow has only the system allocator")
    assert _arrow_pool_in_a_fresh_process(others[0]) == others[0]
