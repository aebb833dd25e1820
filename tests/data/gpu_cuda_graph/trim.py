"""Trim a real cuda-graph framework pass to its first steps and count what it replays (stdlib only).

The capture: ``kernelmap run --framework pytorch --mode cuda-graph --device gpu --profile framework
--steps 50 --trials 3 --batch-size 64 1024`` on an H200 (torch 2.11+cu130); its run directory's
``pytorch-cuda-graph/bs{64,1024}/{trace.json.gz,graph-reference.json.gz}``.

    python trim.py RUN/pytorch-cuda-graph/bs64 tests/data/gpu_cuda_graph
    python trim.py RUN/pytorch-cuda-graph/bs1024 tests/data/gpu_cuda_graph/bs1024

and fp16/ (fp16 with GradScaler inside the graph: its memcpys replayed as kernels "memcpy32_post"), from two
runs of the 4x H200 hold of 2026-11-27 (commit 80ea457, torch 2.11+cu130): ``kernelmap run --math bf16 fp16
--mode all --profile framework --batch-size 64`` (bs64) and ``kernelmap run --framework all --device gpu
--math fp16 --mode all --profile all --batch-size 1024 --steps 20`` (bs1024):

    python trim.py RUN4/pytorch-cuda-graph-fp16/bs64 tests/data/gpu_cuda_graph/fp16/bs64
    python trim.py RUN1/pytorch-cuda-graph-fp16/bs1024 tests/data/gpu_cuda_graph/fp16/bs1024

writes DEST/trace.json.gz (the first ``--steps`` profiled steps: their host events, the device events and
flows their launches correlate with, their GPU step annotations; the events of no step kept), a copy of
graph-reference.json.gz, and DEST/expected.json: what an independent reader (this file, no kernelmap)
counts in the trimmed trace, for tests/test_graph_replay.py:

- graph_launches, replayed_device_events, replayed_kernels, replayed_device_ns: the device events
  (kernel, gpu_memset, gpu_memcpy) correlating with a cudaGraphLaunch and their summed duration (ns),
  as benches/graph_vs_bare.py counts them;
- replayed_memset_nodes: replayed events of category "kernel" named memset/memset8..64 (Kineto's name of
  a graph's memset node; eagerly the same memset is a gpu_memset "Memset (Device)");
- replayed_memcpy_nodes: likewise memcpy8..128 with or without "_post" (a graph's memcpy node; eagerly a
  gpu_memcpy "Memcpy DtoD (Device -> Device)"); eager_memcpys: gpu_memcpy events correlating with no graph
  launch (the input batch copied into the graph's tensors), eager_memcpy_bytes their sizes;
- reference_device_events, reference_memsets (gpu_memset), reference_memset_kernels (kernels named as a
  memset node: 0 where the old name matching fails), reference_memcpys (gpu_memcpy) and their bytes;
- launches_in_reference_order: launches whose device events, in start order, are the reference step's in
  start order (a memset or memcpy node counted as a memset or memcpy, every gpu_memcpy as a memcpy): each replayed event's twin is then the reference's
  event at its position.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
from pathlib import Path

HOST = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
STEP = "kernelmap:step#"
MEMSET_NODE = re.compile(r"^memset(8|16|32|64)?$")
MEMCPY_NODE = re.compile(r"^memcpy(8|16|32|64|128)(_post)?$")


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def trim(doc: dict, steps: int) -> tuple[dict, list[str]]:
    ev = doc["traceEvents"]
    marks = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith(STEP)), key=lambda e: e["ts"])
    kept = [m["name"] for m in marks[:steps]]
    if len(marks) <= steps:
        return doc, kept
    cut = marks[steps]["ts"]  # host events from the first dropped step on go
    dropped_host = [e for e in ev if e.get("ph") == "X" and e.get("cat") in HOST and e["ts"] >= cut]
    gone = {e["args"]["correlation"] for e in dropped_host if "correlation" in e.get("args", {})}
    drop = {id(e) for e in dropped_host}
    out = []
    for e in ev:
        if id(e) in drop:
            continue
        if e.get("cat") in DEVICE and e.get("args", {}).get("correlation") in gone:
            continue
        if e.get("ph") in ("s", "f") and e.get("cat") == "ac2g" and e.get("id") in gone:
            continue
        if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith(STEP) and e["name"] not in kept:
            continue
        out.append(e)
    return {**doc, "traceEvents": out}, kept


def _norm(e: dict) -> str:
    if e["cat"] == "gpu_memset" or (e["cat"] == "kernel" and MEMSET_NODE.match(e["name"])):
        return "memset"
    return "memcpy" if e["cat"] == "gpu_memcpy" or (e["cat"] == "kernel" and MEMCPY_NODE.match(e["name"])) else e["name"]


def count(trace: dict, reference: dict) -> dict:
    ev = trace["traceEvents"]
    launch = {e["args"]["correlation"] for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
              and e.get("name") in LAUNCH and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("ph") == "X" and e.get("cat") in DEVICE
           and e.get("args", {}).get("correlation") in launch]
    ref = sorted((e for e in reference["traceEvents"] if e.get("ph") == "X" and e.get("cat") in DEVICE),
                 key=lambda e: e["ts"])
    ref_seq = [_norm(e) for e in ref]
    eager = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy"
             and e.get("args", {}).get("correlation") not in launch]
    per = {c: sorted((e for e in dev if e["args"]["correlation"] == c), key=lambda e: e["ts"]) for c in launch}
    return {"graph_launches": len(launch), "replayed_device_events": len(dev),
            "replayed_kernels": sum(1 for e in dev if e["cat"] == "kernel"),
            "replayed_device_ns": sum(round(e["dur"] * 1000) for e in dev),
            "replayed_memset_nodes": sum(1 for e in dev if e["cat"] == "kernel" and MEMSET_NODE.match(e["name"])),
            "reference_device_events": len(ref),
            "reference_memsets": sum(1 for e in ref if e["cat"] == "gpu_memset"),
            "reference_memset_kernels": sum(1 for e in ref if e["cat"] == "kernel" and MEMSET_NODE.match(e["name"])),
            "replayed_memcpy_nodes": sum(1 for e in dev if e["cat"] == "kernel" and MEMCPY_NODE.match(e["name"])),
            "reference_memcpys": sum(1 for e in ref if e["cat"] == "gpu_memcpy"),
            "reference_memcpy_bytes": [e["args"].get("bytes") for e in ref if e["cat"] == "gpu_memcpy"],
            "eager_memcpys": len(eager), "eager_memcpy_bytes": sorted({e["args"].get("bytes") for e in eager}),
            "launches_in_reference_order": sum(1 for v in per.values() if [_norm(e) for e in v] == ref_seq)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="a run directory's pytorch-cuda-graph/bsN folder")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    a.dest.mkdir(parents=True, exist_ok=True)
    src_trace = a.src / "trace.json.gz"
    doc, kept = trim(_load(src_trace), a.steps)
    with open(a.dest / "trace.json.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as fh:
        fh.write(json.dumps(doc, separators=(",", ":")).encode())
    shutil.copyfile(a.src / "graph-reference.json.gz", a.dest / "graph-reference.json.gz")
    exp = count(doc, _load(a.dest / "graph-reference.json.gz"))
    exp["source"] = {"trace_sha256": hashlib.sha256(src_trace.read_bytes()).hexdigest(),
                     "untrimmed": count(_load(src_trace), _load(a.dest / "graph-reference.json.gz")), "steps_kept": kept}
    (a.dest / "expected.json").write_text(json.dumps(exp, indent=1) + "\n")
    print(json.dumps(exp, indent=1))


if __name__ == "__main__":
    main()
