"""pytest-benchmark's storage on disk: ``ROOT/<machine_id>/NNNN_<commit>_<date>[_uncommitted-changes].json``,
a folder per machine, runs numbered per machine from 0001. ``BenchStorage`` owns that layout: it
lists, reads (strictly: a broken file is an error naming it) and numbers saved runs, names a new one
and writes it whole, locked, never over another (so the run number names a run for good).
``pick_runs`` reads ``kernelmap compare``'s BASE/NEW (``0001``, ``path.json``, ``0001,0002``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ..errors import KernelmapError
from ..interrupt import raise_if_seen
from .keys import SavedRun, parse_when

NAME_RE = re.compile(r"^(?P<num>\d{4})_(?P<rest>.+)\.json$")  # a saved run's file name: NNNN_<tag>.json


def default_storage() -> Path:
    return Path(".benchmarks")


def machine_id() -> str:
    """pytest-benchmark's machine id of this interpreter (its ``utils.get_machine_id``): the storage
    folder its runs are saved under, e.g. ``Linux-CPython-3.11-64bit``."""
    from pytest_benchmark.utils import get_machine_id

    return get_machine_id()


class BenchStorage:
    """pytest-benchmark's file storage (``ROOT/<machine_id>/NNNN_<tag>.json``, numbered per machine
    from 0001), found by pytest-benchmark's own ``FileStorage.query``. Reading is strict (a broken file
    is an error naming it, where ``FileStorage.load`` warns and skips it) and saving atomic and locked
    (``FileStorage.save`` writes in place), so those two are kernelmap's. Every read and write of
    saved runs goes through it."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def files(self, machine: str | None = None) -> list[tuple[str, str, Path]]:
        """(machine, number, path) of every saved run (of ``machine`` only, when given), in that order."""
        if not self.root.is_dir():
            return []
        from pytest_benchmark.storage.file import FileStorage

        found = FileStorage(self.root, logger=None, default_machine_id=machine).query("[0-9][0-9][0-9][0-9]_")
        out = []
        for path in found:
            if path.parent.parent.resolve() != self.root.resolve():
                continue  # a file directly under ROOT: not a machine's saved run
            m = NAME_RE.match(path.name)
            if m and path.is_file():
                out.append((path.parent.name, m["num"], self.root / path.parent.name / path.name))
        return sorted(out)

    def runs(self) -> list[SavedRun]:
        """Every saved run, ordered by (machine, number)."""
        if not self.root.is_dir():
            raise KernelmapError(f"{self.root}: no pytest-benchmark storage here (`nox -s bench` or "
                                 "`nox -s benchmarks` saves one)")
        runs = [self.read(path, number, machine) for machine, number, path in self.files()]
        if not runs:
            raise KernelmapError(f"{self.root}: no saved runs (<machine>/NNNN_*.json) found")
        return runs

    @staticmethod
    def read(path: Path, number: str | None = None, machine: str | None = None) -> SavedRun:
        """One saved run (its number and machine, where not given, from its name and folder); a file
        that cannot be read or is no pytest-benchmark file is an error naming it."""
        if number is None:
            m = NAME_RE.match(path.name)
            number = m["num"] if m else path.stem
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
        except OSError as exc:
            raise KernelmapError(f"{path}: cannot be read ({exc.strerror})") from None
        if not isinstance(data, dict) or "benchmarks" not in data:
            raise KernelmapError(f"{path}: not a pytest-benchmark file (no 'benchmarks' key)")
        return SavedRun(number, machine if machine is not None else path.parent.name, path, data)

    @staticmethod
    def tag(data: dict) -> str:
        """pytest-benchmark's name for a saved run (``utils.get_tag``): ``<commit>_<YYYYmmdd_HHMMSS>``,
        ``_uncommitted-changes`` appended where the tree was dirty; the time is the run's ``datetime``."""
        commit = data.get("commit_info") or {}
        when = parse_when(data.get("datetime")) or datetime.now(UTC)
        parts = [str(commit.get("id") or "unversioned"), when.astimezone(UTC).strftime("%Y%m%d_%H%M%S")]
        if commit.get("dirty"):
            parts.append("uncommitted-changes")
        return "_".join(parts)

    def next_number(self, machine: str) -> str:
        """The number the next run saved for ``machine`` gets: one more than the highest saved, else 0001."""
        return f"{max((int(n) for _, n, _ in self.files(machine)), default=0) + 1:04d}"

    def save(self, data: dict, machine: str, tag: str) -> Path:
        """Write ``data`` as the next numbered run of ``machine``: ``NNNN_<tag>.json``, as pytest-benchmark
        writes it (indented, ASCII). The file appears whole or not at all: written beside it under a
        temporary name, then linked to its name. Never replaces a file, and never takes a number that a
        run of this machine already has (kernelmap's writers take turns, locking the machine's folder; a number that
        another writer, e.g. pytest's autosave, took meanwhile is given up for the next)."""
        if not NAME_RE.match(f"0000_{tag}.json") or "/" in tag or os.sep in tag:
            raise KernelmapError(f"{tag!r}: not a name a saved run can have")
        folder = self.root / machine
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".save-job.", suffix=".partial", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(json.dumps(data, indent=4, ensure_ascii=True).encode())
                fh.flush()
                os.fsync(fh.fileno())
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # mkstemp's file is private; a saved run is not
            lock = os.open(folder, os.O_RDONLY)  # the machine's folder itself is the lock: no file left behind
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                for _ in range(100):
                    raise_if_seen()
                    number = self.next_number(machine)
                    path = folder / f"{number}_{tag}.json"
                    if not _link(tmp, path):
                        continue  # that name exists: take the next number
                    if any(n == number and p != path for _, n, p in self.files(machine)):
                        os.unlink(path)  # another run has this number: give it up
                        continue
                    return path
            finally:
                os.close(lock)  # releases the lock
            raise KernelmapError(f"{folder}: could not take a run number (100 tries)")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _link(tmp: str, path: Path) -> bool:
    """Give the complete file ``tmp`` the name ``path`` unless that name exists (False then)."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: claim the name, then replace it
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            return False
        os.replace(tmp, path)
        return True


def list_runs(storage: str | Path) -> list[SavedRun]:
    """Every saved run under ``storage``, ordered by (machine, number)."""
    return BenchStorage(storage).runs()


def _pick(runs: list[SavedRun], ref: str) -> SavedRun:
    p = Path(ref)
    if p.suffix == ".json":
        if not p.is_file():
            raise KernelmapError(f"{ref}: no such file")
        for r in runs:
            if r.path.resolve() == p.resolve():
                return r
        return BenchStorage.read(p)
    if not ref.isdigit():
        raise KernelmapError(f"{ref!r}: expected a run number such as 0001, or a .json file")
    num = f"{int(ref):04d}"
    hits = [r for r in runs if r.number == num]
    if not hits:
        raise KernelmapError(f"run {num} not found; saved runs: {', '.join(r.number for r in runs)}")
    if len(hits) > 1:
        raise KernelmapError(
            f"run {num} exists for several machines ({', '.join(r.machine for r in hits)}); "
            "point --storage at one machine's folder's parent with only that machine, or pass the .json path")
    return hits[0]


def pick_runs(runs: list[SavedRun], spec: str) -> list[SavedRun]:
    """``0001``, ``path.json`` or several joined by commas: the saved runs of one side."""
    picked = [_pick(runs, part.strip()) for part in spec.split(",") if part.strip()]
    if not picked:
        raise KernelmapError(f"{spec!r}: no run named")
    return list(dict.fromkeys(picked))

