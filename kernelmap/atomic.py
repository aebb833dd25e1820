"""Write outputs under a temporary name and rename them into place only when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import KernelmapError
from .interrupt import raise_if_seen


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publishable(path: Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp create private (0600/0700) entries; give the final output the usual mode."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Open a temporary file beside ``path``; it replaces ``path`` only if the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        raise_if_seen()
        _publishable(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a file name (Parquet, PNG)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial" + path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        raise_if_seen()
        _publishable(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _remove_tree(path: Path, tries: int = 20, pause_s: float = 0.1) -> None:
    """Remove a directory tree that something may still be writing into (a stopped worker's last
    output, a log line in flight): retried while entries keep appearing."""
    import time

    for _ in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        time.sleep(pause_s)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, replace: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it to ``path`` when the block completes.

    An existing ``path`` is refused unless ``replace`` is set. On any exception (Ctrl-C included)
    the temporary directory is removed, so nothing half-written is left that looks complete.
    """
    path = Path(path)
    if path.exists() and not replace:
        raise KernelmapError(f"{path}: already exists; choose another --out or pass --replace")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield tmp
        raise_if_seen()
        _publishable(tmp, directory=True)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        _remove_tree(tmp)
        raise
