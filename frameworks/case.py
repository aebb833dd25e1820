"""The case: what one result of a run is of, typed end to end.

A case is a framework run in one of its modes, under one math mode, on a number of devices
(``Case``); at one batch size it is a ``CaseKey``, the key of one results.json entry, one folder of
captures and the records normalised from them. The runner writes the key's fields (``to_fields``) into
results.json, the manifest and the records' columns (``framework``, ``mode``, ``math``, ``devices``,
``batch_size``); every reader parses them back with ``from_fields``. ``Case.name`` is the one place the
fields become a string (the case's folder and its name in tables); no code splits it again.

Runs written before the key was typed recorded the case only as that name (the records' ``framework``
column, the folder); ``legacy_columns`` is the translation applied to them (``schema.read_parquet``, the run
loader ``kernelmap.rundir``): a lookup among the registered cases' names (``registered``), not a parse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import REGISTRY
from .spec import MATH_DEFAULT, Math

FIELDS = ("framework", "mode", "math", "devices", "batch_size")


def _check(framework: Any, mode: Any, math: Any, devices: Any) -> None:
    if framework not in REGISTRY:
        raise ValueError(f"framework {framework!r}: not a registered framework ({', '.join(REGISTRY)})")
    if mode not in REGISTRY[framework].modes:
        raise ValueError(f"mode {mode!r}: {framework} has the modes {', '.join(REGISTRY[framework].modes)}")
    if math not in {m.value for m in Math}:
        raise ValueError(f"math {math!r}: one of {', '.join(m.value for m in Math)}")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices {devices!r}: a whole number, at least 1")


@dataclass(frozen=True)
class Case:
    """A framework in one of its modes, under one math mode, on ``devices`` devices (any batch size)."""

    framework: str
    mode: str
    math: str = MATH_DEFAULT.value
    devices: int = 1

    def __post_init__(self) -> None:
        _check(self.framework, self.mode, self.math, self.devices)

    @property
    def name(self) -> str:
        """The case's folder in a run directory and its name in the report's tables: the framework's name
        for its default mode (runs made before modes read the same), ``<framework>-<mode>`` else; a case on
        more than one device adds ``-x<devices>``; a math other than the default (fp32) adds ``-<math>``
        (``pytorch-compile-bf16``): a run of several ``--math`` values names each case once."""
        d = REGISTRY[self.framework]
        name = self.framework if self.mode == d.default_mode else f"{self.framework}-{self.mode}"
        name = name if self.devices == 1 else f"{name}-x{self.devices}"
        return name if self.math == MATH_DEFAULT.value else f"{name}-{self.math}"

    @property
    def label(self) -> str:
        """For people: ``PyTorch``, ``PyTorch cuda-graph``, ``PyTorch cuda-graph x2``, ``PyTorch bf16``."""
        d = REGISTRY[self.framework]
        text = d.label if self.mode == d.default_mode else f"{d.label} {self.mode}"
        text = text if self.devices == 1 else f"{text} x{self.devices}"
        return text if self.math == MATH_DEFAULT.value else f"{text} {self.math}"

    @property
    def color(self) -> str:
        return REGISTRY[self.framework].color

    @property
    def replay_reason(self) -> str | None:
        """Why this case's timed steps replay CUDA graphs (its descriptor's ``replay_modes``), else None."""
        return REGISTRY[self.framework].replay_modes.get(self.mode)

    @property
    def rank(self) -> tuple[int, int, int, int]:
        """Registry order: frameworks as registered, each framework's modes as its descriptor lists them, then the
        devices, then the maths in ``spec.Math``'s order (fp32 first: the reference of a run of several)."""
        return (tuple(REGISTRY).index(self.framework), REGISTRY[self.framework].modes.index(self.mode), self.devices,
                [m.value for m in Math].index(self.math))

    def at(self, batch_size: int) -> CaseKey:
        return CaseKey(self.framework, self.mode, self.math, self.devices, batch_size)


@dataclass(frozen=True)
class CaseKey:
    """One case at one batch size: the key of a results.json entry, a case folder and its records."""

    framework: str
    mode: str
    math: str
    devices: int
    batch_size: int

    def __post_init__(self) -> None:
        _check(self.framework, self.mode, self.math, self.devices)
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size {self.batch_size!r}: a whole number, at least 1")

    @property
    def case(self) -> Case:
        return Case(self.framework, self.mode, self.math, self.devices)

    @property
    def name(self) -> str:
        return self.case.name

    def to_fields(self) -> dict[str, Any]:
        """The key's fields as results.json, the manifest and the records carry them."""
        return {f: getattr(self, f) for f in FIELDS}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> CaseKey:
        """The key recorded in ``d`` (``to_fields``); ValueError naming a missing or bad field."""
        missing = [f for f in FIELDS if d.get(f) is None]
        if missing:
            raise ValueError(f"no {', '.join(missing)} recorded")
        return cls(*(d[f] for f in FIELDS))


def order(cases: Iterable[Case]) -> list[Case]:
    """Cases in registry order (``Case.rank``), each once."""
    return sorted(dict.fromkeys(cases), key=lambda c: c.rank)


# --- a case by its name -------------------------------------------------------------------------------
def registered() -> dict[str, Case]:
    """{name: case} of every registered framework x mode x math on one device: the cases a table's column
    names; those of the default math are how a run written before the key was typed named its cases (its
    folders, its records' ``framework`` column)."""
    return {c.name: c for c in (Case(fw, m, x.value) for fw, d in REGISTRY.items() for m in d.modes for x in Math)}


def by_name(name: str) -> Case | None:
    """The registered case called ``name`` (``registered``), None for a name none has: a lookup, not a parse."""
    return registered().get(str(name))


def legacy_columns(name: Any, math: str | None = None) -> dict[str, Any]:
    """The records' case columns of a run written before the key was typed, from their ``framework`` column
    (the case's name then): the registered case of that name, under the run's ``math`` (None: not known where
    the records are read outside their run directory); a name no registered case has (records of loose files)
    stays the framework, the rest unknown."""
    c = by_name(str(name))
    if c is None:
        return {"framework": name, "mode": None, "math": None, "devices": None}
    return {"framework": c.framework, "mode": c.mode, "math": math, "devices": c.devices}


def order_names(names: Iterable[str]) -> list[str]:
    """Cases' names in registry order (``Case.rank`` of the registered case of each name), each once; names
    no registered case has last, sorted."""
    def rank(name: str) -> tuple:
        c = by_name(name)
        return (0, c.rank, "") if c is not None else (1, (), str(name))

    return sorted(dict.fromkeys(names), key=rank)


def color_of(name: str) -> str | None:
    """The colour of the registered case called ``name`` (its framework's), None for a name none has."""
    c = by_name(name)
    return c.color if c is not None else None
