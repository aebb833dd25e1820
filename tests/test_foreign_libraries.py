"""The library of a kernel by its name (kernelmap/adapters/kernel_libraries.py) on real traces of current CUDA
releases, checked against an independent reading of the raw JSON (stdlib json, numbers as Decimal):

* tracelens_h100_timesformer_inference: AMD-AGI/TraceLens
  tests/traces/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz @ 171dd74721ca1ec45709e5805b68ae1f65e27811
  (H100, bf16 inference: sm90_xmma_gemm_..._cublas, cutlass::Kernel2<cutlass_75_/80_...>, gemvx, cuDNN's CUTLASS);
  its top-level ``metadata`` (the machine's environment) dropped. Before: 34.6% of its kernel time "unknown".
* tracelens_b200_vllm_nvjet: same repository and commit, tests/traces/b200/eager_trace.json.gz (vLLM on a B200:
  nvjet_* gemms).
"""

from __future__ import annotations

import decimal
import gzip
import json
import re
from pathlib import Path

import pytest

from kernelmap import adapters
from kernelmap.adapters import kernel_libraries

DATA = Path(__file__).parent / "data" / "foreign"
H100 = "tracelens_h100_timesformer_inference.json.gz"
B200 = "tracelens_b200_vllm_nvjet.json.gz"


def kernels(name: str) -> list:
    doc = json.loads(gzip.decompress((DATA / name).read_bytes()), parse_float=decimal.Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]


def ns(v) -> int:
    return int((decimal.Decimal(v) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def cublas_family(n: str) -> bool:
    """The test's own reading of cuBLAS's kernel names in these traces (not the table's patterns)."""
    return (n.startswith("sm90_xmma_gemm_") and n.endswith("_cublas") or n.startswith("nvjet_")
            or n.startswith("void cutlass::Kernel2<cutlass_75_") or n.startswith("void cutlass::Kernel2<cutlass_80_")
            or "internal::gemvx::kernel" in n)


@pytest.mark.parametrize("name", [H100, B200])
def test_cublas_kernels_by_name(name):
    """Every cuBLAS-family kernel of the trace has library cuBLAS: count and time exactly the raw trace's."""
    ks = kernels(name)
    fam = [e for e in ks if cublas_family(e["name"])]
    assert fam
    df = adapters.read(DATA / name)
    k = df[df["kind"] == "kernel"]
    got = k[k["kernel_name"].map(cublas_family)]
    assert set(got["library"]) == {"cuBLAS"}
    assert len(got) == len(fam) and int(got["dur_ns"].sum()) == sum(ns(e["dur"]) for e in fam)
    if name == B200:
        assert got["kernel_name"].str.startswith("nvjet_").sum() == sum(e["name"].startswith("nvjet_") for e in ks) > 0


def test_h100_unknown_library_time():
    """The H100 transformer trace's kernel time of unknown library is exactly that of its kernels that are
    neither cuBLAS's, cuDNN's, NCCL's nor PyTorch's own (at::native): 0.06%, where it was 34.6%."""
    ks = kernels(H100)
    total = sum(ns(e["dur"]) for e in ks)
    rest = [e for e in ks if not (cublas_family(e["name"]) or "cudnn" in e["name"].lower() or "nccl" in e["name"].lower()
                                  or "at::native" in e["name"])]
    df = adapters.read(DATA / H100)
    k = df[df["kind"] == "kernel"]
    unknown = int(k.loc[k["library"].isna(), "dur_ns"].sum())
    assert unknown == sum(ns(e["dur"]) for e in rest)
    assert unknown / total < 0.001
    assert sum(ns(e["dur"]) for e in ks if cublas_family(e["name"])) / total > 0.34  # what was "unknown"
    assert set(k.loc[k["kernel_name"].str.contains("cutlass__5x_cudnn", regex=False), "library"]) == {"cuDNN"}


def _names() -> set:
    """Every kernel name of the repository's real traces (tests/data)."""
    out = set()
    for f in (DATA.parent).rglob("*.json.gz"):
        try:
            doc = json.loads(gzip.decompress(f.read_bytes()))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            out |= {e.get("name") for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel")}
    return out - {None}


def test_every_row_of_the_table_names_real_kernels():
    """Each row of KERNEL_LIBRARIES is the first match of at least one kernel of a real trace here (no row
    that nothing real backs), and none of PyTorch's own kernels (at::native, pytorch_flash, which use
    CUTLASS types in their template arguments) is given a library by it."""
    names = _names()
    first = {i: [] for i in range(len(kernel_libraries.KERNEL_LIBRARIES))}
    for n in names:
        for i, (_, pat, _) in enumerate(kernel_libraries.KERNEL_LIBRARIES):
            if re.search(pat, n):
                first[i].append(n)
                break
    assert all(first.values()), [kernel_libraries.KERNEL_LIBRARIES[i][2] for i, v in first.items() if not v]
    own = [n for n in names if "at::native" in n or "pytorch_flash" in n]
    assert own and not [n for n in own if kernel_libraries.library_of(n)]
