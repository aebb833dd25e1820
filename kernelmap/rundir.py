"""The run directory's layout: ``RunDir`` owns every name in it and reads and writes its JSON
(docs/ARCHITECTURE.md draws it). Nothing else spells a file name of a run directory.

    RUN_DIR/manifest.json  results.json  parity-<fw>.json  records.parquet  attribution.json
            logs/<fw>-bs<N>-<pass>[-<trial>].log
            <fw>/bs<N>/clean-<trial>.json  framework.json  libs.json  nsys.json  (+ traces and logs)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KernelmapError

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
_BS = re.compile(r"^bs(\d+)$")


def case_dir(framework: str, batch_size: int) -> Path:
    """The folder of one framework x batch size, relative to the run directory."""
    return Path(framework) / f"bs{batch_size}"


def pass_result_name(pass_name: str, trial: int | None = None) -> str:
    """The worker's result file of a pass: ``clean-<trial>.json`` for the clean pass's trials,
    ``<pass>.json`` for a capture pass."""
    if trial is None:
        return f"{pass_name}.json"
    if trial < 1:
        raise ValueError(f"trial {trial}: trials count from 1")
    return f"{pass_name}-{trial}.json"


def worker_log(framework: str, batch_size: int, pass_name: str, trial: int | None = None) -> Path:
    """A worker's stderr (third-party warnings, library chatter), relative to the run directory."""
    stem = pass_result_name(pass_name, trial).removesuffix(".json")
    return LOGS / f"{framework}-bs{batch_size}-{stem}.log"


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

    def case(self, framework: str, batch_size: int) -> Path:
        return self.path / case_dir(framework, batch_size)

    def pass_result(self, framework: str, batch_size: int, pass_name: str, trial: int | None = None) -> Path:
        return self.case(framework, batch_size) / pass_result_name(pass_name, trial)

    def algorithm_file(self, framework: str, batch_size: int) -> Path:
        """The library algorithms shared by the case's processes (a framework that can share them)."""
        return self.case(framework, batch_size) / ALGORITHM_FILE

    def log(self, framework: str, batch_size: int, pass_name: str, trial: int | None = None) -> Path:
        return self.path / worker_log(framework, batch_size, pass_name, trial)

    def parity(self, framework: str) -> Path:
        return self.path / parity_name(framework)

    def parity_files(self) -> list[Path]:
        """Parity figures present: one file per framework against the reference, or the legacy one."""
        files = sorted(self.path.glob(parity_name("*")))
        legacy = self.path / LEGACY_PARITY
        return files + ([legacy] if legacy.is_file() else [])

    def cases(self) -> Iterator[tuple[str, int, Path]]:
        """(framework, batch size, folder) of every ``<fw>/bs<N>/`` folder present, in name order."""
        for fw_dir in sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for bs_dir in sorted(p for p in fw_dir.iterdir() if p.is_dir() and _BS.match(p.name)):
                yield fw_dir.name, int(_BS.match(bs_dir.name).group(1)), bs_dir

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
