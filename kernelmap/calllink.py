"""Library calls linked to the kernels they launched, in the pass that logged them (issue 25).

The libs pass logs the cuDNN/cuBLAS/cuBLASLt calls and, in the same process, records the kernels
(``rundir.LIBS_TRACE_DIR``: PyTorch's Kineto profiler over its timed steps; the framework's
``Workload.libs_trace``). Its library kernels are those of the timing passes' own rule
(``attribution.library_kernel_mask``). There each logged call owns the kernels it launched:

* cuDNN (``OWN_BY_TIME``): the log stamps every call with the wall clock (microseconds) and the OS
  thread; the trace stamps each kernel's launch (its runtime call) with the host clock and thread.
  A kernel is owned by the last cuDNN call on its launch's thread that started at or before the
  launch and inside the launching framework op. The two clocks are one (the system clock), the log
  written in local time: the offset is searched in whole quarter hours (``CLOCK_STEP_NS``), the one
  under which most kernels find an owner.
* cuBLAS, cuBLASLt (``OWN_BY_SEQUENCE``): their logs stamp whole seconds only, so by order: per
  signature (canonical op, layer, direction), the n-th of the last N logged calls owns the kernels of
  the n-th of the N launching ops in the trace whose kernels have that signature (the trace covers
  the pass's last steps; the log runs from process start). A backward op whose kernels its trace does
  not split (direction ``bwd``: MXNet's ``_backward_FullyConnected`` makes a ``bwd_weight`` and a
  ``bwd_data`` ``cublasSgemmEx``) takes its calls a group per op, and its kernels, cut into one gemm
  (with its split-K reduction) per call, go to them in order (``_own_unsplit``).

An owning call's ``iteration`` (and ``phase``) become its kernels' step: a logged call without one
ran outside the traced steps (warm-up, the framework's autotuning), which the report counts apart.

The mapping is carried to the timing passes (Kineto, nsys) by the launching op: per op kind
(op name, canonical op, layer, direction, its occurrence in the step: counted per process, ``PROCESS``: each
rank's trace, each process of one nsys capture of every rank) the libs pass gives the sequence of its library
kernels and each one's call (``template``); an op of a timing pass that launched the same kernels in the
same order links each kernel to that call. Where the kernels differ (the timing pass ran another
algorithm), its kernels stay unlinked with a reason that names both: what the libs pass's call ran
and what this pass ran (``differs_reason``: the same kernels in another order or number are said so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import adapters
from . import strings as S
from .adapters.kernel_libraries import follows_a_gemm
from .attribution import LIBRARY_OPS, library_kernel_mask
from .errors import ParseError
from .schema import Direction

OWN_BY_TIME = ("cudnn_log",)
OWN_BY_SEQUENCE = ("cublas_log", "cublaslt_log")
CLOCK_STEP_NS = 15 * 60 * 10**9  # time zones are whole quarter hours from UTC
CLOCK_STEPS = 14 * 4  # up to +-14 h
SIGNATURE = ["canonical_op", "layer", "direction"]
# a launching op's kind, and which of the ops of that kind in its step it is (PyTorch's two aten::mm of a
# linear backward share name, layer and direction: the first is the data gradient, the second the weight's)
OP_KEY = ["op_name", "op_canonical", "op_layer", "op_direction", "op_nth"]
_CALL_COLS = ["library", "library_call", "algo", "math_mode"]
# what one process's records are: a rank's trace (Kineto's), or a process of a capture of several (nsys': no rank,
# its launching ops' process ids apart)
PROCESS = ["source", "rank", "op_pid"]
SPLIT_BWD = (Direction.BWD_DATA.value, Direction.BWD_WEIGHT.value)  # what an unsplit backward's calls are


def base_ns(path: Path, trace: pd.DataFrame) -> int:
    """What to add to a libs trace's ``start_ns`` to read it as Unix time (ns): Kineto's
    ``baseTimeNanoseconds``, nsys' session start."""
    sources = set(S.distinct(trace["source"])) if len(trace) else set()
    read_base = getattr(adapters.FORMATS.get(next(iter(sources))), "base_ns", None) if len(sources) == 1 else None
    if read_base is None:
        clocked = [f for f, m in adapters.FORMATS.items() if hasattr(m, "base_ns")]
        raise ParseError(path, f"a libs-pass trace must be one of {', '.join(clocked)} (a format whose clock reads "
                               f"as Unix time), not {sorted(sources)}")
    return read_base(path)


