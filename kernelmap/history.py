"""``kernelmap compare``: compare saved pytest-benchmark runs, like with like.

pytest-benchmark's storage is a folder per machine,
``.benchmarks/<machine_id>/NNNN_<commit>_<date>[_uncommitted-changes].json``; a saved run is never
overwritten, so the run number ``NNNN`` names it. ``BenchStorage`` owns that layout here (reading
every run, numbering and writing a new one).

**A bench job is one saved run.** ``nox -s bench`` and ``nox -s benchmarks`` run one pytest process
per framework (their CUDA runtimes never share a process; JAX runs from its own interpreter), each
writing ``--benchmark-json`` to a scratch file; ``kernelmap save-job`` (``save_job``) merges those
files into ONE numbered run holding every framework and mode of the job, with the top-level key
``"kernelmap_job"`` (``JOB_KEY``): the job id, which ``nox -s bench`` also gives ``kernelmap run``
(``$KERNELMAP_JOB``, the run directory's name) so that a report pairs the two. A part that is
missing, empty or not a pytest-benchmark JSON file is an error naming it, and nothing is written.
Storages saved before (one file per framework, no job id) still load and compare: a run without a
job id is a job of its own.

**Keys.** Every framework benchmark is keyed by framework x mode x device x batch size
(``BenchKey``; ``Mode`` lists the modes: ``eager`` for PyTorch, ``imperative`` and ``hybridized``
for Gluon, ``jit`` for JAX). ``benches/bench_train_step.py`` writes the key into the benchmark's name
(``test_train_step[pytorch-eager-cpu-64]``), its params and its ``extra_info``. A benchmark is
identified by its test function (the name before ``[``) and its key. Files saved before keys
existed are read from params and ``extra_info`` where those hold all four fields; a benchmark that
records some of them but not all (the old ``test_train_step[cpu-64]`` has no mode) cannot be paired
and is listed as such, never guessed. A benchmark that records none of the four is not a framework
benchmark (e.g. ``benches/bench_adapters.py``) and is identified by its full name.

**Pairing.** Only benchmarks with the same identity are compared:

- ``kernelmap compare`` (no runs given): for each identity saved on the machine that saved the
  latest run, NEW is the latest saved run holding it and BASE the one before it that holds it.
  After two bench jobs (0001, 0002) that is every key of 0001 against the same key of 0002; in an
  older storage of one file per framework (0001 PyTorch, 0002 MXNet, 0003 PyTorch, 0004 MXNet) it
  pairs PyTorch 0001 -> 0003 and MXNet 0002 -> 0004. Where every key is saved in one run only (right
  after the first bench job) there is nothing earlier yet: ``main`` says so, naming the saved job,
  and exits 0.
- ``kernelmap compare BASE``: each benchmark of BASE against the latest later run of the same
  machine that holds its identity.
- ``kernelmap compare BASE NEW``: BASE and NEW are each a run number, a ``.json`` file, or several
  of these joined by commas (``0001,0002``: both files of one older bench job); within one side an
  identity may occur once.

When runs named as BASE and NEW pair nothing, ``main`` exits 2 with one line naming what each side
holds. Computing (``compare_runs``, ``compare_latest``) returns a ``Comparison``; printing is
``format_comparison``, which also names each side measured under contention (``extra_info``'s
``contention``, ``kernelmap.contention.summarise``). ``main`` exits 1 when a benchmark got slower
than a threshold given as ``--fail mean:5%`` (relative) or ``--fail min:0.001`` (absolute seconds),
the grammar of pytest-benchmark's ``--benchmark-compare-fail``.

``load_history`` returns every saved benchmark as one tidy table with its key, job and contention;
``trend_series`` cuts it into one series per key over jobs (in time order), which
``reports.figures.trend_figure`` draws.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from . import frameworks
from .errors import KernelmapError
from .interrupt import raise_if_seen

TIME_STATS = ("min", "max", "mean", "stddev", "median", "iqr")  # seconds, as pytest-benchmark saves them
STATS = (*TIME_STATS, "ops", "rounds")
# stats where larger is better; a rise there is not a slowdown
_HIGHER_IS_BETTER = {"ops"}
_NAME_RE = re.compile(r"^(?P<num>\d{4})_(?P<rest>.+)\.json$")

JOB_ENV = "KERNELMAP_JOB"  # the job id `nox -s bench` gives `kernelmap run` and the step benchmarks
JOB_KEY = "kernelmap_job"  # top-level key of a saved job: its id
PARTS_KEY = "kernelmap_parts"  # top-level key of a saved job: the per-framework files merged into it
# extra_info fields of the step benchmark (benches/bench_train_step.py)
STEPS_PER_ROUND = "steps_per_round"  # training steps per round, the device synchronised once per round
CONTENTION = "contention"  # kernelmap.contention.summarise() of the benchmark's rounds


# How a framework executes the benchmarked step: every mode of every framework's descriptor
# (``frameworks.MODES``), members named after them (upper case, "-" as "_"). A new mode is a line in its
# framework's descriptor, not here.
Mode = enum.StrEnum("Mode", {m.upper().replace("-", "_"): m for m in frameworks.MODES})


# the modes each framework's benchmark runs, in order
FRAMEWORK_MODES: dict[str, tuple[Mode, ...]] = {
    name: tuple(Mode(m) for m in d.modes) for name, d in frameworks.REGISTRY.items()
}
KEY_FIELDS = ("framework", "mode", "device", "batch_size")


@dataclass(frozen=True, order=True)
class BenchKey:
    """What a framework benchmark measures: framework x mode x device x batch size."""

    framework: str
    mode: str
    device: str
    batch_size: int

    @property
    def id(self) -> str:
        """The pytest parameter id: ``pytorch-eager-cpu-64``."""
        return f"{self.framework}-{self.mode}-{self.device}-{self.batch_size}"

    @property
    def label(self) -> str:
        return f"{self.framework} {self.mode} {self.device} bs{self.batch_size}"

    def extra_info(self) -> dict:
        """The fields a benchmark records in ``extra_info`` (``key`` is the id, for readers)."""
        return {"framework": self.framework, "mode": Mode(self.mode).value, "device": self.device,
                "batch_size": self.batch_size, "key": self.id}


@dataclass(frozen=True)
class SavedRun:
    """One saved pytest-benchmark file."""

    number: str  # "0001"
    machine: str  # the storage subfolder, pytest-benchmark's machine id
    path: Path
    data: dict = field(repr=False, compare=False, hash=False)

    @property
    def job(self) -> str | None:
        """The bench job this run holds (``JOB_KEY``); None for a run saved before jobs (one framework)."""
        job = self.data.get(JOB_KEY)
        return str(job) if job else None

    @property
    def job_text(self) -> str:
        """``job 20261125T101500Z (run 0001)``, or ``run 0001 (no job recorded)``."""
        return f"job {self.job} (run {self.number})" if self.job else f"run {self.number} (no job recorded)"

    @property
    def label(self) -> str:
        commit = (self.data.get("commit_info") or {}).get("id") or "?"
        job = f"job {self.job}, " if self.job else ""
        return f"{self.number} ({job}{str(commit)[:10]}, {self.data.get('datetime', '?')})"


@dataclass(frozen=True)
class Entry:
    """One benchmark of one saved run, with its identity."""

    run: SavedRun
    name: str  # as saved: test_train_step[pytorch-eager-cpu-64]
    bench: str  # the test function (keyed) or the full name (a plain benchmark)
    key: BenchKey | None  # None: not a framework benchmark
    stats: dict = field(repr=False, compare=False, hash=False)
    extra_info: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def contention(self) -> dict | None:
        """``kernelmap.contention.summarise()`` of the benchmark's rounds; None where not recorded."""
        c = self.extra_info.get(CONTENTION)
        return c if isinstance(c, dict) else None

    @property
    def samples(self) -> np.ndarray | None:
        """The saved per-round times (pytest-benchmark's ``stats["data"]``: ``--benchmark-json`` and
        ``--benchmark-save-data`` keep them), or None where the run kept only the statistics."""
        data = self.stats.get("data")
        if not isinstance(data, list) or not data:
            return None
        return np.asarray([float(v) for v in data], dtype=float)

    @property
    def ident(self) -> tuple[str, BenchKey | None]:
        return self.bench, self.key

    @property
    def label(self) -> str:
        return f"{self.bench}[{self.key.id}]" if self.key else self.bench


