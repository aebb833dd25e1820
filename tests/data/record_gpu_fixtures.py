"""Copy the GPU fixtures under tests/data/ from a ``kernelmap run`` directory (real recordings).

    python tests/data/record_gpu_fixtures.py RUN_DIR [--bs 64]

From ``RUN_DIR/pytorch/bs<N>/``: the Kineto GPU trace (``trace.json.gz``, as recorded), the cuDNN,
cuBLAS and cuBLASLt logs (whole: each is well under 1 MB gzipped), and the nsys SQLite export with
only the tables the nsys adapter reads (kernels, runtime, memcpy, memset, NVTX, strings, target
info, enums and metadata), vacuumed and gzipped. No row of a kept table is changed or dropped,
so the counts the tests check are the recording's. The run the fixtures come from is named in
``gpu_fixtures.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "CUDNN_EVENTS", "CUBLAS_EVENTS", "ThreadNames")
KEEP_PREFIX = ("TARGET_INFO_", "ENUM_", "META_DATA_")
LIMIT = 2 * 1024 * 1024


def _gzip(src: Path, dst: Path) -> None:
    with open(src, "rb") as fi, gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as fo:
        shutil.copyfileobj(fi, fo)


def trim_nsys(src: Path, dst: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "n.sqlite"
        shutil.copy(src, db)
        con = sqlite3.connect(db)
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        for t in tables:
            if t not in KEEP and not t.startswith(KEEP_PREFIX):
                con.execute(f'drop table "{t}"')
        con.commit()
        con.execute("vacuum")
        con.close()
        _gzip(db, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--bs", type=int, default=64)
    a = ap.parse_args()
    d = a.run_dir / "pytorch" / f"bs{a.bs}"
    shutil.copy(d / "trace.json.gz", HERE / "gpu_kineto.json.gz")
    for name in ("cudnn", "cublas", "cublaslt"):
        _gzip(d / f"{name}.log", HERE / f"gpu_{name}.log.gz")
    trim_nsys(d / "nsys.sqlite", HERE / "gpu_nsys.sqlite.gz")
    manifest = json.loads((a.run_dir / "manifest.json").read_text())
    passes = {p: json.loads((d / f"{p}.json").read_text()) for p in ("framework", "libs", "nsys")}
    info = {"run_dir": str(a.run_dir), "batch_size": a.bs,
            "gpu": manifest.get("gpu"), "versions": passes["libs"].get("versions"),
            "steps": {p: {"warmup_steps": v.get("warmup_steps"), "steps": v.get("steps")} for p, v in passes.items()}}
    (HERE / "gpu_fixtures.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    for f in ("gpu_kineto.json.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz", "gpu_nsys.sqlite.gz"):
        size = (HERE / f).stat().st_size
        print(f"{f}: {size} bytes")
        if size > LIMIT:
            raise SystemExit(f"{f} is over {LIMIT} bytes")


if __name__ == "__main__":
    main()
