"""Kernel attribution in the modes that replay CUDA graphs, on the real H200 run of
tests/data/gpu_replay_modes_run (records as normalised there, before ``aten::_foreach_copy_`` had a rule).

In that run, compile-graphs left 0.65% of its kernel time without a canonical op: one
``multi_tensor_apply_kernel`` per step in the backward phase, under ``aten::_foreach_copy_`` (the CUDA-graph
trees copying a replayed graph's non-static inputs into its static buffers). Every other kernel of both
modes had one. The op names are mapped again here with today's vocabulary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernelmap.adapters import canonical

RUN = Path(__file__).parent / "data" / "gpu_replay_modes_run"


def _unattributed_with_op() -> pd.DataFrame:
    """Kernels the run left without a canonical op (NA or "other"), with the name of the op that launched
    them (same framework and source)."""
    r = pd.read_parquet(RUN / "records.parquet")
    k = r[r["kind"] == "kernel"]
    k = k[k["canonical_op"].isna() | (k["canonical_op"] == "other")]
    ops = r[r["kind"] == "op"][["framework", "source", "event_id", "op_name"]]
    return k.merge(ops, left_on=["framework", "source", "op_event_id"],
                   right_on=["framework", "source", "event_id"], how="left", suffixes=("", "_launch"))


def test_the_run_left_one_foreach_copy_kernel_per_step_unattributed():
    un = _unattributed_with_op()
    # exact, from the fixture: 20 profiled steps, one kernel each, in both of compile-graphs' traces
    counts = un.groupby(["framework", "source"], observed=True).size().to_dict()
    assert counts == {("pytorch-compile-graphs", "kineto"): 20, ("pytorch-compile-graphs", "nsys"): 20}
    assert set(un["op_name_launch"]) == {"aten::_foreach_copy_"}
    assert un["kernel_name"].str.contains("multi_tensor_apply_kernel").all()
    assert (un["phase"] == "backward").all()


def test_every_op_that_launched_an_unattributed_kernel_now_has_a_rule():
    un = _unattributed_with_op()
    assert un["op_name_launch"].notna().all()  # every one was launched by an op the trace records
    for name in set(un["op_name_launch"]):
        mapped = canonical.lookup(name, "pytorch")
        assert mapped is not None and mapped[0] != "other", name
    assert canonical.lookup("aten::_foreach_copy_", "pytorch") == ("copy", "none")
