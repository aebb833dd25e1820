"""Names inside a run directory (docs/ARCHITECTURE.md): one place that spells them."""

from __future__ import annotations

from pathlib import Path


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


LOGS = Path("logs")


def worker_log(framework: str, batch_size: int, pass_name: str, trial: int | None = None) -> Path:
    """A worker's stderr (third-party warnings, library chatter), relative to the run directory."""
    stem = pass_result_name(pass_name, trial).removesuffix(".json")
    return LOGS / f"{framework}-bs{batch_size}-{stem}.log"


def parity_name(framework: str) -> str:
    """``kernelmap parity`` figures of ``framework`` against the reference (runs before per-pair files:
    ``parity.json``)."""
    return f"parity-{framework}.json"
