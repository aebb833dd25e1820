"""Analyses of run directories: pure functions that return DataFrames and dicts.

Nothing here draws or formats HTML; ``figures`` and ``html`` only render what these return.
A run directory is read as docs/ARCHITECTURE.md lays it out (manifest.json, results.json,
parity.json, records.parquet, attribution.json); every file but manifest.json and results.json
is optional, and a section whose input is absent says so rather than guessing.

Time accounting (``timed_events``): records hold the same work seen by several sources (a
Kineto trace and an nsys capture both list the kernels). For each framework x batch size one
source is chosen to time from, in ``TRACE_SOURCES`` order, at the finest level it has: kernels
where the source has any (GPU), else the outermost framework ops (CPU, where ops nest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import frameworks, rundir, schema, timing
from kernelmap.errors import KernelmapError
from kernelmap.flops import layer_flops

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


def fw_label(fw: str) -> str:
    return FRAMEWORK_LABEL.get(str(fw), str(fw))


# --- loading ---------------------------------------------------------------------------------
@dataclass
class Run:
    path: Path
    manifest: dict
    results: list[dict]
    parity: list[dict] = field(default_factory=list)
    attribution: Any = None
    records: pd.DataFrame | None = None
    problems: list[str] = field(default_factory=list)  # optional inputs that are absent
    _timed: list | None = field(default=None, repr=False, compare=False)  # timed_events, computed once

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
    run = Run(path, rd.read_manifest(), rd.read_results())
    for fw, info in (_get(run.manifest, "frameworks", default={}) or {}).items():
        if isinstance(info, dict) and info.get("skipped"):
            run.problems.append(f"{fw_label(fw)} did not run: {info.get('device_note') or 'no reason recorded'}")
    # parity-<framework>.json: each framework against the reference; parity.json: runs made before that
    run.parity = [rundir.read_json(f) for f in rd.parity_files()]
    if not run.parity:
        run.problems.append(f"no parity figures (recorded when {fw_label(frameworks.REFERENCE)} and another "
                            "framework ran)")
    # a run of the clean pass only (--profile none) has nothing to normalise: the report says so once
    captured = any(k != "clean" for r in run.results if isinstance(r, dict) for k in _passes(r))
    if rd.attribution.is_file():
        run.attribution = rundir.read_json(rd.attribution)
    elif captured:
        run.problems.append("no attribution.json (run `kernelmap normalise` on the run directory)")
    if rd.records.is_file():
        run.records = schema.read_parquet(rd.records)
    elif captured:
        run.problems.append("no records.parquet (run `kernelmap normalise`): op, kernel and timeline "
                            "sections are empty")
    return run


def _get(d: Any, key: str, default: Any = None) -> Any:
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


# --- summary ---------------------------------------------------------------------------------
def _is_fallback(asked: str | None, used: str | None, expected_auto: str) -> bool:
    """Did a framework run elsewhere than asked? ``auto`` asks for the GPU where the machine has
    one (MXNet on the CPU of a Hopper machine is a fallback; every framework on the CPU of a
    machine without a GPU is not). A framework that did not run at all is not a fallback."""
    if used is None or asked is None:
        return False
    return used != (expected_auto if asked == "auto" else asked)


def framework_devices(run: Run) -> pd.DataFrame:
    """Per framework: device asked, device used, and why they differ (manifest)."""
    expected = "gpu" if _get(run.manifest, "gpu") else "cpu"
    rows = []
    for fw, info in (_get(run.manifest, "frameworks", default={}) or {}).items():
        used = _get(info, "device")
        asked = _get(info, "device_requested", default=used)
        rows.append({"run": run.name, "framework": fw, "device_requested": asked, "device": used,
                     "device_note": _get(info, "device_note"), "fallback": _is_fallback(asked, used, expected)})
    return pd.DataFrame(rows, columns=["run", "framework", "device_requested", "device", "device_note",
                                       "fallback"])


def _passes(r: dict) -> dict[str, dict]:
    passes = _get(r, "passes", default={}) or {}
    return {k: v for k, v in passes.items() if isinstance(v, dict)}


def _step_times_s(r: dict) -> np.ndarray | None:
    v = _get(r, "step_times_s")
    return np.asarray(v, dtype=float) if isinstance(v, list) and v else None


def clean_stats(r: dict) -> dict[str, Any]:
    """The clean pass's step figures of a results.json entry (``kernelmap.timing``). Entries of runs
    made before trials existed carry one trial's per-step times: their interval is computed here,
    by the same rule."""
    if _get(r, "ci95_low_s") is not None or _get(r, "n_trials") is not None:
        return {k: _get(r, k) for k in ("median_step_s", "q25_step_s", "q75_step_s", "iqr_step_s", "ci95_low_s",
                                        "ci95_high_s", "ci95_half_width_rel", "noisy", "n_trials", "n_samples",
                                        "e2e_step_s", "e2e_images_per_s", "timing")}
    st = _step_times_s(r)
    if st is None:
        return {"median_step_s": _get(r, "median_step_s"), "iqr_step_s": _get(r, "iqr_step_s"), "n_trials": 1,
                "n_samples": _get(r, "steps"), "timing": "one trial (older run); no interval"}
    return {**timing.step_stats([list(st)]).to_dict(), "e2e_step_s": None, "e2e_images_per_s": None,
            "timing": "one trial of per-step synchronised steps (older run)"}


def summary_table(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x device x batch size: the clean pass's step time (median over all trials'
    samples, 95% CI, noise flag, IQR), images/s from it, the end-to-end step with the loader, test
    accuracy, and the device fallback mark."""
    rows = []
    for run in runs:
        devs = framework_devices(run).set_index("framework")
        for r in run.results:
            fw = _get(r, "framework")
            bs = _get(r, "batch_size")
            c = clean_stats(r)
            med = c.get("median_step_s")
            lo, hi = c.get("ci95_low_s"), c.get("ci95_high_s")
            e2e = c.get("e2e_step_s")
            dev = devs.loc[fw] if fw in devs.index else None
            rows.append({
                "run": run.name, "framework": fw, "mode": _get(r, "mode"),
                "device": _get(r, "device", default=None if dev is None else dev["device"]),
                "device_requested": None if dev is None else dev["device_requested"],
                "fallback": False if dev is None else bool(dev["fallback"]),
                "device_note": None if dev is None else dev["device_note"],
                "batch_size": bs, "steps_timed": _get(r, "steps"), "trials": c.get("n_trials"),
                "step_ms_median": None if med is None else med * 1e3,
                "step_ms_ci95_low": None if lo is None else lo * 1e3,
                "step_ms_ci95_high": None if hi is None else hi * 1e3,
                "ci95_half_width_pct": None if c.get("ci95_half_width_rel") is None
                else c["ci95_half_width_rel"] * 100,
                "noisy": c.get("noisy"),
                "step_ms_iqr": None if c.get("iqr_step_s") is None else c["iqr_step_s"] * 1e3,
                "images_per_s": bs / med if med and bs else None,
                "e2e_step_ms": None if e2e is None else e2e * 1e3,
                "e2e_images_per_s": bs / e2e if e2e and bs else None,
                "test_accuracy": _get(r, "test_accuracy"),
                "timing": c.get("timing"),
            })
    return pd.DataFrame(rows)


