"""The run directory's layout: ``RunDir`` owns every name in it and reads and writes its JSON
(docs/ARCHITECTURE.md draws it). Nothing else spells a file name of a run directory.

    RUN_DIR/manifest.json  results.json  parity-<fw>.json  records.parquet  attribution.json
            logs/<case>-bs<N>-<pass>[-<trial>].log
            <case>/bs<N>/clean-<trial>.json  framework.json  libs.json  nsys.json  (+ traces and logs)

``<case>`` is ``Case.name`` (kernelmap/frameworks/case.py), written once by the runner from the typed key;
each results.json entry records its key's fields and its folder (``dir``). ``read_cases`` is the one loader
of a run's cases: readers take the recorded fields, never a folder's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KernelmapError
from .frameworks import REGISTRY
from .frameworks.case import CaseKey, legacy_columns
from .frameworks.spec import MATH_DEFAULT

MANIFEST = "manifest.json"
RESULTS = "results.json"
RECORDS = "records.parquet"
ATTRIBUTION = "attribution.json"
LOGS = Path("logs")
LEGACY_PARITY = "parity.json"  # runs made before parity was recorded per framework
# beside a framework pass's trace.json.gz where its steps replay a CUDA graph: one profiled eager step
# with the graph's kernels (adapters/graph_replay.py reads it with the trace; not records of its own)
GRAPH_REFERENCE = "graph-reference.json.gz"
# the libs pass's own kernel trace (beside its logs, one process): RUN_DIR/<fw>/bs<N>/libs/trace.json.gz
# (Kineto) or libs/nsys.sqlite (a framework whose libs pass runs under nsys); a folder, so that it is not
# read as records of the run (kernelmap/calllink.py reads it)
LIBS_TRACE_DIR = "libs"
LIBS_TRACES = ("trace.json.gz", "nsys.sqlite", "nsys.sqlite.gz")
# the library algorithms every process of a case ran (Framework.shared_algorithms_env), in the case folder
ALGORITHM_FILE = "algorithms.tsv"
# results.json entries of this version record their case's typed fields (CaseKey) and ``devices``; version 1
# recorded framework, mode, batch size and math, and named the case only by its folder (``read_cases``)
RUN_VERSION = 2


def case_dir(key: CaseKey) -> Path:
    """The folder of one case at one batch size, relative to the run directory (the runner makes it once;
    readers take the ``dir`` its results.json entry records)."""
    return Path(key.name) / f"bs{key.batch_size}"


def pass_result_name(pass_name: str, trial: int | None = None) -> str:
    """The worker's result file of a pass: ``clean-<trial>.json`` for the clean pass's trials,
    ``<pass>.json`` for a capture pass."""
    if trial is None:
        return f"{pass_name}.json"
    if trial < 1:
        raise ValueError(f"trial {trial}: trials count from 1")
    return f"{pass_name}-{trial}.json"


def worker_log(key: CaseKey, pass_name: str, trial: int | None = None) -> Path:
    """A worker's stderr (third-party warnings, library chatter), relative to the run directory."""
    stem = pass_result_name(pass_name, trial).removesuffix(".json")
    return LOGS / f"{key.name}-bs{key.batch_size}-{stem}.log"


def parity_name(framework: str) -> str:
    """``kernelmap parity`` figures of ``framework`` against the reference."""
    return f"parity-{framework}.json"


def read_json(path: Path) -> Any:
    """A JSON file of a run directory; ``KernelmapError`` naming the file when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise KernelmapError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise KernelmapError(f"{path}: not valid JSON ({exc})") from None


@dataclass(frozen=True)
class RunDir:
    """One run directory (it need not exist yet: the runner fills a temporary one)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    # --- paths ---------------------------------------------------------------------------------
    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def results(self) -> Path:
        return self.path / RESULTS

    @property
    def records(self) -> Path:
        return self.path / RECORDS

    @property
    def attribution(self) -> Path:
        return self.path / ATTRIBUTION

    def case(self, key: CaseKey) -> Path:
        return self.path / case_dir(key)

    def pass_result(self, key: CaseKey, pass_name: str, trial: int | None = None) -> Path:
        return self.case(key) / pass_result_name(pass_name, trial)

    def algorithm_file(self, key: CaseKey) -> Path:
        """The library algorithms shared by the case's processes (a framework that can share them)."""
        return self.case(key) / ALGORITHM_FILE

    def log(self, key: CaseKey, pass_name: str, trial: int | None = None) -> Path:
        return self.path / worker_log(key, pass_name, trial)

    def parity(self, framework: str) -> Path:
        return self.path / parity_name(framework)

    def parity_files(self) -> list[Path]:
        """Parity figures present: one file per framework against the reference, or the legacy one."""
        files = sorted(self.path.glob(parity_name("*")))
        legacy = self.path / LEGACY_PARITY
        return files + ([legacy] if legacy.is_file() else [])

    # --- typed reading -------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        m = read_json(self.manifest)
        if not isinstance(m, dict):
            raise KernelmapError(f"{self.manifest}: not a JSON object")
        return m

    def read_results(self) -> list[dict[str, Any]]:
        r = read_json(self.results)
        if not isinstance(r, list):
            raise KernelmapError(f"{self.results}: not a list of results (one per framework x batch size)")
        return r

    def read_cases(self) -> list[CaseEntry]:
        """Every case of the run, typed (``parse_cases``): the one place a run's cases are read."""
        if not self.results.is_file():
            raise KernelmapError(f"{self.path}: no {RESULTS}; not a complete kernelmap run directory")
        return parse_cases(self.read_results(), self.read_manifest() if self.manifest.is_file() else {}, self.results)

    def read_records(self):
        """records.parquet (``schema.read_parquet``); a version 1 run's records (schema 2: the case's name in
        ``framework``) get their case columns from it (``legacy_columns``)."""
        from . import schema

        math = run_math(self.read_manifest()) if self.manifest.is_file() else MATH_DEFAULT.value
        return schema.read_parquet(self.records, upgrade=lambda fw: legacy_columns(fw, math))

    @staticmethod
    def framework_device(manifest: dict[str, Any], framework: str) -> str | None:
        """The device a framework ran on, as the runner writes it (``frameworks.<fw>.device``)."""
        entry = (manifest.get("frameworks") or {}).get(framework)
        return entry.get("device") if isinstance(entry, dict) and isinstance(entry.get("device"), str) else None

    # --- writing (atomic) ----------------------------------------------------------------------
    def write_json(self, path: Path, obj: Any) -> None:
        from .atomic import atomic_file

        with atomic_file(path) as fh:
            json.dump(obj, fh, indent=2, default=str)


