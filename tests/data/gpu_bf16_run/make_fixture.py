"""Make tests/data/gpu_bf16_run from the run directory of issue 38's bf16 run (4x H200 hold, commit 80ea457,
run set 0 on GPU 0):

    python tests/data/gpu_bf16_run/make_fixture.py RUN_DIR

Kept, as recorded: manifest.json, results.json and, of three of its five cases (PyTorch eager, PyTorch
cuda-graph, JAX), each pass's worker json, the libs pass's cuDNN/cuBLAS/cuBLASLt logs (gzipped) and its own
trace, the timing passes' traces (Kineto, CUDA-graph references, XLA trace and HLO text) and PyTorch eager's nsys
export. Dropped: the two torch.compile cases, logs/ (worker stderr), records.parquet, attribution.json and
parity-*.json (the test normalises again). The nsys export keeps every row of every table, with only the columns
kernelmap.adapters.nsys reads in the tables ``COLUMNS`` names (tests/data/gpu_link_run/make_fixture.py's list);
the other tables whole. Every file is gzipped (level 9, mtime 0) or copied as it was."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("pytorch-bf16", "pytorch-cuda-graph-bf16", "jax-bf16")
TOP = ("manifest.json", "results.json")
_spec = importlib.util.spec_from_file_location("link_fixture", HERE.parent / "gpu_link_run" / "make_fixture.py")
_link = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_link)


def _gzip_bytes(data: bytes, dst: Path) -> None:
    with gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as fo:
        fo.write(data)


def copy_run(src: Path, dst: Path) -> None:
    if dst.exists():
        for p in dst.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            elif p.name in TOP:
                p.unlink()
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOP:
        shutil.copy(src / name, dst / name)
    for case in CASES:
        for f in sorted((src / case).rglob("*")):
            if f.is_dir():
                continue
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            if f.name == "nsys.sqlite":
                _link.trim_sqlite(f, out.with_name(f.name + ".gz"))
            elif f.suffix in (".gz", ".json"):
                shutil.copy(f, out)
            else:
                _gzip_bytes(f.read_bytes(), out.with_name(f.name + ".gz"))


def main() -> None:
    copy_run(Path(sys.argv[1]), HERE)
    total = sum(f.stat().st_size for f in HERE.rglob("*") if f.is_file() and f.suffix != ".py" and f.name != "README.md")
    print(f"{HERE}: {total} bytes")


if __name__ == "__main__":
    main()
