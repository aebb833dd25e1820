"""The stages of the trace labeller (kernelmap/adapters/_trace.py ``label``), each on its own: what
it fills, row by row, on one small PyTorch-shaped trace whose every answer is worked out by hand
below. The whole labeller on the real traces is tests/test_records_identity.py's (digests of every
fixture's records).

The trace, one training step (``ProfilerStep#3``, 0-1000 ns) on host thread 1, kernels on stream 99:

    row kind        name                    start  dur   notes
    0   step        ProfilerStep#3              0  1000
    1   annotation  kernelmap:forward           0   380  phase region
    2   op          aten::conv2d               10   290  conv1's weight shape (dims), seq 5
    3   op          aten::convolution          20   270  inside 2
    4   runtime     cudaLaunchKernel           30    10  inside 3, correlation 7
    5   kernel      implicit_gemm_fprop       500   100  correlation 7 (launched by 4)
    6   annotation  kernelmap:backward        400   500  phase region
    7   op          ConvolutionBackward0      410   390  seq 5 (conv2d's autograd node)
    8   op          aten::foo                 850    20  no canonical op, outside every mapped op
    9   kernel      ncclDevKernel_AllReduce   950    10  no launch
    10  op          aten::nll_loss            385    10  between the two regions
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernelmap.adapters import _trace as T

NA = None
ROWS = [  # kind, op_name, start, dur, tid, correlation, seq, kernel_name
    ("step", "ProfilerStep#3", 0, 1000, 1, NA, NA, NA),
    ("annotation", "kernelmap:forward", 0, 380, 1, NA, NA, NA),
    ("op", "aten::conv2d", 10, 290, 1, NA, 5, NA),
    ("op", "aten::convolution", 20, 270, 1, NA, NA, NA),
    ("runtime", "cudaLaunchKernel", 30, 10, 1, 7, NA, NA),
    ("kernel", NA, 500, 100, 99, 7, NA, "implicit_gemm_fprop"),
    ("annotation", "kernelmap:backward", 400, 500, 1, NA, NA, NA),
    ("op", "ConvolutionBackward0", 410, 390, 1, NA, 5, NA),
    ("op", "aten::foo", 850, 20, 1, NA, NA, NA),
    ("kernel", NA, 950, 10, 99, NA, NA, "ncclDevKernel_AllReduce"),
    ("op", "aten::nll_loss", 385, 10, 1, NA, NA, NA),
]
CONV1_DIMS = [[64, 1, 28, 28], [32, 1, 3, 3], [32], [], []]  # conv1's weight: (32, 1, 3, 3)
DIMS = [CONV1_DIMS if i == 2 else None for i in range(len(ROWS))]


def _frame(rows: list = ROWS) -> pd.DataFrame:
    cols = list(zip(*rows, strict=True))
    return pd.DataFrame({
        "kind": pd.array(cols[0], dtype="string"), "op_name": pd.array(cols[1], dtype="string"),
        "start_ns": pd.array(cols[2], dtype="Int64"), "dur_ns": pd.array(cols[3], dtype="Int64"),
        "tid": pd.array(cols[4], dtype="Int64"), "correlation_id": pd.array(cols[5], dtype="Int64"),
        "seq": pd.array(cols[6], dtype="Int64"), "kernel_name": pd.array(cols[7], dtype="string"),
        "event_id": np.arange(len(rows), dtype="int64")})


STAGES = ("find_regions", "nest_host_spans", "label_ops", "label_layers", "label_steps",
          "inherit_from_launches", "write_labels")


def _upto(stage: str, framework: str = "pytorch", on_device=None, rows: list = ROWS,
          dims: list = DIMS) -> T.LabelRows:
    """The rows after every stage before ``stage`` (``stage`` itself not run)."""
    r = T.label_inputs(_frame(rows), framework)
    for s in STAGES[:STAGES.index(stage)]:
        if s == "find_regions":
            T.find_regions(r, on_device)
        elif s in ("label_layers", "label_steps"):
            getattr(T, s)(r, dims)
        else:
            getattr(T, s)(r)
    return r


def _strings(vocab, codes) -> list:
    return [None if c < 0 else vocab.values[c] for c in np.asarray(codes).tolist()]


def test_label_inputs_adds_what_the_frame_lacks():
    df = _frame().drop(columns=["seq", "library"], errors="ignore")
    df.loc[3, "start_ns"] = pd.NA
    r = T.label_inputs(df, "pytorch")
    assert df["seq"].isna().all() and str(df["seq"].dtype) == "Int64" and "library" in df
    assert r.start.tolist() == [0, 0, 10, 0, 30, 500, 400, 410, 850, 950, 385]  # NA start: 0
    assert r.is_kind("op").nonzero()[0].tolist() == [2, 3, 7, 8, 10]
    assert [r.name_u[c] if c >= 0 else None for c in r.name_codes.tolist()] == [row[1] for row in ROWS]


def test_find_regions():
    r = _upto("find_regions")
    T.find_regions(r, None)
    assert r.rmask.nonzero()[0].tolist() == [1, 6] and r.smask.nonzero()[0].tolist() == [0]
    assert r.hidx.tolist() == [2, 3, 4, 7, 8, 10]  # host spans: no region, step or device row
    assert _strings(r.phases, r.ph_u[r.name_codes[[1, 6]]]) == ["forward", "backward"]
    assert r.st_u[r.name_codes[0]] == 3
    # an annotation on the device's clock is no region and no host span
    r = _upto("find_regions")
    T.find_regions(r, np.arange(len(ROWS)) == 6)
    assert r.rmask.nonzero()[0].tolist() == [1] and r.dev_ann.nonzero()[0].tolist() == [6]
    assert r.hidx.tolist() == [2, 3, 4, 7, 8, 10]


def test_nest_host_spans():
    r = _upto("nest_host_spans")
    T.nest_host_spans(r)
    # the outermost mapped span above each host span (itself included), and its nearest enclosing op
    assert r.top.tolist() == [-1, -1, 2, 2, 2, -1, -1, 7, -1, -1, 10]
    assert r.inner_op.tolist() == [-1, -1, -1, 2, 3, -1, -1, -1, -1, -1, -1]
    assert _strings(r.canon, r.canon_a) == [None, None, "conv2d", "conv2d", None, None, None, "conv2d", None, None,
                                            "nll_loss"]
    assert r.coll_rows is None and r.recomputed is None


def test_label_ops():
    r = _upto("label_ops")
    T.label_ops(r)
    assert _strings(r.canon, r.out_canon) == [None, None, "conv2d", "conv2d", "conv2d", None, None, "conv2d", "other",
                                              None, "nll_loss"]
    assert _strings(r.direc, r.out_dir) == [None, None, "fwd", "fwd", "fwd", None, None, "bwd", "none", None, "fwd"]
    assert (r.ph_canon == r.out_canon).all() and not r.recompute.any()


def test_label_layers_by_weight_tree_and_seq():
    r = _upto("label_layers")
    T.label_layers(r, DIMS)
    # conv2d names conv1 by its weight; its tree (3, 4) takes it; the backward node (7) through seq 5;
    # the loss op is "loss"
    assert _strings(r.layer_v, r.layer) == [None, None, "conv1", "conv1", "conv1", None, None, "conv1", None, None,
                                            "loss"]
    r = _upto("label_layers")
    T.label_layers(r, None)  # no shapes: no layer by weight, none through seq either
    assert _strings(r.layer_v, r.layer) == [None] * 10 + ["loss"]


def test_layers_through_seq_takes_the_forward_ops_layer():
    r = _upto("label_layers")
    r.layer = np.full(len(ROWS), -1, dtype=np.int32)
    r.layer[2] = r.layer_v.code("conv2")
    T.layers_through_seq(r)
    # the rows without a layer in a tree whose first seq is a forward op's: conv2d's own tree (3, 4)
    # and the backward node's (7)
    assert _strings(r.layer_v, r.layer) == [None, None, "conv2", "conv2", "conv2", None, None, "conv2", None, None,
                                            None]


@pytest.mark.parametrize("framework, late", [("pytorch", None), ("mxnet", "forward")])
def test_label_steps(framework, late):
    """Phase by the region holding the start; the loss op starts after the forward region ends and
    before the backward one begins, the NCCL kernel after the backward one: no region holds them,
    except for an asynchronous framework (MXNet), whose regions reach to the next one's start (the
    last one: on)."""
    r = _upto("label_steps", framework)
    T.label_steps(r, DIMS)
    assert _strings(r.phases, r.phase) == ["forward"] * 5 + ["backward"] * 4 + [
        late and "backward", late]
    assert r.it_val[~r.it_na].tolist() == [3] * 11 and not r.it_na.any()


def test_label_steps_device_rows_take_the_device_step():
    """A step on the device's clock (Kineto's gpu_user_annotation copy) gives the iteration of
    device rows no host step holds: the NCCL kernel (950 ns) outside a host step that ends at 900."""
    rows = [("step", "ProfilerStep#3", 0, 900, 1, NA, NA, NA), *ROWS[1:],
            ("step", "ProfilerStep#3", 900, 100, 99, NA, NA, NA)]
    r = _upto("label_steps", on_device=np.arange(len(rows)) == 11, rows=rows, dims=[*DIMS, None])
    T.label_steps(r, [*DIMS, None])
    assert r.it_na.tolist() == [False] * 9 + [False, False, True]  # the device step row itself is no host row
    assert r.it_val[9] == 3


def test_inherit_from_launches():
    r = _upto("inherit_from_launches")
    T.inherit_from_launches(r)
    # the kernel takes its launch's (row 4) labels and launching op (3), not its own time's backward phase
    assert (_strings(r.canon, r.out_canon[[5, 9]]), _strings(r.direc, r.out_dir[[5, 9]])) == (
        ["conv2d", "collective"], ["fwd", "none"])
    assert _strings(r.layer_v, r.layer[[5, 9]]) == ["conv1", None]
    assert _strings(r.phases, r.phase[[5, 9]]) == ["forward", None]  # the NCCL kernel: its own time's (none)
    assert r.inner_op[[5, 9]].tolist() == [3, -1]


def test_write_labels():
    r = _upto("write_labels")
    T.write_labels(r)
    df = r.df
    assert df["op_event_id"].tolist() == [pd.NA, pd.NA, pd.NA, 2, 3, 3, pd.NA, pd.NA, pd.NA, pd.NA, pd.NA]
    assert df["canonical_op"].tolist() == [pd.NA, pd.NA, "conv2d", "conv2d", "conv2d", "conv2d", pd.NA, "conv2d",
                                           "other", "collective", "nll_loss"]
    assert df["layer"].tolist()[:6] == [pd.NA, pd.NA, "conv1", "conv1", "conv1", "conv1"]
    assert df["iteration"].tolist() == [3] * 11
    # phase: the region's; else the direction rule's (schema.phase_of): the loss op, forward
    assert df["phase"].tolist() == ["forward"] * 6 + ["backward"] * 3 + [pd.NA, "forward"]