@dataclass(frozen=True)
class Unpaired:
    """A saved benchmark that cannot be paired, and why."""

    run: SavedRun
    name: str
    reason: str


def _field(b: dict, name: str, path: Path):
    aliases = ("batch_size", "bs") if name == "batch_size" else (name,)
    found = {}
    for where in ("params", "extra_info"):
        src = b.get(where) or {}
        for a in aliases:
            if src.get(a) is not None:
                found[where] = src[a]
                break
    if len(found) == 2 and str(found["params"]) != str(found["extra_info"]):
        raise KernelmapError(f"{path}: benchmark {b.get('name')!r}: {name} is {found['params']!r} in params "
                             f"but {found['extra_info']!r} in extra_info")
    return next(iter(found.values()), None)


def benchmark_identity(b: dict, path: Path) -> tuple[str, BenchKey | None] | str:
    """(test function, key) of one saved benchmark; (full name, None) for a benchmark that records
    no key field; a string saying why for one that records some key fields but not all."""
    name = b.get("name") or b.get("fullname")
    if not name:
        raise KernelmapError(f"{path}: a benchmark has no name")
    values = {f: _field(b, f, path) for f in KEY_FIELDS}
    missing = [f for f, v in values.items() if v is None]
    if len(missing) == len(KEY_FIELDS):
        return b.get("fullname") or name, None
    if missing:
        return f"records no {', '.join(missing)}"
    try:
        bs = int(values["batch_size"])
    except (TypeError, ValueError):
        return f"batch size {values['batch_size']!r} is not an integer"
    return name.split("[", 1)[0], BenchKey(str(values["framework"]), str(values["mode"]), str(values["device"]), bs)


