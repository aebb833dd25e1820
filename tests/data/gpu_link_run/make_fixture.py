"""Make tests/data/gpu_link_run/{all,hyb} from the two run directories of the link runs (recorded on an H200 by
the GPU job of commit a93316a).

    python tests/data/gpu_link_run/make_fixture.py LINK_ALL_RUN_DIR LINK_HYB_RUN_DIR

Kept, as recorded: manifest.json, results.json, each pass's worker json, the libs pass's cuDNN/cuBLAS/cuBLASLt
logs and its own kernel trace (``libs/``), the timing passes' traces (Kineto, XLA trace and HLO text, nsys).
Dropped: logs/ (worker stderr), records.parquet, attribution.json and parity-*.json (the test normalises
again), the JAX libs pass logs (JAX's links come from the HLO text), MXNet's own profiler trace (its
kernels are taken from nsys).
Each nsys export keeps every row of every table it had, with only the columns
kernelmap.adapters.nsys reads (``COLUMNS``); the other tables are kept whole. Every file is gzipped
(level 9, mtime 0)."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId", "streamId", "gridX", "gridY", "gridZ", "blockX",
                                   "blockY", "blockZ", "demangledName", "shortName", "globalPid", "deviceId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId", "bytes", "streamId", "deviceId"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId", "bytes", "streamId", "deviceId"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "correlationId", "nameId", "globalTid"),
    "NVTX_EVENTS": ("start", "end", "text", "textId", "eventType", "globalTid"),
    "CUDNN_EVENTS": ("start", "end", "nameId", "globalTid"),
    "CUBLAS_EVENTS": ("start", "end", "nameId", "globalTid"),
}
SKIP_DIRS = ("logs",)
SKIP_FILES = ("records.parquet", "attribution.json")


def _gzip_bytes(data: bytes, dst: Path) -> None:
    with gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as fo:
        fo.write(data)


def trim_sqlite(src: Path, dst: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "n.sqlite"
        db.write_bytes(gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes())
        con = sqlite3.connect(db)
        for t, keep in COLUMNS.items():
            have = [r[1] for r in con.execute(f'pragma table_info("{t}")')]
            if not have:
                continue
            cols = ", ".join(f'"{c}"' for c in have if c in keep)
            con.execute(f'create table "_{t}" as select {cols} from "{t}" order by rowid')
            con.execute(f'drop table "{t}"')
            con.execute(f'alter table "_{t}" rename to "{t}"')
        # an index SQLite made for a UNIQUE constraint (no sql) goes with its table and cannot be dropped
        for (name,) in con.execute("select name from sqlite_master where type='index' and sql is not null").fetchall():
            con.execute(f'drop index if exists "{name}"')
        con.commit()
        con.execute("vacuum")
        con.close()
        _gzip_bytes(db.read_bytes(), dst.with_suffix(".gz") if dst.suffix != ".gz" else dst)


def copy_run(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or rel.parts[0] in SKIP_DIRS or rel.name in SKIP_FILES or rel.name.startswith("parity-"):
            continue
        fw = rel.parts[0] if len(rel.parts) > 2 else ""
        if fw == "jax" and rel.name.startswith(("cudnn.log", "cublas.log", "cublaslt.log")):
            continue
        if fw.startswith("mxnet") and rel.parts[-1] == "trace.json.gz" and len(rel.parts) == 3:
            continue
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if ".sqlite" in rel.name:
            trim_sqlite(f, out)
        elif rel.suffix == ".gz" or rel.suffix == ".json":
            shutil.copy(f, out)
        else:
            _gzip_bytes(f.read_bytes(), out.with_name(out.name + ".gz"))


def main() -> None:
    for src, name in zip(map(Path, sys.argv[1:3]), ("all", "hyb"), strict=True):
        copy_run(src, HERE / name)
    total = sum(f.stat().st_size for f in HERE.rglob("*") if f.is_file())
    print(f"{HERE}: {total} bytes")


if __name__ == "__main__":
    main()
