"""``kernelmap doctor``: what is installed and usable here, each missing piece with its fix.

Each framework is probed in its own subprocess (``python -c``), so the doctor imports no
framework itself and PyTorch's CUDA and MXNet's CUDA 11 never meet in one process. The doctor is
a report: it exits 0 even when things are missing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from . import gpuinfo

FIX = {
    "pytorch": "pip install 'kernelmap[pytorch]' (a CUDA build for GPUs: see https://pytorch.org/get-started)",
    "mxnet": "pip install 'kernelmap[mxnet]' (CPU) or 'kernelmap[mxnet-gpu]' (mxnet-cu112 + CUDA 11 libraries); "
    "needs Python 3.11 and numpy < 1.24; on sm_90 and newer: kernelmap build-mxnet",
    "nsys": "install Nsight Systems (https://developer.nvidia.com/nsight-systems) and put `nsys` on PATH",
    "ncu": "install Nsight Compute (https://developer.nvidia.com/nsight-compute) and put `ncu` on PATH",
    "torch-cuda": "install a CUDA build of torch, e.g. pip install torch --index-url "
    "https://download.pytorch.org/whl/cu130, on a machine with an NVIDIA GPU and driver",
}

# Each probe prints one JSON line last on stdout. Imports may print to stdout first; only the
# last line is read.
_PROBES = {
    "pytorch": r"""
import json, torch
d = {"version": torch.__version__, "cuda_build": torch.version.cuda,
     "cuda_available": bool(torch.cuda.is_available()), "devices": []}