_LENGTH = re.compile(r"\d+")


def _source_names(s: str, i: int) -> tuple[list[str], int]:
    """The names of an Itanium-ABI mangled name from ``s[i]``: one ``<length><identifier>``, or a nested
    ``N...`` up to its template arguments (``I``) or its end (``E``); substitutions (``S_``, ``S0_``) stand
    for a prefix already read and are skipped, ``St`` is ``std``."""
    nested = s.startswith("N", i)
    i += nested
    while nested and i < len(s) and s[i] in "rVK":  # a member function's qualifiers
        i += 1
    out: list[str] = []
    while i < len(s):
        if s.startswith("St", i):
            out.append("std")
            i += 2
        elif s[i] == "S" and "_" in s[i:i + 8]:
            i = s.index("_", i) + 1
        elif m := _LENGTH.match(s, i):
            out.append(s[m.end():m.end() + int(m.group())])
            i = m.end() + int(m.group())
        else:
            break
        if not nested:
            break
    return out, i


def mangled_head(name: str) -> tuple[str, str | None] | None:
    """(qualified function name, last name of its first template argument or None) of a kernel name left
    Itanium-mangled (Kineto leaves cuDNN's 1,600-character CUTLASS names so where nsys and ncu demangle them:
    ``_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionI...`` ->
    (``cutlass__5x_cudnn::Kernel``, ``ImplicitGemmConvolution``)); None for a name that is not mangled."""
    s = str(name)
    if not s.startswith("_Z"):
        return None
    fn, i = _source_names(s, 2)
    if not fn or not all(fn):
        return None
    first = _source_names(s, i + 1)[0] if s.startswith("I", i) else []
    return "::".join(fn), (first[-1] if first and first[-1] else None)


def short_name(name: str) -> str:
    """A kernel name without its template and argument lists (``void fft2d_r2c_32x32<...>(...)`` ->
    ``fft2d_r2c_32x32``): what two profilers' demanglings agree on; a mangled name's function
    (``mangled_head``)."""
    head = mangled_head(name)
    if head:
        return head[0]
    s = str(name)
    s = s[5:] if s.startswith("void ") else s
    for anon in ("<unnamed>::", "(anonymous namespace)::"):
        s = s.replace(anon, "")
    return re.split(r"[<(]", s, maxsplit=1)[0].strip() or str(name)


OPEN, CLOSE = "<([{", ">)]}"  # without_return_type: the brackets a demangled name nests


def without_return_type(name: str) -> str:
    """A demangled kernel name less the return type written before it: the text after the last space outside
    every bracket before the argument list (``void k<float>(float*)`` -> ``k<float>(float*)``; cuBLAS's gemv,
    ``std::enable_if<!T7, void>::type internal::kernel<int, ...>(T13)`` as ncu 2025.3 wrote it,
    ``std::enable_if<!(false), void>::type internal::gemvx::kernel<int, ...>(...)`` in XLA's trace, ->
    ``internal::kernel<int, ...>``: the return type's ``!T7``/``!(false)`` is no part of the kernel's name). A name
    whose brackets do not balance is returned as it is."""
    depth, cut = 0, 0
    for i, ch in enumerate(name):
        if ch == "(" and depth == 0 and i > 0:
            break  # the argument list
        if ch in OPEN:
            depth += 1
        elif ch in CLOSE:
            depth -= 1
            if depth < 0:
                return name
        elif ch == " " and depth == 0:
            cut = i + 1
    return name[cut:]


def _nth(frame: pd.DataFrame) -> np.ndarray:
    """Per row, which occurrence of its op kind (``OP_KEY`` but ``op_nth``) in its step its launching op
    is, counting ops by their start."""
    ops = frame.drop_duplicates("op_event_id").sort_values(["op_start_ns", "op_event_id"], kind="stable")
    keys = [ops[c].astype(object).where(ops[c].notna(), "\0").astype(str) for c in (*OP_KEY[:-1], "iteration")]
    nth = pd.DataFrame({f"k{i}": k.to_numpy() for i, k in enumerate(keys)}).groupby(
        [f"k{i}" for i in range(len(keys))], sort=False).cumcount().to_numpy()
    return pd.Series(nth, index=ops["op_event_id"].to_numpy()).reindex(frame["op_event_id"].to_numpy()).to_numpy()


