"""Two self-checks of a case on 2 GPUs, on a real run (tests/data/gpu_devices_all_run: 2x H200, session 13,
``kernelmap run --framework all --devices 1 2 --profile all``; MXNet x2 and JAX x2 at bs 1024, their last 3 traced
steps, MXNet's whole cuDNN log; README.md there), against an independent reading of the trace and the log (stdlib):

* ``library calls per step``: MXNet drives its two GPUs from one process, so its one cuDNN log holds both devices'
  calls: the model's calls twice a step (before the fix its 5 conv rows failed "expected 1, measured 2"); JAX's calls,
  counted from XLA's own trace, stay once a step.
* ``launch-bound figures``: 'GPU busy' is the union of a step's kernels on its busiest device; the union across the
  two devices (the figure before the fix) outlasts the clean step's 95% upper bound.
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import json
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.analyses.launch import busy_per_step_ns
from kernelmap.reports.analyses.timed import timed_events
from kernelmap.reports.callchecks import library_call_checks
from kernelmap.reports.checkrows import FAIL, PASS, Check
from kernelmap.reports.checks import launch_bound_checks

from kernelmap import frameworks
from kernelmap.normalise import normalise_run_dir

RUN = Path(__file__).parent / "data" / "gpu_devices_all_run"
MX, JX = "mxnet-x2/bs1024", "jax-x2/bs1024"
CONV_CALLS = {"cudnnConvolutionForward": "fwd", "cudnnConvolutionBackwardData": "bwd_data",
              "cudnnConvolutionBackwardFilter": "bwd_weight"}
FILTER_LAYER = {"[32,1,3,3]": "conv1", "[64,32,3,3]": "conv2"}  # the conv filters' dims as cuDNN logs them
STEP = re.compile(r"^kernelmap:step#(\d+)$")


# --- the independent readers ---------------------------------------------------------------------------------
def _log_blocks(log: Path) -> list[str]:
    with gzip.open(log, "rt") as f:
        return [b for b in f.read().split("\n\n") if "function cudnn" in b]


def _conv_calls_per_step(log: Path) -> dict[int, list[Counter]]:
    """{GPU: [Counter((layer, direction)) per step]} of the cuDNN convolution calls of ``log``, each device's calls
    in log order cut into steps at its conv1 forward call (a step's first conv call)."""
    per: dict[int, list[Counter]] = defaultdict(list)
    for b in _log_blocks(log):
        fn = re.search(r"function (cudnn\w+)\(\)", b).group(1)
        if fn not in CONV_CALLS:
            continue
        gpu = int(re.search(r"GPU=(\d+);", b).group(1))
        dims = re.search(r"(?:wDesc|dwDesc): type=cudnnFilterDescriptor_t:.*?dimA: type=int; val=(\[[\d,]+\]);", b,
                         re.S).group(1)
        key = (FILTER_LAYER[dims], CONV_CALLS[fn])
        if key == ("conv1", "fwd") or not per[gpu]:
            per[gpu].append(Counter())
        per[gpu][-1][key] += 1
    return dict(per)


def _events(trace: Path) -> list[dict]:
    with gzip.open(trace, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(iv: list[tuple[int, int]]) -> int:
    tot, cur = 0, None
    for s, e in sorted(iv):
        if cur is None or s > cur[1]:
            tot += 0 if cur is None else cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return tot + (0 if cur is None else cur[1] - cur[0])


def _xla_kernel_unions(trace: Path) -> dict[int, dict[str, int]]:
    """{step: {device process name: union of its kernels (ns)}, plus "both": the union across the devices} of an XLA
    trace: kernels (``kernel_details``) on ``/device:GPU:N`` processes, each in the last ``kernelmap:step#N`` region
    that started at or before it (the capture pass synchronises the devices after every step)."""
    ev = _events(trace)
    gpu = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
           and str(e["args"]["name"]).startswith("/device:GPU")}
    steps = sorted((e["ts"], int(STEP.match(e["name"]).group(1))) for e in ev
                   if e.get("ph") == "X" and STEP.match(str(e.get("name", ""))))
    starts = [s for s, _ in steps]
    iv: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for e in ev:
        if e.get("ph") == "X" and e.get("pid") in gpu and "kernel_details" in e.get("args", {}):
            at = bisect.bisect_right(starts, e["ts"]) - 1
            assert at >= 0, e
            s = round(e["ts"] * 1000)
            iv[steps[at][1]][gpu[e["pid"]]].append((s, s + round(e["dur"] * 1000)))
    return {n: {**{d: _union(v) for d, v in per.items()}, "both": _union([x for v in per.values() for x in v])}
            for n, per in iv.items()}


# --- the run -------------------------------------------------------------------------------------------------
def _normalised(d: Path) -> Path:
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_devices_all") / "run"
    shutil.copytree(RUN, d)
    return load_run(_normalised(d))


def _call_rows(run, case: str) -> dict[str, dict]:
    rows = library_call_checks(run, A.library_calls([run]))
    return {r["subject"]: r for r in rows if r["framework"] == case and r["check"] == Check.LIBRARY_CALLS}


# --- library calls per step ----------------------------------------------------------------------------------
def test_mxnet_log_holds_each_device_calls_once_a_step():
    """The log itself: each of the two GPUs makes the model's conv calls once in every logged step (1 warm-up + 20)."""
    per = _conv_calls_per_step(RUN / MX / "cudnn.log.gz")
    libs = json.loads((RUN / MX / "libs.json").read_text())
    model = Counter({("conv1", "fwd"): 1, ("conv1", "bwd_weight"): 1, ("conv2", "fwd"): 1, ("conv2", "bwd_data"): 1,
                     ("conv2", "bwd_weight"): 1})
    assert sorted(per) == [0, 1]
    for steps in per.values():
        assert len(steps) == libs["warmup_steps"] + libs["steps"] == 21
        assert all(s == model for s in steps)


def test_mxnet_x2_calls_per_step_pass_as_twice_the_model(run):
    per = _conv_calls_per_step(RUN / MX / "cudnn.log.gz")
    rows = _call_rows(run, "mxnet-x2")
    for (layer, d) in (("conv1", "fwd"), ("conv1", "bwd_weight"), ("conv2", "fwd"), ("conv2", "bwd_data"),
                       ("conv2", "bwd_weight")):
        both = [sum(per[g][i][(layer, d)] for g in per) for i in range(21)]
        assert set(both) == {2}  # every step: once on each GPU
        r = rows[f"{layer} {d}"]
        assert (r["status"], r["expected"], r["measured"]) == (PASS, 2, 2.0), r
        assert "2 devices in one process's log: the model's calls once per device" in r["detail"]
    assert (rows["conv1 bwd_data"]["status"], rows["conv1 bwd_data"]["expected"]) == (PASS, 0)


def test_mxnet_x2_calls_fail_as_a_process_per_device(run, monkeypatch):
    """Planted: MXNet said to run a process per device (each logging its own rank's calls): the same rows FAIL."""
    d = frameworks.REGISTRY["mxnet"]
    monkeypatch.setitem(frameworks.REGISTRY, "mxnet", dataclasses.replace(
        d, data_parallel=dataclasses.replace(d.data_parallel, processes=True)))
    rows = _call_rows(run, "mxnet-x2")
    conv = [r for s, r in rows.items() if s != "conv1 bwd_data"]
    assert len(conv) == 5 and all((r["status"], r["expected"], r["measured"]) == (FAIL, 1, 2.0) for r in conv)


def test_mxnet_x2_calls_fail_with_one_device_dropped_from_the_log(tmp_path):
    """Planted: the log keeps GPU 0's calls only (GPU 1's blocks dropped): 1 a step against the expected 2."""
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    blocks = [b for b in _log_blocks(d / MX / "cudnn.log.gz") if "GPU=1;" not in b]
    with gzip.open(d / MX / "cudnn.log.gz", "wt") as f:
        f.write("\n\n".join(blocks) + "\n\n")
    assert set(_conv_calls_per_step(d / MX / "cudnn.log.gz")) == {0}
    rows = _call_rows(load_run(_normalised(d)), "mxnet-x2")
    conv = [r for s, r in rows.items() if s != "conv1 bwd_data"]
    assert len(conv) == 5 and all((r["status"], r["expected"], r["measured"]) == (FAIL, 2, 1.0) for r in conv)


def test_jax_x2_calls_from_xla_own_trace_stay_once_a_step(run):
    rows = _call_rows(run, "jax-x2")
    assert len(rows) == 6 and all(r["status"] == PASS for r in rows.values())
    assert all(r["expected"] == (0 if s == "conv1 bwd_data" else 1) for s, r in rows.items())
    assert not any("devices in one process's log" in r["detail"] for r in rows.values())


# --- GPU busy on two devices ---------------------------------------------------------------------------------
def test_jax_x2_gpu_busy_is_the_busiest_device_union(run):
    unions = _xla_kernel_unions(RUN / JX / "trace.json.gz")
    assert sorted(unions) == [22, 23, 24]
    busiest = sum(max(v for k, v in u.items() if k != "both") for u in unions.values()) / 3 / 1e6
    across = sum(u["both"] for u in unions.values()) / 3 / 1e6
    lb = A.launch_bound([run])
    row = lb[lb["framework"] == "jax-x2"].iloc[0]
    assert row["steps"] == 3 and row["gpu_busy_ms"] == pytest.approx(busiest, abs=1e-9)
    assert round(busiest, 4) == 1.1660 and round(across, 4) == 1.2479  # against a clean step of 1.2026 ms
    # the analysis's own events, read as one device (no rank or device column): the union across the devices
    t = next(x for x in timed_events(run) if x.framework == "jax-x2" and x.level == "kernel")
    one = t.events.drop(columns=[c for c in ("rank", "device_index") if c in t.events])
    assert busy_per_step_ns(one, t.iterations) / 1e6 == pytest.approx(across, abs=1e-9)


def test_jax_x2_launch_bound_passes_and_the_union_across_devices_fails(run):
    unions = _xla_kernel_unions(RUN / JX / "trace.json.gz")
    across = sum(u["both"] for u in unions.values()) / 3 / 1e6
    lb, busy, summ = A.launch_bound([run]), A.busy_share([run]), A.summary_table([run])
    results = {r["dir"]: r for r in json.loads((RUN / "results.json").read_text())}
    bound = results[JX]["ci95_high_s"] * 1e3
    mine = [r for r in launch_bound_checks(lb, busy, summ) if r["framework"] == "jax-x2"]
    step = next(r for r in mine if r["subject"].startswith("GPU busy <= clean step"))
    assert step["status"] == PASS and step["expected"] == pytest.approx(bound, rel=1e-12)
    assert {r["status"] for r in mine} == {PASS}
    # the old figure: the union across devices, all kernels (no compute-only figure beside it)
    old = lb.assign(gpu_busy_ms=lb["gpu_busy_ms"].where(lb["framework"] != "jax-x2", across),
                    compute_busy_ms=lb["compute_busy_ms"].where(lb["framework"] != "jax-x2"))
    was = next(r for r in launch_bound_checks(old, busy, summ)
               if r["framework"] == "jax-x2" and r["subject"].startswith("GPU busy <= clean step"))
    assert across > bound and was["status"] == FAIL and "outlast the clean step" in was["detail"]
