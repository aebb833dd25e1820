"""MXNet's FullyConnected gemms owned by their own cublasSgemmEx in the libs pass (kernelmap/calllink.py,
``_own_unsplit``), on tests/data/gpu_mxnet_h200_libs: the libs pass's cuBLAS and cuBLASLt logs of
``kernelmap run --framework mxnet --device gpu --mode all --math fp32 fp16 --profile all --batch-size 1024
--steps 20`` on an H200 (GPU job of commit 89daeb0, MXNet 1.9.1 sm_90, cuBLAS 13.1), with that run's nsys pass
(imperative) standing for the libs pass's own trace, which the run's small files lack (README there).

``_backward_FullyConnected`` is one op that makes two cublasSgemmEx (weight gradient, then data gradient), so
its kernels have direction ``bwd`` and no call's signature; they were owned by no call (the run's link summary:
680/900 owned, 20 of each of those gemm kernels not). Counts checked against stdlib readers of the raw log
(the gemm calls, their m/n/k and transposes) and of the trace rows (the kernels of each FullyConnected op), and
each owning call checked against the kernel's name: the layout letters cuBLAS names its gemms with (``_nt_``,
``_nn_``, ``_tn_``) are the owning call's transa/transb."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import adapters, calllink
from kernelmap.normalise import normalise

DATA = Path(__file__).parent / "data" / "gpu_mxnet_h200_libs"
LOGS = [DATA / "cublas.log.gz", DATA / "cublaslt.log.gz"]
GEMMS_PER_STEP = 6  # fc1, fc2 x (fwd, bwd_weight, bwd_data)
FC_OPS = ("FullyConnected", "_backward_FullyConnected")
_LAYOUT = re.compile(r"_([nt]{2})_(?:n_tilesize|align)")


def _raw_gemms() -> list[dict]:
    """The log's cublasSgemmEx calls in order, by a stdlib reader: m, n, k, transa, transb, MathMode."""
    out, cur = [], None
    for line in gzip.open(DATA / "cublas.log.gz", "rt"):
        if line.startswith("I! cuBLAS"):
            cur = {} if " cublasSgemmEx(" in line else None
            if cur is not None:
                out.append(cur)
        elif cur is not None and (m := re.match(r"i!\s+(m|n|k|transa|transb): type=\w+; val=(\w+)", line)):
            cur[m.group(1)] = m.group(2)
        elif cur is not None and (m := re.search(r"MathMode=(\w+)", line)):
            cur["mode"] = m.group(1)
    return out


def raw_trace() -> tuple[list[dict], dict[str, dict]]:
    """The trace rows (stdlib csv) and its ops by event id."""
    rows = list(csv.DictReader(io.TextIOWrapper(gzip.open(DATA / "trace.csv.gz"))))
    return rows, {r["event_id"]: r for r in rows if r["kind"] == "op"}


def _raw_fc_kernels() -> list[dict]:
    """The library kernels launched inside a FullyConnected op (not MXNet's own: library ``native``), in start order."""
    rows, ops = raw_trace()
    return [r for r in rows if r["kind"] == "kernel" and r["library"] != "native" and r["op_event_id"]
            and ops[r["op_event_id"]]["op_name"] in FC_OPS]


def read_trace() -> pd.DataFrame:
    t = pd.read_csv(DATA / "trace.csv.gz", dtype=str, keep_default_na=False, na_values=[""])
    for c in ("event_id", "iteration", "start_ns", "dur_ns", "correlation_id", "op_event_id", "tid"):
        t[c] = pd.array(pd.to_numeric(t[c]), dtype="Int64")
    return t


@pytest.fixture(scope="module")
def libs():
    return json.loads((DATA / "libs.json").read_text())


@pytest.fixture(scope="module")
def linked(libs):
    """The logs normalised as the run does (its NVIDIA_TF32_OVERRIDE), the trace's launches and their owners."""
    df, _ = normalise(LOGS, run="r", tf32_override=libs["tf32_override"])
    lk = calllink.launches(read_trace(), 0, df)
    return df, lk, calllink.own(df, lk)