def parity_table(runs: list[Run]) -> pd.DataFrame:
    """parity.json's headline figures: run, figure, value, tolerance, definition. Scalars only
    (per-step lists, versions and config stay in the file); per-tensor dicts become one row each."""
    rows = []
    skip = {"tolerances", "definitions", "versions", "config", "data", "losses", "frameworks", "python"}
    for run in runs:
        for p in run.parity:
            if not isinstance(p, dict):
                continue
            pair = " vs ".join(fw_label(f) for f in p.get("frameworks") or [])
            tol, defs = p.get("tolerances") or {}, p.get("definitions") or {}
            for k, v in p.items():
                if k in skip or isinstance(v, list):
                    continue
                items = v.items() if isinstance(v, dict) else [(None, v)]
                for sub, val in items:
                    if isinstance(val, dict | list):
                        continue
                    rows.append({"run": run.name, "pair": pair, "figure": k if sub is None else f"{k} [{sub}]",
                                 "value": val, "tolerance": tol.get(k), "definition": defs.get(k)})
    return pd.DataFrame(rows, columns=["run", "pair", "figure", "value", "tolerance", "definition"])


# (label, manifest key) as kernelmap/manifest.py writes them
_ENV_KEYS = (
    ("GPU", "gpu.name"),
    ("compute capability", "gpu.compute_capability"),
    ("driver", "driver"),
    ("CUDA driver API", "cuda_driver_version"),
    ("CPU", "host.cpu"),
    ("Python", "host.python"),
    ("commit", "git_commit.commit"),
    ("tree dirty", "git_commit.dirty"),
    ("kernelmap", "kernelmap_version"),
    ("data", "data.kind"),
)
# (label, key of a framework's ``versions`` as the workloads' ``versions()`` write them)
_FW_VERSION_KEYS = (("framework", "version"), ("CUDA", "cuda"), ("cuDNN", "cudnn"), ("cuBLAS", "cublas"),
                    ("oneDNN", "mkldnn"))


def _scalar(v: Any) -> Any:
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    return v


def environment_table(runs: list[Run]) -> pd.DataFrame:
    """Rows: item (GPU, driver, CUDA, cuDNN, cuBLAS, framework versions, commit...); one column per run."""
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        m = run.manifest
        col = {}
        for label, key in _ENV_KEYS:
            v = _get(m, key)
            if v is not None:
                col[label] = _scalar(v)
        for fw, info in (_get(m, "frameworks", default={}) or {}).items():
            versions = _get(info, "versions", default={}) or {}
            for label, key in _FW_VERSION_KEYS:
                v = _get(versions, key)
                if v is not None:
                    col[f"{fw_label(fw)} {label}".replace(" framework", "")] = _scalar(v)
            asked, used = _get(info, "device_requested"), _get(info, "device")
            if used is not None:
                col[f"{fw_label(fw)} device"] = used if asked in (None, used) else f"{used} (asked {asked})"
        table[run.name] = col
    df = pd.DataFrame(table)
    df.index.name = "item"
    return df.reset_index()


# --- records: which events to time from ------------------------------------------------------
def _records(run: Run) -> pd.DataFrame:
    return run.records if run.records is not None else schema.empty()


def _outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """Keep op rows not contained in another op row of the same (pid, tid)."""
    if ops.empty:
        return ops
    keep = []
    for _, g in ops.sort_values(["start_ns", "dur_ns"], ascending=[True, False]).groupby(
            [ops["pid"].fillna(-1), ops["tid"].fillna(-1)], sort=False):
        end = -1
        for idx, s, d in zip(g.index, g["start_ns"], g["dur_ns"], strict=True):
            if pd.isna(s) or pd.isna(d):
                continue
            if s >= end:
                keep.append(idx)
                end = s + d
            # else: nested inside the current outermost op
    return ops.loc[sorted(keep)]


@dataclass
class Timed:
    """The events one framework x batch size is timed from."""

    framework: str
    batch_size: int | None
    source: str
    level: str  # kernel | op
    events: pd.DataFrame  # the timed rows, canonical_op/direction/library/... filled from links
    n_steps: int
    step_ns: float | None  # median step duration in this source (kind=step rows), if any
    n_steps_basis: str = ""
    step_basis: str | None = None  # where step_ns comes from
    iterations: tuple[int, ...] = ()  # the traced iterations counted as steps (those with model ops)
    outside_events: int = 0  # timed events of iterations not counted (e.g. a warm-up step's tail)
    outside_ns: int = 0
    pass_name: str | None = None  # the capture pass the source belongs to (framework, nsys)
    ops: pd.DataFrame | None = field(default=None, repr=False)  # the source's op rows of the counted steps

    @property
    def records_run(self) -> set[str]:
        return set(self.events["run"].dropna().unique())


def _fill_from_links(ev: pd.DataFrame, rec: pd.DataFrame) -> pd.DataFrame:
    """Fill canonical_op, direction, phase, layer, op_name from the linked op, and library,
    library_call, math_mode, algo from the linked library call, where the row itself has none.
    Links are event ids, unique within a records ``run`` (one framework x batch size folder)."""
    ev = ev.copy()
    ref = rec.dropna(subset=["event_id"]).drop_duplicates(["run", "event_id"])
    for link, cols in (("op_event_id", ("canonical_op", "direction", "phase", "layer", "op_name")),
                       ("call_event_id", ("library", "library_call", "math_mode", "algo", "canonical_op",
                                          "direction"))):
        if ev[link].isna().all():
            continue
        r = ref[["run", "event_id", *cols]].rename(columns={"event_id": link, **{c: f"_{c}" for c in cols}})
        merged = ev[["run", link]].merge(r, on=["run", link], how="left")
        merged.index = ev.index
        for c in cols:
            ev[c] = ev[c].fillna(merged[f"_{c}"].astype(ev[c].dtype))
    return ev


_SOURCE_PASS = {**{d.trace_source: "framework" for d in frameworks.REGISTRY.values()}, "nsys": "nsys"}


def model_ops() -> frozenset[str]:
    """Canonical ops of the model's layers (frameworks/spec.py, via ``reports.checks``)."""
    from .checks import expected_calls_per_step

    return frozenset(op for op, _ in expected_calls_per_step())


