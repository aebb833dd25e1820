"""Issue 36 on a real GPU run: tests/data/gpu_modes_run, the normalised output of
``kernelmap run --framework all --device gpu --mode all --profile all --batch-size 64`` on an H200 (its README).

* the typed key end to end on the GPU: every record's framework, mode, math, devices and batch size filled and
  typed, the cases those the manifest asked for, read by the one loader (``RunDir``);
* every library kernel linked to its call in every case and timing source, graph replays and compiled modes
  included: exact counts and times counted here by an independent reader (pyarrow rows, no kernelmap code),
  equal to attribution.json's figures; the counts are those of the fp32 run before the key was typed
  (tests/data/gpu_link_run: PyTorch eager 340, MXNet 580, JAX 360 at bs 64)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
from kernelmap.frameworks.case import CaseKey

from kernelmap.rundir import RunDir

RUN = Path(__file__).parent / "data" / "gpu_modes_run"
LIBRARIES = ("cuDNN", "cuBLAS", "cuBLASLt")
# (framework, mode, source): (library kernels, linked to a call, their time ns), counted from the records
LINKS = {
    ("jax", "jit", "xla_trace"): (360, 360, 2976880),
    ("mxnet", "hybridized", "nsys"): (580, 580, 5598281),
    ("mxnet", "imperative", "nsys"): (580, 580, 5658541),
    ("pytorch", "compile", "kineto"): (360, 360, 3240987),
    ("pytorch", "compile", "nsys"): (360, 360, 3224420),
    ("pytorch", "compile-graphs", "kineto"): (360, 360, 3260577),
    ("pytorch", "cuda-graph", "kineto"): (340, 340, 3509469),
    ("pytorch", "eager", "kineto"): (340, 340, 3492743),
    ("pytorch", "eager", "nsys"): (340, 340, 3500258),
}


def _independent_links() -> dict:
    rows = pq.read_table(RUN / "records.parquet",
                         columns=["framework", "mode", "source", "kind", "library", "call_event_id", "dur_ns"]).to_pylist()
    out: dict = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        if r["kind"] == "kernel" and r["library"] in LIBRARIES:
            c = out[(r["framework"], r["mode"], r["source"])]
            c[0] += 1
            c[1] += r["call_event_id"] is not None
            c[2] += r["dur_ns"]
    return {k: tuple(v) for k, v in out.items()}


def test_every_record_carries_its_typed_case():
    rd = RunDir(RUN)
    df = rd.read_records()
    asked = {CaseKey.from_fields(c) for c in rd.read_manifest()["config"]["cases"]}
    assert len(asked) == 7 and {k.mode for k in asked} == {"eager", "cuda-graph", "compile", "compile-graphs",
                                                             "imperative", "hybridized", "jit"}
    for col in ("framework", "mode", "math", "devices", "batch_size"):
        assert df[col].notna().all(), col
    got = {CaseKey(*(r[c] for c in ("framework", "mode", "math", "devices", "batch_size")))
           for r in df[["framework", "mode", "math", "devices", "batch_size"]].drop_duplicates().to_dict("records")}
    assert got == asked
    assert {e.key for e in rd.read_cases()} == asked
    assert len(df) == 46162


def test_every_library_kernel_linked_in_every_mode():
    assert _independent_links() == LINKS
    attr = json.loads((RUN / "attribution.json").read_text())
    folders = {str(e.dir): e.key for e in RunDir(RUN).read_cases()}
    seen = {}
    for folder, run in attr["runs"].items():
        key = folders[folder]
        for source, b in run["by_source"].items():
            if b.get("library_kernels"):
                seen[(key.framework, key.mode, source)] = (b["library_kernels"], b["library_kernels_linked"],
                                                           b["library_kernel_time_linked_share"])
    assert seen == {k: (n, linked, 1.0) for k, (n, linked, _) in LINKS.items()}
