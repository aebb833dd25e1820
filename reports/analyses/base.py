"""Run directories as read by the report: the Run type, loading, labels, results.json helpers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from kernelmap.frameworks.case import Case, by_name
from kernelmap.frameworks.spec import LAYERS, MATH_DEFAULT, Layer

from kernelmap import frameworks, rundir
from kernelmap.contention import path_free
from kernelmap.errors import KernelmapError

# each framework's profiler trace (its descriptor says which), then nsys
TRACE_SOURCES = (*dict.fromkeys(d.trace_source for d in frameworks.REGISTRY.values()), "nsys")
PHASE_ORDER = ("forward", "backward", "optimizer", "data", "other")
FRAMEWORK_LABEL = {name: d.label for name, d in frameworks.REGISTRY.items()}

# Peak dense throughput (FLOP/s) by GPU name, from NVIDIA's datasheets. Tensor-core figures are
# the dense ones: the datasheets print them "with sparsity", i.e. doubled; we halve them.
#  - H100 SXM5 / H200 SXM: FP32 67 TFLOPS, TF32 Tensor Core 989 TFLOPS with sparsity -> 494.5 dense
#    (NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H200 Tensor Core GPU datasheet).
#  - H100 PCIe: FP32 51 TFLOPS, TF32 756 TFLOPS with sparsity -> 378 dense (H100 datasheet).
#  - H200 NVL: FP32 60 TFLOPS, TF32 835 TFLOPS with sparsity -> 417.5 dense (H200 datasheet).
#  - A100 SXM4 / PCIe: FP32 19.5 TFLOPS, TF32 156 TFLOPS dense (A100 datasheet).
# Matching is by substring of the GPU name, most specific first.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"fp32": 60e12, "tf32": 417.5e12}),
    ("H200", {"fp32": 67e12, "tf32": 494.5e12}),
    ("H100 PCIe", {"fp32": 51e12, "tf32": 378e12}),
    ("H100", {"fp32": 67e12, "tf32": 494.5e12}),
    ("A100", {"fp32": 19.5e12, "tf32": 156e12}),
)


def peak_flops(gpu_name: str | None) -> dict[str, float] | None:
    """{'fp32': FLOP/s, 'tf32': FLOP/s} for a known GPU, else None (CPU and unknown GPUs)."""
    if not gpu_name:
        return None
    for key, peaks in PEAK_FLOPS:
        if key.lower() in gpu_name.lower():
            return dict(peaks)
    return None


def expected_calls_per_step(layers: Iterable[Layer] = LAYERS) -> dict[tuple[str, str], int]:
    """(canonical op, direction group) -> calls per training step, from the spec's layers.

    The spec (frameworks/spec.py) lists the conv and linear layers; its model is each conv
    followed by a relu and a 2x2 max-pool, each linear layer but the last (the classifier)
    followed by a relu. Every forward call has one backward call."""
    layers = list(layers)
    convs = sum(1 for x in layers if x.kind == "conv2d")
    linears = sum(1 for x in layers if x.kind == "linear")
    fwd = {"conv2d": convs, "relu": convs + max(linears - 1, 0), "max_pool2d": convs, "linear": linears}
    return {(op, d): n for op, n in fwd.items() if n for d in ("fwd", "bwd")}


def fw_label(fw: str) -> str:
    """A framework or a case's name (``Case.name``: pytorch-cuda-graph) for people: its registered case's
    label (``frameworks.case.by_name``: a lookup, not a parse), else the name as it is."""
    c = by_name(str(fw))
    return FRAMEWORK_LABEL.get(str(fw)) or (c.label if c is not None else str(fw))


def replay_reason(run: Run, name: str) -> str | None:
    """Why the run's case ``name`` replays CUDA graphs in its timed steps (``Case.replay_reason``), else None."""
    c = run.cases.get(str(name)) or by_name(str(name))
    return c.replay_reason if c is not None else None


def case_of(r: Any) -> str | None:
    """The case's name of a results.json entry as ``load_run`` typed it (``CaseEntry.fields``): what the
    report's tables key a case by, as its records' ``case`` column does."""
    return field_at(r, "case")


# --- loading ---------------------------------------------------------------------------------
def with_case_column(rec: pd.DataFrame) -> pd.DataFrame:
    """The records with a ``case`` column: each row's case's name (``Case.name``) from its typed columns
    (framework, mode, math, devices; a math not recorded: the default's name), computed once per distinct case;
    a row of no registered case (loose files: no mode) is named by its framework."""
    if rec.empty:
        return rec.assign(case=pd.array([], dtype="string"))
    cols = ["framework", "mode", "math", "devices"]
    keys = rec[cols].astype(object).where(rec[cols].notna(), None)
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
    names = []
    for fw, mode, math, devices in uniques:
        try:
            names.append(Case(fw, mode, math if isinstance(math, str) else MATH_DEFAULT.value, int(devices)).name)
        except (ValueError, TypeError):  # a framework or mode no descriptor registers: its framework
            names.append(fw)
    table = np.array([*names, None], dtype=object)
    return rec.assign(case=pd.array(table[codes], dtype="string"))


