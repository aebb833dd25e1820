"""One rule for what is a library kernel (``attribution.library_kernel_mask``), read by the timing passes' figures
(``attribution.library_kernels``, ``by_source``) and by the libs pass for its own trace (``calllink.launches``,
``link_in_libs_pass``'s ``libs_trace_library_kernels``), on tests/data/gpu_mxnet_h200_libs: the MXNet imperative
fp32 case of ``kernelmap run --framework mxnet --device gpu --mode all --math fp32 fp16 --profile all
--batch-size 1024 --steps 20`` on an H200 (GPU job of commit 89daeb0), its libs pass's cuBLAS/cuBLASLt logs and its
nsys pass's rows (README there).

The first full MXNet GPU run's link summary said 880 library kernels in the libs pass and 780 in the nsys pass of
the same model and steps: the libs pass took every kernel launched in an op that was not marked MXNet's own,
so MXNet's mshadow ``MapPlanKernel`` (its expression kernels: 5 a step in mean, its backward, pick's backward and
SetValueOp) counted there (and stood "not owned" by any call); the timing passes' rule never counted them. Here
the nsys rows stand for both passes' traces, so one rule must give one count: the stdlib reader's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from test_mxnet_unsplit_gemm import raw_trace, read_trace

from kernelmap import attribution, calllink, schema
from kernelmap.normalise import normalise

DATA = Path(__file__).parent / "data" / "gpu_mxnet_h200_libs"
GPU_LIBS = {"cuDNN", "cuBLAS", "cuBLASLt"}
STEPS = 20


def _raw() -> tuple[list[dict], dict[str, dict]]:
    """The trace's kernel rows (stdlib csv) and its ops by event id."""
    rows, ops = raw_trace()
    return [r for r in rows if r["kind"] == "kernel"], ops


@pytest.fixture(scope="module")
def case():
    """The case as normalise holds it: the libs pass's logs and the nsys pass's rows as one run (the nsys rows'
    event ids after the logs', as normalise offsets each file's), and the trace standing for the libs pass's."""
    libs = json.loads((DATA / "libs.json").read_text())
    logs, _ = normalise([DATA / "cublas.log.gz", DATA / "cublaslt.log.gz"], run="r", tf32_override=libs["tf32_override"])
    t = read_trace()
    off = int(logs["event_id"].max()) + 1
    nsys = t.assign(event_id=t["event_id"] + off, op_event_id=t["op_event_id"] + off, source="nsys", run="r",
                    source_file="nsys.sqlite")
    return schema.conform(schema.concat([logs, schema.conform(nsys)])), t


def test_the_raw_trace_kernels_by_library():
    """Stdlib: 780 kernels named by a GPU library (cuDNN 580, cuBLAS 200: 39 a step), MXNet's own (``mxnet::op::``,
    library native) 340, and 100 mshadow MapPlanKernel without a library, none of them inside a convolution or
    FullyConnected op (so the op rule adds no kernel to the names')."""
    kernels, ops = _raw()
    by_lib = Counter(r["library"] for r in kernels)
    assert by_lib == {"cuDNN": 580, "cuBLAS": 200, "native": 340, "": 100}
    named = [r for r in kernels if r["library"] in GPU_LIBS]
    assert len(named) == 780 == 39 * STEPS
    plan = [r for r in kernels if r["library"] == ""]
    assert all(r["kernel_name"].startswith("void mshadow::cuda::MapPlanKernel<") for r in plan)
    assert Counter(ops[r["op_event_id"]]["op_name"] for r in plan) == {
        "mean": 40, "_backward_mean": 20, "_backward_pick": 20, "SetValueOp": 20}
    lib_ops = {"Convolution", "_backward_Convolution", "FullyConnected", "_backward_FullyConnected"}
    assert all(r["library"] for r in kernels if ops[r["op_event_id"]]["op_name"] in lib_ops)  # a library's or native


def test_both_passes_count_the_same_library_kernels(case):
    """The libs pass's figure and the timing pass's are one rule's on the same rows: 780 each, the stdlib count
    (the old libs pass said 880: the 100 MapPlanKernel too), and no MapPlanKernel among them."""
    rdf, t = case
    n = sum(r["library"] in GPU_LIBS for r in _raw()[0])
    pre = calllink.link_in_libs_pass(rdf, t, 0)
    lk = attribution.library_kernels(rdf)
    assert pre["libs_trace_library_kernels"] == len(lk) == attribution.by_source(rdf)["nsys"]["library_kernels"] == n
    assert len(calllink.launches(t, 0, rdf)) == n  # all of them launched inside an op
    assert not lk["kernel_name"].str.contains("MapPlanKernel").any()
    assert not any("MapPlanKernel" in u["kernel_name"] for u in pre["libs_trace_unowned_top"])
    # the FullyConnected gemms owned by their cublasSgemmEx, carried to the nsys rows; cuDNN's need its log (none here)
    assert pre["libs_trace_kernels_owned"] == pre["carried_kernels_linked"] == int(lk["call_event_id"].notna().sum()) \
        == 10 * STEPS
    assert pre["libs_pass_notes"] == []


def test_a_library_kernel_outside_any_op_is_counted_and_said(case):
    """A library kernel of the libs trace outside any op (a CUDA graph's replay) counts as the timing passes count
    it, unowned, with a note; the mask is the same function's either way."""
    rdf, t = case
    k = t["kind"].eq("kernel") & t["library"].eq("cuDNN")
    first = t.index[k][0]
    t.loc[first, "op_event_id"] = pd.NA
    pre = calllink.link_in_libs_pass(rdf.copy(), t, 0)
    assert pre["libs_trace_library_kernels"] == 780 and len(calllink.launches(t, 0, rdf)) == 779
    assert pre["libs_pass_notes"] == [
        "1 library kernels of the libs trace ran outside any op (a CUDA graph's replays: a replay mode's are owned "
        "in its reference step instead); no launching op, not owned here"]
    mask = attribution.library_kernel_mask(t[t["kind"].eq("kernel")], rdf)
    assert int(mask.sum()) == 780