d["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
if d["cuda_available"]:
    for i in range(torch.cuda.device_count()):
        cc = torch.cuda.get_device_capability(i)
        d["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                             "compute_capability": f"{cc[0]}.{cc[1]}"})
    d["arch_list"] = torch.cuda.get_arch_list()
print(json.dumps(d))
""",
    "mxnet": r"""
import json
import os
from kernelmap.frameworks.mxnet import built, cuda11
tree = os.environ.get(built.ENV_TREE)  # an MXNet built for this GPU (PYTHONPATH names its python/)
pre = built.preload(tree) if tree else cuda11.preload()  # else the CUDA 11 wheels of mxnet-cu112, if any
import mxnet as mx
f = mx.runtime.Features()
cuda = f.is_enabled("CUDA")
d = {"version": mx.__version__, "cuda_build": cuda, "cudnn_build": f.is_enabled("CUDNN"),
     "onednn_build": f.is_enabled("MKLDNN"), "num_gpus": mx.context.num_gpus() if cuda else 0,
     "cuda11_preload": pre.describe(), "built_tree": tree, "module": mx.__file__}
d["cuda_available"] = d["num_gpus"] > 0
print(json.dumps(d))
""",
}


def mxnet_env(compute_capability: str | None = None) -> dict[str, str] | None:
    """Environment entries that make a subprocess import the MXNet built for this GPU by
    ``kernelmap build-mxnet`` (frameworks/mxnet/built.py), or None where there is none."""
    from kernelmap.frameworks.mxnet import built  # framework-free module

    if compute_capability is None:
        gpus = gpuinfo.query()
        compute_capability = gpus.gpus[0].compute_capability if gpus.gpus else None
    tree = built.tree_for_gpu(compute_capability)
    return built.worker_env(tree) if tree is not None else None


def probe_framework(name: str, timeout: float = 180.0) -> dict[str, Any]:
    """Import framework ``name`` in a fresh interpreter; return its facts, or why it failed.

    The result always has ``installed`` (bool); when False, ``error`` (the last stderr line) and
    ``fix``. MXNet is probed from the tree built for this GPU where there is one (``mxnet_env``).
    """
    extra = mxnet_env() if name == "mxnet" else None
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBES[name]], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **extra} if extra else None,
        )
    except subprocess.TimeoutExpired:
        return {"installed": False, "error": f"importing {name} took more than {timeout:.0f} s", "fix": FIX[name]}
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not lines:
        err = [line for line in out.stderr.splitlines() if line.strip()]
        return {
            "installed": False,
            "error": err[-1] if err else f"probe exited {out.returncode}",
            "fix": FIX[name],
        }
    facts = json.loads(lines[-1])
    facts["installed"] = True
    return facts


IMPORT_NAMES = {"pytorch": ("torch", "torchvision"), "mxnet": ("mxnet",)}


def find_framework(name: str) -> dict[str, Any]:
    """Whether ``name``'s modules are installed, without importing them (cheaper than a probe;
    enough where no GPU question is asked). Same shape as ``probe_framework``'s answer."""
    import importlib.util

    for module in IMPORT_NAMES[name]:
        if importlib.util.find_spec(module) is None:
            return {"installed": False, "error": f"No module named {module!r}", "fix": FIX[name]}
    return {"installed": True}


def find_tool(name: str) -> str | None:
    """``nsys``/``ncu`` on PATH, else in the usual Nsight and CUDA install folders (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    patterns = [
        f"/opt/nvidia/nsight-systems*/*/bin/{name}",
        f"/opt/nvidia/nsight-systems/*/bin/{name}",
        f"/opt/nvidia/nsight-compute/*/{name}",
        f"/opt/nvidia/nsight-compute*/{name}",
        f"/usr/local/cuda*/bin/{name}",
    ]
    hits = sorted({p for pat in patterns for p in glob.glob(pat) if os.access(p, os.X_OK)}, reverse=True)
    return hits[0] if hits else None


def mxnet_gpu_verdict(compute_capability: str | None) -> tuple[bool, str]:
    """Whether an MXNet here has machine code for this GPU: one built by ``kernelmap build-mxnet``
    (read from its library's fatbins), else the cu11x wheel (frameworks/mxnet/cuda11.py)."""
    from kernelmap.frameworks.mxnet.built import gpu_verdict  # framework-free module

    if compute_capability is None:
        return False, "no NVIDIA GPU found"
    major, minor = compute_capability.split(".")
    return gpu_verdict((int(major), int(minor)))


def collect() -> dict[str, Any]:
    """Everything the doctor reports, as one JSON-able dict."""
    gpus = gpuinfo.query()
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu": gpuinfo.cpu_model(),
        "gpu": gpus.to_dict(),
        "frameworks": {name: probe_framework(name) for name in _PROBES},
        "profilers": {},
        "missing": [],
    }
    for tool in ("nsys", "ncu"):
        path = find_tool(tool)
        report["profilers"][tool] = path
        if path is None:
            report["missing"].append({"what": tool, "fix": FIX[tool]})
    for name, facts in report["frameworks"].items():
        if not facts["installed"]:
            report["missing"].append({"what": name, "fix": facts["fix"], "error": facts["error"]})
    if not gpus.gpus:
        report["missing"].append(
            {"what": "NVIDIA GPU", "fix": "run on a machine with an NVIDIA GPU and driver", "error": gpus.problem}
        )
    else:
        torch_facts = report["frameworks"]["pytorch"]
        if torch_facts["installed"] and not torch_facts["cuda_available"]:
            report["missing"].append({"what": "torch CUDA", "fix": FIX["torch-cuda"]})
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    ok, msg = mxnet_gpu_verdict(cc)
    report["mxnet_on_this_gpu"] = {"ok": ok, "compute_capability": cc, "message": msg}
    return report


def _print_text(r: dict[str, Any]) -> None:
    print(f"python      {r['python']} ({r['executable']})")
    print(f"cpu         {r['cpu']}")
    gpus = r["gpu"]["gpus"]
    if gpus:
        for g in gpus:
            print(f"gpu {g['index']}       {g['name']}  sm {g['compute_capability']}  driver {g['driver']}")
        print(f"cuda driver {r['gpu']['cuda_driver_version']}")
    else:
        print(f"gpu         none ({r['gpu']['problem']})")
    for name, f in r["frameworks"].items():
        if not f["installed"]:
            print(f"{name:<11} MISSING: {f['error']}")
            continue
        if name == "pytorch":
            extra = f"CUDA build {f['cuda_build']}, cuDNN {f['cudnn']}, cuda available: {f['cuda_available']}"
            devs = ", ".join(f"{d['name']} (sm {d['compute_capability']})" for d in f["devices"])
            if devs:
                extra += f", devices: {devs}"
        else:
            extra = (f"CUDA build: {f['cuda_build']}, cuDNN: {f['cudnn_build']}, oneDNN: {f['onednn_build']}, "
                     f"GPUs: {f['num_gpus']}")
        print(f"{name:<11} {f['version']}  ({extra})")
    for tool, path in r["profilers"].items():
        print(f"{tool:<11} {path or 'not found'}")
    m = r["mxnet_on_this_gpu"]
    print(f"mxnet gpu   {'yes' if m['ok'] else 'no'}: {m['message']}")
    if r["missing"]:
        print("\nmissing:")
        for item in r["missing"]:
            print(f"  {item['what']}: {item['fix']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0