def run_entries(run: SavedRun) -> tuple[list[Entry], list[Unpaired]]:
    """The benchmarks of one saved run that can be paired, and those that cannot."""
    entries, unpaired = [], []
    benches = run.data.get("benchmarks")
    if not isinstance(benches, list):
        raise KernelmapError(f"{run.path}: 'benchmarks' is not a list")
    for b in benches:
        got = benchmark_identity(b, run.path)
        if isinstance(got, str):
            unpaired.append(Unpaired(run, b.get("name") or b.get("fullname"), got))
        else:
            entries.append(Entry(run, b.get("name") or b["fullname"], *got, stats=b.get("stats") or {},
                                 extra_info=b.get("extra_info") or {}))
    seen: dict = {}
    for e in entries:
        if e.ident in seen:
            raise KernelmapError(f"{run.path}: benchmarks {seen[e.ident]!r} and {e.name!r} have the same key "
                                 f"{e.label}")
        seen[e.ident] = e.name
    return entries, unpaired


@dataclass(frozen=True)
class Threshold:
    stat: str
    value: float
    relative: bool  # True: value is a fraction (0.05 for 5%); False: seconds

    @classmethod
    def parse(cls, text: str) -> Threshold:
        m = re.fullmatch(r"\s*(\w+)\s*:\s*([0-9.]+)\s*(%?)\s*", text)
        if not m:
            raise KernelmapError(f"--fail {text!r}: expected STAT:N% or STAT:SECONDS, e.g. mean:5%")
        stat, num, pct = m.groups()
        if stat not in STATS or stat in _HIGHER_IS_BETTER or stat == "rounds":
            raise KernelmapError(f"--fail {text!r}: stat must be one of min, max, mean, stddev, median, iqr")
        try:
            value = float(num)
        except ValueError:
            raise KernelmapError(f"--fail {text!r}: {num!r} is not a number") from None
        return cls(stat, value / 100 if pct else value, bool(pct))

    def __str__(self) -> str:
        return f"{self.stat}:{self.value * 100:g}%" if self.relative else f"{self.stat}:{self.value:g}s"


class NothingToCompare(KernelmapError):
    """No benchmark of BASE has a match in NEW (exit 2)."""


_ROW_ID = ["benchmark", "framework", "mode", "device", "batch_size", "base_run", "new_run"]
# per pair: whether each side was measured under contention (None: not recorded) and the measured figure
_CONTENTION_COLS = ["contended_base", "contended_new", "contention_base", "contention_new"]


@dataclass
class Comparison:
    base: list[SavedRun]  # the runs BASE's benchmarks came from
    new: list[SavedRun]
    table: pd.DataFrame  # one row per pair: _ROW_ID, then <stat>_base, <stat>_new, <stat>_delta, <stat>_rel
    only_base: list[str]  # benchmark labels without a match on the other side
    only_new: list[str]
    unpaired: list[Unpaired]
    thresholds: list[Threshold]
    failures: list[str]  # human-readable, one per (benchmark, threshold) exceeded
    selection: str  # how BASE and NEW were chosen, one line
    single: list[str] = field(default_factory=list)  # default selection: "label in NNNN" saved in one run only
    single_runs: list[SavedRun] = field(default_factory=list)  # the runs holding ``single``'s benchmarks
    # past a threshold, but the samples do not differ beyond their noise (NOISE_ALPHA): not failures
    within_noise: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def nothing_earlier(self) -> bool:
        """The default selection paired nothing because every key is saved in one run only (right
        after the first bench job): nothing earlier to compare yet, which is not an error."""
        return self.table.empty and bool(self.single)

    def earlier_message(self) -> str:
        """One line naming the saved job(s) that hold the only run of each key."""
        runs = self.single_runs
        held = (f"its {len(self.single)} benchmark(s) are saved in one job only, {runs[0].job_text}"
                if len(runs) == 1 else
                f"each of its {len(self.single)} benchmark(s) is saved in one run only "
                f"({', '.join(r.job_text for r in runs)})")
        text = (f"nothing earlier to compare yet ({self.selection}): {held}; the next bench job will be "
                "compared against it")
        if self.thresholds:
            text += f"; {', '.join(map(str, self.thresholds))} not applied"
        return text + (f"; cannot be paired: {_unpaired_text(self.unpaired)}" if self.unpaired else "")

    def nothing_message(self) -> str:
        """One line: what each side holds, when nothing pairs."""
        if self.single or not (self.base or self.new):  # the default selection: name each key's one run
            held = f"no key is saved in two runs; saved once: {_list_text(self.single)}"
        else:
            held = (f"BASE {_runs_text(self.base)} holds {_list_text(self.only_base)}; "
                    f"NEW {_runs_text(self.new)} holds {_list_text(self.only_new)}")
        return (f"nothing to compare ({self.selection}): {held}"
                + (f"; cannot be paired: {_unpaired_text(self.unpaired)}" if self.unpaired else ""))

    def to_dict(self) -> dict:
        def run(r: SavedRun) -> dict:
            return {"number": r.number, "machine": r.machine, "path": str(r.path), "label": r.label}

        return {
            "selection": self.selection,
            "base": [run(r) for r in self.base],
            "new": [run(r) for r in self.new],
            "thresholds": [str(t) for t in self.thresholds],
            "benchmarks": json.loads(self.table.to_json(orient="records")),
            "only_base": self.only_base,
            "only_new": self.only_new,
            "single": self.single,
            "unpaired": [{"run": u.run.number, "path": str(u.run.path), "name": u.name, "reason": u.reason}
                         for u in self.unpaired],
            "failures": self.failures,
            "within_noise": self.within_noise,
            "failed": self.failed,
            "nothing_earlier": self.earlier_message() if self.nothing_earlier else None,
        }


