"""XLA profiler traces: ``jax.profiler.trace(dir)``'s Chrome trace,
``plugins/profile/<time>/<host>.trace.json.gz`` (``kernelmap run`` keeps it as ``trace.json.gz``).

Records (``ph: X`` events; metadata, counters and flows are not records):

* GPU (process ``/device:GPU:N``): ``kernel`` per kernel event, ``memcpy``/``memset`` per event
  with ``memcpy_details``/``Memset_details``. ``correlation_id``, ``stream`` (the tid) and the
  grid/block of ``kernel_details`` as the trace gives them.
* CPU (process ``/host:CPU``): each XLA thunk (``args.hlo_op``) is an ``op`` — the CPU backend's
  unit of execution, as a oneDNN primitive or an ATen op is for the other frameworks — timed from its
  start to its completion (``thunk_completion.py``: an asynchronous thunk's traced span is its dispatch
  only); the ``end: <op>`` completion markers are annotations owned by their thunk. A host event with a
  ``correlation_id`` (a CUDA or HIP API call: a launch, even where it also carries the ``hlo_op`` of
  the kernel it launches, as ROCm's do) is ``runtime``, and its kernel, linked to it by that id, takes
  its ``hlo_op`` where the kernel's own event has none; ``kernelmap:step#N`` is ``step``; every other
  host span is an ``annotation``.

**What an XLA op is.** The trace names the HLO op (``hlo_op``, ``hlo_module``), not what it
computes. ``frameworks/jax/capture.py`` writes the optimised HLO text of the module beside the
trace (``<hlo_module>.hlo.txt.gz`` or ``.hlo.txt``, same directory); where it is found, each op
is classified from the JAX name paths (``metadata={op_name=...}``) of the instruction and of
every instruction fused into it (``calls=``), and from its cuDNN/cuBLAS custom-call target.
Without the HLO text, only the path the trace itself carries (``args.name`` on GPU custom calls)
is used; ``df.attrs["hlo_text"]`` says which modules had it.

* kernel -> HLO instruction: ``hlo_op``; inside a CUDA graph (``hlo_op`` ``command_buffer_N``)
  the kernel's own name, which XLA derives from the fusion (``loop_add_fusion_4`` is
  ``loop_add_fusion.4``). A library kernel inside a graph (a cuBLAS gemm, a ``memcpy32_post``
  copy) has no such name: it is the custom-call (for memcpy kernels: copy) instruction scheduled
  between the instructions of the resolved kernels before and after it in the same graph launch,
  taken in schedule order.
* name path -> (canonical op, direction, layer): ``transpose(jvp(...))`` is backward,
  ``jvp(...)`` forward, the ``kernelmap:optimizer`` scope the update (``sgd_update``); the layer is
  the path's ``conv1|conv2|fc1|fc2`` component (Flax module names), ``params['conv2'][...]`` for
  a parameter's layout copy (canonical ``reorder``). The primitive says the op (``_PRIMITIVES``);
  a bias ``add``/``reduce_sum`` in a layer's scope is that layer's op (``bwd_bias`` backward).
* a fusion covering several canonical ops is attributed to ONE of them, the first in
  ``PRIORITY`` (conv2d, linear, max_pool2d, log_softmax, nll_loss, mean, relu, flatten,
  sgd_update, ...), with that op's direction and layer; ``op_name`` is the HLO op name followed by
  all canonical ops it contains, e.g. ``input_reduce_select_fusion.2 [linear+relu]``.
* an instruction with no name path at all (XLA's own zero fills, paddings, argmax recomputation)
  takes the classification of its first user that has one; a ``copy`` without, ``copy``.
* conv/linear backward: cuDNN's ``convBackwardInput`` -> bwd_data, ``convBackwardFilter`` ->
  bwd_weight; otherwise a dot whose operands include the layer's kernel parameter (or its cast:
  ``_from_param``) is bwd_data, and one without it bwd_weight; a CPU convolution whose output has
  the layer's weight dimensions is bwd_weight, else bwd_data.

Library: cuDNN / cuBLAS / cuBLASLt from the custom-call target (``__cudnn$...``,
``__cublas$gemm``, ``__cublas$lt$matmul``); ``native`` for kernels XLA generates itself (loop,
input and Triton gemm fusions, copies); NA for CPU ``ynn_fusion`` (YNNPACK, outside the
vocabulary); where no HLO text is found, the kernel's name (``kernel_libraries``), else NA. ``algo``: cuDNN's ``algo_id`` (``eng<N>``).

Iteration: the last ``kernelmap:step#N`` region that started at or before the event (the host
region covers only the dispatch of the asynchronous step; exact as long as the loop waits for
each step, which the worker does). Phase: from the direction (forward / backward / optimizer).
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import frameworks, schema
from ..errors import ParseError
from ..frameworks.spec import LAYERS
from ..strings import STRING
from . import canonical as C
from . import mathtypes as MT
from . import thunk_completion
from ._common import finish, frame, int64_array, ns_from_us, parse_exact, read_bytes
from .kernel_libraries import library_of

# What the report's self-checks may ask of this source (reports/checks.py reads these):
# an XLA op is a fused kernel or thunk of the compiled program, not one call of a framework op, so its
# count per step is no framework-call count; on the CPU, XLA's thunks run asynchronously and a thunk's
# time, start to completion, includes waiting for a pool thread, so op time is not busy time.
OPS_ARE_FRAMEWORK_CALLS = False
CPU_OP_TIME_IS_BUSY = False
# an asynchronous CPU thunk is timed to its completion (thunk_completion.py), past the thunks its thread ran
# meanwhile: a thunk inside another's traced span (a control-flow thunk's body) says so by its op_event_id
OP_SPANS_MAY_OVERLAP = True
OP_TIME_SAYS = ("each XLA thunk from its start to its completion: an asynchronous one's (a dot on Eigen's pool, a "
                "loop fusion split over the pool, a large copy) includes waiting for a pool thread; "
                "thunk_completion.COMPLETION_RULE")

SOURCE = "xla_trace"
FRAMEWORK = frameworks.of_trace_source(SOURCE).name  # the framework whose profiler writes it
OPTIMIZER_SCOPE = "kernelmap:optimizer"
HLO_SUFFIXES = (".hlo.txt.gz", ".hlo.txt")
PRIORITY = ("conv2d", "linear", "max_pool2d", "log_softmax", "nll_loss", "mean", "relu", "flatten",
            "sgd_update", "reorder", "copy", "fill", "other")
_LAYER_KIND = {x.name: x.kind for x in LAYERS}
_LAYER_DIMS = {x.name: sorted(x.weight_shape) for x in LAYERS}
_PRIMITIVES = {
    "conv_general_dilated": "conv2d", "dot_general": "linear",
    "reduce_window_max": "max_pool2d", "select_and_scatter": "max_pool2d", "select_and_scatter_add": "max_pool2d",
    "reshape": "flatten",
}


# XLA's profiler names its processes /host:CPU and /device:<KIND>:<N> (process_name metadata);
# jax.profiler writes them without whitespace, xprof's trace viewer JSON (and json.dump) with it
_XLA_PROCESS = re.compile(rb'"name"\s*:\s*"/(?:host:CPU|device:[A-Z_]+:\d+)"')
_DEVICE = re.compile(r"^/device:[A-Z_]+:(\d+)$")


def sniff(head: bytes) -> bool:
    return head.lstrip().startswith(b"{") and b'"traceEvents"' in head and _XLA_PROCESS.search(head) is not None


# --- the HLO text ---------------------------------------------------------------------------------
_COMP = re.compile(r"^(ENTRY )?%([\w.\-]+) ")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_OPNAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLS = re.compile(r"\bcalls=%([\w.\-]+)")  # fusion bodies; not to_apply reducers, which XLA shares between ops
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_ALGO = re.compile(r'"algo_id":"(\d+)"')
_OPERANDS = re.compile(r"%([\w.\-]+)")
_SHAPE = re.compile(r"^\(?\w+\[([\d,]*)\]")


@dataclass
class Instr:
    name: str
    opcode: str
    shape: list[int]
    op_name: str | None
    calls: list[str]
    target: str | None
    algo: str | None
    operands: list[str]
    kind: str | None = None  # fusion kind (kLoop, kInput, kCustom)
    users: list[str] = field(default_factory=list)
    bytes: int | None = None  # a collective's (``BYTES_OPCODES``): its result's bytes (``result_bytes``)


def parse_hlo(text: str) -> tuple[list[Instr], dict[str, list[Instr]]]:
    """(entry instructions in schedule order, every computation's instructions by name)."""
    comps: dict[str, list[Instr]] = {}
    entry: str | None = None
    cur: list[Instr] | None = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and line.rstrip().endswith("{"):
            cur = comps.setdefault(m.group(2), [])
            if m.group(1):
                entry = m.group(2)
            continue
        if line.startswith("}"):
            cur = None
            continue
        m = _INSTR.match(line)
        if m is None or cur is None:
            continue
        name, rest = m.group(1), m.group(2)
        sm = _SHAPE.match(rest)
        shape = [int(x) for x in sm.group(1).split(",") if x] if sm else []
        op = re.search(r"\}?\s([\w\-]+)\(", rest)
        opcode = op.group(1) if op else ""
        paren = rest.find(opcode + "(") + len(opcode) + 1 if op else 0
        depth, end = 1, paren
        while end < len(rest) and depth:
            depth += {"(": 1, ")": -1}.get(rest[end], 0)
            end += 1
        on = _OPNAME.search(rest)
        tg = _TARGET.search(rest)
        al = _ALGO.search(rest)
        km = re.search(r"kind=(k\w+)", rest)
        cur.append(Instr(name, opcode, shape, on.group(1).replace("\\'", "'") if on else None,
                         _CALLS.findall(rest), tg.group(1) if tg else None, al.group(1) if al else None,
                         _OPERANDS.findall(rest[paren:end]), km.group(1) if km else None,
                         bytes=result_bytes(rest, opcode) if opcode in BYTES_OPCODES else None))
    if entry is None:
        raise ValueError("no ENTRY computation")
    by_name = {i.name: i for i in comps[entry]}
    for ins in comps[entry]:
        for o in ins.operands:
            if o in by_name:
                by_name[o].users.append(ins.name)
    return comps[entry], comps


@dataclass(frozen=True)
class Label:
    canonical: str
    direction: str
    layer: str | None


def classify_path(path: str) -> Label | None:
    """(canonical op, direction, layer) of one JAX name path (see the module docstring); None for
    a name that is no path: an argument (``images``) or the bare primitive of a reducer
    computation (``reduce_sum``), whose calling instruction carries the path."""
    parts = path.split("/")
    pm = re.match(r"^(?:params|opt_state\[\d+\]\.trace)\['(\w+)'\]", path)
    if pm:
        return Label("reorder", "none", pm.group(1) if pm.group(1) in _LAYER_KIND else None)
    if len(parts) < 2:
        return None
    prim = parts[-1]
    layer = next((p for p in parts if p in _LAYER_KIND), None)
    if OPTIMIZER_SCOPE in parts:
        return Label("sgd_update", "update", layer)
    bwd = "transpose(" in path
    direction = "bwd" if bwd else "fwd" if "jvp(" in path else "none"
    if "log_softmax" in path:
        return Label("log_softmax", direction, "loss")
    if "take_along_axis" in path or prim == "neg" and "CNN" not in path:
        return Label("nll_loss", direction, "loss")
    if layer is not None:
        kind = _LAYER_KIND[layer]
        if bwd and prim == "reduce_sum":
            return Label(kind, "bwd_bias", layer)
        return Label(kind, direction, layer)
    if "jit(relu)" in parts or prim in ("gt", "select_n", "max") and "CNN" in path:
        return Label("relu", direction, None)
    if prim in ("ge", "add") and "CNN" in path:  # max pooling's select_and_scatter: select ge, scatter add
        return Label("max_pool2d", direction, None)
    if prim in _PRIMITIVES:
        return Label(_PRIMITIVES[prim], direction, None)
    if prim in ("reduce_sum", "div", "broadcast_in_dim") and re.search(r"(?:^|/)(?:transpose\()?jvp\(\)\)?$", "/".join(parts[:-1])):
        return Label("mean", direction, "loss")
    return Label("other", direction, None)


_COMPUTE = ("convolution", "dot", "custom-call")


def _paths(ins: Instr, comps: dict[str, list[Instr]], seen: set, compute: list | None = None) -> list[str]:
    """The name paths of ``ins`` and of every instruction fused into it; those of convolution,
    dot and custom-call instructions are also appended to ``compute``."""
    out = [ins.op_name] if ins.op_name else []
    if compute is not None and ins.op_name and ins.opcode in _COMPUTE:
        compute.append(ins.op_name)
    for c in ins.calls:
        if c in seen or c not in comps:
            continue
        seen.add(c)
        for sub in comps[c]:
            out += _paths(sub, comps, seen, compute)
    return out


@dataclass
class OpInfo:
    op_name: str
    canonical: str
    direction: str
    layer: str | None
    library: str | None
    algo: str | None
    position: int
    target: str | None = None  # a custom call's target (``__cudnn$convForward``, ``__cublas$lt$matmul``)
    bytes: int | None = None  # an all-reduce's: the bytes of its result (every tensor it reduces; issue 39)


# XLA's collective instructions (and their async halves: all-reduce-start, all-reduce-done ...)
COLLECTIVE_OPCODES = frozenset(f"{op}{half}" for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                                        "collective-permute", "collective-broadcast")
                               for half in ("", "-start", "-done"))


