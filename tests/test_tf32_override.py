"""NVIDIA_TF32_OVERRIDE from the workers' pass files, applied before any kernel takes a math (issue 38).

The real H200 fp32 run's MXNet bs 1024 case (tests/data/gpu_link_run/all), as a cuDNN whose log does not print the
variable would leave it (cuDNN 9 prints ``NVIDIA_TF32_OVERRIDE=0.`` in every trailer; here each is cut out), and
with its timing pass's fc2 backward run by another cuBLAS kernel than the libs pass's (MXNet's per-process
algorithm choice: the nsys pass's ``cutlass_80_simt_sgemm_128x64_8x5_nn`` renamed to cuBLAS's ``gemmSN_NN_kernel``),
so that fc2's backward kernels are left unlinked and take their op's one math (``kernelmath.from_op``). The logged
cuBLAS calls say TF32 (MXNet's SgemmEx under TF32 mode); the pass files say the override was 0, so every call ran
fp32, and so did the kernels that take their op's math. Applied after the kernels had taken their op's TF32, the
override left them TF32.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest

from kernelmap import kernelmath, schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "gpu_link_run" / "all"
CASE = "mxnet/bs1024"
TRAILER = " NVIDIA_TF32_OVERRIDE=0."
LIBS_KERNEL = "cutlass_80_simt_sgemm_128x64_8x5_nn_align1"
OTHER_KERNEL = ("void gemmSN_NN_kernel<float, (int)256, (int)4, (int)2, (int)8, (int)4, (int)4, (bool)0, "
                "cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<const float>, "
                "cublasGemvTensorStridedBatched<float>>(cublasGemmSmallNParams<T9, T10, T11, T1>)")


@pytest.fixture(scope="module")
def normalised(tmp_path_factory):
    run = tmp_path_factory.mktemp("tf32") / "run"
    shutil.copytree(DATA, run, ignore=shutil.ignore_patterns("jax", "pytorch", "bs64", "bs256"))
    case = run / CASE
    log = case / "cudnn.log.gz"
    text = gzip.decompress(log.read_bytes()).decode()
    assert text.count(TRAILER) == 2233
    log.write_bytes(gzip.compress(text.replace(TRAILER, "").encode()))
    sq, raw = case / "nsys.sqlite.gz", run / "nsys.sqlite"
    raw.write_bytes(gzip.decompress(sq.read_bytes()))
    with sqlite3.connect(raw) as con:
        renamed = con.execute("UPDATE StringIds SET value = ? WHERE value LIKE ?",
                              (OTHER_KERNEL, f"%{LIBS_KERNEL}%")).rowcount
    assert renamed == 2  # its demangled and its short name
    sq.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    summary = normalise_run_dir(run)
    return schema.read_parquet(run / "records.parquet"), summary["runs"][CASE]


def test_op_filled_kernels_take_the_math_their_calls_ran_under_the_override(normalised):
    rec, _ = normalised
    calls = rec[(rec["kind"] == "library_call") & (rec["layer"] == "fc2")]
    assert set(calls["math_ran"]) == {"fp32"} and len(calls) == 63
    assert calls["math_dtypes"].str.endswith(kernelmath.OVERRIDE_NOTE).all()  # each one the pass files set
    k = rec[(rec["kind"] == "kernel") & (rec["layer"] == "fc2") & (rec["math_source"] == "op")]
    # the timing pass's fc2 backward: the renamed gemm and cuBLASLt's split-K reduction, 20 steps each, unlinked
    assert k["call_event_id"].isna().all()
    assert sorted(k["kernel_name"].str.extract(r"(gemmSN_NN_kernel|splitKreduce_kernel)")[0].value_counts().items()) \
        == [("gemmSN_NN_kernel", 20), ("splitKreduce_kernel", 20)]
    assert set(k["math_ran"]) == {"fp32"}  # was tf32: the op's calls before the override


def test_the_override_is_counted_once_per_call(normalised):
    rec, figures = normalised
    calls = rec[rec["kind"] == "library_call"]
    assert figures["tf32_overridden_calls"] == int(calls["math_dtypes"].str.contains(kernelmath.OVERRIDE_NOTE,
                                                                                    regex=False).sum())