def _counted_iterations(rows: pd.DataFrame) -> list[int]:
    """The traced iterations that hold timed work of the model: an iteration counts as a step when
    one of its timed events has a canonical op of the model's layers. A trace may hold step marks
    of steps it did not profile (MXNet's profiler keeps the warm-up steps' regions) and stray ops
    of such a step (a variable deleted as the profiler starts); neither makes a step."""
    it = rows.loc[rows["canonical_op"].isin(model_ops()), "iteration"].dropna()
    return sorted(int(i) for i in it.unique())


def _n_steps(rows: pd.DataFrame, run: Run, fw: str, bs: int | None, source: str) -> tuple[int, str]:
    """Traced steps: iterations holding timed model work, else the capture pass's timed step
    count from results.json. Returns (n, how it was found). Step events alone never count: a
    trace may mark steps it did not time (MXNet's profiler keeps the warm-up steps' marks)."""
    its = _counted_iterations(rows)
    if its:
        return len(its), "iterations of the trace that hold timed model ops"
    for r in run.results:
        if _get(r, "framework") == fw and _get(r, "batch_size") == bs:
            n = _get(_passes(r).get(_SOURCE_PASS.get(source, ""), {}), "steps")
            if n:
                return int(n), f"results.json: steps of the {_SOURCE_PASS[source]} pass"
    raise KernelmapError(f"{run.path}: {fw} bs {bs}: cannot tell how many steps the {source} trace holds "
                         "(no iterations with timed model ops, no pass step count)")


def timed_events(run: Run) -> list[Timed]:
    """The events each framework x batch size is timed from (computed once per Run)."""
    if run._timed is None:
        run._timed = _timed_events(run)
    return run._timed


def _timed_events(run: Run) -> list[Timed]:
    out = []
    rec = _records(run)
    if rec.empty:
        return out
    for (fw, bs), g in rec.groupby(["framework", rec["batch_size"].fillna(-1)], sort=True):
        bs_v = None if bs == -1 else int(bs)
        chosen = None
        for level, kinds in (("kernel", ("kernel",)), ("op", ("op",))):
            for src in TRACE_SOURCES:
                rows = g[(g["source"] == src) & g["kind"].isin(kinds) & g["dur_ns"].notna()]
                if len(rows):
                    chosen = (src, level, rows)
                    break
            if chosen:
                break
        if not chosen:
            continue
        src, level, rows = chosen
        srows = g[g["source"] == src]
        rows = _fill_from_links(rows, srows)
        if level == "op":
            rows = _outermost(rows[rows["canonical_op"].notna()])
        steps = srows[srows["kind"] == "step"]["dur_ns"].dropna()
        n, basis = _n_steps(rows, run, str(fw), bs_v, src)
        its = _counted_iterations(rows)
        outside = rows["iteration"].notna() & ~rows["iteration"].isin(its) if its else \
            pd.Series(False, index=rows.index)
        out_ev, out_ns = int(outside.sum()), int(rows.loc[outside, "dur_ns"].sum())
        rows = rows[~outside]
        ops = srows[(srows["kind"] == "op") & srows["canonical_op"].notna()]
        if its:
            ops = ops[ops["iteration"].isin(its)]
        # The step's wall time is the median the worker measured (device synchronised) in the very
        # pass that recorded this trace. Traced step spans are host-side only: MXNet's engine runs
        # ops after its region has closed, and CUDA kernels outlive their launches.
        step_ns, step_basis = None, None
        pass_name = _SOURCE_PASS.get(src, "")
        for r in run.results:
            if _get(r, "framework") == fw and _get(r, "batch_size") == bs_v:
                med = _get(_passes(r).get(pass_name, {}), "median_step_s")
                if med:
                    step_ns, step_basis = med * 1e9, f"median synchronised step of the {pass_name} pass"
        if step_ns is None and len(steps):
            step_ns, step_basis = float(steps.median()), "traced step events (host side)"
        out.append(Timed(str(fw), bs_v, src, level, rows, n, step_ns, basis, step_basis, tuple(its),
                         out_ev, out_ns, pass_name or None, ops))
    return out


_BWD = ("bwd", "bwd_data", "bwd_weight", "bwd_bias")


def direction_group(d: Any) -> str:
    """fwd, bwd (any gradient), or the direction itself (update, none)."""
    if d is None or (not isinstance(d, str) and pd.isna(d)):
        return "none"
    return "bwd" if d in _BWD else str(d)


def op_calls(t: Timed) -> pd.DataFrame:
    """Framework-op calls per step of each canonical op x direction group (fwd, bwd, ...) in the
    counted steps of the timed source: outermost ops with a canonical op. A backward call is
    counted once per forward call it differentiates: where the trace has autograd sequence numbers
    (PyTorch), backward ops whose ``seq`` falls in the same outermost forward op are one call
    (linear's ``AddmmBackward0`` and ``TBackward0`` are linear's one backward); without them
    (MXNet: one ``_backward_*`` op per forward op) each outermost backward op is a call.

    Columns: canonical_op, direction (group), calls, calls_per_step, basis."""
    cols = ["canonical_op", "direction", "calls", "calls_per_step", "basis"]
    ops = t.ops
    if ops is None or ops.empty:
        return pd.DataFrame(columns=cols)
    outer = _outermost(ops)
    dgroup = outer["direction"].map(direction_group)
    key = outer["event_id"].astype("Int64").astype(object)
    basis = pd.Series("outermost op", index=outer.index, dtype=object)
    if ops["seq"].notna().any():
        fwd_outer = outer[dgroup.eq("fwd")]
        seq_to_fwd: dict[int, int] = {}
        if len(fwd_outer):
            fw_ops = ops[ops["seq"].notna() & ops["direction"].eq("fwd")]
            for (pid, tid), g in fw_ops.groupby([fw_ops["pid"].fillna(-1), fw_ops["tid"].fillna(-1)]):
                fo = fwd_outer[(fwd_outer["pid"].fillna(-1) == pid) & (fwd_outer["tid"].fillna(-1) == tid)]
                if fo.empty:
                    continue
                fo = fo.sort_values("start_ns")
                starts = fo["start_ns"].to_numpy(dtype="int64")
                ends = starts + fo["dur_ns"].to_numpy(dtype="int64")
                pos = np.searchsorted(starts, g["start_ns"].to_numpy(dtype="int64"), side="right") - 1
                for p, s_, sq in zip(pos, g["start_ns"].to_numpy(dtype="int64"), g["seq"], strict=True):
                    if p >= 0 and s_ < ends[p]:
                        seq_to_fwd.setdefault(int(sq), int(fo["event_id"].iloc[p]))
        bwd = dgroup.eq("bwd") & outer["seq"].notna()
        mapped = outer.loc[bwd, "seq"].map(lambda q: seq_to_fwd.get(int(q)))
        hit = mapped.notna()
        key.loc[mapped.index[hit]] = [("fwd", int(v)) for v in mapped[hit]]
        basis.loc[mapped.index[hit]] = "backward ops per forward call (autograd seq)"
    df = pd.DataFrame({"canonical_op": outer["canonical_op"], "direction": dgroup, "key": key, "basis": basis})
    rows = []
    for (op, d), g in df.groupby(["canonical_op", "direction"], sort=False):
        n = int(g["key"].nunique())
        rows.append({"canonical_op": op, "direction": d, "calls": n, "calls_per_step": n / t.n_steps,
                     "basis": "; ".join(sorted(set(g["basis"])))})
    return pd.DataFrame(rows, columns=cols)