# bytes per element of HLO's element types (the all-reduce's result); a type not here: no bytes
HLO_TYPE_BYTES = {"f64": 8, "f32": 4, "s64": 8, "u64": 8, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "s16": 2, "u16": 2,
                  "s8": 1, "u8": 1, "pred": 1}
_TYPED = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
# the collectives whose result is the data they move (all-reduce's async start returns its result's shape); the
# others' start returns a tuple of operands and results, their done a result alone: no bytes (not run here)
BYTES_OPCODES = ("all-reduce", "all-reduce-start")


def result_bytes(line: str, opcode: str) -> int | None:
    """The bytes of the result type of an instruction's text (``(f32[32]{0}, f32[3,3,1,32]{...}) all-reduce(...)``:
    the sum over its tensors of elements x element size), None for a type ``HLO_TYPE_BYTES`` lacks."""
    head = line.split(f" {opcode}(", 1)[0]
    total = 0
    for dtype, dims in _TYPED.findall(head):
        if dtype not in HLO_TYPE_BYTES:
            return None
        n = 1
        for d in (int(x) for x in dims.split(",") if x):
            n *= d
        total += n * HLO_TYPE_BYTES[dtype]
    return total


def classify_module(text: str) -> dict[str, OpInfo]:
    """HLO instruction name -> what it computes (see the module docstring)."""
    entry, comps = parse_hlo(text)
    by_name = {i.name: i for i in entry}
    labels: dict[str, tuple[Label, set[str]] | None] = {}
    for ins in entry:
        compute: list[str] = []
        labs = [classify_path(p) for p in dict.fromkeys(_paths(ins, comps, set(), compute))]
        labs = [lb for lb in labs if lb is not None and lb.canonical != "other"
                and not (lb.canonical == "reorder" and ins.opcode == "parameter")]
        if not labs:
            labels[ins.name] = _weight_gradient(ins, comps)
            continue
        cans = {lb.canonical for lb in labs}
        heavy = [lb for lb in map(classify_path, compute) if lb is not None and lb.canonical != "other"]
        own = classify_path(ins.op_name) if ins.op_name else None
        if heavy:  # a convolution or matmul inside: the fusion is that op's
            primary = min(heavy, key=lambda lb: _rank(lb.canonical))
        elif own is not None and own.canonical != "other":
            primary = own
        else:
            primary = min(labs, key=lambda lb: _rank(lb.canonical))
        labels[ins.name] = (_refine(ins, primary, by_name), cans)

    def resolved(name: str, depth: int = 0):
        lab = labels.get(name)
        if lab is not None or depth > 50:
            return lab
        for u in by_name[name].users:
            r = resolved(u, depth + 1)
            if r is not None:
                return r[0], {r[0].canonical}
        return None

    out: dict[str, OpInfo] = {}
    for pos, ins in enumerate(entry):
        lab = resolved(ins.name) if ins.opcode != "copy" or labels[ins.name] else None
        if ins.opcode in COLLECTIVE_OPCODES:  # issue 39: communication, whatever its operands compute
            lab = (Label(C.COLLECTIVE, "none", None), set())
        if lab is None:
            lab = (Label("copy" if ins.opcode == "copy" else "other", "none", None), set())
        label, cans = lab
        cans = cans or {label.canonical}
        name = ins.name if len(cans) == 1 else f"{ins.name} [{'+'.join(sorted(cans, key=_rank))}]"
        out[ins.name] = OpInfo(name, label.canonical, label.direction, label.layer, _library(ins),
                               f"eng{ins.algo}" if ins.algo and (ins.target or "").startswith("__cudnn") else None, pos,
                               ins.target, ins.bytes)
    return out


