"""Communication records of a multi-device case (issue 39): each collective, and each of the KVStore's
copies and sums, as communication (canonical op ``collective``), linked to the framework op that issued it,
with its bytes where the trace gives its sizes. Applied by ``normalise`` to the records of each case.

What is communication, per trace (the adapters label it; here only what needs the case's records whole):

- **PyTorch** (Kineto): ``c10d::allreduce_``/``c10d::broadcast_`` ops (the issuing op, on the thread that ran
  DDP's gradient hook) and the collective's work: on the CPU gloo's ``gloo:all_reduce`` span on a gloo
  thread, on the GPU the NCCL kernels (linked to their launching op by the adapter). A work span has no
  parent op in the trace (another thread); ``link`` links the n-th work span of a collective (all_reduce,
  broadcast, ...) to the n-th issuing op of that collective in the same trace (a rank's), in start order, where
  the counts agree and each work span starts after its op and holds the same number of elements (else it stays
  unlinked, and the report's self-check says so).
- **MXNet** (its profiler): ``KVStoreReduce`` (the KVStore's sum, its vocabulary's ``collective_prefixes``) and
  the copies its push and pull make between contexts: copy operators (the vocabulary's ``collective_copies``)
  in the optimizer phase of a case on more than one device (``Trainer.step``: the batch's copies to the
  contexts run before, in the data and forward phases). Each is an MXNet operator: the op that issued it.
- **JAX** (XLA's trace): the ``all-reduce`` HLO instructions (the adapter: canonical op ``collective``), the op
  itself; on the GPU its NCCL kernels carry the instruction.

An NCCL kernel's ``algo``: its algorithm and protocol where its name says them (``nccl_algorithm``).

``bytes`` of a collective op or work span: its elements (the trace's ``Input Dims``) times 4, the gradients'
float32 (the parameters' dtype at every math: mixed precision keeps fp32 master weights). XLA's trace gives no
sizes: its adapter reads each all-reduce's bytes from the HLO text's result type (``xla_trace.result_bytes``).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from . import frameworks
from . import strings as S
from .adapters import NCCL_LOG  # noqa: F401  each rank's NCCL log (run/devices.libs_env, the report's tables)
from .adapters.canonical import COLLECTIVE, is_collective_kernel

GRADIENT_BYTES = 4  # float32 gradients
OPTIMIZER_PHASE = "optimizer"
_VERB = re.compile(r"[^a-z]")


def verb(op_name: str) -> str:
    """The collective an op or work span names, spelling aside: ``c10d::allreduce_``, ``gloo:all_reduce`` and
    ``nccl:all_reduce`` are all ``allreduce``."""
    name = str(op_name).rsplit(":", 1)[-1].lower()
    return _VERB.sub("", name)


def elements(shapes) -> int | None:
    """Elements of a collective's tensors from the ``shapes`` JSON (``[[402826]]``, a list of lists), or None."""
    if not isinstance(shapes, str) or not shapes:
        return None
    try:
        dims = json.loads(shapes)
    except ValueError:
        return None

    def walk(x) -> int:
        if isinstance(x, list) and x and all(isinstance(v, int) for v in x):
            return int(np.prod(x))
        return sum(walk(v) for v in x) if isinstance(x, list) else 0

    n = walk(dims[:1]) if isinstance(dims, list) else 0
    return n or None


# NCCL's kernels name their algorithm and protocol where NCCL compiled a kernel for them: 2.19 and later
# ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` (collective, reduction, type, algorithm, protocol), before
# ``ncclKernel_AllReduce_RING_LL_Sum_float(...)``; a generic kernel (``ncclDevKernel_Generic``: NCCL runs its other
# algorithm x protocol pairs there) names none
_NCCL_ALGOS = r"RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT"
_NCCL_NEW = re.compile(rf"^ncclDevKernel_[A-Za-z]+_[A-Za-z]+_\w+?_({_NCCL_ALGOS})_(LL128|LL|SIMPLE)\b")
_NCCL_OLD = re.compile(rf"^ncclKernel_[A-Za-z]+_({_NCCL_ALGOS})_(LL128|LL|SIMPLE)_")


def nccl_algorithm(kernel_name: str) -> str | None:
    """``"<algorithm> <protocol>"`` (``RING LL``) an NCCL kernel's name says, else None (see above)."""
    name = str(kernel_name)
    m = _NCCL_NEW.match(name) or _NCCL_OLD.match(name)
    return f"{m.group(1)} {m.group(2)}" if m else None