def _runs_text(runs: Sequence[SavedRun]) -> str:
    return ",".join(r.number for r in runs) if runs else "(no run)"


def _list_text(labels: Sequence[str], most: int = 12) -> str:
    if not labels:
        return "nothing pairable"
    shown = list(labels[:most])
    return ", ".join(shown) + (f" and {len(labels) - most} more" if len(labels) > most else "")


def _unpaired_text(unpaired: Sequence[Unpaired]) -> str:
    by_reason: dict[str, list[Unpaired]] = {}
    for u in unpaired:
        by_reason.setdefault(u.reason, []).append(u)
    return "; ".join(f"{len(us)} benchmark(s) in {_runs_text(sorted({u.run for u in us}, key=_run_order))} "
                     f"{reason}" for reason, us in by_reason.items())


def _run_order(r: SavedRun) -> tuple[str, str]:
    return r.machine, r.number


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
            m = _NAME_RE.match(path.name)
            if m and path.is_file():
                out.append((path.parent.name, m["num"], self.root / path.parent.name / path.name))
        return sorted(out)

    def runs(self) -> list[SavedRun]:
        """Every saved run, ordered by (machine, number)."""
        if not self.root.is_dir():
            raise KernelmapError(f"{self.root}: no pytest-benchmark storage here (`nox -s bench` or "
                                 "`nox -s benchmarks` saves one)")
        runs = [load_run(path, number, machine) for machine, number, path in self.files()]
        if not runs:
            raise KernelmapError(f"{self.root}: no saved runs (<machine>/NNNN_*.json) found")
        return runs

    def next_number(self, machine: str) -> str:
        """The number the next run saved for ``machine`` gets: one more than the highest saved, else 0001."""
        return f"{max((int(n) for _, n, _ in self.files(machine)), default=0) + 1:04d}"

    def save(self, data: dict, machine: str, tag: str) -> Path:
        """Write ``data`` as the next numbered run of ``machine``: ``NNNN_<tag>.json``, as pytest-benchmark
        writes it (indented, ASCII). The file appears whole or not at all: written beside it under a
        temporary name, then linked to its name. Never replaces a file, and never takes a number that a
        run of this machine already has (kernelmap's writers take turns, locking the machine's folder; a number that
        another writer, e.g. pytest's autosave, took meanwhile is given up for the next)."""
        if not _NAME_RE.match(f"0000_{tag}.json") or "/" in tag or os.sep in tag:
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


def load_run(path: Path, number: str, machine: str) -> SavedRun:
    """One saved run; a file that cannot be read or is no pytest-benchmark file is an error naming it."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise KernelmapError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise KernelmapError(f"{path}: not a pytest-benchmark file (no 'benchmarks' key)")
    return SavedRun(number, machine, path, data)


# --- one bench job, one saved run ------------------------------------------------------------
def read_part(path: str | Path) -> dict:
    """One framework's ``--benchmark-json`` file of a bench job. Missing, empty, not JSON, not a
    pytest-benchmark file, or already a merged job: an error naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KernelmapError(f"{path}: no such file (that framework's step benchmarks wrote no "
                             "--benchmark-json)") from None
    except OSError as exc:
        raise KernelmapError(f"{path}: cannot be read ({exc.strerror})") from None
    if not text.strip():
        raise KernelmapError(f"{path}: empty (pytest wrote no benchmark into it)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise KernelmapError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    if data.get(JOB_KEY):
        raise KernelmapError(f"{path}: already a saved job ({data[JOB_KEY]}); give the per-framework files")
    for b in data["benchmarks"]:
        if not isinstance(b, dict) or not isinstance(b.get("stats"), dict):
            raise KernelmapError(f"{path}: benchmark {b.get('name') if isinstance(b, dict) else b!r} has no stats")
    return data


def _when(text) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)  # pytest-benchmark < 4.0.0 wrote naive UTC


def merge_job(parts: Sequence[str | Path], job: str) -> dict:
    """The per-framework ``--benchmark-json`` files of one bench job as ONE pytest-benchmark run: their
    benchmarks in the order given, the first part's machine and commit info (``dirty`` where any part's
    is; ``machine_info["kernelmap"]["framework_versions"]`` per framework), the earliest part's
    ``datetime``, ``JOB_KEY``: ``job``, and ``PARTS_KEY``: per part its file name, framework, datetime,
    Python and number of benchmarks. Every part is read before anything is merged; a key held by two
    parts is an error naming both."""
    if not job or not str(job).strip():
        raise KernelmapError("a job id is required (the run directory's name, e.g. 20261125T101500Z)")
    if not parts:
        raise KernelmapError(f"job {job}: no benchmark file to save")
    paths = [Path(p) for p in parts]
    datas = [read_part(p) for p in paths]
    held: dict = {}
    for path, data in zip(paths, datas, strict=True):
        for b in data["benchmarks"]:
            got = benchmark_identity(b, path)
            ident = got if isinstance(got, tuple) else b.get("fullname") or b.get("name")
            if ident in held:
                raise KernelmapError(f"{held[ident]} and {path} both hold benchmark {b.get('name')!r}")
            held[ident] = path
    first = datas[0]
    machine_info = json.loads(json.dumps(first.get("machine_info") or {}))
    versions = {}
    summary = []
    for path, data in zip(paths, datas, strict=True):
        km = (data.get("machine_info") or {}).get("kernelmap") or {}
        fw = km.get("framework")
        if fw:
            versions[fw] = km.get("framework_versions")
        summary.append({"file": path.name, "framework": fw, "datetime": data.get("datetime"),
                        "python_version": (data.get("machine_info") or {}).get("python_version"),
                        "benchmarks": len(data["benchmarks"])})
    if isinstance(machine_info.get("kernelmap"), dict):
        km = machine_info["kernelmap"]
        km.pop("framework", None)
        km["framework_versions"] = versions
    commit = dict(first.get("commit_info") or {})
    if any((d.get("commit_info") or {}).get("dirty") for d in datas):
        commit["dirty"] = True
    stamps = [(w, d.get("datetime")) for d in datas if (w := _when(d.get("datetime"))) is not None]
    return {
        "machine_info": machine_info,
        "commit_info": commit,
        "benchmarks": [b for d in datas for b in d["benchmarks"]],
        "datetime": min(stamps, key=lambda s: s[0])[1] if stamps else first.get("datetime"),
        "version": first.get("version"),
        JOB_KEY: str(job),
        PARTS_KEY: summary,
    }