def _weight_gradient(ins: Instr, comps: dict[str, list[Instr]]) -> tuple[Label, set[str]] | None:
    """A convolution or dot without any name path (XLA CPU drops the metadata of a convolution
    it rewrites for YNNPACK) whose output has exactly one layer's weight dimensions: that layer's
    weight gradient. None otherwise."""
    body = [i for c in ins.calls for i in comps.get(c, [])] + [ins]
    if not any(i.opcode in ("convolution", "dot") for i in body):
        return None
    hits = [name for name, dims in _LAYER_DIMS.items() if sorted(ins.shape) == dims]
    if len(hits) != 1:
        return None
    return Label(_LAYER_KIND[hits[0]], "bwd_weight", hits[0]), {_LAYER_KIND[hits[0]]}


def _rank(c: str) -> int:
    return PRIORITY.index(c) if c in PRIORITY else len(PRIORITY)


def _from_param(name: str, param: str, by_name: dict[str, Instr], hops: int = 4) -> bool:
    """Whether operand ``name`` is the parameter ``param`` or made from it alone: a chain of one-operand
    instructions (convert, bitcast, copy, a one-operand fusion: under a bf16/fp16 policy the dot reads
    ``wrapped_convert.1 = fusion(params__fc1____kernel__.1)``, not the parameter)."""
    for _ in range(hops):
        if name.startswith(param):
            return True
        ins = by_name.get(name)
        if ins is None or len(ins.operands) != 1:
            return False
        name = ins.operands[0]
    return name.startswith(param)


