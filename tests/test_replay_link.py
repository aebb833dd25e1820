"""Library kernels of a graph-replay mode linked to their calls where the kernel names do not split a convolution's
backward (cuDNN's FFT), on a real H200 case: tests/data/gpu_replay_link, the pytorch-cuda-graph bs 1024 case of
`kernelmap run --framework all --device gpu --mode all --profile all --batch-size 64 1024 --steps 20 --trials 1
--max-repeats 0` (2026-11-26; torch 2.11+cu130, cuDNN 9.19), whole: the framework pass's trace and reference step,
the libs pass's logs (gzipped), its trace and its own reference step. Normalised again here.

At bs 1024 cuDNN runs conv2's data gradient as an FFT (``fft2d_r2c`` x2, a complex gemm, ``fft2d_c2r``): no
``dgrad``/``wgrad`` in their names, so their direction stayed ``bwd`` and nothing could link them; that run's first
report linked 280 of 380 library kernels (68.10% of their time). Now each takes the call that owns its twin in
the libs pass's reference step (``calllink.link_replayed``)."""

from __future__ import annotations

import collections
import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import calllink
from kernelmap.normalise import normalise_run_dir

FIXTURE = Path(__file__).parent / "data" / "gpu_replay_link"
KEY = "pytorch-cuda-graph/bs1024"
FFT = ("fft2d_r2c_32x32", "sm80_xmma_gemm_cf32cf32", "fft2d_c2r_32x32")


def _normalised(tmp_path: Path) -> tuple[dict, pd.DataFrame]:
    d = tmp_path / "run"
    shutil.copytree(FIXTURE, d)
    normalise_run_dir(d)
    run = json.loads((d / "attribution.json").read_text())["runs"][KEY]
    return run, pd.read_parquet(d / "records.parquet")


def _replayed_fft_kernels_in_raw_trace() -> collections.Counter:
    """An independent reader (stdlib json): the FFT kernels of the framework pass's trace that correlate with a
    cudaGraphLaunch, by name."""
    ev = json.loads(gzip.decompress((FIXTURE / KEY / "trace.json.gz").read_bytes()))["traceEvents"]
    launches = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch" and "args" in e}
    return collections.Counter(next(f for f in FFT if f in e["name"]) for e in ev
                               if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches
                               and any(f in e["name"] for f in FFT))


def test_every_library_kernel_of_the_replayed_fft_backward_links_to_its_call(tmp_path):
    run, rec = _normalised(tmp_path)
    kin = run["by_source"]["kineto"]
    assert (kin["library_kernels_linked"], kin["library_kernels"]) == (380, 380)
    assert kin["attributed_kernel_time_share"] == 1.0
    assert (run["replayed_linked"], run["replayed_unowned"]) == (120, 0)  # 20 steps x (4 FFT kernels + 2 memsets)
    raw = _replayed_fft_kernels_in_raw_trace()
    assert raw == {"fft2d_r2c_32x32": 40, "sm80_xmma_gemm_cf32cf32": 20, "fft2d_c2r_32x32": 20}
    k = rec[(rec["kind"] == "kernel") & (rec["source"] == "kineto")]
    fft = k[k["kernel_name"].str.contains("|".join(FFT))]
    assert len(fft) == sum(raw.values())
    # each is conv2's data gradient, linked to the cuDNN call that ran it: engine 50 (FFT), as the log says
    assert set(zip(fft["layer"], fft["direction"], fft["library_call"], fft["algo"], strict=True)) == {
        ("conv2", "bwd_data", "cudnnBackendExecute", "eng50")}
    calls = rec[(rec["kind"] == "library_call") & (rec["source"] == "cudnn_log")]
    linked = calls[calls["event_id"].isin(fft["call_event_id"].astype("int64"))]
    assert set(zip(linked["layer"], linked["direction"], linked["algo"], strict=True)) == {("conv2", "bwd_data", "eng50")}


def test_without_the_reference_steps_calls_the_fft_kernels_stay_unlinked(tmp_path, monkeypatch):
    """The figure of that run's first report: 280 of 380, the FFT kernels "not split into bwd_data/bwd_weight"."""
    monkeypatch.setattr(calllink, "link_replayed",
                        lambda df, ref, base_ns: {"replayed_linked": 0, "replayed_unowned": 0, "reasons": {}})
    run, _ = _normalised(tmp_path)
    kin = run["by_source"]["kineto"]
    assert (kin["library_kernels_linked"], kin["library_kernels"]) == (280, 380)
    assert kin["library_kernel_time_linked_share"] == pytest.approx(0.6810, abs=5e-4)
