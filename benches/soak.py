"""Soak: train whole epochs and repeat profiler captures, sampling memory after each; it must stay flat.

    python benches/soak.py --framework pytorch --device gpu --epochs 10 --out soak-pytorch.json
    python benches/soak.py --framework all ...    # each framework in its own subprocess

Per epoch it samples the process's device memory as the driver sees it (nvidia-smi
--query-compute-apps, the same measure for both frameworks), the framework allocator's own figure
where it has one, and the process's resident set (VmRSS). Then it repeats the framework profiler
capture (``--captures`` times, ``--capture-steps`` steps each) in the same process and samples
again after each. The verdict compares the last sample with the one after the first epoch (or the
first capture): growth beyond ``--tolerance-mib`` is a leak, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelmap import frameworks

MIB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def driver_device_bytes(pid: int) -> int | None:
    """This process's GPU memory as nvidia-smi reports it, or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1]) * MIB
    return 0


def sample(workload, gpu: bool, label: str, t0: float) -> dict:
    gc.collect()  # unreachable cycles are garbage, not a leak: collect before measuring
    return {"label": label, "t_s": round(time.perf_counter() - t0, 3), "rss_bytes": rss_bytes(),
            "device_bytes": driver_device_bytes(os.getpid()) if gpu else None,
            "allocator_bytes": workload.allocator_bytes() if gpu else None}


def growth(samples: list[dict], key: str) -> int | None:
    vals = [s[key] for s in samples if s[key] is not None]
    return vals[-1] - vals[0] if len(vals) >= 2 else None


def soak_one(args) -> dict:
    """Runs in the framework's own process."""
    from kernelmap.frameworks import data, load_workload, spec

    gpu = args.device == "gpu"
    config = spec.TrainConfig(batch_size=args.batch_size, data=args.data, device=args.device, steps=None,
                              epochs=args.epochs)
    info = data.resolve_data(config)
    workload = load_workload(args.framework)(config, info, None)
    t0 = time.perf_counter()
    epochs: list[dict] = []
    for epoch in range(args.epochs):
        loss = None
        for images, labels in workload.batches("train", args.batch_size,
                                               spec.sample_order(info.n_train, config.seed, epoch)):
            loss = workload.train_step(images, labels)
        workload.synchronize()
        s = sample(workload, gpu, f"epoch {epoch + 1}", t0)
        s["loss"] = workload.to_float(loss)
        epochs.append(s)
        print(f"soak {args.framework}: epoch {epoch + 1}/{args.epochs} loss {s['loss']:.4f} "
              f"rss {s['rss_bytes'] / MIB:.1f} MiB device {((s['device_bytes'] or 0) / MIB):.1f} MiB",
              file=sys.stderr)
    captures: list[dict] = []
    order = spec.sample_order(info.n_train, config.seed, args.epochs)
    batches = list(zip(range(args.capture_steps), workload.batches("train", args.batch_size, order), strict=False))
    for c in range(args.captures):
        with tempfile.TemporaryDirectory() as tmp:
            with workload.profile(Path(tmp)):
                for i, (images, labels) in batches:
                    with workload.region(f"kernelmap:step#{i}"):
                        workload.train_step(images, labels)
                workload.synchronize()
        captures.append(sample(workload, gpu, f"capture {c + 1}", t0))
    result = {"framework": args.framework, "device": args.device, "batch_size": args.batch_size,
              "epochs": args.epochs, "data": info.kind, "test_accuracy": float(workload.evaluate()),
              "versions": workload.versions(), "tolerance_bytes": int(args.tolerance_mib * MIB),
              "epoch_samples": epochs, "capture_samples": captures}
    # The first epoch grows the allocator's pools; flatness is judged from its end onwards.
    result["growth_bytes"] = {
        "epochs": {k: growth(epochs, k) for k in ("rss_bytes", "device_bytes", "allocator_bytes")},
        "captures": {k: growth(captures, k) for k in ("rss_bytes", "device_bytes", "allocator_bytes")},
    }
    result["flat"] = all(v is None or v <= result["tolerance_bytes"]
                         for part in result["growth_bytes"].values() for v in part.values())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=(*frameworks.FRAMEWORKS, "all"), default="all")
    p.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data", default="auto")
    p.add_argument("--captures", type=int, default=5)
    p.add_argument("--capture-steps", type=int, default=20)
    p.add_argument("--tolerance-mib", type=float, default=16.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.framework == "all":
        rc = 0
        for fw in frameworks.FRAMEWORKS:  # one process each (its own interpreter where it has one)
            out = str(Path(args.out).with_suffix(f".{fw}.json"))
            cmd = [frameworks.get(fw).python() or sys.executable, __file__, *[a for a in (argv or sys.argv[1:])]]
            cmd[cmd.index("all")] = fw
            cmd[cmd.index(args.out)] = out
            rc |= subprocess.run(cmd).returncode
        return rc
    result = soak_one(args)
    from kernelmap.atomic import atomic_file

    with atomic_file(args.out) as fh:
        json.dump(result, fh, indent=1)
    g = result["growth_bytes"]
    print(json.dumps({"framework": result["framework"], "device": result["device"], "flat": result["flat"],
                      "growth_mib": {part: {k: None if v is None else round(v / MIB, 2) for k, v in d.items()}
                                     for part, d in g.items()}}))
    return 0 if result["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