# --- library calls linked to ops (CPU: oneDNN, BLAS) -----------------------------------------
_SIG = ["canonical_op", "layer", "dgroup"]


def _fwbs(rec: pd.DataFrame, fw: str, bs: int | None) -> pd.DataFrame:
    return rec[(rec["framework"] == fw) & (rec["batch_size"].fillna(-1) == (-1 if bs is None else bs))]


def log_steps(run: Run, fw: str, bs: int | None) -> tuple[int | None, str]:
    """Training steps the library-log (libs) pass ran with its logs on: its warm-up and timed
    steps (the logs are on from process start), from results.json."""
    for r in run.results:
        if _get(r, "framework") == fw and _get(r, "batch_size") == bs:
            p = _passes(r).get("libs", {})
            n, w = _get(p, "steps"), _get(p, "warmup_steps")
            if isinstance(n, int) and isinstance(w, int):
                return n + w, f"libs pass: {n + w} logged steps ({w} warm-up + {n} timed)"
    return None, "results.json does not say how many steps the libs pass ran"


def linked_calls(run: Run, fw: str, bs: int | None) -> pd.DataFrame:
    """The library-log calls of one framework x batch size (any library), each with the
    signature of the framework op it is linked to (``op_canonical``, ``op_layer``, ``op_dgroup``:
    a oneDNN reorder takes the op of the primitive it feeds) and its own (``canonical_op``,
    ``layer``, ``dgroup``). Unlinked calls keep NA op columns."""
    rec = _fwbs(_records(run), fw, bs)
    calls = rec[rec["kind"] == "library_call"].copy()
    calls["dgroup"] = calls["direction"].map(direction_group)
    ops = rec[rec["kind"] == "op"][["run", "event_id", "canonical_op", "layer", "direction"]].rename(
        columns={"event_id": "op_event_id", "canonical_op": "op_canonical", "layer": "op_layer",
                 "direction": "op_direction"}).drop_duplicates(["run", "op_event_id"])
    m = calls[["run", "op_event_id"]].merge(ops, on=["run", "op_event_id"], how="left")
    m.index = calls.index
    calls["op_canonical"], calls["op_layer"] = m["op_canonical"], m["op_layer"]
    calls["op_dgroup"] = m["op_direction"].map(direction_group).where(m["op_direction"].notna())
    return calls


def linked_libraries(run: Run, fw: str, bs: int | None) -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """Per op signature (canonical op, layer or '-', direction group): the libraries and library
    calls linked to ops of that signature (CPU library logs: oneDNN, BLAS)."""
    calls = linked_calls(run, fw, bs)
    calls = calls[calls["op_canonical"].notna()]
    out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for (op, layer, d), g in calls.groupby([calls["op_canonical"], calls["op_layer"].fillna(schema.UNKNOWN),
                                            calls["op_dgroup"].fillna("none")]):
        out[(str(op), str(layer), str(d))] = {"libraries": sorted(set(g["library"].dropna())),
                                              "library_calls": sorted(set(g["library_call"].dropna()))}
    return out


def _op_signature(ev: pd.DataFrame) -> list[tuple[str, str, str]]:
    return list(zip(ev["canonical_op"].fillna(schema.UNATTRIBUTED), ev["layer"].fillna(schema.UNKNOWN),
                    ev["direction"].map(direction_group), strict=True))


# --- op time and the side-by-side table ------------------------------------------------------
def op_time(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x canonical op x direction x phase: time per step (ms),
    events per step, share of the step. ``level`` says whether kernels or ops were summed."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED),
                                 direction=t.events["direction"].fillna("none"),
                                 phase=t.events["phase"].fillna("other"))
            for (op, d, ph), g in ev.groupby(["canonical_op", "direction", "phase"]):
                ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "canonical_op": op, "direction": d, "phase": ph, "level": t.level,
                             "source": t.source, "ms_per_step": ms,
                             "events_per_step": len(g) / t.n_steps,
                             "share_of_step": ms * 1e6 / t.step_ns if t.step_ns else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "canonical_op", "direction",
                                       "phase", "level", "source", "ms_per_step", "events_per_step",
                                       "share_of_step"])


def short_kernel(name: str, limit: int = 110) -> str:
    """A kernel's name without return type, template arguments and parameters, for tables."""
    n = str(name).replace("<unnamed>", "{anon}")
    n = n[5:] if n.startswith("void ") else n
    depth, out = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    n = "".join(out).strip() or n
    return n if len(n) <= limit else n[: limit - 1] + "…"


def _uniq(s: pd.Series, limit: int = 6) -> list[str]:
    vals = [str(v) for v in pd.unique(s.dropna())]
    return vals[:limit] + ([f"... {len(vals) - limit} more"] if len(vals) > limit else [])


