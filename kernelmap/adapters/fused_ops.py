"""A framework's fused ops, attributed to the ops they fuse, from their kernels' names.

A framework that fuses elementwise operators at run time records one op for the chain (MXNet's pointwise fusion,
hybridized on the GPU: ``_FusedOp``), whose generated kernel names what it fuses: the vocabulary's ``fused_ops``
maps the op's name to its kernels' prefix (``FusedKernel_``), after which each fused operator's name follows with a
``_`` (``FusedKernel_Activation_amp_cast_``: fc1's ReLU and AMP's cast of fc2's input, MXNet fp16 on the 4x H200;
``FusedKernel__backward_amp_cast__backward_Activation_`` in the backward). The names are read against the
vocabulary's op names, the longest first; a kernel with a name it does not know leaves its op as it was.

The fused op and its kernels take ONE canonical op and direction: the one model op (a direction other than
``none``) among those fused, the AMP casts (``copy``, ``none``) being plumbing; where it fuses none or several
different ones, none is picked and the op stays as its name maps (``other``). Without this a fused ReLU was no
ReLU call (the 4x H200 MXNet hybridized fp16 run: "calls per step: relu fwd: expected 3, measured 2"). ``op_name``
keeps the trace's name (``_FusedOp``); what it fused is its kernel's name. A trace without kernel names (MXNet's
own profiler) cannot say what its ``_FusedOp`` fused: it stays ``other`` there.

Not shared with ``inductor.fused_ops`` (Inductor's kernel names): the grammars differ; here a name is the
vocabulary's prefix then known op names each closed by ``_``, and one unknown part leaves the kernel unread, where
Inductor's is ``(triton|cpp)_<kind>_fused_<ops>_<index>`` whose known ATen words are picked out of ``<ops>`` and
the rest (``with``, ``default``, numbers) skipped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import strings as S
from .canonical import VOCABULARIES


def fused_names(kernel_name: str, prefix: str, known) -> list[str] | None:
    """The operator names a fused op's kernel name holds, in order; None where it has not the prefix or a part
    is not one of ``known`` (the vocabulary's op names)."""
    if not isinstance(kernel_name, str):
        return None
    head = kernel_name.split("(", 1)[0].strip()
    head = head[5:] if head.startswith("void ") else head
    if not head.startswith(prefix):
        return None
    rest, out = head[len(prefix):], []
    names = sorted(known, key=len, reverse=True)
    while rest:
        name = next((n for n in names if rest.startswith(n + "_")), None)
        if name is None:
            return None
        out.append(name)
        rest = rest[len(name) + 1:]
    return out or None


def model_op(parts: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The one (canonical op, direction) of ``parts`` whose direction is not ``none``; None where none or several."""
    work = set(p for p in parts if p[1] != "none")
    return work.pop() if len(work) == 1 else None


def attribute(df: pd.DataFrame, framework: str) -> int:
    """Give each fused op of ``df`` (one trace's records, ``framework``'s) and its kernels the model op it fuses,
    in place (module docstring); the number of fused ops set."""
    vocab = VOCABULARIES.get(framework)
    if vocab is None or not vocab.fused_ops or not len(df):
        return 0
    ops = np.flatnonzero(S.eq(df["kind"], "op") & S.isin(df["op_name"], list(vocab.fused_ops)))
    if not len(ops):
        return 0
    kern = np.flatnonzero(S.eq(df["kind"], "kernel") & df["op_event_id"].notna().to_numpy())
    owner = df["op_event_id"].to_numpy(dtype="float64", na_value=np.nan)[kern]
    ids = df["event_id"].to_numpy(dtype="float64", na_value=np.nan)
    names = S.objects(df["kernel_name"])
    op_names = S.objects(df["op_name"])
    kernels_of: dict[float, list[int]] = {}
    wanted = set(ids[ops].tolist())
    for row, o in zip(kern.tolist(), owner.tolist(), strict=True):
        if o in wanted:
            kernels_of.setdefault(o, []).append(row)
    rows, canon, direc, n_ops = [], [], [], 0
    for row in ops.tolist():
        mine = kernels_of.get(ids[row], [])
        prefix = vocab.fused_ops[op_names[row]]
        picked = set()
        for k in mine:
            parts = fused_names(names[k], prefix, vocab.ops)
            picked.add(None if parts is None else model_op([vocab.lookup(n) or ("other", "none") for n in parts]))
        if len(picked) != 1 or None in picked:  # no kernel, a name not read, or no single model op
            continue
        c, d = picked.pop()
        n_ops += 1
        rows += [row, *mine]
        canon += [c] * (1 + len(mine))
        direc += [d] * (1 + len(mine))
    if rows:
        at = np.array(rows, dtype=np.int64)
        S.set_rows(df, "canonical_op", at, canon)
        S.set_rows(df, "direction", at, direc)
    return n_ops
