"""Record the CPU Kineto trace of a torchvision model that tests/test_report_foreign_cpu.py reads as
"someone else's" trace (not a kernelmap run): ``.nox/frameworks/bin/python tests/data/foreign_cpu/record.py``.

torchvision's resnet18 (random weights, no download), batch 2 of 3x64x64, SGD, on the CPU with 2 threads;
torch.profiler's schedule: 1 wait, 1 warm-up, 3 active steps (ProfilerStep#2-#4), written with
``export_chrome_trace`` and gzip -9 (no timestamps in the gzip header: ``mtime=0``)."""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import torch
import torchvision

OUT = Path(__file__).with_name("resnet18_cpu_kineto.json.gz")


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    raw = OUT.with_suffix("")  # .json
    sched = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"{OUT} ({OUT.stat().st_size} bytes), torch {torch.__version__}, torchvision {torchvision.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