# --- NCCL's own log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL,TUNING; the libs pass of a multi-GPU case) ---------
NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,TUNING"}  # + NCCL_DEBUG_FILE, the log's path
# ncclDataType_t (nccl.h): ncclInt8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
# Float8e4m3, Float8e5m2: bytes per element
NCCL_TYPE_BYTES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
NCCL_ALGO_NAMES = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")  # older logs: numbers
NCCL_PROTO_NAMES = ("LL", "LL128", "SIMPLE")
NCCL_LOG_COLUMNS = ["line", "pid", "tid", "cuda_device", "func", "op_count", "count", "datatype", "bytes", "nranks",
                    "comm", "stream", "algorithm"]
# enqueue.cc, every rank: "<host>:<pid>:<tid> [<dev>] NCCL INFO AllReduce: opCount 1 sendbuff 0x.. recvbuff 0x.. count
# 402826 datatype 7 op 0 root 0 comm 0x.. [nranks=2] stream 0x.."; rank 0 after it (TUNING, NCCL 2.19+): "AllReduce:
# 1611304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}", before: "1611304 Bytes -> Algo 1 proto 2 time 12.3"
_NCCL_COLL = re.compile(r"(?:^|\s)\S*?:(\d+):(\d+) \[(\d+)\] NCCL INFO (\w+): opCount ([0-9a-fA-F]+) .*?\bcount (\d+) "
                        r"datatype (\d+) .*?\bcomm (\S+) \[nranks=(\d+)\](?: stream (\S+))?")
_NCCL_TUNE = re.compile(r"NCCL INFO (?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)")


def _named(value: str, names: tuple[str, ...]) -> str:
    return names[int(value)] if value.isdigit() and int(value) < len(names) else value.upper()


def read_nccl_log(path) -> pd.DataFrame:
    """``NCCL_LOG_COLUMNS``: one row per collective NCCL logged (COLL), in the log's order: its bytes (count x the
    datatype's size), communicator, stream, and the algorithm and protocol of the TUNING line that follows it in the
    same process and thread (rank 0 logs them; NA elsewhere: every rank of a communicator runs the same pair). A line
    that starts like one but does not parse: ``ParseError`` naming the file and the line."""
    from .errors import ParseError

    rows: list[dict] = []
    last: dict[tuple[str, str], dict] = {}
    with open(path, errors="replace") as fh:
        for i, line in enumerate(fh, 1):
            if "NCCL INFO" not in line:
                continue
            m = _NCCL_COLL.search(line)
            if m:
                pid, tid, dev, func, op, count, dtype, comm, nranks, stream = m.groups()
                size = NCCL_TYPE_BYTES[int(dtype)] if int(dtype) < len(NCCL_TYPE_BYTES) else None
                row = {"line": i, "pid": int(pid), "tid": int(tid), "cuda_device": int(dev), "func": func,
                       "op_count": int(op, 16), "count": int(count), "datatype": int(dtype),
                       "bytes": None if size is None else int(count) * size, "nranks": int(nranks), "comm": comm,
                       "stream": stream, "algorithm": None}
                rows.append(row)
                last[(pid, tid)] = row
                continue
            t = _NCCL_TUNE.search(line)
            if t:
                key = tuple(line.split(" [", 1)[0].rsplit(":", 2)[-2:])
                row = last.get(key)
                if row is None or row["algorithm"] is not None or (row["bytes"] is not None
                                                                   and row["bytes"] != int(t.group(2))):
                    continue  # a tuning line of no logged collective (another thread's, or COLL off)
                row["algorithm"] = f"{_named(t.group(3), NCCL_ALGO_NAMES)} {_named(t.group(4), NCCL_PROTO_NAMES)}"
            elif " opCount " in line:
                raise ParseError(path, f"line {i}: an NCCL collective line that does not parse: {line.strip()[:200]}")
    out = pd.DataFrame(rows, columns=NCCL_LOG_COLUMNS)
    for c in ("pid", "tid", "cuda_device", "op_count", "count", "datatype", "bytes", "nranks"):
        out[c] = out[c].astype("Int64")
    return out


def _copies() -> set[tuple[str, str]]:
    """(framework, op name) of every framework's KVStore copies (its vocabulary's ``collective_copies``)."""
    return {(name, c) for name, d in frameworks.REGISTRY.items()
            if d.vocabulary is not None for c in d.vocabulary.collective_copies}