def op_table(run: Run, batch_size: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The side-by-side table of one run at one batch size: one row per canonical op x direction,
    columns ``<framework>.<field>``, and ``differences`` saying plainly where the frameworks part.

    Returns (table, frameworks)."""
    rec = _records(run)
    timed = [t for t in timed_events(run) if batch_size is None or t.batch_size == batch_size]
    if batch_size is None and timed:
        batch_size = timed[0].batch_size
        timed = [t for t in timed if t.batch_size == batch_size]
    fws = [t.framework for t in timed]
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for t in timed:
        allrows = _fwbs(rec, t.framework, t.batch_size)
        allrows = _fill_from_links(allrows, allrows)
        ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED),
                             direction=t.events["direction"].fillna("none"))
        lib = _event_library(run, t)
        calls_n = op_calls(t).set_index(["canonical_op", "direction"])["calls_per_step"]
        by_sig = linked_libraries(run, t.framework, t.batch_size) if t.level == "op" else {}
        for (op, d), g in ev.groupby(["canonical_op", "direction"]):
            key = (op, d)
            a = allrows[(allrows["canonical_op"] == op) & (allrows["direction"].fillna("none") == d)]
            kernels = a[a["kind"] == "kernel"]
            ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
            if t.level == "op":
                # what was linked to these ops (CPU library logs), not what a name suggests
                sigs = set(_op_signature(g))
                lib_calls = sorted({c for k in sigs if k in by_sig for c in by_sig[k]["library_calls"]})
            else:
                lib_calls = _uniq(a[a["kind"] == "library_call"]["library_call"]) or _uniq(a["library_call"])
            # kernel-level rows split a backward op (bwd_data/bwd_weight): their calls are kernel launches
            n_calls = calls_n.get((op, d)) if (op, d) in calls_n.index else None
            per.setdefault(key, {})[t.framework] = {
                "op_names": _uniq(g["op_name"]) or _uniq(a[a["kind"] == "op"]["op_name"]),
                "libraries": sorted(set(lib[g.index])),
                "library_calls": lib_calls,
                "kernels": _uniq(kernels["kernel_name"].map(short_kernel, na_action="ignore")),
                "n_kernels": int(kernels["kernel_name"].nunique()),
                "calls_per_step": float(n_calls) if n_calls is not None else len(g) / t.n_steps,
                "calls_basis": "framework-op calls" if n_calls is not None else f"{t.level}s",
                "ms_per_step": ms,
                "share_of_step": ms * 1e6 / t.step_ns if t.step_ns else None,
                "math_modes": _uniq(a["math_mode"]),
                "level": t.level,
            }
    rows = []
    for (op, d), cells in per.items():
        row: dict[str, Any] = {"canonical_op": op, "direction": d}
        for fw in fws:
            for k, v in (cells.get(fw) or {}).items():
                row[f"{fw}.{k}"] = v
        row["differences"] = differences(cells, fws)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        order = {o: i for i, o in enumerate((*schema.CANONICAL_OPS, schema.UNATTRIBUTED))}
        dorder = {o: i for i, o in enumerate(schema.DIRECTIONS)}
        df = df.assign(_o=df["canonical_op"].map(order), _d=df["direction"].map(dorder)).sort_values(
            ["_o", "_d"]).drop(columns=["_o", "_d"]).reset_index(drop=True)
    return df, fws


LAYER_COLUMNS = ("run", "batch_size", "layer", "canonical_op", "direction", "framework", "level",
                 "libraries", "library_calls", "algos", "kernels", "calls_per_step", "ms_per_step", "time_source",
                 "op_ms_per_step", "reorders_per_step", "reorder_ms_per_step", "flops_per_step", "achieved_flops",
                 "math_modes")


def layer_table(runs: list[Run]) -> pd.DataFrame:
    """Conv and linear work per layer and direction, for each framework: the library call(s), the
    algorithm (cuDNN engine id, oneDNN implementation), the kernel(s), the time per step and the
    FLOP/s that gives (the spec's FLOPs for the layer).

    Time per step: on the GPU the kernels' (the timed source's); on the CPU the library calls'
    own time from the library log (oneDNN primitives, BLAS calls; libs pass, per logged step),
    with ``time_source`` naming it; ``op_ms_per_step`` is the framework ops' time in the trace's
    pass (as in the op table), and the oneDNN layout reorders feeding the layer's primitives are
    counted apart (``reorders_per_step``, ``reorder_ms_per_step``)."""
    rows = []
    for run in runs:
        rec = _records(run)
        for t in timed_events(run):
            ev = t.events[t.events["canonical_op"].isin(["conv2d", "linear"]) & t.events["layer"].notna()]
            if ev.empty:
                continue
            allrows = _fill_from_links(_fwbs(rec, t.framework, t.batch_size), _fwbs(rec, t.framework, t.batch_size))
            lcalls = linked_calls(run, t.framework, t.batch_size) if t.level == "op" else None
            n_log, log_basis = log_steps(run, t.framework, t.batch_size) if t.level == "op" else (None, "")
            for (layer, op, d), g in ev.groupby(["layer", "canonical_op", ev["direction"].fillna("none")]):
                # an op-level "bwd" (CPU traces do not split a backward op) covers both gradients;
                # a kernel-level "bwd" is work no gradient call owns (the bias gradient's reduction)
                split = d == "bwd" and t.level == "op"
                dirs = {"bwd", "bwd_data", "bwd_weight"} if split else {d}
                a = allrows[(allrows["canonical_op"] == op) & (allrows["layer"] == layer)
                            & allrows["direction"].fillna("none").isin(dirs)]
                calls = a[a["kind"] == "library_call"]
                kernels = a[a["kind"] == "kernel"]["kernel_name"]
                onednn = calls[calls["library"] == "oneDNN"]
                op_ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
                reorders_ps = reorder_ms = None
                if t.level == "op":
                    ms, calls_ps, source = None, None, f"no library log for this layer ({t.framework})"
                    if len(calls) and n_log:
                        ms = float(calls["dur_ns"].sum()) / n_log / 1e6 if calls["dur_ns"].notna().all() else None
                        calls_ps = len(calls) / n_log
                        source = f"{'/'.join(sorted(set(calls['library'].dropna())))} log, {log_basis}"
                    elif len(calls):
                        source = f"library log: {log_basis}"
                    ro = lcalls[lcalls["canonical_op"].eq("reorder") & lcalls["op_canonical"].eq(op)
                                & lcalls["op_layer"].eq(layer) & lcalls["op_dgroup"].eq(direction_group(d))]
                    if n_log and len(calls):
                        reorders_ps = len(ro) / n_log
                        reorder_ms = float(ro["dur_ns"].sum()) / n_log / 1e6
                else:
                    ms, calls_ps = op_ms, None
                    source = f"{t.level}s of the {t.source} trace ({t.pass_name} pass)"
                # FLOPs of an op-level "bwd": the gradients its library calls computed
                parts = sorted(set(calls["direction"].dropna()) & {"bwd_data", "bwd_weight"}) if split else [d]
                flops = sum(layer_flops(layer, x, int(t.batch_size)) or 0 for x in parts) or None \
                    if t.batch_size is not None else None
                rows.append({
                    "run": run.name, "batch_size": t.batch_size, "layer": layer, "canonical_op": op,
                    "direction": d, "framework": t.framework, "level": t.level,
                    "libraries": _uniq(pd.concat([g["library"], calls["library"]])) or ["native"],
                    "library_calls": _uniq(pd.concat([calls["library_call"], g["library_call"]])),
                    "algos": _uniq(calls["algo"]),
                    # oneDNN names its implementation (its "kernel") in the verbose line
                    "kernels": _uniq(kernels.map(short_kernel, na_action="ignore")) or _uniq(onednn["kernel_name"]),
                    "calls_per_step": calls_ps, "ms_per_step": ms, "time_source": source, "op_ms_per_step": op_ms,
                    "reorders_per_step": reorders_ps, "reorder_ms_per_step": reorder_ms,
                    "flops_per_step": flops,
                    "achieved_flops": flops / (ms / 1e3) if flops and ms else None,
                    "math_modes": _uniq(pd.concat([g["math_mode"], calls["math_mode"]])),
                })
    df = pd.DataFrame(rows, columns=list(LAYER_COLUMNS))
    if len(df):
        dorder = {o: i for i, o in enumerate(schema.DIRECTIONS)}
        df = df.assign(_d=df["direction"].map(dorder)).sort_values(
            ["run", "batch_size", "layer", "_d", "framework"]).drop(columns="_d").reset_index(drop=True)
    return df


LIBRARY_CALL_COLUMNS = ("run", "framework", "batch_size", "library", "library_call", "canonical_op", "layer",
                        "direction", "linked", "calls_per_step", "ms_per_step", "logged_calls", "logged_steps",
                        "basis")


def library_calls(runs: list[Run]) -> pd.DataFrame:
    """Every library-log call kind per framework x batch size: library, call, the framework op it
    is linked to (canonical op, layer, direction group; a oneDNN layout reorder is counted under
    the op of the primitive it feeds, as its own row), calls and time per logged step. Calls not
    linked to an op are listed under their own canonical op, with ``linked`` False."""
    rows = []
    for run in runs:
        rec = _records(run)
        keys = rec[rec["kind"] == "library_call"][["framework", "batch_size"]].drop_duplicates()
        for fw, bs in keys.itertuples(index=False):
            bs_v = None if pd.isna(bs) else int(bs)
            c = linked_calls(run, str(fw), bs_v)
            n_log, basis = log_steps(run, str(fw), bs_v)
            linked = c["op_canonical"].notna()
            c = c.assign(_op=c["op_canonical"].fillna(c["canonical_op"]).fillna(schema.UNATTRIBUTED),
                         _layer=c["op_layer"].where(linked, c["layer"]).fillna(schema.UNKNOWN),
                         _dir=c["op_dgroup"].where(linked, c["dgroup"]).fillna("none"), _linked=linked)
            for (lib, call, op, layer, d, lk), g in c.groupby(
                    [c["library"].fillna(schema.UNKNOWN), c["library_call"].fillna(schema.UNKNOWN), "_op", "_layer", "_dir", "_linked"]):
                timed = g["dur_ns"].notna().all()
                rows.append({"run": run.name, "framework": fw, "batch_size": bs_v, "library": lib,
                             "library_call": call, "canonical_op": op, "layer": None if layer == "-" else layer,
                             "direction": d, "linked": bool(lk),
                             "calls_per_step": len(g) / n_log if n_log else None,
                             "ms_per_step": float(g["dur_ns"].sum()) / n_log / 1e6 if n_log and timed else None,
                             "logged_calls": len(g), "logged_steps": n_log,
                             "basis": basis if timed else f"{basis}; the log records no durations"})
    df = pd.DataFrame(rows, columns=list(LIBRARY_CALL_COLUMNS))
    if len(df):
        order = {o: i for i, o in enumerate(schema.CANONICAL_OPS)}
        df = df.assign(_o=df["canonical_op"].map(order).fillna(99)).sort_values(
            ["run", "batch_size", "framework", "_o", "layer", "direction", "library_call"],
            na_position="first").drop(columns="_o").reset_index(drop=True)
    return df


TIME_GAP = 1.5  # times on one row this many times apart (either way) are named as a gap


def differences(cells: dict[str, dict], fws: list[str]) -> list[str]:
    """Plain statements of where frameworks differ for one op row: library, math mode, kernels,
    a time gap of ``TIME_GAP`` or more, and different calls per step (counted the same way)."""
    present = [fw for fw in fws if fw in cells]
    missing = [fw for fw in fws if fw not in cells]
    out = []
    if missing and present:
        out.append(f"only {', '.join(fw_label(f) for f in present)} has this op")
    if len(present) < 2:
        return out

    def say(field_: str, what: str) -> None:
        sets = {fw: tuple(sorted(cells[fw][field_])) for fw in present}
        if len(set(sets.values())) > 1:
            out.append(f"{what} differs: " + ", ".join(
                f"{fw_label(fw)}: {'/'.join(v) or 'none recorded'}" for fw, v in sets.items()))

    say("libraries", "library")
    modes = {fw: tuple(sorted(cells[fw]["math_modes"])) for fw in present}
    if len(set(modes.values())) > 1:
        tf32 = {fw for fw, m in modes.items() if "tf32" in m}
        lead = "TF32 differs" if tf32 and len(tf32) < len(present) else "math mode differs"
        out.append(f"{lead}: " + ", ".join(f"{fw_label(fw)}: {'/'.join(m) or 'not recorded'}"
                                         for fw, m in modes.items()))
    libs = {fw: tuple(sorted(cells[fw]["libraries"])) for fw in present}
    kern = {fw: set(cells[fw]["kernels"]) for fw in present}
    if len(set(libs.values())) == 1 and all(kern.values()) and not set.intersection(*kern.values()):
        out.append("different algorithms (no kernel in common)")
    ms = {fw: cells[fw].get("ms_per_step") for fw in present}
    ms = {fw: v for fw, v in ms.items() if v is not None and not pd.isna(v)}
    if len(ms) >= 2 and min(ms.values()) > 0 and max(ms.values()) / min(ms.values()) >= TIME_GAP:
        out.append(f"time differs {max(ms.values()) / min(ms.values()):.1f}x: "
                   + ", ".join(f"{fw_label(fw)} {v:.3g} ms" for fw, v in ms.items()))
    bases = {cells[fw].get("calls_basis") for fw in present}
    calls = {fw: cells[fw].get("calls_per_step") for fw in present}
    if len(bases) == 1 and None not in calls.values() and len({round(float(v), 2) for v in calls.values()}) > 1:
        out.append(f"{bases.pop()} per step differ: " + ", ".join(f"{fw_label(fw)} {v:.3g}" for fw, v in calls.items()))
    return out


# --- library mix, kernel counts, busy share -----------------------------------------------------
def _event_library(run: Run, t: Timed) -> pd.Series:
    """The library of each timed event. Kernels (GPU): their own, from the linked library call.
    Framework ops (CPU): the libraries of the library-log calls linked to ops of the same
    signature (canonical op, layer, direction group), e.g. oneDNN for a convolution backward,
    BLAS for PyTorch's linear; ``a/b`` where both ran; "native" (framework code) where nothing
    was linked."""
    lib = t.events["library"]
    if t.level == "op":
        by_sig = linked_libraries(run, t.framework, t.batch_size)
        vals = ["/".join(by_sig[k]["libraries"]) if k in by_sig else pd.NA for k in _op_signature(t.events)]
        lib = pd.Series(vals, index=t.events.index, dtype="string")
    return lib.fillna("native")


def library_mix(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x library: time per step (ms) and share of timed time."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            lib = _event_library(run, t)
            total = float(t.events["dur_ns"].sum())
            for name, g in t.events.groupby(lib):
                ns = float(g["dur_ns"].sum())
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "library": name, "level": t.level, "ms_per_step": ns / t.n_steps / 1e6,
                             "share": ns / total if total else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "library", "level",
                                       "ms_per_step", "share"])


def kernel_counts(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x canonical op: distinct kernels and launches per step."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            if t.level != "kernel":
                continue
            ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED))
            for op, g in ev.groupby("canonical_op"):
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "canonical_op": op, "distinct_kernels": int(g["kernel_name"].nunique()),
                             "launches_per_step": len(g) / t.n_steps})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "canonical_op",
                                       "distinct_kernels", "launches_per_step"])


def busy_share(runs: list[Run]) -> pd.DataFrame:
    """Sum of timed event time per step / step wall time (median step in the same trace, or,
    when the trace has no step events, the clean pass's median step time from results.json)."""
    summ = summary_table(runs)
    rows = []
    for run in runs:
        for t in timed_events(run):
            busy_ms = float(t.events["dur_ns"].sum()) / t.n_steps / 1e6
            step_ms, basis = (t.step_ns / 1e6, t.step_basis) if t.step_ns else (None, None)
            if step_ms is None:
                m = summ[(summ["run"] == run.name) & (summ["framework"] == t.framework)
                         & (summ["batch_size"] == t.batch_size)]
                if len(m) and pd.notna(m["step_ms_median"].iloc[0]):
                    step_ms, basis = float(m["step_ms_median"].iloc[0]), "clean-pass median step"
            rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                         "level": t.level, "source": t.source, "busy_ms_per_step": busy_ms,
                         "step_ms": step_ms, "step_basis": basis,
                         "busy_share": busy_ms / step_ms if step_ms else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "level", "source",
                                       "busy_ms_per_step", "step_ms", "step_basis", "busy_share"])


