"""Record a real model's GPU trace for ``benches/bench_normalise.py --input``: ResNet-50 training
steps (SGD, cross-entropy, synthetic ImageNet-shaped batch already on the GPU) under the same
profilers kernelmap's PyTorch workload uses.

    python benches/record_resnet50_trace.py kineto OUT.json.gz [--steps 120] [--batch-size 32]
    nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o R \\
        python benches/record_resnet50_trace.py nsys - [--steps 40]   # then nsys export --type sqlite R.nsys-rep

``kineto``: torch.profiler (CPU + CUDA activities, record_shapes) around the steps, written as a
Chrome trace and gzip-compressed. ``nsys``: ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``
inside a cudaProfilerStart/Stop window. The model is torchvision's ``resnet50()`` where torchvision is
installed, else the same architecture defined below (said in the JSON line printed at the end).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import torch
from torch import nn


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (stride on the 3x3 conv, v1.5)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, stride=2)
        self.layer3 = self._layer(256, 6, stride=2)
        self.layer4 = self._layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                 nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def model() -> tuple[nn.Module, str]:
    try:
        import torchvision

        return torchvision.models.resnet50(), f"torchvision {torchvision.__version__} resnet50()"
    except ImportError:
        return ResNet50(), "ResNet-50 as defined in benches/record_resnet50_trace.py (torchvision not installed)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("kineto", "nsys"))
    ap.add_argument("out", help="the .json.gz to write (kineto), '-' for nsys")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("record_resnet50_trace: no CUDA device (torch.cuda.is_available() is False)")
    dev = torch.device("cuda")
    net, which = model()
    net = net.to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(args.batch_size, 3, 224, 224, device=dev, generator=gen)
    y = torch.randint(0, 1000, (args.batch_size,), device=dev, generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if args.mode == "kineto":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for i in range(args.steps):
                with torch.profiler.record_function(f"ProfilerStep#{i}"):
                    step()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as fin, gzip.open(args.out + ".partial", "wb", compresslevel=6) as fout:
                shutil.copyfileobj(fin, fout)
            os.replace(args.out + ".partial", args.out)
    else:
        torch.cuda.cudart().cudaProfilerStart()
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            for i in range(args.steps):
                torch.cuda.nvtx.range_push(f"ProfilerStep#{i}")
                step()
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(json.dumps({"mode": args.mode, "model": which, "steps": args.steps, "batch_size": args.batch_size,
                      "seconds": round(time.perf_counter() - t0, 2), "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