def mark_copies(df: pd.DataFrame) -> pd.DataFrame:
    """The KVStore's copies of a case on more than one device, canonical op ``collective`` (see the docstring)."""
    copies = _copies()
    if not copies or df.empty or "devices" not in df:
        return df
    cand = (df["devices"].fillna(1) > 1).to_numpy()  # a case on one device has none: no string looked at
    if cand.any():
        # a new array: to_numpy() may hand out pandas' own, read-only under copy-on-write (pandas 3's default)
        cand = cand & (S.eq(df["kind"], "op") & S.eq(df["phase"], OPTIMIZER_PHASE)
                       & S.isin(df["op_name"], {c for _, c in copies}))
    rows = np.flatnonzero(cand)
    if not len(rows):
        return df
    key = zip(S.objects(df["framework"])[rows], S.objects(df["op_name"])[rows], strict=True)
    hit = np.zeros(len(df), dtype=bool)
    hit[rows[np.array([k in copies for k in key], dtype=bool)]] = True
    if hit.any():
        df.loc[hit, "canonical_op"] = COLLECTIVE
        df.loc[hit, "direction"] = "none"
    return df


def _by_name(col, rows: np.ndarray, judge) -> np.ndarray:
    """``judge(name)`` of each of ``rows``' names in ``col`` (None where NA), asked once per distinct name."""
    codes, uniques = S.factorize(col)
    codes = codes[rows]
    table = np.full(len(uniques) + 1, None, dtype=object)  # code -1 (NA): the last
    for c in np.unique(codes[codes >= 0]):
        table[c] = judge(str(uniques[c]))
    return table[codes]


def link(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (one case's records) with its communication labelled and linked (see the docstring): the
    KVStore's copies marked, each collective work span's ``op_event_id`` its issuing op's, ``bytes`` filled on
    collective ops and work spans from their sizes. The rows and their order are kept. Each distinct kernel name
    is judged once; a case without a collective row stops after the NCCL kernels' names."""
    if df.empty:
        return df
    df = mark_copies(df)
    if "algo" in df and "kernel_name" in df:  # an NCCL kernel's algorithm and protocol, where its name says them
        kern = np.flatnonzero(S.eq(df["kind"], "kernel") & S.isna(df["algo"]))
        said = _by_name(df["kernel_name"], kern, nccl_algorithm)
        hit = np.array([x is not None for x in said], dtype=bool)
        if hit.any():
            mask = np.zeros(len(df), dtype=bool)
            mask[kern[hit]] = True
            df.loc[mask, "algo"] = said[hit]
    coll = S.eq(df["canonical_op"], COLLECTIVE)
    if not coll.any():
        return df
    n = pd.Series(pd.NA, index=df.index, dtype="Int64")
    pos = np.flatnonzero(coll)
    n.iloc[pos] = pd.array([elements(s) for s in df["shapes"].to_numpy(dtype=object)[pos]], dtype="Int64")
    fill = coll & df["bytes"].isna().to_numpy() & n.notna().to_numpy()
    df.loc[fill, "bytes"] = (n[fill] * GRADIENT_BYTES).astype("Int64")
    # one trace is one rank's: its file name alone is not (every rank's folder holds a trace.json.gz)
    trace = ["source_file", "rank"] if "rank" in df else ["source_file"]
    cols = [*trace, "kind", "op_name", "event_id", "op_event_id", "start_ns"]  # what _link_work reads
    for _, g in df.loc[coll, cols].groupby(trace, sort=False, dropna=False):
        _link_work(df, g, n)
    return df


def _link_work(df: pd.DataFrame, g: pd.DataFrame, n: pd.Series) -> None:
    """In one trace (a rank's), each collective's work spans (annotations) to its issuing ops, in order."""
    ops = g[(g["kind"] == "op").fillna(False)]
    work = g[(g["kind"] == "annotation").fillna(False) & g["op_event_id"].isna()]
    if ops.empty or work.empty:
        return
    for v, w in work.groupby(work["op_name"].map(verb), sort=False):
        o = ops[ops["op_name"].map(verb) == v].sort_values("start_ns", kind="stable")
        w = w.sort_values("start_ns", kind="stable")
        if len(o) != len(w):
            continue  # counts differ: unlinked, said by the report's self-check
        ok = (w["start_ns"].to_numpy() >= o["start_ns"].to_numpy()) & np.array(
            [a == b for a, b in zip(n[w.index], n[o.index], strict=True)], dtype=bool)
        if ok.all():
            df.loc[w.index, "op_event_id"] = o["event_id"].to_numpy()


def is_communication(df: pd.DataFrame) -> np.ndarray:
    """Rows that are communication: canonical op ``collective`` (ops, work spans, kernels), and collective
    kernels by name (NCCL's) whatever op they were attributed to (each distinct name judged once)."""
    by_name = S.eq(df["kind"], "kernel") & S.matches(df["kernel_name"], lambda k: is_collective_kernel(str(k)))
    return S.eq(df["canonical_op"], COLLECTIVE) | by_name
