"""What a saved step benchmark is: its key, the saved run holding it, and the fields kernelmap writes
into pytest-benchmark's files (the job id, contention, steps per round). Shared by ``storage``,
``job``, ``compare`` and ``trend``; reads no file itself.

**Keys.** Every framework benchmark is keyed by framework x mode x device x batch size (``BenchKey``;
``Mode`` lists every mode of every framework's descriptor). ``benches/bench_train_step.py`` writes the
key into the benchmark's name (``test_train_step[pytorch-eager-cpu-64]``), its params and its
``extra_info``; ``benchmark_identity`` reads it back (params and ``extra_info`` must agree).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from .. import frameworks
from ..contention import path_free_summary
from ..errors import KernelmapError

TIME_STATS = ("min", "max", "mean", "stddev", "median", "iqr")  # seconds, as pytest-benchmark saves them
STATS = (*TIME_STATS, "ops", "rounds")

JOB_ENV = "KERNELMAP_JOB"  # the job id `nox -s bench` gives `kernelmap run` and the step benchmarks
JOB_KEY = "kernelmap_job"  # top-level key of a saved job: its id
PARTS_KEY = "kernelmap_parts"  # top-level key of a saved job: the per-framework files merged into it
# extra_info fields of the step benchmark (benches/bench_train_step.py)
STEPS_PER_ROUND = "steps_per_round"  # training steps per round, the device synchronised once per round
CONTENTION = "contention"  # kernelmap.contention.summarise() of the benchmark's rounds
# the glibc malloc settings (timing.ALLOC_ENV: name -> value, None where glibc's default) of the benchmark's process;
# absent in runs saved before they were recorded
MALLOC_INFO = "malloc"


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
        """``kernelmap.contention.summarise()`` of the benchmark's rounds, its words path-free (``path_free_summary``:
        one saved before ``command_line`` cut them); None where not recorded."""
        c = self.extra_info.get(CONTENTION)
        return path_free_summary(c) if isinstance(c, dict) else None

    @property
    def malloc(self) -> dict | None:
        """The malloc settings the benchmark's process ran with (``MALLOC_INFO``); None where not recorded."""
        m = self.extra_info.get(MALLOC_INFO)
        return m if isinstance(m, dict) else None

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


def malloc_text(settings: dict | None) -> str:
    """A benchmark's malloc settings as one line: ``NAME=value`` each (``default`` where glibc's own), or "not
    recorded" (a run saved before they were)."""
    if not isinstance(settings, dict):
        return "not recorded"
    return " ".join(f"{k}={'default' if v is None else v}" for k, v in sorted(settings.items())) or "none set"


def malloc_differs(base: dict | None, new: dict | None) -> str | None:
    """Why two benchmarks' step times may differ by their malloc settings (``MALLOC_INFO``): one line naming both
    sides where they differ or one side recorded none; None where both recorded the same, or neither recorded any."""
    if base is None and new is None:
        return None
    if base == new:
        return None
    return f"malloc settings differ (timing.ALLOC_ENV): BASE {malloc_text(base)}; NEW {malloc_text(new)}"


def flagged(x) -> bool:
    """A ``contended`` cell that says yes (True; not False, None or NaN: not recorded)."""
    return isinstance(x, bool | np.bool_) and bool(x)


def parse_when(text) -> datetime | None:
    """A saved run's ``datetime`` as an aware UTC time; None where it is not an ISO time."""
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)  # pytest-benchmark < 4.0.0 wrote naive UTC