def run_tag(data: dict) -> str:
    """pytest-benchmark's name for a saved run (``utils.get_tag``): ``<commit>_<YYYYmmdd_HHMMSS>``,
    ``_uncommitted-changes`` appended where the tree was dirty; the time is the run's ``datetime``."""
    commit = data.get("commit_info") or {}
    when = _when(data.get("datetime")) or datetime.now(UTC)
    parts = [str(commit.get("id") or "unversioned"), when.astimezone(UTC).strftime("%Y%m%d_%H%M%S")]
    if commit.get("dirty"):
        parts.append("uncommitted-changes")
    return "_".join(parts)


def save_job(storage: str | Path, parts: Sequence[str | Path], job: str, machine: str | None = None) -> Path:
    """Merge one bench job's per-framework files (``merge_job``) and save them as the next numbered run
    of ``machine`` (default: this interpreter's ``machine_id``) under ``storage``; its path."""
    data = merge_job(parts, job)
    return BenchStorage(storage).save(data, machine or machine_id(), run_tag(data))


def _pick(runs: list[SavedRun], ref: str) -> SavedRun:
    p = Path(ref)
    if p.suffix == ".json":
        if not p.is_file():
            raise KernelmapError(f"{ref}: no such file")
        for r in runs:
            if r.path.resolve() == p.resolve():
                return r
        m = _NAME_RE.match(p.name)
        return load_run(p, m["num"] if m else p.stem, p.parent.name)
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


def _side(runs: list[SavedRun], which: str) -> tuple[dict, list[Unpaired]]:
    """identity -> Entry over one side's runs; an identity held by two of them is an error."""
    out: dict = {}
    unpaired: list[Unpaired] = []
    for r in runs:
        entries, bad = run_entries(r)
        unpaired += bad
        for e in entries:
            if e.ident in out:
                raise KernelmapError(f"{which} holds {e.label} twice ({out[e.ident].run.path} and {r.path}); "
                                     "name one of those runs")
            out[e.ident] = e
    return out, unpaired


# A change is called only where the two runs' samples differ beyond their noise: a two-sided
# Mann-Whitney U test at this level (as google/benchmark's compare.py does before it reports a change).
NOISE_ALPHA = 0.05
MIN_SAMPLES = 5  # per side; with fewer the test cannot reach NOISE_ALPHA reliably: noise not judged


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test of samples ``a`` and ``b`` (normal approximation
    with tie and continuity corrections; samples of MIN_SAMPLES or more)."""
    import math

    n1, n2 = len(a), len(b)
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ((counts ** 3 - counts).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u1 - mean) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def noise_verdict(base: Entry, new: Entry) -> tuple[float | None, str]:
    """(p-value, why) of the pair's samples: p None where either side has fewer than MIN_SAMPLES."""
    a, b = base.samples, new.samples
    if a is None or b is None or min(len(a), len(b)) < MIN_SAMPLES:
        have = "no samples saved" if a is None or b is None else f"{len(a)} and {len(b)} samples"
        return None, f"noise not judged ({have}; needs {MIN_SAMPLES} a side)"
    p = mann_whitney_p(a, b)
    return p, f"Mann-Whitney U p={p:.3g}, {len(a)} and {len(b)} samples"


def _sort_key(e: Entry):
    k = e.key
    return (e.bench, k is not None, *((k.framework, k.mode, k.device, k.batch_size) if k else ()))


