"""Achieved FLOP/s against the device's peak: per layer from the timing passes (``roofline``), and per kernel
from the counters pass's hardware counters (``counter_kernels``, ``layer_counters``; docs/COUNTERS.md)."""

from __future__ import annotations

import bisect
import re
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import gemmwork, kernelmath, schema
from kernelmap.adapters import graph_replay, ncu
from kernelmap.calllink import mangled_head, short_name, without_return_type
from kernelmap.errors import KernelmapError
from kernelmap.flops import layer_flops

from .base import TRACE_SOURCES, Run, case_of, field_at, fw_label, peak_flops
from .ops import distinct_values
from .timed import records_of, timed_events


# --- roofline ----------------------------------------------------------------------------------
def gpu_name(run: Run) -> str | None:
    v = field_at(run.manifest, "gpu.name")
    return v if isinstance(v, str) else None


def roofline(runs: list[Run]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Achieved FLOP/s of conv and linear work vs the device's peak.

    One row per framework x batch size x layer x canonical op x direction: FLOPs per step (from
    the op's ``flops``) over the kernel time per step of that op. Returns (table, peaks) where
    peaks maps run -> {'gpu', 'fp32', 'tf32'} or a 'note' why no peak is known, and 'not_shown':
    the frameworks whose backward is left out, and why."""
    rows, peaks = [], {}
    for run in runs:
        no_bwd: list[str] = []  # frameworks whose backward this run's traces cannot place
        name = gpu_name(run)
        pk = peak_flops(name)
        peaks[run.name] = {"gpu": name, **(pk or {})} if pk else {
            "gpu": name, "note": "peak unknown (CPU run, or a GPU not in the peak table)"}
        rec = records_of(run)
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
                    if t.level == "op" and d == "bwd" and t.framework not in no_bwd:
                        no_bwd.append(t.framework)
                    continue
                ns = float(g["dur_ns"].sum())
                modes = distinct_values(g["math_mode"])
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "layer": layer, "canonical_op": op, "direction": d, "level": t.level,
                             "device": "gpu" if t.level == "kernel" else "cpu",
                             "flops_per_step": float(flops.sum()) / t.n_steps,
                             "ms_per_step": ns / t.n_steps / 1e6,
                             "achieved_flops": float(flops.sum()) / (ns / 1e9) if ns else None,
                             "math_mode": "/".join(modes) if modes else None})
        if no_bwd:  # named: a framework whose trace splits the gradients (XLA's) shows its backward
            peaks[run.name]["not_shown"] = (
                f"backward not shown for {', '.join(fw_label(fw) for fw in no_bwd)}: a CPU trace's backward op "
                "covers both gradients (data and weight) and records no FLOPs; the model gives FLOPs per gradient only")
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "layer", "canonical_op",
                                       "direction", "level", "device", "flops_per_step", "ms_per_step",
                                       "achieved_flops", "math_mode"]), peaks




# --- the counters pass: each kernel's FLOPs, bytes and math from Nsight Compute ------------------------------
# (kernelmap/run/counters.py writes RUN_DIR/<case>/bs<N>/counters/ncu.csv; kernelmap/adapters/ncu.py reads it)
TENSOR_MATHS = tuple(ncu.TENSOR_OPS)  # tf32, bf16, fp16: a kernel whose counters say it ran the tensor cores
# the log's math of a kernel: what its call ran (issue 38's math column, kernelmap/kernelmath.py), else, in records
# written before it, what the call permitted (``math_mode``); compared as the arithmetic it implies
# (kernelmath.counted_math: the column ``log_math``)
LOG_MATH = "math_ran"
FLOP_TOLERANCE = 0.10
OWN_LIBRARIES = (schema.Library.NATIVE.value, schema.Library.CUSTOM.value)  # kernels no GPU library launched  # counter FLOPs of a conv/linear layer x direction within +-10% of the shapes' (issue 38)
KERNEL_COLUMNS = ["run", "case", "batch_size", "position", "kernel_name", "matched", "reason", "source",
                  "iteration", "layer", "canonical_op", "direction", "library", "library_call", "math_ran", "math_unit",
                  "log_math",
                  "counter_math", "math_agrees", "ncu_ns", "timed_ns", "flops", "flops_complete", "bytes",
                  "flops_per_s", "bytes_per_s", "intensity", "peak_flops_per_s", "attainable_flops_per_s",
                  "roofline_share", "sm_clock_hz", "unmeasured", "grid", "expected_flops", "expected_from"]
# expected_flops: the FLOPs a tiled conv/GEMM kernel executes by its shape, tile and launch (kernelmap/gemmwork.py),
# expected_from how they were derived or why they are not
# paired_time_share: the timing step's kernel time in kernels that have counters (issue 38: >= 99%); copy_nodes,
# copy_nodes_ms: the step's graph memcpy/memset nodes left out of it (``timed_step``: copies, not kernels)
# ncu_wall_s against COUNTERS_BUDGET_S (issue 38: the pass costs <= 60 s per framework and case); math_*: the
# paired kernels whose log math and counter math are both known, how many agree, the ones that do not
COUNTERS_BUDGET_S = 60.0
STATUS_COLUMNS = ["run", "case", "batch_size", "kernels", "timed_kernels", "matched", "pairing", "paired_time_share",
                  "copy_nodes", "copy_nodes_ms", "source",
                  "iteration", "ncu_wall_s", "within_budget", "math_compared", "math_agree", "math_disagree",
                  "math_by_name", "math_products_by_name", "math_call_vs_name", "profiler_messages", "reason"]
# math_by_name: of math_compared, the kernels whose log math is their name's alone (kernelmath.counted_by_name: the
# call's math_ran not used), math_products_by_name those of them that multiply operands (FMA-unit kernels), and
# math_call_vs_name the FMA-unit ones whose call's math_ran differs from the name's arithmetic (a bf16 call that
# ran on the FP32 FMA units), each "kernel: call X, name Y on the FMA units"


def not_a_roof(gemm: dict[str, Any]) -> dict[str, str]:
    """{precision: why} of one case's tensor-core GEMM rates (tf32, bf16, fp16) at or below its own fp32 rate: on a GPU
    with tensor cores (every GPU ncu's tensor-pipe counters read) such a GEMM runs above the FMA units' fp32 one,
    so a lower figure measured a slower path (an untuned kernel, another algorithm), not the GPU's peak. On an H200,
    session 13, JAX's bf16 and fp16 GEMMs (XLA's default algorithms, no autotuning) ran 10.4 TFLOP/s against fp32's
    26.7: a roofline against them would place every bf16 kernel near its roof."""
    fp32 = (gemm.get(ncu.MATH_FP32) or {}).get("flops_per_s")
    return {prec: (f"{prec} GEMM {g['flops_per_s']:.3g} FLOP/s, at or below the same case's fp32 {fp32:.3g}: a "
                   "tensor-core GEMM runs faster than the FMA units' one, so this measured a slower path, not the peak")
            for prec, g in gemm.items() if prec in TENSOR_MATHS and isinstance(g, dict) and fp32
            and g.get("flops_per_s") and g["flops_per_s"] <= fp32}


def measured_peaks(run: Run) -> dict[str, Any]:
    """The GPU's peaks the run measured (each counters pass's worker: frameworks/{pytorch,jax,mxnet}/peaks.py): per
    precision the GEMM FLOP/s and the DRAM copy bytes/s, the highest over the cases that measured them, with
    the case that did; {} where none did. Never a spec sheet's figure. A case's tensor-core rate that is no roof
    (``not_a_roof``) is not one: ``rejected`` lists it with why."""
    gemm: dict[str, dict] = {}
    rejected: list[dict] = []
    dram = None
    for r in run.results:
        p = field_at(r, "counters.peaks") or {}
        bad = not_a_roof(p.get("gemm") or {})
        for prec, g in (p.get("gemm") or {}).items():
            if prec in bad:
                rejected.append({**g, "precision": prec, "case": case_of(r), "method": p.get("method"), "why": bad[prec]})
            elif isinstance(g, dict) and g.get("flops_per_s") and g["flops_per_s"] > gemm.get(prec, {}).get("flops_per_s", 0):
                gemm[prec] = {**g, "case": case_of(r), "method": p.get("method")}
        d = p.get("dram") or {}
        if d.get("bytes_per_s") and (dram is None or d["bytes_per_s"] > dram["bytes_per_s"]):
            dram = {**d, "case": case_of(r), "method": p.get("method")}
    return {"gemm": gemm, "dram": dram, "rejected": rejected} if gemm or dram or rejected else {}


PEAK_COLUMNS = ["run", "roof", "unit", "per_s", "per_s_best", "ms_median", "timed_runs", "size", "case", "method",
                "not_a_roof"]


def _peak_row(run: str, roof: str, unit: str, entry: dict, key: str, size: str) -> dict[str, Any]:
    return {"run": run, "roof": roof, "unit": unit, "per_s": entry.get(key), "per_s_best": entry.get(f"{key}_best"),
            "ms_median": entry.get("ms_median"), "timed_runs": len(entry.get("ms") or []), "size": size,
            "case": entry.get("case"), "method": entry.get("method"), "not_a_roof": entry.get("why")}


def peak_table(peaks: dict[str, dict]) -> pd.DataFrame:
    """The roofs each run measured (``measured_peaks``): one row per GEMM precision and the device copy, its rate at
    the median run and the fastest, the median time and how many runs were timed, the size, the case that measured
    it and how (``method``: PyTorch's CUDA events, JAX's and MXNet's host timing); a measured rate that is no roof
    has its row too, ``not_a_roof`` saying why (else empty)."""
    rows = []
    for run, p in peaks.items():
        for prec, g in (p.get("gemm") or {}).items():
            rows.append(_peak_row(run, f"gemm {prec}", "FLOP/s", g, "flops_per_s", f"n={g.get('n')}"))
        for g in p.get("rejected") or []:  # measured, shown, not used (``not_a_roof``)
            rows.append(_peak_row(run, f"gemm {g['precision']}", "FLOP/s", g, "flops_per_s", f"n={g.get('n')}"))
        if p.get("dram"):
            rows.append(_peak_row(run, "device copy", "bytes/s (read + write)", p["dram"], "bytes_per_s",
                                  f"{p['dram'].get('bytes')} bytes"))
    return pd.DataFrame(rows, columns=PEAK_COLUMNS)


def timed_step(rec: pd.DataFrame, run_id: str) -> tuple[pd.DataFrame, str | None, int | None]:
    """The kernels of one traced step of a case's timing passes, in the order they were launched (ncu's order):
    the first trace source (the framework pass's, then nsys) with kernels in traced steps, its last step. Launch
    order is the CUDA correlation id where every kernel has one (two threads and several streams launch in one
    global order), then the start on the device (a CUDA graph's kernels share their launch's id); else the start.
    A replayed graph's memcpy and memset nodes, which the trace records as kernels (``memcpy32_post``:
    ``graph_replay.node_kind``), are copies, left out as an eager step's copies are (memcpy/memset rows, not kernels),
    and ncu profiles no copy: the 4x H200 JAX bf16 capture counted 53 kernels, its XLA step held 56, three of them
    its command buffers' ``memcpy32_post``. Their count and time: ``attrs["copy_nodes"]`` (n, ns).
    (empty, None, None) if none."""
    k = rec[(rec["run"] == run_id) & (rec["kind"] == "kernel") & rec["iteration"].notna()]
    for src in TRACE_SOURCES:
        ks = k[k["source"] == src]
        if len(ks):
            it = int(ks["iteration"].max())
            step = ks[ks["iteration"] == it]
            copies = np.array([isinstance(n, str) and graph_replay.node_kind(n) is not None
                               for n in step["kernel_name"]], dtype=bool)
            left = (int(copies.sum()), int(pd.to_numeric(step["dur_ns"][copies], errors="coerce").sum()))
            step = step[~copies]
            by = (["correlation_id", "start_ns", "event_id"] if step["correlation_id"].notna().all()
                  else ["start_ns", "event_id"])
            out = step.sort_values(by, kind="stable").reset_index(drop=True)
            out.attrs["copy_nodes"] = left
            return out, src, it
    return k.iloc[0:0], None, None


# how a case's kernels were paired (``counter_status.pairing``)
BY_ORDER = "launch order and name"
BY_IDENTITY = "name and launch configuration, in launch order per kernel (the two steps' launch orders differ)"


def match_kernels(counted: pd.DataFrame, timed: pd.DataFrame, source: str | None) -> tuple[pd.Series, list, str | None]:
    """Pair the counters step's kernels (ncu's profiling order) with a timing step's (``timed_step``). Only where
    both steps ran the same number of kernels: position by position where every name agrees (``kernel_key``: the
    function's name and its first template argument); else, where both ran the same kernels in another order
    (``launch_identity``: the name, grid and block of each, the same multiset on both sides: a framework whose
    threads launch onto several streams, MXNet's engine, launches them in another interleaving in each process),
    the n-th launch of each kernel with its n-th; else position by position where the names agree, the rest
    unpaired with its reason. Returns (index into ``timed`` per counted kernel, NA where unpaired; the reason per
    counted kernel, None where paired; how they were paired: ``BY_ORDER``, ``BY_IDENTITY``, None where none was).
    Counts that differ pair nothing: a kernel one step ran and the other did not leaves order and identity
    unable to say which kernel is which."""
    n, m = len(counted), len(timed)
    if source is None:
        return pd.Series([pd.NA] * n, dtype="Int64"), ["no timing pass traced a step of this case"] * n, None
    if n != m:
        why = (f"the counters step ran {n} kernels, the {source} step {m}: kernels are paired only where both ran "
               "the same number")
        return pd.Series([pd.NA] * n, dtype="Int64"), [why] * n, None
    a = [kernel_key(x) for x in counted["kernel_name"]]
    b = [kernel_key(x) for x in timed["kernel_name"]]
    if a != b:
        found = _by_identity(launch_identity(counted, a), launch_identity(timed, b))
        if found is not None:
            return (pd.Series(found, dtype="Int64"), [None] * n,
                    f"{BY_IDENTITY}: {out_of_order(found)} of {n} launched at another point")
    idx = [i if x == y else pd.NA for i, (x, y) in enumerate(zip(a, b, strict=True))]
    why = [None if x == y else f"name differs at position {i}: counters {_said(x)}, {source} {_said(y)}"
           for i, (x, y) in enumerate(zip(a, b, strict=True))]
    return pd.Series(idx, dtype="Int64"), why, (BY_ORDER if any(w is None for w in why) else None)


def launch_identity(df: pd.DataFrame, keys: list[str]) -> list[tuple] | None:
    """Per kernel: (``kernel_key``, grid, block) from ncu's ``grid``/``block`` text (``(1568, 1, 1)``) or a
    trace's ``grid_x``... columns; None where a kernel's launch configuration is not known."""
    if "grid" in df.columns:
        dims = [tuple(_dims(g)) + tuple(_dims(b)) for g, b in zip(df["grid"], df["block"], strict=True)]
    elif "grid_x" in df.columns:
        cols = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
        dims = [tuple(None if pd.isna(v) else int(v) for v in row) for row in df[cols].itertuples(index=False)]
    else:
        return None
    if any(None in d or len(d) != 6 for d in dims):
        return None
    return [(k, *d) for k, d in zip(keys, dims, strict=True)]


def _dims(text) -> list:
    if not isinstance(text, str):
        return [None]
    try:
        return [int(x) for x in text.strip().strip("()").split(",")]
    except ValueError:
        return [None]


def out_of_order(idx: list[int]) -> int:
    """How many kernels of a pairing sit elsewhere in the other step: the pairs less the longest run of them in the
    same relative order on both sides (a longest increasing subsequence of ``idx``)."""
    tails: list[int] = []
    for j in idx:
        k = bisect.bisect_left(tails, j)
        tails[k:k + 1] = [j]
    return len(idx) - len(tails)


def _by_identity(a: list[tuple] | None, b: list[tuple] | None) -> list[int] | None:
    """The n-th kernel of each identity of ``a`` with the n-th of ``b``; None unless both hold the same multiset."""
    if a is None or b is None or sorted(a) != sorted(b):
        return None
    at: dict[tuple, list[int]] = {}
    for j, ident in enumerate(b):
        at.setdefault(ident, []).append(j)
    for v in at.values():
        v.reverse()
    return [at[ident].pop() for ident in a]


BOOL_ARGS = {"true": "1", "false": "0"}  # kernel_key: a bool template argument as ncu writes it


def kernel_key(name: str) -> str:
    """A kernel's name as two profilers' demanglers agree on it: its function's own name and the head of its
    first template argument, each without namespaces (``vectorized_elementwise_kernel<8``,
    ``Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_64x64_32x10_nhwc_align8``,
    ``implicit_convolve_sgemm<__nv_bfloat16``). The rest is spelled differently: Kineto's GNU demangling writes
    ``at::native::(anonymous namespace)::``, ``{lambda(int)#1}``, ``false``, ``2ul``; ncu 2025.3 wrote
    ``at::<unnamed>::``, ``[lambda(int) (instance 1)]``, ``0``, ``(int)4`` and no ``native::`` for the same kernels;
    a bool template argument is ``true`` in Kineto's name and a bare ``1`` in ncu's (cuBLAS's ``sgemm_largek_lds64``
    of the 2x H200 fp32 run), so ``true``/``false`` read as ``1``/``0`` (the whole argument only: ``true_type`` stays).
    A name Kineto left mangled (cuDNN's long CUTLASS kernels) gives the same key from its mangled head. A return type
    written before the name is no part of it (``calllink.without_return_type``: cuBLAS's gemv, ``std::enable_if<!T7,
    void>::type internal::kernel<int`` in ncu 2025.3, ``std::enable_if<!(false), void>::type
    internal::gemvx::kernel<int`` in XLA's trace, both ``kernel<int``: the 4x H100 JAX fp32 capture paired 55 of 56)."""
    head = mangled_head(name)
    if head:
        fn = head[0].split("::")[-1]
        return f"{fn}<{head[1]}" if head[1] else fn
    s = re.sub(r"\((?:unsigned )?(?:int|long|long long|short|char|bool)\)(?=-?\d)", "", str(name))
    s = s.replace("(anonymous namespace)", "<unnamed>").replace("<unnamed>::", "")
    s = without_return_type(s)
    fn, lt, rest = s.partition("<")
    fn = re.split(r"\(", fn, maxsplit=1)[0].strip().split("::")[-1]  # a function without a template: no args
    if not lt:
        return fn
    first = re.split(r"[<,(>]", rest, maxsplit=1)[0].strip().split("::")[-1]
    first = re.sub(r"(?<=\d)(?:ull|ul|u|ll|l)$", "", first)  # 2ul -> 2
    first = BOOL_ARGS.get(first, first)  # a bool argument: Kineto's ``true``, ncu's ``1``
    return f"{fn}<{first}"


def display_name(name: str) -> str:
    """A kernel's name in a reason: ``calllink.short_name`` less a return type written before it (cuBLAS's gemv,
    ``std::enable_if<!T7, void>::type internal::kernel<...>``: ``internal::kernel``, not ``std::enable_if``)."""
    return short_name(without_return_type(str(name)))


def _said(key: str, width: int = 200) -> str:
    return key if len(key) <= width else key[: width - 3] + "..."


def _peak_for(math: str, peaks: dict) -> float | None:
    g = (peaks.get("gemm") or {}).get(math) if math in (*TENSOR_MATHS, ncu.MATH_FP32) else None
    return g.get("flops_per_s") if g else None


def _case_kernels(run: Run, r: dict, rec: pd.DataFrame, peaks: dict) -> tuple[pd.DataFrame, dict]:
    """The per-kernel rows and the status row of one case's counters pass."""
    case, bs, run_id = case_of(r), field_at(r, "batch_size"), field_at(r, "dir")
    status = {"run": run.name, "case": case, "batch_size": bs}
    c = field_at(r, "counters") or {}
    if c.get("skipped"):
        return pd.DataFrame(columns=KERNEL_COLUMNS), {**status, "reason": c["skipped"]}
    try:
        df = ncu.read(run.path / c["csv"])
    except KernelmapError as exc:  # ParseError: the file and the cause, said per case
        return pd.DataFrame(columns=KERNEL_COLUMNS), {**status, "reason": str(exc)}
    f = ncu.flops(df)
    timed, source, it = timed_step(rec, run_id)
    idx, why, how = match_kernels(df, timed, source)
    t = timed.reindex(idx.fillna(-1).astype(int)).reset_index(drop=True)  # unpaired: NA rows
    out = pd.DataFrame({
        "run": run.name, "case": case, "batch_size": bs, "position": df["id"].to_numpy(),
        "kernel_name": df["kernel_name"].to_numpy(), "matched": idx.notna().to_numpy(), "reason": why,
        "source": source, "iteration": it,
        **{c_: t[c_].to_numpy() if len(t) else pd.NA for c_ in ("layer", "canonical_op", "direction", "library",
                                                                "library_call")},
        **_log_math(t),
        "counter_math": f["math"].to_numpy(),
        "ncu_ns": df["duration_ns"].to_numpy(), "timed_ns": t["dur_ns"].to_numpy() if len(t) else pd.NA,
        "flops": f["flops"].to_numpy(), "flops_complete": f["flops_complete"].to_numpy(),
        "bytes": f["bytes"].to_numpy(), "sm_clock_hz": df["sm_clock_hz"].to_numpy(),
        "unmeasured": df["unmeasured"].to_numpy(), "grid": df["grid"].to_numpy()})
    out["expected_flops"], out["expected_from"] = gemmwork.expected_columns(out)
    out = _rates(out, peaks)
    step_ns = pd.to_numeric(timed["dur_ns"], errors="coerce").sum()
    paired_ns = pd.to_numeric(out.loc[out["matched"], "timed_ns"], errors="coerce").sum()
    wall = c.get("ncu_wall_s")
    copies = timed.attrs.get("copy_nodes", (0, 0))
    status.update(kernels=len(df), timed_kernels=len(timed), matched=int(out["matched"].sum()), pairing=how,
                  copy_nodes=copies[0], copy_nodes_ms=copies[1] / 1e6,
                  source=source,
                  iteration=it, paired_time_share=paired_ns / step_ns if step_ns else None, ncu_wall_s=wall,
                  within_budget=None if wall is None else wall <= COUNTERS_BUDGET_S, **math_agreement(out),
                  profiler_messages=list(dict.fromkeys([*(c.get("profiler_messages") or []),
                                                        *df.attrs["profiler_messages"]])),
                  reason=None if out["matched"].all() else next(w for w in why if w))
    return out[KERNEL_COLUMNS], status


def _log_math(t: pd.DataFrame) -> dict[str, Any]:
    """The paired timing kernels' math as their records give it (``math_ran``: the call's operand types, else, in
    records written before it, ``math_mode``), the unit their names say (``kernelmath.name_unit``), and
    ``log_math``: the arithmetic those imply, which the counters should find (``kernelmath.counted_math``: an
    FMA-unit bf16 conv computes in fp32, a layout transform in its compute type)."""
    if not len(t):
        return {"math_ran": pd.NA, "math_unit": pd.NA, "log_math": pd.NA}
    ran = t[LOG_MATH if LOG_MATH in t.columns else "math_mode"].astype(object).to_numpy()
    names = t["kernel_name"].astype(object).to_numpy()
    return {"math_ran": ran, "math_unit": [kernelmath.name_unit(n) if isinstance(n, str) else None for n in names],
            "log_math": [kernelmath.counted_math(n, r) for n, r in zip(names, ran, strict=True)]}


def _rates(out: pd.DataFrame, peaks: dict) -> pd.DataFrame:
    sec = pd.to_numeric(out["ncu_ns"], errors="coerce") / 1e9
    fl = pd.to_numeric(out["flops"], errors="coerce")
    by = pd.to_numeric(out["bytes"], errors="coerce")
    out["flops_per_s"] = fl / sec
    out["bytes_per_s"] = by / sec
    out["intensity"] = (fl / by).where(by > 0)
    bw = (peaks.get("dram") or {}).get("bytes_per_s")
    out["peak_flops_per_s"] = [_peak_for(m, peaks) for m in out["counter_math"]]
    peak = pd.to_numeric(out["peak_flops_per_s"], errors="coerce")
    out["attainable_flops_per_s"] = (np.minimum(peak, out["intensity"] * bw) if bw else peak)
    out["roofline_share"] = out["flops_per_s"] / out["attainable_flops_per_s"]
    lm = out["log_math"].astype(object)
    out["math_agrees"] = [None if not m or pd.isna(a) or b == ncu.MATH_UNKNOWN else kernelmath.agrees(a, b)
                          for m, a, b in zip(out["matched"], lm, out["counter_math"], strict=True)]
    return out


def math_agreement(kernels: pd.DataFrame) -> dict[str, Any]:
    """Log math against counter math over the paired kernels where both are known (``math_agrees`` not None):
    how many were compared, how many agree, and each that does not ("kernel: log X, counters Y")."""
    k = kernels[kernels["math_agrees"].notna()]
    bad = k[~k["math_agrees"].astype(bool)]
    named = k[np.array([kernelmath.counted_by_name(n) for n in k["kernel_name"]], dtype=bool)]
    fma = named[named["math_unit"].astype(object) == kernelmath.MathUnit.FMA.value]
    apart = fma[np.array([isinstance(r, str) and r != lm for r, lm in zip(fma["math_ran"], fma["log_math"],
                                                                          strict=True)], dtype=bool)]
    return {"math_compared": len(k), "math_agree": len(k) - len(bad),
            "math_disagree": [f"{display_name(n)}: log {lm}, counters {cm}" for n, lm, cm in
                              zip(bad["kernel_name"], bad["log_math"], bad["counter_math"], strict=True)],
            "math_by_name": len(named), "math_products_by_name": len(fma),
            "math_call_vs_name": [f"{display_name(n)}: call {r}, name {lm} on the FMA units" for n, r, lm in
                                  zip(apart["kernel_name"], apart["math_ran"], apart["log_math"], strict=True)]}


def counter_kernels(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict]]:
    """Every counted kernel of every case's counters pass, joined to its timing pass's kernel (``match_kernels``):
    layer, op, direction, library call and the log's math beside the counters' math (``math_agrees``), its
    FLOPs, DRAM bytes, achieved FLOP/s (over ncu's own duration of the kernel), arithmetic intensity and
    where it sits under the roofline of the run's measured peaks (``roofline_share``: achieved over
    min(peak of its math, intensity x DRAM bandwidth)). Returns (kernels, one status row per case: kernels
    counted, paired, why not; a refused or failed pass's reason), peaks by run)."""
    frames, status, peaks = [], [], {}
    for run in runs:
        if not any(field_at(r, "counters") for r in run.results):
            continue
        rec = records_of(run)
        peaks[run.name] = measured_peaks(run)
        for r in run.results:
            if not field_at(r, "counters"):
                continue
            k, s = _case_kernels(run, r, rec, peaks[run.name])
            frames.append(k)
            status.append(s)
    kernels = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=KERNEL_COLUMNS)
    return kernels, pd.DataFrame(status, columns=STATUS_COLUMNS), peaks


def layer_counters(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per case x layer x direction (the paired kernels only): the timing pass's kernel time, the share of it
    in kernels whose counters say tensor cores (``tensor_share``), the counter FLOPs beside the project's FLOP
    model from the shapes (``kernelmap/flops.py``: the direct algorithm's useful work; conv2d and linear only;
    ``ratio``, a measurement), and the verdict: the layer's conv/GEMM kernels' counter FLOPs (``gemm_counter_flops``)
    against the FLOPs those kernels execute by their shape, tile and launch (``expected_flops``,
    ``kernelmap/gemmwork.py``: tile padding, split-K, Winograd) within ``FLOP_TOLERANCE`` (``within_tolerance``;
    None, with ``expected_from`` saying why, where a kernel's work is not derivable or a counter that may matter
    was not measured). The counter FLOPs are the layer's library kernels' (cuDNN, cuBLAS...: the conv or GEMM and
    its layout kernels), not the framework's own bias adds, whose HFMA2.MMA register moves ncu counts as
    half-precision FLOPs; all its kernels where the records name no library (``flops_from`` says which)."""
    k = kernels[kernels["matched"].astype(bool) & kernels["layer"].notna()]
    rows = []
    for (run, case, bs, layer, op, d), g in k.groupby(["run", "case", "batch_size", "layer", "canonical_op",
                                                        "direction"], sort=False):
        t = pd.to_numeric(g["timed_ns"], errors="coerce")
        tensor = t[g["counter_math"].isin(TENSOR_MATHS)].sum()
        model = layer_flops(layer, d, int(bs)) if op in ("conv2d", "linear") else None
        lib = g[g["library"].notna() & ~g["library"].isin(OWN_LIBRARIES)]  # the conv/GEMM library's kernels
        w = lib if len(lib) else g
        fl = float(pd.to_numeric(w["flops"], errors="coerce").sum())
        complete = bool(w["flops_complete"].astype(bool).all())
        ratio = fl / model if model else None
        rows.append({"run": run, "case": case, "batch_size": bs, "layer": layer, "canonical_op": op, "direction": d,
                     "kernels": len(g), "timed_ms": t.sum() / 1e6, "tensor_share": tensor / t.sum() if t.sum() else None,
                     "counter_flops": fl, "flops_from": "library kernels" if len(lib) else "all kernels (no library known)",
                     "flops_complete": complete, "model_flops": model, "ratio": ratio,
                     **(executed_verdict(g) if model else dict.fromkeys(EXECUTED_COLUMNS)),
                     "maths": "/".join(sorted(set(g["counter_math"])))})
    return pd.DataFrame(rows, columns=["run", "case", "batch_size", "layer", "canonical_op", "direction", "kernels",
                                       "timed_ms", "tensor_share", "counter_flops", "flops_from", "flops_complete",
                                       "model_flops", "ratio", *EXECUTED_COLUMNS, "maths"])


EXECUTED_COLUMNS = ["gemm_counter_flops", "expected_flops", "expected_ratio", "expected_from", "within_tolerance"]


def executed_verdict(g: pd.DataFrame) -> dict[str, Any]:
    """One layer direction's conv/GEMM kernels (those ``expected_from`` speaks of): their counter FLOPs against the
    FLOPs they execute by ``gemmwork``'s rule, within ``FLOP_TOLERANCE``; no verdict, and the reason, where a
    kernel's work is not derivable (its name gives no tile...) or its counters are a lower bound."""
    out = dict.fromkeys(EXECUTED_COLUMNS)
    gm = g[g["expected_from"].notna()] if "expected_from" in g.columns else g.iloc[0:0]
    if gm.empty:
        return {**out, "expected_from": "no conv or GEMM kernel among the layer's paired kernels"}
    fl = float(pd.to_numeric(gm["flops"], errors="coerce").sum())
    out["gemm_counter_flops"] = fl
    missing = gm[gm["expected_flops"].isna()]
    if len(missing):
        return {**out, "expected_from": "; ".join(f"{display_name(n)}: {w}" for n, w in
                                                  zip(missing["kernel_name"], missing["expected_from"], strict=True))}
    exp = float(pd.to_numeric(gm["expected_flops"]).sum())
    out.update(expected_flops=exp, expected_ratio=fl / exp if exp else None,
               expected_from="; ".join(f"{display_name(n)}: {w}" for n, w in
                                       zip(gm["kernel_name"], gm["expected_from"], strict=True)))
    if not gm["flops_complete"].astype(bool).all():
        out["expected_from"] = "counter FLOPs a lower bound (a metric not measured); " + out["expected_from"]
    elif exp:
        out["within_tolerance"] = abs(fl / exp - 1) <= FLOP_TOLERANCE
    return out