def _refine(ins: Instr, lab: Label, by_name: dict[str, Instr]) -> Label:
    if lab.direction != "bwd" or lab.canonical not in ("conv2d", "linear"):
        return lab
    t = ins.target or ""
    if t.endswith("convBackwardInput"):
        return Label(lab.canonical, "bwd_data", lab.layer)
    if t.endswith("convBackwardFilter"):
        return Label(lab.canonical, "bwd_weight", lab.layer)
    if lab.layer is None:
        return lab
    if lab.canonical == "linear":
        kernel = f"params__{lab.layer}____kernel__"
        uses = any(_from_param(o, kernel, by_name) for o in ins.operands)
        return Label("linear", "bwd_data" if uses else "bwd_weight", lab.layer)
    if "conv" in ins.name or "ynn" in ins.name or ins.opcode in ("convolution", "fusion"):
        same = sorted(ins.shape) == _LAYER_DIMS[lab.layer]
        return Label("conv2d", "bwd_weight" if same else "bwd_data", lab.layer)
    return lab


def _library(ins: Instr) -> str | None:
    t = ins.target or ""
    if t.startswith("__cudnn$"):
        return "cuDNN"
    if t == "__cublas$lt$matmul":
        return "cuBLASLt"
    if t.startswith("__cublas$"):
        return "cuBLAS"
    if ins.name.startswith("ynn_") or ins.opcode == "custom-call":
        return None
    return "native"