def library_rows(trace: pd.DataFrame, records: pd.DataFrame, kinds: tuple[str, ...] = ("kernel",)) -> pd.DataFrame:
    """The rows of ``trace`` (of ``kinds``) that are library kernels by the timing passes' own rule
    (``attribution.library_kernel_mask``, the signatures of ``records``' GPU library-log calls), launched inside
    an op or not."""
    t = S.plain(trace)
    k = t[t["kind"].isin(list(kinds))]
    return k[library_kernel_mask(k, records)]


def launches(trace: pd.DataFrame, base_ns: int, records: pd.DataFrame, kinds: tuple[str, ...] = ("kernel",)
             ) -> pd.DataFrame:
    """The trace's library kernels (``library_rows``: the timing passes' rule, against the log calls of
    ``records``) launched inside an op, with their launch: the runtime call of the same correlation id
    (thread, start in Unix ns), the launching op (name, signature, start) and their order. Index: the kernel
    rows' labels in ``trace``. ``kinds``: the device rows taken (a graph reference step's memsets too:
    ``link_replayed``)."""
    t = S.plain(trace)
    k = library_rows(t, records, kinds)
    k = k[k["op_event_id"].notna()]
    rt = t[t["kind"].eq("runtime") & t["correlation_id"].notna()].drop_duplicates("correlation_id")
    rt = rt.set_index("correlation_id")
    ops = t[t["kind"].eq("op")].drop_duplicates("event_id").set_index("event_id")
    corr = k["correlation_id"]
    out = pd.DataFrame({
        "kernel_name": k["kernel_name"], "short": k["kernel_name"].map(short_name),
        **{c: k[c] for c in SIGNATURE}, "iteration": k["iteration"], "phase": k["phase"],
        "op_event_id": k["op_event_id"],
        "tid": rt["tid"].reindex(corr).to_numpy(),
        "launch_ns": (rt["start_ns"].reindex(corr).to_numpy(dtype="float64", na_value=np.nan) + base_ns),
    }, index=k.index)
    op = ops.reindex(k["op_event_id"].astype("int64").to_numpy())
    out["op_name"] = op["op_name"].to_numpy()
    out["op_canonical"] = op["canonical_op"].to_numpy()
    out["op_layer"] = op["layer"].to_numpy()
    out["op_direction"] = op["direction"].to_numpy()
    out["op_start_ns"] = op["start_ns"].to_numpy(dtype="float64", na_value=np.nan) + base_ns
    out["op_nth"] = _nth(out)
    return out.sort_values(["launch_ns", "kernel_name"], kind="stable")


@dataclass
class Ownership:
    """Which logged call launched each library kernel of the libs pass's own trace."""
    owner: pd.Series  # kernel label (in the libs trace) -> the log call's event_id (NA: no owner)
    clock_offset_ns: int | None  # added to a log time to read it on the trace's clock
    by_time: int = 0
    by_sequence: int = 0
    notes: list[str] = field(default_factory=list)


def _own_by_time(calls: pd.DataFrame, lk: pd.DataFrame, offset: int) -> pd.Series:
    out = pd.Series(pd.NA, index=lk.index, dtype="Int64")
    for tid, g in lk.groupby("tid", dropna=True):
        c = calls[calls["tid"].eq(tid)]
        if c.empty:
            continue
        c = c.sort_values(["start_ns", "event_id"], kind="stable")
        st = c["start_ns"].to_numpy(dtype="int64") + offset
        pos = np.searchsorted(st, g["launch_ns"].to_numpy(dtype="float64"), side="right") - 1
        ok = pos >= 0
        ok[ok] &= st[pos[ok]] >= g["op_start_ns"].to_numpy(dtype="float64")[ok]
        ids = c["event_id"].to_numpy(dtype="int64")
        out.loc[g.index[ok]] = ids[pos[ok]]
    return out