def test_the_log_holds_six_gemms_a_step(libs, linked):
    raw = _raw_gemms()
    steps = libs["warmup_steps"] + libs["steps"]
    assert (libs["warmup_steps"], libs["steps"], libs["tf32_override"]) == (1, 20, "0")
    assert len(raw) == GEMMS_PER_STEP * steps == 126
    assert set(Counter((g["m"], g["n"], g["k"]) for g in raw).values()) == {steps}
    assert len({(g["m"], g["n"], g["k"]) for g in raw}) == GEMMS_PER_STEP
    df = linked[0]
    calls = df[df["kind"].eq("library_call") & df["source"].eq("cublas_log")]
    assert list(calls["library_call"]) == ["cublasSgemmEx"] * len(raw)
    assert calls.groupby(["layer", "direction"]).size().to_dict() == {
        (lay, d): steps for lay in ("fc1", "fc2") for d in ("bwd_data", "bwd_weight", "fwd")}
    # cuBLASLt beneath: one typed matmul per cublasSgemmEx; its 63 cublasLtMatmul are cuDNN's (3 a step: conv2's
    # Winograd forward over 36 tiles, its FFT backward's complex gemms over 144 frequencies), no model layer
    text = gzip.open(DATA / "cublaslt.log.gz", "rt").read()
    assert text.count("[Trace][cublasLtSSSMatmul]") == len(raw)
    assert text.count("[Api][cublasLtMatmul]") == 3 * steps
    lt = df[df["kind"].eq("library_call") & df["source"].eq("cublaslt_log")]
    assert len(lt) == 3 * steps and lt["layer"].isna().all()
    assert sorted(Counter(lt["shapes"]).values()) == [steps] * 3
    assert {json.loads(s)[0][0] for s in lt["shapes"]} == {36, 144}


def test_every_fullyconnected_gemm_owned_by_its_own_call(libs, linked):
    df, lk, ow = linked
    raw_k = _raw_fc_kernels()
    assert len(raw_k) == 10 * libs["steps"] == 200  # a step: forward 2 + 2, backward 3 + 3
    assert len({r["iteration"] for r in raw_k}) == libs["steps"]
    fc = lk[lk["op_name"].isin(FC_OPS)]
    assert len(fc) == len(raw_k)
    assert ow.by_time == 0 and ow.by_sequence == len(raw_k) and not ow.notes  # no cuDNN log here: no call by time
    assert ow.owner[fc.index].notna().all()
    assert ow.owner.notna().sum() == len(raw_k)  # nothing outside those ops owned by a cuBLAS call
    # the owners: the last 20 steps' calls, each of them (the first step's 6 calls ran before the trace)
    calls = df[df["kind"].eq("library_call") & df["source"].eq("cublas_log")].sort_values("event_id")
    assert set(ow.owner[fc.index].astype(int)) == set(calls["event_id"].iloc[GEMMS_PER_STEP:].astype(int))