def _hlo_modules(path: Path, modules: set[str], maths: dict | None = None) -> dict[str, dict[str, OpInfo]]:
    """Each module's instructions classified; ``maths``, where given, gets each module's library calls' math
    (``mathtypes.hlo_call_math``)."""
    out = {}
    for m in sorted(modules):
        for suffix in HLO_SUFFIXES:
            f = path.parent / f"{m}{suffix}"
            if f.is_file():
                try:
                    raw = f.read_bytes()
                    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
                    out[m] = classify_module(text)
                    if maths is not None:
                        maths[m] = MT.hlo_call_math(text)
                except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError) as exc:
                    raise ParseError(f, f"not a readable HLO module text: {exc}") from None
                break
    return out


# --- the trace ------------------------------------------------------------------------------------
_GRID = re.compile(r"grid:(\d+),(\d+),(\d+) block:(\d+),(\d+),(\d+)")
_KERNEL_SUFFIX = re.compile(r"^(.*)_(\d+)$")


def _complete_events(path: Path) -> tuple[list, dict, dict]:
    """The trace's complete (``ph: X``) events as (index, event, args), and the process and thread
    names its metadata events give (pid -> name, (pid, tid) -> name)."""
    doc = parse_exact(read_bytes(path), path)  # ts/dur with their decimal text: exact nanoseconds
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ParseError(path, "not a Chrome trace: no traceEvents list")
    pname: dict = {}
    tname: dict = {}
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ParseError(path, f"trace event is a {type(e).__name__}, not an object", record=i)
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e.get("pid")] = str((e.get("args") or {}).get("name", ""))
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
    rows = []
    for i, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        name, args = e.get("name"), e.get("args") or {}
        if not isinstance(name, str) or "ts" not in e:
            raise ParseError(path, "complete event without a string name or a ts", record=i)
        if not isinstance(args, dict):
            raise ParseError(path, "args is not an object", record=i)
        rows.append((i, e, args))
    return rows, pname, tname