def own(df: pd.DataFrame, lk: pd.DataFrame) -> Ownership:
    """Owners of the libs trace's library kernels ``lk`` (``launches``) among the log calls of ``df``."""
    calls = S.plain(df[S.eq(df["kind"], "library_call") & S.isin(df["source"], [*OWN_BY_TIME, *OWN_BY_SEQUENCE])])
    owner = pd.Series(pd.NA, index=lk.index, dtype="Int64")
    res = Ownership(owner, None)
    timed = calls[calls["source"].isin(OWN_BY_TIME) & calls["start_ns"].notna() & calls["tid"].notna()]
    if len(timed) and len(lk):
        best, offset = -1, 0
        for step in sorted(range(-CLOCK_STEPS, CLOCK_STEPS + 1), key=abs):
            got = _own_by_time(timed, lk, step * CLOCK_STEP_NS)
            n = int(got.notna().sum())
            if n > best:
                best, offset, owner = n, step * CLOCK_STEP_NS, got
        res.by_time = best
        res.clock_offset_ns = offset if best > 0 else None
        if best == 0:
            res.notes.append(f"no logged cuDNN call owns a kernel of the libs trace under any clock offset within "
                             f"+-{CLOCK_STEPS // 4} h: the log's threads or times do not meet the trace's launches")
    # by sequence: per signature, the last N calls <-> the last N launching ops whose kernels have it
    seq = calls[calls["source"].isin(OWN_BY_SEQUENCE) & calls[SIGNATURE].notna().all(axis=1)]
    seq = seq.sort_values("event_id", kind="stable")
    free = lk[owner.isna().to_numpy() & lk[SIGNATURE].notna().all(axis=1).to_numpy()]
    for sig, c in seq.groupby(SIGNATURE, sort=False):
        k = free[(free[SIGNATURE] == pd.Series(sig, index=SIGNATURE)).all(axis=1)]
        if k.empty or not _one_library(c, "/".join(map(str, sig)), res):
            continue
        occ = list(dict.fromkeys(k["op_event_id"].tolist()))  # launching ops in launch order
        n = min(len(c), len(occ))
        ids = c["event_id"].to_numpy(dtype="int64")[len(c) - n:]
        for op_id, call_id in zip(occ[len(occ) - n:], ids, strict=True):
            rows = k.index[k["op_event_id"].eq(op_id).to_numpy()]
            owner.loc[rows] = call_id
            res.by_sequence += len(rows)
    _own_unsplit(seq, free, owner, res)
    res.owner = owner
    return res


def _one_library(c: pd.DataFrame, what: str, res: Ownership) -> bool:
    """Whether the calls ``c`` of one signature are of one library (else a note: two logs' calls are not
    ordered against each other)."""
    if c["library"].nunique() > 1:
        res.notes.append(f"{what}: calls of {sorted(c['library'].unique())} in the logs; not linked by order")
        return False
    return True