def profiler_overhead(runs: list[Run]) -> pd.DataFrame:
    """Per capture pass (results.json ``passes``): median step time, its change vs the clean pass and
    the verdict against the clean pass's 95% interval (``timing.overhead_verdict``): an overhead is
    a figure only where the verdict is "above noise"."""
    rows = []
    for run in runs:
        for r in run.results:
            clean = clean_stats(r)
            for name, p in _passes(r).items():
                if name == "clean":
                    med, over, verdict, steps = clean.get("median_step_s"), None, None, _get(r, "steps")
                else:
                    st = _step_times_s(p)
                    med = float(np.median(st)) if st is not None else _get(p, "median_step_s")
                    steps = _get(p, "steps")
                    over = med / clean["median_step_s"] - 1 if med is not None and clean.get("median_step_s") else None
                    verdict = None if med is None else str(timing.overhead_verdict(med, steps or 0, clean))
                rows.append({"run": run.name, "framework": _get(r, "framework"),
                             "batch_size": _get(r, "batch_size"), "pass": name, "steps": steps,
                             "step_ms_median": None if med is None else med * 1e3,
                             "overhead": over, "verdict": verdict,
                             "skipped": None if _get(p, "skipped") is None else str(_get(p, "skipped"))})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "pass", "steps", "step_ms_median",
                                       "overhead", "verdict", "skipped"])