def read(path: str | os.PathLike) -> pd.DataFrame:
    path = Path(path)
    rows, pname, tname = _complete_events(path)
    idx = [r[0] for r in rows]
    try:
        start = ns_from_us([r[1]["ts"] for r in rows])
        dur = ns_from_us([r[1].get("dur", 0) for r in rows])
    except (TypeError, ValueError) as exc:
        raise ParseError(path, f"non-numeric ts/dur: {exc}") from None
    n = len(rows)
    kind = np.empty(n, dtype=object)
    names = [r[1]["name"] for r in rows]
    dev = np.array([pname.get(r[1].get("pid"), "").startswith("/device:") for r in rows], dtype=bool)
    # a device's activity is on its stream lines ("Stream #14(Compute)"); xprof adds derived lines to
    # the device process ("XLA Modules", "XLA Ops", "Framework Ops", "Framework Name Scope", "Source
    # code", "Steps"...), which repeat that activity grouped otherwise: annotations, not kernels
    derived = np.array([dev[j] and not tname.get((r[1].get("pid"), r[1].get("tid")), "Stream").startswith("Stream")
                        for j, r in enumerate(rows)], dtype=bool)
    dev &= ~derived
    device_index = [_device_index(pname.get(r[1].get("pid"), "")) if dev[j] else None for j, r in enumerate(rows)]
    hlo_op = [r[2].get("hlo_op") for r in rows]
    module = [r[2].get("hlo_module") for r in rows]
    corr = [r[2].get("correlation_id") for r in rows]
    for j, (_, _, a) in enumerate(rows):
        if dev[j]:
            kind[j] = "memcpy" if "memcpy_details" in a else "memset" if "Memset_details" in a else "kernel"
        elif derived[j]:
            kind[j] = "annotation"
        elif corr[j] is not None:  # a launch (ROCm's carry its kernel's hlo_op too): not the op itself
            kind[j] = "runtime"
        elif hlo_op[j] is not None:
            kind[j] = "op"
        elif C.step_number(names[j]) is not None:
            kind[j] = "step"
        else:
            kind[j] = "annotation"
    _inherit_hlo_op(kind, hlo_op, module, corr)
    # asynchronous CPU thunks: timed to their completion, not their dispatch (thunk_completion.py)
    start, dur, owner, completions = thunk_completion.complete(
        kind, names, hlo_op, start, dur, [r[1].get("pid") for r in rows], [r[1].get("tid") for r in rows],
        ~(dev | derived))
    grid = np.full((n, 6), np.nan)
    for j, (_, _, a) in enumerate(rows):
        m = _GRID.search(str(a.get("kernel_details", "")))
        if m:
            grid[j] = [float(x) for x in m.groups()]
    maths: dict[str, dict] = {}
    hlo = _hlo_modules(path, {m for m in module if isinstance(m, str)}, maths)
    resolved = _resolve(kind, names, hlo_op, module, corr, start, hlo)
    info = [hlo.get(module[j], {}).get(resolved[j]) if resolved[j] else None for j in range(n)]
    op_name = [(inf.op_name if inf else hlo_op[j]) if kind[j] in ("op", "kernel", "memcpy", "memset") and
               hlo_op[j] is not None else (None if dev[j] else names[j]) for j, inf in enumerate(info)]
    canon = [inf.canonical if inf else None for inf in info]
    direc = [inf.direction if inf else None for inf in info]
    layer = [inf.layer if inf else None for inf in info]
    # without the HLO text: the name path a GPU custom call carries in args.name
    for j, (_, _, a) in enumerate(rows):
        if info[j] is None and kind[j] in ("op", "kernel") and isinstance(a.get("name"), str) and "/" in a["name"]:
            lab = classify_path(a["name"])
            if lab is not None:
                canon[j], direc[j], layer[j] = lab.canonical, lab.direction, lab.layer
    # a kernel's own custom call says its library; without the HLO text, its name may (kernel_libraries)
    library = [inf.library if inf else library_of(names[j]) if dev[j] else None for j, inf in enumerate(info)]
    cols = {
        "kind": kind,
        "op_name": pd.array(op_name, dtype=STRING),
        "kernel_name": pd.array([names[j] if dev[j] else None for j in range(n)], dtype=STRING),
        "start_ns": start, "dur_ns": dur,
        "op_event_id": pd.array(owner, dtype="Int64"),
        "canonical_op": pd.array(canon, dtype=STRING),
        "direction": pd.array(direc, dtype=STRING),
        "layer": pd.array(layer, dtype=STRING),
        "library": pd.array([lib if kind[j] != "runtime" else None for j, lib in enumerate(library)], dtype=STRING),
        "algo": pd.array([inf.algo if inf else None for inf in info], dtype=STRING),
        # a collective's bytes on its op (the HLO text's result type), not on its kernels (issue 39)
        "bytes": pd.array([inf.bytes if inf and kind[j] == "op" else None for j, inf in enumerate(info)], dtype="Int64"),
        "framework": FRAMEWORK,
        "device": "gpu" if dev.any() else "cpu",
    }
    for col, vals in (("pid", [r[1].get("pid") for r in rows]), ("tid", [r[1].get("tid") for r in rows]),
                      ("correlation_id", corr)):
        cols[col] = int64_array(pd.Series(vals, dtype=object), path, col, idx) if n else pd.array([], dtype="Int64")
    cols["stream"] = pd.array(np.where(dev, cols["tid"], pd.NA), dtype="Int64") if n else pd.array([], dtype="Int64")
    cols["device_index"] = pd.array(device_index, dtype="Int64")
    # the CPU's thunks name their device: where a trace holds several (XLA's host platform devices, one per
    # rank of a sharded step: issue 39), each thunk's rank is its device's; one device: no rank, as before
    ordinal = [_ordinal(r[2]) if kind[j] == "op" and not dev[j] else None for j, r in enumerate(rows)]
    if len({o for o in ordinal if o is not None}) > 1:
        cols["rank"] = pd.array(ordinal, dtype="Int64")
    for k, col in enumerate(("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")):
        cols[col] = int64_array(grid[:, k], path, col, idx) if n else pd.array([], dtype="Int64")
    df = finish(cols, path, SOURCE)
    df.attrs["hlo_text"] = sorted(hlo)
    if completions:
        df.attrs[thunk_completion.SUMMARY_KEY] = completions  # normalise keeps it in attribution.json, per file
    df.attrs["hlo_ops_unresolved"] = int(sum(1 for j in range(n) if hlo_op[j] is not None and info[j] is None))
    _label_steps(df)
    return _with_library_calls(df, [inf.target if inf and inf.library in GPU_LIBRARIES else None for inf in info],
                               resolved, module, path, maths)