# --- the one loader of a run's cases ----------------------------------------------------------------
@dataclass(frozen=True)
class CaseEntry:
    """One results.json entry, typed: its case key, its folder (relative to the run directory) and the
    entry as written, with its key's fields as recorded (``fields``)."""

    key: CaseKey
    dir: Path
    entry: dict[str, Any]

    @property
    def fields(self) -> dict[str, Any]:
        """The entry with its typed key's fields (a version 1 entry's translated) and its case's name."""
        return {**self.entry, **self.key.to_fields(), "case": self.key.name, "dir": str(self.dir)}


def run_version(manifest: dict[str, Any], where: Path) -> int:
    """The run format a manifest declares; a newer one than this kernelmap reads is refused."""
    v = manifest.get("run_version", 1)
    if not isinstance(v, int) or v < 1:
        raise KernelmapError(f"{where}: run_version {v!r} is not a version number")
    if v > RUN_VERSION:
        raise KernelmapError(f"{where}: written by a newer kernelmap (run_version {v}; this one reads up to "
                             f"{RUN_VERSION}): report it with that kernelmap, or upgrade this one")
    return v


def run_math(manifest: dict[str, Any]) -> str | None:
    """The one math mode of a run (its manifest's training config: a version 1 run's string, a later run's list of
    ``--math`` values), else the default; None for a run of several maths: each of its cases records its own
    (``CaseKey.math``), and a record without one cannot be given one."""
    math = ((manifest.get("config") or {}).get("train") or {}).get("math")
    if isinstance(math, list):
        return math[0] if len(math) == 1 and isinstance(math[0], str) else None
    return math if isinstance(math, str) else MATH_DEFAULT.value


def _legacy_key(r: dict[str, Any], math: str) -> CaseKey:
    """A version 1 entry's key: framework, mode (absent before modes: the framework's default), batch size
    and math as it recorded them; one device."""
    fw = r.get("framework")
    mode = r.get("mode") or (REGISTRY[fw].default_mode if fw in REGISTRY else None)
    return CaseKey(fw, mode, r.get("math") or math, 1, r.get("batch_size"))


def parse_cases(results: list[Any], manifest: dict[str, Any], where: Path) -> list[CaseEntry]:
    """results.json's entries as typed cases: a version 2 entry's recorded key (``CaseKey.from_fields``), a
    version 1 entry's translated (``_legacy_key``); KernelmapError naming the file and the entry otherwise."""
    version = run_version(manifest, where.with_name(MANIFEST))
    out = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise KernelmapError(f"{where}: entry {i} is not a JSON object")
        try:
            key = CaseKey.from_fields(r) if version >= 2 else _legacy_key(r, run_math(manifest))
        except (ValueError, TypeError) as exc:
            raise KernelmapError(f"{where}: entry {i}: no case key ({exc})") from None
        d = r.get("dir")
        out.append(CaseEntry(key, Path(d) if isinstance(d, str) and d else case_dir(key), r))
    return out


def asked_cases(manifest: dict[str, Any], where: Path) -> list[CaseKey] | None:
    """Every case the run asked for that could run there: the manifest's typed ``config.cases`` (version 2);
    a version 1 manifest's modes x batch sizes, translated; None where the manifest does not say."""
    config = manifest.get("config") or {}
    try:
        if run_version(manifest, where) >= 2 and isinstance(config.get("cases"), list):
            return [CaseKey.from_fields(c) for c in config["cases"]]
        modes, sizes = config.get("modes"), (config.get("cli") or {}).get("batch_size")
        if not isinstance(modes, dict) or not sizes:
            return None
        return [CaseKey(fw, m, run_math(manifest), 1, int(bs)) for fw, ms in modes.items() if fw in REGISTRY
                for m in ms for bs in sizes]
    except (ValueError, TypeError) as exc:
        raise KernelmapError(f"{where}: the cases asked for: {exc}") from None