def _build(pairs: list[tuple[Entry, Entry]], only_base: list[Entry], only_new: list[Entry],
           unpaired: list[Unpaired], thresholds: list[Threshold], selection: str,
           base_runs: list[SavedRun] | None = None, new_runs: list[SavedRun] | None = None,
           single: Sequence[Entry] = ()) -> Comparison:
    pairs = sorted(pairs, key=lambda p: _sort_key(p[1]))
    rows = []
    for b, n in pairs:
        k = n.key
        row = {"benchmark": n.bench, "framework": k.framework if k else None, "mode": k.mode if k else None,
               "device": k.device if k else None, "batch_size": k.batch_size if k else None,
               "base_run": b.run.number, "new_run": n.run.number, "label": n.label,
               "base_job": b.run.job, "new_job": n.run.job}
        for side, e in (("base", b), ("new", n)):
            c = e.contention
            row[f"contended_{side}"] = bool(c["contended"]) if c and c.get("contended") is not None else None
            row[f"contention_{side}"] = c.get("text") if c else None
        row["p_value"], row["noise"] = noise_verdict(b, n)
        for s in STATS:
            bs, ns = _num(b.stats.get(s)), _num(n.stats.get(s))
            row.update({f"{s}_base": bs, f"{s}_new": ns, f"{s}_delta": ns - bs,
                        f"{s}_rel": (ns - bs) / bs if bs else float("nan")})
        rows.append(row)
    cols = [*_ROW_ID, "label", "base_job", "new_job", *_CONTENTION_COLS, "p_value", "noise",
            *(f"{s}_{w}" for s in STATS for w in ("base", "new", "delta", "rel"))]
    table = pd.DataFrame(rows, columns=cols)
    failures, within_noise = [], []
    for t in thresholds:
        for _, r in table.iterrows():
            delta = r[f"{t.stat}_rel" if t.relative else f"{t.stat}_delta"]
            if pd.notna(delta) and delta > t.value:
                got = f"{delta * 100:+.2f}%" if t.relative else f"{delta:+.6g}s"
                if pd.notna(r["p_value"]) and r["p_value"] >= NOISE_ALPHA:  # the samples overlap: no change called
                    within_noise.append(f"{r['label']} ({r['base_run']} -> {r['new_run']}): {t.stat} {got} past {t}, "
                                        f"within the samples' noise ({r['noise']})")
                    continue
                failures.append(f"{r['label']} ({r['base_run']} -> {r['new_run']}): {t.stat} {got} exceeds {t}"
                                + ("" if pd.notna(r["p_value"]) else f"; {r['noise']}")
                                + "".join(f"; {side.upper()} measured under contention ({r[f'contention_{side}']})"
                                          for side in ("base", "new") if flagged(r[f"contended_{side}"])))
    if base_runs is None:
        base_runs = sorted({b.run for b, _ in pairs} | {e.run for e in only_base}, key=_run_order)
    if new_runs is None:
        new_runs = sorted({n.run for _, n in pairs} | {e.run for e in only_new}, key=_run_order)
    return Comparison(base_runs, new_runs, table,
                      [e.label for e in sorted(only_base, key=_sort_key)],
                      [e.label for e in sorted(only_new, key=_sort_key)],
                      sorted(unpaired, key=lambda u: (_run_order(u.run), u.name)), thresholds, failures, selection,
                      [f"{e.label} in {e.run.number}" for e in sorted(single, key=_sort_key)],
                      sorted({e.run for e in single}, key=_run_order), within_noise)


def flagged(x) -> bool:
    """A ``contended`` cell that says yes (True; not False, None or NaN: not recorded)."""
    return isinstance(x, bool | np.bool_) and bool(x)


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def compare_runs(base: SavedRun | Sequence[SavedRun], new: SavedRun | Sequence[SavedRun],
                 thresholds: list[Threshold] | None = None) -> Comparison:
    """BASE's and NEW's benchmarks paired by identity (test function x framework x mode x device x
    batch size); per pair, the deltas of every stat; ``failures`` lists the thresholds exceeded."""
    base = [base] if isinstance(base, SavedRun) else list(base)
    new = [new] if isinstance(new, SavedRun) else list(new)
    b, ub = _side(base, "BASE")
    n, un = _side(new, "NEW")
    pairs = [(b[i], n[i]) for i in n if i in b]
    return _build(pairs, [e for i, e in b.items() if i not in n], [e for i, e in n.items() if i not in b],
                  ub + [u for u in un if u not in ub], list(thresholds or []),
                  f"BASE {_runs_text(base)}, NEW {_runs_text(new)}", base, new)


def compare_latest(runs: list[SavedRun], thresholds: list[Threshold] | None = None,
                   base: Sequence[SavedRun] | None = None) -> Comparison:
    """Without ``base``: per identity, the latest two saved runs of the machine that saved the latest
    run. With ``base``: each of BASE's benchmarks against the latest later run of its machine that
    holds the same identity."""
    if base is None:
        latest = max(runs, key=lambda r: (str(r.data.get("datetime", "")), r.number))
        machines = {latest.machine}
        selection = f"latest two saved runs per key on {latest.machine}"
    else:
        machines = {r.machine for r in base}
        selection = f"BASE {_runs_text(base)} against the latest later run per key"
    pool = sorted((r for r in runs if r.machine in machines), key=lambda r: int(r.number))
    held: dict = {}  # identity -> [Entry] in run order
    unpaired: list[Unpaired] = []
    for r in pool:
        entries, bad = run_entries(r)
        unpaired += bad
        for e in entries:
            held.setdefault((r.machine, e.ident), []).append(e)
    pairs, only_base, single = [], [], []
    if base is None:
        for es in held.values():
            if len(es) >= 2:
                pairs.append((es[-2], es[-1]))
            else:
                single.append(es[-1])
        return _build(pairs, [], [], unpaired, list(thresholds or []), selection, single=single)
    b, ub = _side(list(base), "BASE")
    for ident, e in b.items():
        later = [x for x in held.get((e.run.machine, ident), []) if int(x.run.number) > int(e.run.number)]
        if later:
            pairs.append((e, later[-1]))
        else:
            only_base.append(e)
    return _build(pairs, only_base, [], ub, list(thresholds or []), selection, list(base))