# --- roofline ----------------------------------------------------------------------------------
def gpu_name(run: Run) -> str | None:
    v = _get(run.manifest, "gpu.name")
    return v if isinstance(v, str) else None


def roofline(runs: list[Run]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Achieved FLOP/s of conv and linear work vs the device's peak.

    One row per framework x batch size x layer x canonical op x direction: FLOPs per step (from
    the op's ``flops``) over the kernel time per step of that op. Returns (table, peaks) where
    peaks maps run -> {'gpu', 'fp32', 'tf32'} or a 'note' why no peak is known."""
    rows, peaks = [], {}
    for run in runs:
        name = gpu_name(run)
        pk = peak_flops(name)
        peaks[run.name] = {"gpu": name, **(pk or {})} if pk else {
            "gpu": name, "note": "peak unknown (CPU run, or a GPU not in the peak table)"}
        rec = _records(run)
        for t in timed_events(run):
            ev = t.events[t.events["canonical_op"].isin(["conv2d", "linear"])]
            if ev.empty:
                continue
            src_ops = rec[(rec["source"] == t.source) & (rec["kind"] == "op")
                          & rec["run"].isin(t.events["run"].dropna().unique())]
            for (layer, op, d), g in ev.groupby([ev["layer"].fillna(schema.UNKNOWN), "canonical_op",
                                                 ev["direction"].fillna("none")]):
                flops = g["flops"].dropna()
                if flops.empty and t.level == "kernel":
                    linked = src_ops[src_ops["event_id"].isin(g["op_event_id"].dropna().unique())
                                     & src_ops["run"].isin(g["run"].unique())]
                    flops = linked["flops"].dropna()
                if flops.empty and t.batch_size is not None:
                    # Nothing recorded per event: the spec's shapes give the layer's FLOPs per step.
                    model = layer_flops(layer, d, int(t.batch_size))
                    flops = pd.Series([model] * t.n_steps, dtype="float64") if model else flops
                if flops.empty:
                    if t.level == "op" and d == "bwd":
                        peaks[run.name]["not_shown"] = (
                            "backward not shown: a CPU trace's backward op covers both gradients (data and "
                            "weight) and records no FLOPs; the model gives FLOPs per gradient only")
                    continue
                ns = float(g["dur_ns"].sum())
                modes = _uniq(g["math_mode"])
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "layer": layer, "canonical_op": op, "direction": d, "level": t.level,
                             "device": "gpu" if t.level == "kernel" else "cpu",
                             "flops_per_step": float(flops.sum()) / t.n_steps,
                             "ms_per_step": ns / t.n_steps / 1e6,
                             "achieved_flops": float(flops.sum()) / (ns / 1e9) if ns else None,
                             "math_mode": "/".join(modes) if modes else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "layer", "canonical_op",
                                       "direction", "level", "device", "flops_per_step", "ms_per_step",
                                       "achieved_flops", "math_mode"]), peaks


# --- coverage ----------------------------------------------------------------------------------
ATTRIBUTION_COLUMNS = ("framework", "batch_size", "source", "steps", "kernels", "kernel_time_ns",
                       "attributed_kernel_time_share", "library_kernels", "library_kernels_linked",
                       "library_kernel_time_linked_share", "ops", "onednn_primitives", "onednn_linked",
                       "onednn_linked_share")


def coverage(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(summary, top unattributed events, attribution.json per part, files normalise did not read).

    summary: per run x framework x batch size, timed time with and without a canonical op.
    top: the largest unattributed events by time per step, with whatever reason is recorded."""
    summ, top = [], []
    for run in runs:
        for t in timed_events(run):
            ev = t.events
            un = ev[ev["canonical_op"].isna()]
            total = float(ev["dur_ns"].sum())
            summ.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                         "level": t.level, "source": t.source, "events": len(ev),
                         "unattributed_events": len(un),
                         "unattributed_ms_per_step": float(un["dur_ns"].sum()) / t.n_steps / 1e6,
                         "unattributed_share": float(un["dur_ns"].sum()) / total if total else None})
            name = un["kernel_name"].fillna(un["op_name"]).fillna("(unnamed)")
            for nm, g in un.groupby(name):
                top.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                            "event": nm, "count_per_step": len(g) / t.n_steps,
                            "ms_per_step": float(g["dur_ns"].sum()) / t.n_steps / 1e6,
                            "linked_op": "yes" if g["op_event_id"].notna().any() else "no",
                            "linked_call": "yes" if g["call_event_id"].notna().any() else "no"})
    attr, skipped_files = [], []
    for run in runs:
        a = run.attribution
        if not isinstance(a, dict):
            continue
        # GPU: one row per framework x batch size x source (Kineto and nsys are separate passes).
        # CPU (no kernels): one row per framework x batch size with the oneDNN figures.
        for entry in (a.get("runs") or {}).values():
            per_source = entry.get("by_source") or {}
            for src, fig in per_source.items():
                attr.append({"run": run.name, "framework": entry.get("framework"),
                             "batch_size": entry.get("batch_size"), "source": src,
                             **{k: fig.get(k) for k in ATTRIBUTION_COLUMNS[3:]}})
            if not per_source:
                prims = entry.get("onednn_primitives") or {}
                attr.append({"run": run.name, **{k: entry.get(k) for k in ATTRIBUTION_COLUMNS},
                             "source": "all files", "onednn_primitives": sum(prims.values()) if prims else None})
        for nr in a.get("not_records") or []:
            skipped_files.append({"run": run.name, "file": nr.get("file"), "reason": nr.get("reason")})
    top_df = pd.DataFrame(top, columns=["run", "framework", "batch_size", "event", "count_per_step",
                                        "ms_per_step", "linked_op", "linked_call"])
    top_df = top_df.sort_values("ms_per_step", ascending=False).groupby(
        ["run", "framework", "batch_size"], dropna=False).head(10).reset_index(drop=True)
    return (pd.DataFrame(summ, columns=["run", "framework", "batch_size", "level", "source", "events",
                                        "unattributed_events", "unattributed_ms_per_step",
                                        "unattributed_share"]),
            top_df, pd.DataFrame(attr, columns=["run", *ATTRIBUTION_COLUMNS]).dropna(axis=1, how="all"),
            pd.DataFrame(skipped_files, columns=["run", "file", "reason"]))