def typed_attribution(attribution: Any) -> Any:
    """attribution.json with each entry's case's name under ``case``: as recorded, or, in a run written before
    the key was typed, its ``framework`` (the case's name then)."""
    if not isinstance(attribution, dict):
        return attribution
    out = dict(attribution)
    if isinstance(attribution.get("runs"), dict):
        out["runs"] = {k: {**v, "case": v.get("case", v.get("framework"))} if isinstance(v, dict) else v
                       for k, v in attribution["runs"].items()}
    if isinstance(attribution.get("by_source"), list):
        out["by_source"] = [{**v, "case": v.get("case", v.get("framework"))} if isinstance(v, dict) else v
                            for v in attribution["by_source"]]
    return out


@dataclass
class Run:
    path: Path
    manifest: dict
    results: list[dict]
    parity: list[dict] = field(default_factory=list)
    attribution: Any = None
    records: pd.DataFrame | None = None
    problems: list[str] = field(default_factory=list)  # optional inputs that are absent
    cases: dict[str, Case] = field(default_factory=dict)  # {case's name: its typed case} (load_run)
    _timed: list | None = field(default=None, repr=False, compare=False)  # timed_events, computed once
    _pass_states: dict | None = field(default=None, repr=False, compare=False)  # basis.pass_states, computed once
    _op_cpu: dict | None = field(default=None, repr=False, compare=False)  # opcpu.op_cpu, computed once

    @property
    def name(self) -> str:
        return self.path.name


def load_run(path: str | Path) -> Run:
    """Read one run directory (``rundir.RunDir``). manifest.json and results.json are required."""
    rd = rundir.RunDir(path)
    path = rd.path
    if not path.exists():
        raise KernelmapError(f"{path}: does not exist")
    if not path.is_dir():
        raise KernelmapError(f"{path}: not a run directory (a file, not a directory)")
    for req in (rd.manifest, rd.results):
        if not req.is_file():
            raise KernelmapError(f"{path}: no {req.name}; not a complete kernelmap run directory")
    # the one loader of the run's cases (``RunDir.read_cases``): each entry typed, an older run's translated
    cases = rd.read_cases()
    run = Run(path, rd.read_manifest(), [e.fields for e in cases], cases={e.key.name: e.key.case for e in cases})
    for fw, info in (field_at(run.manifest, "frameworks", default={}) or {}).items():
        if isinstance(info, dict) and info.get("skipped"):
            run.problems.append(f"{fw_label(fw)} did not run: {info.get('device_note') or 'no reason recorded'}")
    # parity-<framework>.json: each framework against the reference; parity.json: runs made before that
    run.parity = [rundir.read_json(f) for f in rd.parity_files()]
    failed = field_at(run.manifest, "parity_failed")
    if failed:
        run.problems.append(f"parity failed, no parity figures: {failed}")
    elif not run.parity:
        run.problems.append(f"no parity figures (recorded when {fw_label(frameworks.REFERENCE)} and another "
                            "framework ran)")
    # a run of the clean pass only (--profile none) has nothing to normalise: the report says so once
    captured = any(k != "clean" for r in run.results if isinstance(r, dict) for k in passes_of(r))
    if rd.attribution.is_file():
        run.attribution = typed_attribution(rundir.read_json(rd.attribution))
    elif captured:
        run.problems.append("no attribution.json (run `kernelmap normalise` on the run directory)")
    if rd.records.is_file():
        run.records = with_case_column(rd.read_records())
    elif captured:
        run.problems.append("no records.parquet (run `kernelmap normalise`): op, kernel and timeline "
                            "sections are empty")
    return run


def field_at(d: Any, key: str, default: Any = None) -> Any:
    """``d``'s value at the dotted path ``key``, or ``default`` where it is missing or None."""
    cur: Any = d
    for part in key.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return default
        cur = cur[part]
    return cur




def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts/lists -> {'a.b.0.c': scalar}."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, list) and not all(isinstance(x, int | float) for x in d):
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out

NOT_MEASURED = "not measured"
BUSY = "BUSY"


@dataclass(frozen=True)
class Busy:
    """What else used the machine while one pass ran (results.json ``contention``)."""

    contended: bool | None  # None: not measured
    text: str

    @classmethod
    def of(cls, d: Any) -> Busy:
        """The pass's figure, its words path-free (``contention.path_free``: a run saved before its processes'
        commands were cut names this machine's folders)."""
        c = field_at(d, "contention")
        if not isinstance(c, dict) or not isinstance(c.get("contended"), bool):
            return cls(None, path_free(str(c.get("text") or NOT_MEASURED)) if isinstance(c, dict) else NOT_MEASURED)
        return cls(bool(c["contended"]), path_free(str(c.get("text") or ("contended" if c["contended"] else "quiet"))))

    @property
    def marked(self) -> str:
        """The text with ``BUSY`` before it where the pass was contended."""
        return f"{BUSY}: {self.text}" if self.contended else self.text


def passes_of(r: dict) -> dict[str, dict]:
    """A results.json entry's passes (clean and capture passes), by name."""
    passes = field_at(r, "passes", default={}) or {}
    return {k: v for k, v in passes.items() if isinstance(v, dict)}




def step_times_of(r: dict) -> np.ndarray | None:
    v = field_at(r, "step_times_s")
    return np.asarray(v, dtype=float) if isinstance(v, list) and v else None