def compare_storage(storage: str | Path, base: str | None = None, new: str | None = None,
                    thresholds: list[Threshold] | None = None) -> Comparison:
    """``kernelmap compare [BASE] [NEW]`` on a storage folder (see the module docstring)."""
    runs = list_runs(storage)
    if base is None and new is None:
        return compare_latest(runs, thresholds)
    if base is None:
        raise KernelmapError("NEW given without BASE")
    if new is None:
        return compare_latest(runs, thresholds, pick_runs(runs, base))
    return compare_runs(pick_runs(runs, base), pick_runs(runs, new), thresholds)


def _fmt_s(x: float) -> str:
    if pd.isna(x):
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x:.3g} s"


def format_comparison(cmp: Comparison, stats: tuple[str, ...] = ("min", "mean", "median", "max")) -> str:
    """A plain-text table: one row per pair, naming framework, mode, device and batch size, then
    base -> new and the change per stat."""
    lines = [f"selection: {cmp.selection}"]
    lines += [f"BASE {r.label}  {r.path}" for r in cmp.base]
    lines += [f"NEW  {r.label}  {r.path}" for r in cmp.new]
    lines.append("")
    header = ["benchmark", "framework", "mode", "device", "bs", "runs"] + [f"{s} base -> new (change)" for s in stats]
    rows = []
    for _, r in cmp.table.iterrows():
        keyed = pd.notna(r["framework"])
        cells = [r["benchmark"], *((r["framework"], r["mode"], r["device"], str(int(r["batch_size"])))
                                   if keyed else ("-", "-", "-", "-")),
                 f"{r['base_run']} -> {r['new_run']}"]
        for s in stats:
            rel = r[f"{s}_rel"]
            cells.append(f"{_fmt_s(r[f'{s}_base'])} -> {_fmt_s(r[f'{s}_new'])} "
                         f"({'-' if pd.isna(rel) else f'{rel * 100:+.1f}%'})")
        rows.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for cells in [header, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    contended = [f"  {r['label']}: " + "; ".join(f"{side.upper()} {r[f'{side}_run']}: {r[f'contention_{side}']}"
                                                  for side in ("base", "new") if flagged(r[f"contended_{side}"]))
                 for _, r in cmp.table.iterrows() if flagged(r["contended_base"]) or flagged(r["contended_new"])]
    if contended:
        lines.append("\nmeasured under contention (other work on the machine; its change is not the code's alone):")
        lines.extend(contended)
    if cmp.only_base:
        lines.append(f"\nonly in BASE: {', '.join(cmp.only_base)}")
    if cmp.only_new:
        lines.append(f"\nonly in NEW: {', '.join(cmp.only_new)}")
    if cmp.single:
        lines.append(f"\nsaved in one run only: {', '.join(cmp.single)}")
    if cmp.unpaired:
        lines.append(f"\ncannot be paired: {_unpaired_text(cmp.unpaired)}")
    if cmp.thresholds:
        lines.append("")
        if cmp.failures:
            lines.append(f"FAILED: {len(cmp.failures)} regression(s) beyond {', '.join(map(str, cmp.thresholds))}")
            lines.extend(f"  {f}" for f in cmp.failures)
        else:
            lines.append(f"ok: no benchmark beyond {', '.join(map(str, cmp.thresholds))}")
        if cmp.within_noise:
            lines.append("not called a change (past the threshold, within the samples' noise):")
            lines.extend(f"  {f}" for f in cmp.within_noise)
    return "\n".join(lines)


HISTORY_COLUMNS = ["run", "machine", "job", "datetime", "commit", "name", "bench", "framework", "mode", "device",
                   "batch_size", "key", "unpaired", "steps_per_round", "contended", "contention_text", *STATS]


def _steps_per_round(b: dict) -> int:
    """Training steps per round: the step benchmark's ``extra_info`` (its device synchronised once per
    round); else pytest-benchmark's ``iterations`` (calls per round; before blocks, every call
    synchronised), else 1. The stats are per call, i.e. per step, either way."""
    for v in ((b.get("extra_info") or {}).get(STEPS_PER_ROUND), (b.get("stats") or {}).get("iterations")):
        if v is not None:
            return int(v)
    return 1


def load_history(storage: str | Path) -> pd.DataFrame:
    """Every benchmark of every saved run: run number, machine, ``job`` (the bench job's id; None for
    a run saved before jobs), datetime, commit, name, its identity (bench, framework, mode, device,
    batch_size; ``key`` is the BenchKey id, None for a plain benchmark), ``unpaired`` (why it cannot
    be paired, else None), ``steps_per_round`` (int; ``_steps_per_round``), ``contended`` (bool; None
    where the benchmark recorded no contention) and ``contention_text`` (the measured figure, e.g.
    "other processes used 1.7 of 2 cores"), then its stats (times in seconds per training step)."""
    rows = []
    for run in list_runs(storage):
        entries, unpaired = run_entries(run)
        meta = {"run": run.number, "machine": run.machine, "job": run.job, "datetime": run.data.get("datetime"),
                "commit": (run.data.get("commit_info") or {}).get("id")}
        raw = {b.get("name") or b.get("fullname"): b for b in run.data["benchmarks"]}

        def per_bench(b: dict) -> dict:
            c = (b.get("extra_info") or {}).get(CONTENTION)
            c = c if isinstance(c, dict) else {}
            return {"steps_per_round": _steps_per_round(b),
                    "contended": bool(c["contended"]) if c.get("contended") is not None else None,
                    "contention_text": c.get("text"), **{s: (b.get("stats") or {}).get(s) for s in STATS}}

        for e in entries:
            k = e.key
            rows.append({**meta, "name": e.name, "bench": e.bench,
                         **{f: (getattr(k, f) if k else None) for f in KEY_FIELDS},
                         "key": k.id if k else None, "unpaired": None, **per_bench(raw[e.name])})
        for u in unpaired:
            rows.append({**meta, "name": u.name, "bench": None, **dict.fromkeys(KEY_FIELDS), "key": None,
                         "unpaired": u.reason, **per_bench(raw[u.name])})
    df = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    df["batch_size"] = df["batch_size"].astype("Int64")
    df["steps_per_round"] = df["steps_per_round"].astype("int64")
    df["contended"] = df["contended"].astype(object).where(df["contended"].notna(), None)
    return df


def job_axis(history: pd.DataFrame) -> pd.DataFrame:
    """The points of the trend's time axis: one per job (a run saved before jobs is a job of its own)
    per machine, in time order (earliest datetime, then machine and run number). Columns: machine,
    point (the job id, or ``run NNNN``), x (0, 1, ...), datetime (the job's earliest)."""
    h = history.assign(point=[j if isinstance(j, str) and j else f"run {r}"
                              for j, r in zip(history["job"], history["run"], strict=True)],
                       when=[_when(d) for d in history["datetime"]], num=history["run"].astype(int))
    pts = []
    for (machine, point), g in h.groupby(["machine", "point"], sort=False):
        whens = [w for w in g["when"] if w is not None]
        pts.append({"machine": machine, "point": point, "datetime": min(whens) if whens else None,
                    "_order": (min(whens).timestamp() if whens else float("inf"), machine, g["num"].min())})
    pts.sort(key=lambda p: p["_order"])
    return pd.DataFrame([{**{k: v for k, v in p.items() if k != "_order"}, "x": i} for i, p in enumerate(pts)],
                        columns=["machine", "point", "x", "datetime"])


def trend_series(history: pd.DataFrame, stat: str = "median") -> dict[str, pd.DataFrame]:
    """One series per key (framework benchmarks only) over jobs: label -> rows (machine, job, run,
    datetime, the key's fields, ``value``: the stat in seconds per step, ``contended``, ``point`` and
    ``x``: the job's place on ``job_axis``) in time order, one row per job (a job's key saved twice:
    its latest run). The label is the key's (``pytorch eager cpu bs64``), prefixed by the test
    function when the history holds several, suffixed by the machine when it holds several."""
    h = history[history["key"].notna()]
    if h.empty:
        return {}
    axis = job_axis(h)
    h = h.assign(point=[j if isinstance(j, str) and j else f"run {r}" for j, r in zip(h["job"], h["run"], strict=True)])
    h = h.merge(axis[["machine", "point", "x"]], on=["machine", "point"], how="left")
    several_benches = h["bench"].nunique() > 1
    several_machines = h["machine"].nunique() > 1
    out = {}
    for (bench, machine, *_), g in h.groupby(["bench", "machine", *KEY_FIELDS], sort=True):
        r = g.iloc[0]
        label = BenchKey(r["framework"], r["mode"], r["device"], int(r["batch_size"])).label
        if several_benches:
            label = f"{bench} {label}"
        if several_machines:
            label = f"{label} ({machine})"
        g = (g.assign(value=pd.to_numeric(g[stat], errors="coerce"), num=g["run"].astype(int))
             .sort_values(["x", "num"]).drop_duplicates("x", keep="last"))
        out[label] = g[["machine", "job", "run", "datetime", *KEY_FIELDS, "value", "contended", "point", "x"]
                       ].reset_index(drop=True)
    return out


# --- CLI -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", nargs="?", metavar="BASE",
                        help="run number (e.g. 0001), .json, or several joined by commas (0001,0002); "
                             "default: per key, the second latest run holding it")
    parser.add_argument("new", nargs="?", metavar="NEW",
                        help="as BASE; default: per key, the latest run holding it")
    parser.add_argument("--storage", default=str(default_storage()),
                        help="pytest-benchmark storage folder (default: .benchmarks)")
    parser.add_argument("--fail", action="append", default=[], metavar="STAT:N%",
                        help="exit 1 when NEW is slower than BASE by more than this, e.g. mean:5%% or "
                             "median:10%% or min:0.001 (seconds); may be repeated")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def main(args: argparse.Namespace) -> int:
    thresholds = [Threshold.parse(t) for t in args.fail]
    cmp = compare_storage(args.storage, args.base, args.new, thresholds)
    if cmp.nothing_earlier:  # the first bench job: nothing before it, which is not a failure
        print(json.dumps(cmp.to_dict(), indent=2) if args.json else cmp.earlier_message())
        return 0
    if cmp.table.empty:
        raise NothingToCompare(cmp.nothing_message())
    print(json.dumps(cmp.to_dict(), indent=2) if args.json else format_comparison(cmp))
    return 1 if cmp.failed else 0
