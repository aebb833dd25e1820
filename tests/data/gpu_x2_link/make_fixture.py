"""Make tests/data/gpu_x2_link from a run directory of ``kernelmap run --framework pytorch --devices 2 --profile all``
(README.md here says which run): every rank's Kineto trace and rank 0's libs-pass trace trimmed to their last
``--steps`` steps (``trim_devices_run.trim``), rank 0's library logs whole (gzipped: their calls are counted over the
libs pass's steps), and the nsys capture's rows (both processes in one capture) from the run's records.parquet (the
run kept no nsys.sqlite): the nsys adapter's own columns, from the first kept step's marker on.

    python tests/data/gpu_x2_link/make_fixture.py RUN_DIR [--case pytorch-x2/bs64] [--steps 3]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "foreign"))
from make_fixtures import dump, load  # noqa: E402  (scripts beside this one)
from trim_devices_run import steps_of, trim  # noqa: E402

# the nsys adapter's own columns (what nsys.label_rows reads and keeps; its labels are made again from them)
NSYS_COLUMNS = ["kind", "start_ns", "dur_ns", "correlation_id", "stream", "kernel_name", "op_name", "seq", "shapes",
                "bytes", "library", "library_call", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                "device_index", "tid", "pid"]
NSYS_ROWS = "nsys-rows.csv.gz"
LOGS = ("cudnn.log", "cublas.log", "cublaslt.log")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--case", default="pytorch-x2/bs64")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    src, out = a.run / a.case, HERE / a.case
    keep = sorted(steps_of(load(src / "trace.json.gz")))[-a.steps:]
    for rel in ("trace.json.gz", "rank1/trace.json.gz"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        dump(trim(load(src / rel), keep, src / rel), out / rel)
    libs = src / "libs" / "trace.json.gz"
    (out / "libs").mkdir(exist_ok=True)
    dump(trim(load(libs), sorted(steps_of(load(libs)))[-a.steps:], libs), out / "libs" / "trace.json.gz")
    for name in LOGS:
        with open(src / name, "rb") as fi, gzip.GzipFile(out / f"{name}.gz", "wb", 9, mtime=0) as fo:
            shutil.copyfileobj(fi, fo)
    rec = pd.read_parquet(a.run / "records.parquet")
    rec = rec[(rec["run"] == a.case) & (rec["source"] == "nsys")]
    first = rec.loc[(rec["kind"] == "step") & (rec["op_name"] == f"kernelmap:step#{keep[0]}"), "start_ns"].min()
    rows = rec[rec["start_ns"] >= first].sort_values("start_ns", kind="stable")[NSYS_COLUMNS]
    with gzip.GzipFile(out / NSYS_ROWS, "wb", 9, mtime=0) as fo:
        fo.write(rows.to_csv(index=False).encode())
    print(f"{a.case}: steps {keep[0]}-{keep[-1]}; nsys rows {len(rows)} ({rows['kind'].value_counts().to_dict()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