def _call_runs(names: list[str]) -> list[list[int]]:
    """One backward op's library kernels (in launch order) cut into the runs its library calls launched: each
    run starts with a gemm, the kernels that finish it (split-K reductions: ``kernel_libraries.follows_a_gemm``)
    follow it inside the same call."""
    runs: list[list[int]] = []
    for i, name in enumerate(names):
        if runs and follows_a_gemm(name):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _own_unsplit(seq: pd.DataFrame, free: pd.DataFrame, owner: pd.Series, res: Ownership) -> None:
    """Backward kernels not split by their op (direction ``bwd``: MXNet's ``_backward_FullyConnected`` runs the
    weight and the data gradient's gemm, two ``cublasSgemmEx`` of directions ``bwd_weight`` and ``bwd_data``)
    owned by those calls. Per (op, layer) whose logged calls are all split, each launching op made one call of
    each direction, in one order: the last N groups of that many calls <-> the last N launching ops. Inside an
    op, its library kernels in launch order cut into one run per call (``_call_runs``) go to its calls in
    their order; an op whose kernels do not cut so stays unowned (a note)."""
    bwd = free[free["direction"].eq(Direction.BWD.value).to_numpy()]
    split = seq[seq["direction"].isin(SPLIT_BWD).to_numpy()]
    for (op, layer), k in bwd.groupby(["canonical_op", "layer"], sort=False):
        c = split[split["canonical_op"].eq(op).to_numpy() & split["layer"].eq(layer).to_numpy()]
        mixed = seq["canonical_op"].eq(op).to_numpy() & seq["layer"].eq(layer).to_numpy() & seq["direction"].eq(
            Direction.BWD.value).to_numpy()
        what = f"{op}/{layer}/{Direction.BWD.value}"
        if c.empty or mixed.any() or not _one_library(c, what, res):
            continue
        per_op = c["direction"].nunique()
        ops = list(dict.fromkeys(k["op_event_id"].tolist()))
        n = min(len(c) // per_op, len(ops))
        ids = c["event_id"].to_numpy(dtype="int64")[len(c) - n * per_op:].reshape(n, per_op)
        dirs = c["direction"].to_numpy(dtype=object)[len(c) - n * per_op:].reshape(n, per_op)
        if len({tuple(d) for d in dirs}) > 1 or any(len(set(d)) != per_op for d in dirs):
            res.notes.append(f"{what}: its {len(c)} logged calls ({', '.join(sorted(set(c['direction'])))}) do "
                             f"not come in groups of one call per direction; not linked by order")
            continue
        odd = 0
        for op_id, call_ids in zip(ops[len(ops) - n:], ids, strict=True):
            g = k[k["op_event_id"].eq(op_id).to_numpy()]
            runs = _call_runs(g["kernel_name"].tolist())
            if len(runs) != per_op:
                odd += 1
                continue
            for run, call_id in zip(runs, call_ids, strict=True):
                owner.loc[g.index[run]] = call_id
                res.by_sequence += len(run)
        if odd:
            res.notes.append(f"{what}: {odd} of {n} ops launched library kernels that do not cut into one gemm "
                             f"(and its split-K reduction) per call of {per_op} ({', '.join(dirs[0])}); not owned")


def mark_calls(df: pd.DataFrame, lk: pd.DataFrame, ownership: Ownership) -> None:
    """Give each owning log call the step (``iteration``, ``phase``) of its kernels in the libs trace."""
    got = lk.assign(owner=ownership.owner).dropna(subset=["owner"])
    if got.empty:
        return
    first = got.groupby("owner", sort=True).first()
    ids = first.index.to_numpy(dtype="int64")
    rows = np.flatnonzero(np.isin(df["event_id"].to_numpy(dtype="int64", na_value=-1), ids)
                          & S.eq(df["kind"], "library_call"))
    at = pd.Series(np.arange(len(ids)), index=ids).reindex(df["event_id"].array.take(rows).astype("int64")).to_numpy()
    S.set_rows(df, "iteration", rows, pd.array(first["iteration"].to_numpy()[at], dtype="Int64"))
    S.set_rows(df, "phase", rows, pd.array(first["phase"].astype(object).to_numpy()[at], dtype=S.STRING))


@dataclass
class Template:
    """The library kernels one kind of launching op ran in the libs pass, in launch order, and the call
    that launched each (NA: none of the logged calls)."""
    names: tuple[str, ...]
    owners: tuple
    variants: int  # distinct kernel sequences among the op's occurrences in the libs trace


def templates(lk: pd.DataFrame, owner: pd.Series) -> dict[tuple, Template]:
    """Per launching op kind (``OP_KEY``) of the libs trace: its library kernels and their calls, where
    the op is a convolution or linear op or some logged call owned one of its kernels (an op that runs
    no library call has none)."""
    out: dict[tuple, Template] = {}
    lk = lk.assign(owner=owner)
    for key, g in lk.groupby(OP_KEY, dropna=False, sort=False):
        if g["owner"].isna().all() and key[1] not in LIBRARY_OPS:
            continue
        seqs = {}
        for op_id, o in g.groupby("op_event_id", sort=False):
            seqs[op_id] = (tuple(o["short"]), tuple(o["owner"]))
        last = seqs[list(seqs)[-1]]
        out[tuple(None if pd.isna(v) else v for v in key)] = Template(
            last[0], last[1], len({s for s, _ in seqs.values()}))
    return out


def _describe(t: Template, calls: pd.DataFrame) -> str:
    parts = []
    for cid in dict.fromkeys(t.owners):
        if pd.isna(cid) or int(cid) not in calls.index:
            continue
        c = calls.loc[int(cid)]
        names = [n for n, o in zip(t.names, t.owners, strict=True) if not pd.isna(o) and int(o) == int(cid)]
        algo = "" if pd.isna(c["algo"]) else f" {c['algo']}"
        parts.append(f"{c['library_call']}{algo} ({c['direction']}: {', '.join(dict.fromkeys(names))})")
    return "; ".join(parts) or "no logged call"


def differs_reason(key: tuple, tp: Template, names: tuple[str, ...], libs: str, algorithms_shared: bool) -> str:
    """Why an op's kernels ``names`` (in launch order) are not linked through the libs pass's template ``tp`` of its
    op kind ``key`` (``libs``: what its calls ran, ``_describe``). Only kernels other than the call's (not the same
    names) are an algorithm the process may have chosen for itself; the same kernels in another order or number
    are said as such."""
    if tp.variants > 1:
        return f"the libs pass's {key[0]} ({key[2] or '-'} {key[3]}) launched other kernels in its own steps"
    ran = f"the libs pass ran {libs}; this pass ran {', '.join(dict.fromkeys(names))}"
    if set(names) == set(tp.names):
        how = "in another order" if sorted(names) == sorted(tp.names) else f"{len(names)} where it ran {len(tp.names)}"
        return f"{ran}: the same kernels, {how}"
    return ran + ("" if algorithms_shared else " (each process of this case chose its own algorithms)")


def carry(df: pd.DataFrame, tpl: dict[tuple, Template], algorithms_shared: bool = True) -> dict:
    """Link the timing passes' library kernels of ``df`` (every trace source in it) to the libs
    pass's calls through ``tpl``; returns the figures, the per-layer differences and, per kernel row
    left unlinked for a known reason, that reason (``reasons``: row label -> text). Where the case's
    processes did not share their algorithms (``algorithms_shared`` False), an algorithm difference
    says so."""
    calls = S.plain(df[S.eq(df["kind"], "library_call")]).drop_duplicates("event_id").set_index("event_id")
    t = S.plain(df[S.eq(df["kind"], "kernel") & df["op_event_id"].notna().to_numpy()
                   & df["call_event_id"].isna().to_numpy()])
    t = t[library_kernel_mask(t, df)]  # the libs pass's templates hold its library kernels by the same rule
    info = {"linked": 0, "differs": [], "reasons": {}}
    if t.empty or not tpl:
        return info
    ops = S.plain(df[S.eq(df["kind"], "op")]).drop_duplicates(["source", "event_id"]).set_index("event_id")
    op = ops.reindex(t["op_event_id"].astype("int64").to_numpy())
    t = t.assign(op_name=op["op_name"].to_numpy(), op_canonical=op["canonical_op"].to_numpy(),
                 op_layer=op["layer"].to_numpy(), op_direction=op["direction"].to_numpy(),
                 op_start_ns=op["start_ns"].to_numpy(dtype="float64", na_value=np.nan),
                 op_pid=op["pid"].to_numpy(dtype="float64", na_value=np.nan),
                 short=t["kernel_name"].map(short_name))
    t["op_nth"] = 0
    # each process's ops counted in its own steps (``PROCESS``: one trace of each rank, or one nsys capture of all)
    for _, g in t.groupby(PROCESS, sort=False, dropna=False):
        t.loc[g.index, "op_nth"] = _nth(g)
    t["launch_ns"] = _launch_ns(df, t)
    t = t.sort_values(["source", "launch_ns", "event_id"], kind="stable")
    rows, ids = [], []
    differs: dict[tuple, dict] = {}
    for (src, _op), g in t.groupby(["source", "op_event_id"], sort=False):
        key = tuple(None if pd.isna(g[c].iloc[0]) else g[c].iloc[0] for c in OP_KEY)
        tp = tpl.get(key)
        if tp is None:
            continue
        names = tuple(g["short"])
        if names == tp.names and tp.variants == 1:
            for label, cid in zip(g.index, tp.owners, strict=True):
                if not pd.isna(cid):
                    rows.append(label)
                    ids.append(int(cid))
            continue
        libs = _describe(tp, calls)
        why = differs_reason(key, tp, names, libs, algorithms_shared)
        for label in g.index:
            info["reasons"][label] = why
        d = differs.setdefault((src, *key), {"source": src, "op_name": key[0], "canonical_op": key[1],
                                              "layer": key[2], "direction": key[3], "libs_pass": libs,
                                              "this_pass": sorted(set(names)), "ops": 0})
        d["ops"] += 1
    _set_links(df, rows, ids, calls)
    info["linked"] = len(rows)
    info["differs"] = list(differs.values())
    return info


def _launch_ns(df: pd.DataFrame, t: pd.DataFrame) -> np.ndarray:
    """The launch time of each kernel row of ``t`` (``carry``'s: ``op_pid`` its launching op's process): its runtime
    call of the same correlation id in the same trace and process (every rank's trace is a ``trace.json.gz``;
    one nsys capture holds every rank's processes, each counting its own ids from the same first one); where the
    op's process has none (a trace whose runtime rows carry another pid than its ops), the one runtime call of that
    id in the trace (an id two processes share: none); else the kernel's own start. Launch order is the libs
    trace's order, not the GPU's: kernels of several streams (cuDNN's FFT) start out of the order they were
    launched in."""
    rt = S.plain(df[S.eq(df["kind"], "runtime") & df["correlation_id"].notna().to_numpy()])
    rt = pd.DataFrame({"file": rt["source_file"].astype(object).to_numpy(),
                       "rank": rt["rank"].to_numpy(dtype="float64", na_value=-1.0),
                       "pid": rt["pid"].to_numpy(dtype="float64", na_value=-1.0),
                       "corr": rt["correlation_id"].to_numpy(dtype="int64"),
                       "start": rt["start_ns"].to_numpy(dtype="float64", na_value=np.nan)})
    k = pd.DataFrame({"file": t["source_file"].astype(object).to_numpy(),
                      "rank": t["rank"].to_numpy(dtype="float64", na_value=-1.0),
                      "pid": np.nan_to_num(t["op_pid"].to_numpy(dtype="float64"), nan=-1.0),
                      "corr": t["correlation_id"].to_numpy(dtype="float64", na_value=-1.0).astype("int64")})
    at = np.full(len(t), np.nan)
    for keys, keep in ((["file", "rank", "pid", "corr"], "first"), (["file", "rank", "corr"], False)):
        one = rt.drop_duplicates(keys, keep=keep).set_index(keys)["start"]
        got = one.reindex(pd.MultiIndex.from_frame(k[keys])).to_numpy(dtype="float64")
        at = np.where(np.isnan(at), got, at)
    return np.where(np.isnan(at), t["start_ns"].to_numpy(dtype="float64", na_value=np.nan), at)


def _set_links(df: pd.DataFrame, rows: list, ids: list[int], calls: pd.DataFrame) -> None:
    """Link the kernel rows labelled ``rows`` to the log calls ``ids`` (``calls``: the log calls by event id):
    the call's id, library, API, algo and math mode; a backward kernel not split by its name or op (cuDNN's
    FFT, MXNet's ``_backward_FullyConnected`` gemms: direction ``bwd``) takes the direction of its call."""
    if not rows:
        return
    pos = df.index.get_indexer(np.asarray(rows))
    cids = np.asarray(ids, dtype="int64")
    S.set_rows(df, "call_event_id", pos, pd.array(cids, dtype="Int64"))
    c = calls.reindex(cids)
    for col in _CALL_COLS:
        S.set_rows(df, col, pos, pd.array(c[col].astype(object).to_numpy(), dtype=S.STRING))
    unsplit = np.flatnonzero(S.eq(df["direction"].array.take(pos), "bwd"))
    if len(unsplit):
        S.set_rows(df, "direction", pos[unsplit],
                   pd.array(c["direction"].astype(object).to_numpy()[unsplit], dtype=S.STRING))


def link_in_libs_pass(df: pd.DataFrame, trace: pd.DataFrame, base_ns: int, algorithms_shared: bool = True) -> dict:
    """Own the libs trace's kernels by the log calls of ``df``, mark the owning calls' steps, and carry
    the links to ``df``'s own kernels (``carry``). Returns what the summary reports."""
    lk = launches(trace, base_ns, df)
    ow = own(df, lk)
    mark_calls(df, lk, ow)
    tpl = templates(lk, ow.owner)
    info = carry(df, tpl, algorithms_shared)
    owned = ow.owner.notna()
    outside = library_rows(trace, df)  # counted as the timing passes count theirs: outside an op too (no owner)
    outside = outside.loc[outside["op_event_id"].isna(), "kernel_name"].map(short_name)
    unowned = pd.concat([lk.loc[~owned.to_numpy(), "short"], outside])
    if len(outside):
        ow.notes.append(f"{len(outside)} library kernels of the libs trace ran outside any op (a CUDA graph's replays: "
                        f"a replay mode's are owned in its reference step instead); no launching op, not owned here")
    return {
        "libs_trace_library_kernels": len(lk) + len(outside),
        "libs_trace_kernels_owned": int(owned.sum()),
        "libs_trace_kernels_owned_by_time": ow.by_time,
        "libs_trace_kernels_owned_by_order": ow.by_sequence,
        "libs_trace_unowned_top": [{"kernel_name": n, "count": int(c)} for n, c in
                                   unowned.value_counts().head(10).items()],
        "log_clock_offset_ns": ow.clock_offset_ns,
        "libs_pass_notes": ow.notes,
        "carried_kernels_linked": info["linked"],
        "algorithm_differs": info["differs"],
        "reasons": info["reasons"],
    }


REPLAY_UNSPLIT = ("conv2d", "bwd")  # the replayed rows linked here: a convolution backward not split by its name


def link_replayed(df: pd.DataFrame, ref: pd.DataFrame, base_ns: int) -> dict:
    """Replay modes (a CUDA graph replays the step, so no kernel of it is launched inside an op or a call):
    the libs pass profiled one reference step that launches the graph's kernels one by one
    (``rundir.GRAPH_REFERENCE`` in its trace folder, ``ref``), while its library calls were logged. There the
    calls own their kernels as in ``link_in_libs_pass``; each replayed row of ``df``'s traces takes the call
    of its twin, the reference row of the same device name and occurrence in its step
    (``graph_replay.twin_keys``, the pairing that gave it its op).

    Only the rows a signature cannot link are linked so: a convolution backward's kernels that their names
    do not split into data and weight gradient (cuDNN's FFT: ``_trace.refine_direction``). They take their
    call's direction. A kernel whose twin the libs pass's reference step lacks or no logged call owns stays
    unlinked, with the reason (a memset no call owns is the framework's own: left as it is). Returns the
    figures and ``reasons`` (row label -> text)."""
    from .adapters import graph_replay

    lk = launches(ref, base_ns, df, kinds=("kernel", "memset"))
    ow = own(df, lk)
    rdev = graph_replay.reference_rows(ref)
    owner_at = ow.owner.reindex(ref.index[rdev]).to_numpy()
    twin = dict(zip(graph_replay.twin_keys(ref, rdev), owner_at, strict=True))
    calls = S.plain(df[S.eq(df["kind"], "library_call")]).drop_duplicates("event_id").set_index("event_id")
    info = {"replayed_linked": 0, "replayed_unowned": 0, "reasons": {}}
    rows, ids = [], []
    for _src, pos in pd.Series(np.arange(len(df))).groupby(df["source_file"].astype(object).to_numpy(),
                                                            sort=False):
        sub = df.iloc[pos.to_numpy()]
        rep, _ = graph_replay.replayed_rows(sub)
        if not len(rep):
            continue
        it = sub["iteration"].to_numpy(dtype="float64", na_value=np.nan)[rep]
        want = (S.eq(sub["canonical_op"], REPLAY_UNSPLIT[0]) & S.eq(sub["direction"], REPLAY_UNSPLIT[1])
                & sub["call_event_id"].isna().to_numpy())[rep]
        want &= library_kernel_mask(S.plain(sub.iloc[rep]), df)  # not a generated kernel fusing its epilogue
        for g in np.unique(it[~np.isnan(it)]).tolist():
            at = rep[it == g]  # one step's replayed rows, in start order
            for r, key, w in zip(at, graph_replay.twin_keys(sub, at), want[it == g], strict=True):
                if not w:
                    continue
                cid = twin.get(key, pd.NA)
                label = sub.index[r]
                if pd.isna(cid) and key[0] == "memset" and key in twin:
                    continue  # a memset the framework launched outside any library call: no library row
                if pd.isna(cid):
                    info["replayed_unowned"] += 1
                    info["reasons"][label] = ("replayed from a CUDA graph; its twin in the libs pass's reference "
                                              f"step ({key[0]} #{key[1] + 1}) " + ("has no logged call that owns it"
                                              if key in twin else "is not there (that step ran other kernels)"))
                    continue
                rows.append(label)
                ids.append(int(cid))
    _set_links(df, rows, ids, calls)
    info["replayed_linked"] = len(rows)
    info["replay_reference_kernels_owned"] = int(ow.owner.notna().sum())
    return info
