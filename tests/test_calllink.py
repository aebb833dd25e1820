"""kernelmap/calllink.py (issue 25) on the real GPU fixtures: the pieces that a capture of another pass
can test (kernel names across profilers, clocks, carrying a call mapping by launching op and kernel
sequence, naming a pass that ran other kernels). Call ownership in the libs pass itself (cuDNN by thread
and time) needs the libs pass's own trace: tests/test_gpu_link_run.py, on a trimmed run recorded on an H200
by the GPU job of commit a93316a.

Fixtures: tests/data/gpu_kineto.json.gz, gpu_nsys.sqlite.gz and the gpu_*.log.gz logs are one PyTorch run
at bs 64 (tests/data/gpu_fixtures.json); gpu_kineto_bs1024_fft.json.gz is PyTorch at bs 1024, whose conv2
backward ran FFT kernels."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelmap import adapters, attribution, calllink, schema
from kernelmap.errors import ParseError
from kernelmap.normalise import normalise

DATA = Path(__file__).parent / "data"
LOGS = [DATA / f"gpu_{n}.log.gz" for n in ("cudnn", "cublas", "cublaslt")]


def _library_kernels(df: pd.DataFrame) -> pd.DataFrame:
    k = df[df["kind"].eq("kernel")]
    return k[~attribution.native_kernels(k)]


def test_short_names_agree_between_kineto_and_nsys():
    """One run's Kineto and nsys passes demangle the same kernels differently (``(anonymous namespace)`` /
    ``<unnamed>``, ``4, true`` / ``(int)4, (bool)1``); their short names are one set."""
    kin = set(_library_kernels(adapters.read(DATA / "gpu_kineto.json.gz"))["kernel_name"])
    nsy = set(_library_kernels(adapters.read(DATA / "gpu_nsys.sqlite.gz"))["kernel_name"])
    assert len(kin) == len(nsy) == 20 and len(kin & nsy) == 5
    assert {calllink.short_name(n) for n in kin} == {calllink.short_name(n) for n in nsy}
    assert calllink.short_name("void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*)") == "fft2d_r2c_32x32"


def test_trace_clocks_read_as_unix_time(tmp_path):
    doc = json.loads(gzip.decompress((DATA / "gpu_kineto.json.gz").read_bytes()))
    trace = adapters.read(DATA / "gpu_kineto.json.gz")
    assert calllink.base_ns(DATA / "gpu_kineto.json.gz", trace) == doc["baseTimeNanoseconds"] == 1790857026000000000
    db = tmp_path / "n.sqlite"
    db.write_bytes(gzip.decompress((DATA / "gpu_nsys.sqlite.gz").read_bytes()))
    utc = sqlite3.connect(db).execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    assert calllink.base_ns(DATA / "gpu_nsys.sqlite.gz", adapters.read(DATA / "gpu_nsys.sqlite.gz")) == utc
    # the cuDNN log of the same run (libs pass, 8 s later) starts after the Kineto pass began, on one clock
    log = adapters.read(LOGS[0])
    first_call = int(log.loc[log["kind"].eq("library_call"), "start_ns"].min())
    kineto_start = int(trace["start_ns"].min()) + doc["baseTimeNanoseconds"]
    assert 0 < first_call - kineto_start < 60 * 10**9
    with pytest.raises(ParseError, match="TARGET_INFO_SESSION_START_TIME"):
        adapters.nsys.base_ns(LOGS[0])
    with pytest.raises(ParseError, match=r"must be one of nsys, kineto \(a format whose clock reads as Unix time\)"):
        calllink.base_ns(LOGS[0], log)


def _linked(trace: Path) -> pd.DataFrame:
    """The trace and the bs-64 logs normalised as one run, logs first (so that their event ids are the
    same in every such frame), linked by signature."""
    df, _ = normalise([*LOGS, trace], run="r")
    return df


def test_carry_links_the_kernels_of_ops_that_ran_the_same_kernels():
    """The mapping the Kineto pass's kernels give (here: their signature links, right at bs 64) carried by
    launching op and kernel sequence to the nsys pass of the same run links every nsys library kernel of
    those ops, each to the call the signature join links it to."""
    kin = _linked(DATA / "gpu_kineto.json.gz")
    lk = calllink.launches(kin, 0, kin)
    owners = kin.loc[lk.index, "call_event_id"]
    tpl = calllink.templates(lk, owners)
    # conv2d and linear ops, and their kinds per step (two aten::mm per linear backward: data, then weight)
    assert {(k[0], k[2], k[4]) for k in tpl if k[1] == "linear" and k[0] == "aten::mm"} == {
        ("aten::mm", "fc1", 0), ("aten::mm", "fc1", 1), ("aten::mm", "fc2", 0), ("aten::mm", "fc2", 1)}
    nsys = _linked(DATA / "gpu_nsys.sqlite.gz")
    want = nsys["call_event_id"].copy()
    nsys["call_event_id"] = pd.array([pd.NA] * len(nsys), dtype="Int64")
    info = calllink.carry(nsys, tpl)
    got = nsys["call_event_id"]
    lib = _library_kernels(nsys)
    carried = got.notna()
    assert info["linked"] == int(carried.sum()) == 220 == int(want.loc[lib.index].notna().sum())
    assert (got[carried] == want[carried]).all()
    assert info["differs"] == [] and info["reasons"] == {}


def test_carry_names_what_each_pass_ran_where_the_kernels_differ():
    """bs 1024's conv2 backward ran FFT kernels; the bs-64 mapping has ALGO-style kernels there: those
    kernels are not linked, and the reason names both."""
    kin = _linked(DATA / "gpu_kineto.json.gz")
    lk = calllink.launches(kin, 0, kin)
    tpl = calllink.templates(lk, kin.loc[lk.index, "call_event_id"])
    fft = _linked(DATA / "gpu_kineto_bs1024_fft.json.gz")
    fft["call_event_id"] = pd.array([pd.NA] * len(fft), dtype="Int64")
    info = calllink.carry(fft, tpl)
    d = {(x["op_name"], x["layer"]): x for x in info["differs"]}
    conv2 = d[("aten::convolution_backward", "conv2")]
    assert {"fft2d_r2c_32x32", "fft2d_c2r_32x32"} <= set(conv2["this_pass"])
    assert conv2["libs_pass"].startswith("cudnnBackendExecute eng")
    ev = json.loads(gzip.decompress((DATA / "gpu_kineto_bs1024_fft.json.gz").read_bytes()))["traceEvents"]
    steps = {e["name"] for e in ev if str(e.get("name", "")).startswith("kernelmap:step#")}
    assert conv2["ops"] == len(steps) == 20  # one conv2 backward per traced step
    k = fft.loc[list(info["reasons"])]
    conv2_k = k[k["kernel_name"].str.contains("fft2d_r2c_32x32")]
    assert len(conv2_k) and conv2_k["call_event_id"].isna().all()
    text = info["reasons"][conv2_k.index[0]]
    assert text.startswith("the libs pass ran cudnnBackendExecute") and "this pass ran" in text and "fft2d" in text


def test_kernel_figures_name_what_they_count():
    """``attributed_*`` counts kernels whose op is in the model's vocabulary, ``launch_op_known_*`` kernels
    whose launching op is known: a kernel of an op outside the vocabulary ('other') counts in the second
    only."""
    df = adapters.read(DATA / "gpu_kineto.json.gz")
    s = attribution.summarise(df)
    assert s["attributed_kernel_time_share"] == s["launch_op_known_kernel_time_share"] == 1.0
    k = df.index[df["kind"].eq("kernel")][:10]
    moved = int(df.loc[k, "dur_ns"].sum())
    total = int(df.loc[df["kind"].eq("kernel"), "dur_ns"].sum())
    df.loc[k, "canonical_op"] = "other"
    s = attribution.summarise(df)
    assert s["attributed_kernel_time_share"] == pytest.approx(1 - moved / total)
    assert s["launch_op_known_kernel_time_share"] == 1.0 and s["launch_op_known_kernels"] == 245
    df.loc[k, "op_event_id"] = pd.NA
    assert attribution.summarise(df)["launch_op_known_kernels"] == 235


def test_signature_join_leaves_excluded_kernels_alone():
    df, _ = normalise([*LOGS, DATA / "gpu_kineto.json.gz"], run="r")
    want = df["call_event_id"].copy()
    linked = want.index[want.notna()]
    assert len(linked) == 110
    df["call_event_id"] = pd.array([pd.NA] * len(df), dtype="Int64")
    attribution.link_library_calls(df, exclude={int(linked[0])})
    assert pd.isna(df.loc[linked[0], "call_event_id"])
    assert (df.loc[linked[1:], "call_event_id"] == want.loc[linked[1:]]).all()
    assert int(df["call_event_id"].notna().sum()) == 109
    assert schema.validate(df) is not None
    assert np.isin(df.loc[linked[1:], "call_event_id"].astype("int64"),
                   df.loc[df["kind"].eq("library_call"), "event_id"].astype("int64")).all()


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "gpu_kineto_bs1024_fft.json.gz"])
def test_the_gpu_run_tests_reader_counts_what_attribution_counts(name):
    """tests/test_gpu_link_run.py counts library kernels from the raw Kineto JSON; on the fixtures at hand
    it agrees with attribution's library kernels (count and time), so its exact counts test something."""
    from test_gpu_link_run import _kineto_library_kernels

    _, s = normalise([*LOGS, DATA / name], run="r")
    b = s["runs"]["r"]["by_source"]["kineto"]
    assert _kineto_library_kernels(DATA / name) == (b["library_kernels"], b["library_kernel_time_ns"])


