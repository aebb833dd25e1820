"""The math column on a real `--math tf32` run (tests/data/gpu_tf32_run, H200, bs 1024, framework pass only: no
library log, so a kernel's math comes from its XLA call's HLO or its name). As recorded on the GPU, 'math known'
failed JAX at 57.8% of its library-kernel time and PyTorch at 79.4%: the sm80 xmma kernel whose name carries
qualifier words (`..._fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32_...`) and cuDNN's legacy
`wgrad_alg0_engine[_NHWC]<float, ...>` had none. Filled again with today's rules: every library kernel's math
known (a layout conversion counted as multiplying nothing)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from kernelmap.reports.analyses import math as M
from kernelmap.reports.analyses.base import load_run

from kernelmap import kernelmath, schema

RUN = Path(__file__).parent / "data" / "gpu_tf32_run"


def _refilled(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    df = schema.read_parquet(d / "records.parquet")
    kern = df["kind"] == "kernel"
    for col in ("math_ran", "math_dtypes", "math_source", "math_unit"):
        df.loc[kern, col] = pd.NA
    assert kernelmath.fill(df) == {"tf32_overridden_calls": 0, "kernels_math_from_call": 20,
                                   "kernels_math_from_name": 340, "kernels_math_from_op": 0}
    schema.write_parquet(df, d / "records.parquet")
    return d


def test_recorded_math_coverage_fell_short(tmp_path):
    cov = M.math_coverage([load_run(RUN)]).set_index("case")
    assert round(cov.loc["jax-tf32", "share"], 4) == 0.5782
    assert round(cov.loc["pytorch-tf32", "share"], 4) == 0.7938
    assert "wgrad_alg0_engine" in cov.loc["pytorch-tf32", "unknown_top"]


def test_every_library_kernel_of_the_tf32_run_has_its_math(tmp_path):
    run = load_run(_refilled(tmp_path))
    cov = M.math_coverage([run]).set_index("case")
    assert cov.loc["jax-tf32", ["kernels", "kernels_with_math"]].tolist() == [200, 200]
    assert cov.loc["pytorch-tf32", ["kernels", "kernels_with_math"]].tolist() == [420, 420]
    assert cov["share"].tolist() == [1.0, 1.0]
    rec = schema.read_parquet(tmp_path / "run" / "records.parquet")
    k = rec[(rec["kind"] == "kernel") & rec["math_ran"].notna()]
    names = k["kernel_name"].str.removeprefix("void ")

    def n(framework: str, prefix: str, math: str) -> int:
        return int(((k["framework"] == framework) & names.str.startswith(prefix) & (k["math_ran"] == math)).sum())

    assert n("jax", "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32", "tf32") == 20
    assert n("jax", "wgrad_alg0_engine_NHWC<float,", "fp32") == 20
    assert n("pytorch", "wgrad_alg0_engine<float,", "fp32") == 20
    # asked tf32: each conv/linear product ran tf32 or fp32 (TF32 is a permission), none another math
    assert not len(M.math_mismatches(M.math_table([run])))
