"""Make tests/data/gpu_mxnet_h200_libs from a run directory of `kernelmap run --framework mxnet --device gpu
--profile all --batch-size 1024 --steps 20` (its small files suffice: records.parquet and mxnet/bs1024/).

    python tests/data/gpu_mxnet_h200_libs/make_fixture.py RUN_DIR

Kept: the libs pass's cuBLAS and cuBLASLt logs whole (gzipped, mtime 0), its pass file libs.json whole, and
trace.csv.gz: the imperative case's nsys pass as records.parquet holds it (source nsys): its op rows, its kernel
rows and the runtime rows that launched them, with the columns calllink.launches reads. The libs pass's own
nsys export is not among the run's small files: the nsys pass of the same run stands for it (the same kernels
per op; its library kernels were linked through the libs pass's templates, 780/780)."""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).parent
COLS = ["event_id", "kind", "iteration", "phase", "op_name", "canonical_op", "layer", "direction", "library",
        "kernel_name", "start_ns", "dur_ns", "correlation_id", "op_event_id", "tid"]


def main(run_dir: str) -> None:
    run = Path(run_dir)
    bs = run / "mxnet" / "bs1024"
    for name in ("cublas.log", "cublaslt.log"):
        with open(bs / name, "rb") as fin, gzip.GzipFile(HERE / f"{name}.gz", "wb", mtime=0) as fout:
            shutil.copyfileobj(fin, fout)
    shutil.copyfile(bs / "libs.json", HERE / "libs.json")
    df = pd.read_parquet(run / "records.parquet")
    df = df[df["source"].eq("nsys") & df["framework"].eq("mxnet") & df["mode"].eq("imperative")]
    kernels = df[df["kind"].eq("kernel")]
    keep = df["kind"].isin(["op", "kernel"]) | (df["kind"].eq("runtime")
                                                & df["correlation_id"].isin(kernels["correlation_id"]))
    out = df.loc[keep, COLS].sort_values(["start_ns", "event_id"], kind="stable")
    with gzip.GzipFile(HERE / "trace.csv.gz", "wb", mtime=0) as f:
        f.write(out.to_csv(index=False).encode())


if __name__ == "__main__":
    main(sys.argv[1])
