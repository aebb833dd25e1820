"""MXNet's AMP started on the operators this MXNet has.

``amp.init`` wraps every operator its lists name (``mxnet/contrib/amp/lists/symbol_{fp16,bf16}.py``) in both
``mx.symbol`` and ``mx.nd``, and raises AttributeError on the first one the module lacks. kernelmap's sm_90
tree (``kernelmap build-mxnet``, patches 0005/0006) leaves legacy and contrib operators out
(``build.EXCLUDED_SOURCES``: Convolution_v1, Pooling_v1, ...; ``EXCLUDED_SOURCE_DIRS``), so ``amp.init`` failed
there on ``Convolution_v1`` (seen on the H200s). ``start`` gives ``amp.init`` its lists pruned to the names
that resolve in both modules, resolved as ``amp.init`` resolves them, and returns the names it dropped, per
list, for the caller to say (never silently). An MXNet that has every operator gets its lists unchanged.

No mxnet import here: the caller passes its loaded modules (the workload loads mxnet after its preload).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# the lists amp.init reads, by the name this module reports them under (the first three are amp.init's own
# keyword arguments; the widest-type-cast list has none and is pruned in place while amp.init runs)
TARGET_OPS, FP32_OPS, CONDITIONAL_OPS, WIDEST_OPS = (
    "target_precision_ops", "fp32_ops", "conditional_fp32_ops", "widest_type_casts")


def _resolves(impl, module, submodules: dict[str, Any], name: str) -> bool:
    try:
        fun_name, owner = impl._get_fun_to_wrap(name, module, submodules)
        getattr(owner, fun_name)
    except (AttributeError, KeyError):
        return False
    return True


def _present(mx, impl) -> Any:
    """A test of an operator name: whether ``amp.init`` finds it in both ``mx.symbol`` and ``mx.nd``."""
    modules = []
    for module in (mx.symbol, mx.ndarray):
        subs = {prefix: getattr(module, prefix[1:-1], None) for prefix in mx.base._OP_NAME_PREFIX_LIST}
        modules.append((module, subs))
    return lambda name: all(_resolves(impl, module, subs, name) for module, subs in modules)


def amp_dtype(impl, target_dtype: str) -> Any:
    """``target_dtype`` as AMP's list functions take it (bfloat16 is AMP's own numpy dtype)."""
    return impl.bfloat16 if target_dtype == "bfloat16" else target_dtype


def pruned_lists(mx, impl, target_dtype: str) -> tuple[dict[str, list], dict[str, list[str]]]:
    """AMP's four operator lists at ``target_dtype`` less the names this MXNet lacks, and those names per list."""
    dtype, present = amp_dtype(impl, target_dtype), _present(mx, impl)
    lists = {TARGET_OPS: list(impl.list_lp16_ops(dtype)), FP32_OPS: list(impl.list_fp32_ops(dtype)),
             CONDITIONAL_OPS: list(impl.list_conditional_fp32_ops(dtype)),
             WIDEST_OPS: list(impl.list_widest_type_cast(dtype))}
    kept, dropped = {}, {}
    for key, entries in lists.items():
        names = [e[0] if isinstance(e, tuple) else e for e in entries]
        ok = [present(n) for n in names]  # each name looked up once
        kept[key] = [e for e, here in zip(entries, ok, strict=True) if here]
        gone = [n for n, here in zip(names, ok, strict=True) if not here]
        if gone:
            dropped[key] = gone
    return kept, dropped


@contextlib.contextmanager
def _widest_as(impl, dtype, kept: list) -> Iterator[None]:
    """AMP's widest-type-cast list (the object amp.init reads) holding ``kept`` only, restored afterwards."""
    target = impl.list_widest_type_cast(dtype)
    whole = list(target)
    target[:] = kept
    try:
        yield
    finally:
        target[:] = whole


def start(mx, amp, target_dtype: str) -> dict[str, list[str]]:
    """``amp.init(target_dtype)`` on the operators this MXNet has; the operator names left out, per list
    (empty where the build has them all). ``amp`` is ``mxnet.contrib.amp``."""
    impl = amp.amp  # the module that holds amp.init's lists and its name resolution
    kept, dropped = pruned_lists(mx, impl, target_dtype)
    with _widest_as(impl, amp_dtype(impl, target_dtype), kept[WIDEST_OPS]):
        amp.init(target_dtype=target_dtype, target_precision_ops=kept[TARGET_OPS], fp32_ops=kept[FP32_OPS],
                 conditional_fp32_ops=kept[CONDITIONAL_OPS])
    return dropped


def dropped_line(dropped: dict[str, list[str]]) -> str:
    """One line naming what ``start`` left out of AMP's lists (for the worker's log)."""
    total = sum(len(v) for v in dropped.values())
    parts = "; ".join(f"{key}: {', '.join(names)}" for key, names in dropped.items())
    return f"mxnet amp: {total} operators of AMP's lists are not in this MXNet, left out of amp.init ({parts})"