GPU_LIBRARIES = ("cuDNN", "cuBLAS", "cuBLASLt")


def _with_library_calls(df: pd.DataFrame, target: list, resolved: list, module: list, path: Path,
                        maths: dict | None = None) -> pd.DataFrame:
    """``df`` with one ``library_call`` row per execution of a library custom call (the HLO
    instruction whose target names cuDNN/cuBLAS/cuBLASLt, run once per step: its device events of one
    iteration), and each of those events linked to it (``call_event_id``; ``library_call`` = the
    target). The call's start and duration are the span of its device events (GPU time, from the
    first kernel's start to the last one's end): XLA traces no host-side library call."""
    it = df["iteration"].to_numpy(dtype=object, na_value=None)
    groups: dict[tuple, list[int]] = {}
    for j, t in enumerate(target):
        if t is not None and df["kind"].iat[j] in ("kernel", "memcpy", "memset"):
            groups.setdefault((module[j], resolved[j], it[j]), []).append(j)
    if not groups:
        return df
    start = df["start_ns"].to_numpy(dtype="int64")
    end = start + df["dur_ns"].to_numpy(dtype="int64")
    keys = sorted(groups, key=lambda g: int(start[groups[g]].min()))
    first = [groups[g][0] for g in keys]
    n = len(df)
    call_ids = np.full(n, -1, dtype="int64")
    for k, g in enumerate(keys):
        call_ids[groups[g]] = n + k
    span0 = np.array([start[groups[g]].min() for g in keys], dtype="int64")
    span1 = np.array([end[groups[g]].max() for g in keys], dtype="int64")
    pick = df.iloc[first]
    cols = {
        "kind": "library_call",
        "op_name": pd.array([g[1] for g in keys], dtype=STRING),
        "library_call": pd.array([target[j] for j in first], dtype=STRING),
        "start_ns": span0, "dur_ns": span1 - span0,
        **{c: pick[c].array for c in ("canonical_op", "direction", "layer", "library", "algo", "iteration", "phase")},
        "framework": FRAMEWORK, "device": "gpu",
    }
    math = [(maths or {}).get(g[0], {}).get(g[1], (None, None)) for g in keys]  # the HLO text's (issue 38)
    cols.update(math_ran=pd.array([m[0] for m in math], dtype=STRING),
                math_dtypes=pd.array([m[1] for m in math], dtype=STRING),
                math_source=pd.array(["hlo" if m[0] or m[1] else None for m in math], dtype=STRING))
    calls = frame(cols, path, SOURCE)
    calls["event_id"] = np.arange(n, n + len(keys), dtype="int64")
    linked = call_ids >= 0
    df["call_event_id"] = pd.array(np.where(linked, call_ids, 0), dtype="Int64")
    df.loc[~linked, "call_event_id"] = pd.NA
    lc = df["library_call"].astype(object).to_numpy(copy=True)  # pandas 3 (copy-on-write) hands out read-only views
    lc[linked] = [target[j] for j in np.flatnonzero(linked)]
    df["library_call"] = pd.array(lc, dtype=STRING)
    attrs = dict(df.attrs)
    out = finish(schema.concat([df, schema.conform(calls, copy=False)]), path, SOURCE)
    out.attrs.update(attrs, library_calls_in_trace=len(keys))
    return out