def test_report_lists_every_unlinked_library_kernel_with_its_reason():
    """The report's table of unlinked library kernels (reports/analyses/coverage.py) is attribution.json's
    ``library_unlinked_top`` per source: at bs 1024 with the bs-64 logs, PyTorch's FFT conv2 backward
    kernels (not split by name, no libs-pass trace of their own) with the signature join's reason."""
    from types import SimpleNamespace

    from kernelmap.reports import analysis as A

    _, s = normalise([*LOGS, DATA / "gpu_kineto_bs1024_fft.json.gz"], run="r")
    run = {**s["runs"]["r"], "framework": "pytorch", "batch_size": 1024}
    t = A.unlinked_library_kernels([SimpleNamespace(name="x", attribution={"runs": {"r": run}})])
    top = run["by_source"]["kineto"]["library_unlinked_top"]
    assert len(t) == len(top) > 0
    assert t[["kernel_name", "reason", "count", "time_ns"]].to_dict("records") == top
    fft = t[t["kernel_name"].str.contains("fft2d_r2c_32x32")]
    assert len(fft) and set(fft["reason"]) == {"convolution backward kernel not split into bwd_data/bwd_weight"}
    assert int(t["count"].sum()) == run["by_source"]["kineto"]["library_kernels_unlinked"]