def test_each_owner_is_the_call_the_kernel_name_says(linked):
    """The layout letters of a gemm kernel's name are its owner's transposes (raw log, by the call's rank), the
    owner's layer the kernel's, its shapes the raw m/n/k's, and its math fp32 (ffma kernels) under the run's
    NVIDIA_TF32_OVERRIDE=0 though the handle asked for TF32."""
    df, lk, ow = linked
    raw = _raw_gemms()
    calls = df[df["kind"].eq("library_call") & df["source"].eq("cublas_log")].sort_values("event_id")
    rank = {int(e): i for i, e in enumerate(calls["event_id"])}
    by_id = calls.set_index("event_id")
    fc = lk[lk["op_name"].isin(FC_OPS)]
    checked = 0
    for label, r in fc.iterrows():
        cid = int(ow.owner[label])
        g, c = raw[rank[cid]], by_id.loc[cid]
        assert c["layer"] == r["layer"]
        assert json.loads(c["shapes"]) == [[int(g["m"]), int(g["k"])], [int(g["k"]), int(g["n"])]]
        assert g["mode"] == "CUBLAS_TF32_TENSOR_OP_MATH" and c["math_mode"] == "tf32" and c["math_ran"] == "fp32"
        assert "ffma" in r["kernel_name"] or "simt_sgemm" in r["kernel_name"] or "splitKreduce" in r["kernel_name"]
        m = _LAYOUT.search(r["kernel_name"])
        if m:
            assert m.group(1) == g["transa"][-1].lower() + g["transb"][-1].lower(), (r["kernel_name"], g)
            checked += 1
    assert checked == 9 * 20  # every kernel but cuBLASLt's split-K reduction names its layout
    # each backward op: weight gradient's run first, then the data gradient's
    bwd = fc[fc["op_name"].eq("_backward_FullyConnected")].assign(owner=ow.owner)
    for _, g in bwd.groupby("op_event_id", sort=False):
        dirs = list(dict.fromkeys(by_id.loc[g["owner"].astype(int), "direction"]))
        assert dirs == ["bwd_weight", "bwd_data"]


def test_an_op_whose_kernels_do_not_cut_per_call_stays_unowned(linked):
    """Where an op's kernels make more gemm runs than it made calls (here: one step's split-K reduction renamed
    to a gemm), that op's kernels are left without an owner, said in a note; the other ops keep theirs."""
    df = linked[0]
    t = read_trace()
    lk = calllink.launches(t, 0, df)
    op = lk.loc[lk["short"].eq("cublasLt::splitKreduce_kernel"), "op_event_id"].iloc[5]
    hit = t["kind"].eq("kernel") & t["op_event_id"].eq(op) & t["kernel_name"].str.contains("splitKreduce")
    t.loc[hit, "kernel_name"] = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_execute_kernel__5x_cublas"
    lk = calllink.launches(t, 0, df)
    ow = calllink.own(df, lk)
    in_op = lk["op_event_id"].eq(op).to_numpy() & ~lk["kernel_name"].str.contains("native").to_numpy()
    assert ow.owner[in_op].isna().all() and in_op.sum() == 3
    assert ow.by_sequence == 200 - 3
    assert ow.notes == ["linear/fc2/bwd: 1 of 20 ops launched library kernels that do not cut into one gemm (and its "
                        "split-K reduction) per call of 2 (bwd_weight, bwd_data); not owned"]


def test_calls_out_of_their_groups_own_nothing_of_that_layer(linked):
    """A log whose calls of one layer's backward do not come a group of one call per direction (here: one
    bwd_data call missing mid-log) owns none of that layer's backward kernels, and says so."""
    df, lk, _ = linked
    calls = df[df["kind"].eq("library_call") & df["layer"].eq("fc1") & df["direction"].eq("bwd_data")]
    ow = calllink.own(df.drop(index=calls.index[10]), lk)
    fc1 = lk["op_name"].eq("_backward_FullyConnected").to_numpy() & lk["layer"].eq("fc1").to_numpy()
    assert ow.owner[fc1].isna().all() and fc1.sum() == 60
    assert ow.by_sequence == 200 - 60
    assert ow.notes == ["linear/fc1/bwd: its 41 logged calls (bwd_data, bwd_weight) do not come in groups of one "
                        "call per direction; not linked by order"]


def test_the_trace_rows_read_as_a_trace(linked):
    """The fixture's trace is the run's own nsys rows: every kernel has its launch (thread, time) and its op."""
    lk = calllink.launches(read_trace(), 0, linked[0])
    assert lk["tid"].notna().all() and lk["launch_ns"].notna().all() and lk["op_name"].notna().all()
    assert adapters.kernel_libraries.follows_a_gemm("void cublasLt::splitKreduce_kernel<(int)32>(...)")
    assert not adapters.kernel_libraries.follows_a_gemm("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn>")