def _inherit_hlo_op(kind, hlo_op: list, module: list, corr: list) -> None:
    """A device event without ``hlo_op`` takes its launch's (``hlo_op``/``hlo_module`` of the host event
    with its ``correlation_id``: ROCm's launch events carry them), in place."""
    launch = {corr[j]: (hlo_op[j], module[j]) for j in range(len(kind))
              if kind[j] == "runtime" and hlo_op[j] is not None}
    if not launch:
        return
    for j in range(len(kind)):
        if kind[j] in ("kernel", "memcpy", "memset") and hlo_op[j] is None and corr[j] in launch:
            hlo_op[j], module[j] = launch[corr[j]]


def _ordinal(args: dict) -> int | None:
    """A CPU thunk's ``device_ordinal`` (its host platform device), None where it has none."""
    value = args.get("device_ordinal")
    return int(value) if isinstance(value, (int, str)) and str(value).isdigit() else None


def _device_index(process: str) -> int | None:
    m = _DEVICE.match(process)
    return int(m.group(1)) if m else None


def _resolve(kind, names, hlo_op, module, corr, start, hlo) -> list[str | None]:
    """Per row, the HLO instruction it executes (see the module docstring), or None."""
    n = len(kind)
    out: list[str | None] = [None] * n
    graph_rows: dict = {}
    for j in range(n):
        op, mod = hlo_op[j], module[j]
        if op is None or mod not in hlo:
            continue
        table = hlo[mod]
        if op in table:
            out[j] = op
        elif op.startswith("command_buffer"):
            m = _KERNEL_SUFFIX.match(names[j])
            cand = f"{m.group(1)}.{m.group(2)}" if m else names[j]
            out[j] = cand if cand in table else names[j] if names[j] in table else None
            graph_rows.setdefault((mod, corr[j]), []).append(j)
    for (mod, _), js in graph_rows.items():
        table = hlo[mod]
        js.sort(key=lambda j: start[j])
        order = sorted(table.values(), key=lambda x: x.position)
        used: set[str] = {out[j] for j in js if out[j]}
        for k, j in enumerate(js):
            if out[j] is not None:
                continue
            before = next((table[out[i]].position for i in reversed(js[:k]) if out[i]), -1)
            after = next((table[out[i]].position for i in js[k + 1:] if out[i]), len(order))
            want = "copy" if names[j].startswith("memcpy") else "library"
            for inf in order[before + 1:after]:
                key = inf.op_name.split(" ")[0]
                if key in used:
                    continue
                if (want == "copy" and key.startswith("copy")) or (want == "library" and inf.library in ("cuDNN", "cuBLAS", "cuBLASLt")):
                    out[j] = key
                    used.add(key)
                    break
    return out


def _label_steps(df: pd.DataFrame) -> None:
    steps = df[df["kind"].eq("step")]
    nums = steps["op_name"].map(C.step_number).to_numpy(dtype=object)
    st = steps["start_ns"].to_numpy(dtype="int64")
    start = df["start_ns"].to_numpy(dtype="int64", na_value=0)
    order = np.argsort(st, kind="stable")
    pos = np.searchsorted(st[order], start, side="right") - 1
    it = np.where(pos >= 0, nums[order][np.maximum(pos, 0)] if len(st) else None, None)
    df["iteration"] = pd.array(list(it) if len(st) else [None] * len(df), dtype="Int64")
    df["phase"] = C.phase_from_direction(df["direction"], df["canonical_op"])