def test_a_log_of_another_process_owns_no_kernel_by_time():
    """Ownership by thread and time links only a log and a trace of one process: the fixtures' cuDNN log
    (libs pass, pid 573) and Kineto trace (framework pass, pid 527) are of two; no kernel is owned by time,
    no clock offset is claimed, and the summary says why. (cuBLAS' order-based ownership still pairs calls
    and ops of one signature: it assumes one process, which the libs pass's own trace is.)"""
    df, _ = normalise([*LOGS, DATA / "gpu_kineto.json.gz"], run="r")
    trace = adapters.read(DATA / "gpu_kineto.json.gz")
    lk = calllink.launches(trace, calllink.base_ns(DATA / "gpu_kineto.json.gz", trace), df)
    assert set(lk["tid"].dropna().astype(int)) == {527, 569}
    cudnn = df[(df["kind"] == "library_call") & (df["source"] == "cudnn_log")]
    # the libs process's main thread and its autograd thread (zcat gpu_cudnn.log.gz | grep -o "Thread=[0-9]*")
    assert set(cudnn["tid"].dropna().astype(int)) == {573, 615}
    ow = calllink.own(df, lk)
    assert ow.by_time == 0 and ow.clock_offset_ns is None
    assert any("no logged cuDNN call owns a kernel" in n for n in ow.notes)