# --- one iteration, for the timeline figure and export ------------------------------------------
LANES = ("phase", "op", "library_call", "kernel")


def timeline_events(run: Run, iteration: int | None = None, all_iterations: bool = False) -> pd.DataFrame:
    """Events of the timed source, per framework x batch size, in lanes phase/op/library_call/kernel,
    with times relative to the start of the shown window (ns).

    By default one iteration: ``iteration`` if given, else the median-numbered traced iteration.
    Library calls are the source's own library_call rows; where the source has none (Kineto does
    not record cuDNN/cuBLAS calls) they are derived as the span of the kernels linked to each call
    (``derived`` = True)."""
    rec = _records(run)
    out = []
    for t in timed_events(run):
        src = rec[(rec["source"] == t.source) & (rec["framework"] == t.framework)
                  & (rec["batch_size"].fillna(-1) == (-1 if t.batch_size is None else t.batch_size))]
        src = src[src["start_ns"].notna() & src["dur_ns"].notna()]
        src = _fill_from_links(src, src)
        its = sorted(src["iteration"].dropna().unique())
        it = None
        if not all_iterations and its:
            it = iteration if iteration in its else its[len(its) // 2]
            src = src[src["iteration"] == it]
        parts = []
        ops = src[src["kind"] == "op"]
        ph = src[src["kind"].isin(["step", "annotation"])]
        # Kineto repeats each annotation on the GPU timeline (gpu_user_annotation, the device's
        # pid): the phase lane shows the host's, as the op lane does.
        # (MXNet's profiler gives its step marks a process id of their own: keep them where none
        # is on the ops' process)
        host = set(ops["pid"].dropna())
        ph = ph[ph["pid"].isna() | ph["pid"].isin(host)] if host and ph["pid"].isin(host).any() else ph
        parts.append(ph.assign(lane="phase", derived=False))
        outer = _outermost(ops[ops["canonical_op"].notna()]).index
        parts.append(ops.assign(lane="op", derived=False, outermost=ops.index.isin(outer)))
        calls = src[src["kind"] == "library_call"].assign(lane="library_call", derived=False)
        kernels = src[src["kind"].isin(["kernel", "memcpy", "memset"])].assign(lane="kernel", derived=False)
        if calls.empty and kernels["call_event_id"].notna().any():
            k = kernels.dropna(subset=["call_event_id"]).assign(end_ns=lambda x: x["start_ns"] + x["dur_ns"])
            agg = k.groupby("call_event_id").agg(
                start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), library_call=("library_call", "first"),
                library=("library", "first"), canonical_op=("canonical_op", "first"),
                direction=("direction", "first"), stream=("stream", "first")).reset_index()
            calls = agg.assign(dur_ns=agg["end_ns"] - agg["start_ns"], kind="library_call",
                               lane="library_call", derived=True, framework=t.framework,
                               batch_size=t.batch_size, iteration=it).drop(columns=["end_ns"])
        parts += [calls, kernels]
        ev = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) \
            else pd.DataFrame(columns=[*schema.COLUMNS, "lane", "derived"])
        if ev.empty:
            continue
        t0 = ev["start_ns"].min()
        if it is None:  # no step marks: start the window at the first attributed timed event
            timed = ev[ev["lane"].isin(["kernel", "op"]) & ev["canonical_op"].notna()]
            if len(timed):
                t0 = timed["start_ns"].min()
                ev = ev[ev["start_ns"] + ev["dur_ns"] >= t0]
        ev = ev.assign(rel_ns=(ev["start_ns"] - t0).astype("int64"), framework=t.framework,
                       batch_size=t.batch_size, shown_iteration=it, run=run.name)
        out.append(ev)
    if not out:
        return pd.DataFrame(columns=[*schema.COLUMNS, "lane", "derived", "rel_ns", "shown_iteration"])
    return pd.concat(out, ignore_index=True)
