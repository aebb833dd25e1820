"""How much a bare PyTorch step loop moves from one process to the next on this GPU host, with and
without CPU pinning: the floor under any "repeated runs agree within X %" claim.

Each line is one fresh process: 30 warm-up steps, then 30 blocks of 10 steps on one batch already on
the GPU (as benches/bench_reference_loop.py's bare loop), the median and IQR of the blocks' ms/step.
usage: python benches/gpu_host_noise.py --batch-size 64 256 --repeats 4 --cpus all 2-5 2-3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def child(bs: int) -> None:
    from kernelmap.frameworks import load_workload, spec

    w = load_workload("pytorch")(spec.TrainConfig(batch_size=bs, device="gpu", data="synthetic", steps=None))
    info = w.data_info
    images, labels = next(iter(w.batches("train", bs, spec.training_order(info.n_train, 0, bs))))
    for _ in range(30):
        w.train_step(images, labels)
    w.synchronize()
    blocks = []
    for _ in range(30):
        t0 = time.perf_counter()
        for _ in range(10):
            w.train_step(images, labels)
        w.synchronize()
        blocks.append((time.perf_counter() - t0) / 10)
    q = statistics.quantiles(blocks, n=4)
    print(f"{statistics.median(blocks) * 1e3:.3f} {(q[2] - q[0]) * 1e3:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--cpus", nargs="+", default=["all", "2-5", "2-3"], help="taskset CPU lists; all = unpinned")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return 0
    rows: dict[tuple[int, str], list[float]] = {}
    for bs in a.batch_size:
        for _ in range(a.repeats):
            for cpus in a.cpus:  # interleaved, so a drift of the host falls on every setting alike
                cmd = [sys.executable, __file__, "--child", str(bs)]
                if cpus != "all":
                    cmd = ["taskset", "-c", cpus, *cmd]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
                med, iqr = float(out[0]), float(out[1])
                rows.setdefault((bs, cpus), []).append(med)
                print(f"bs {bs} cpus {cpus}: median {med:.3f} ms/step, IQR {iqr:.3f} (30 blocks of 10)")
    print("\nper setting, across processes: median of medians, spread (max-min)/median")
    for (bs, cpus), meds in rows.items():
        m = statistics.median(meds)
        print(f"bs {bs} cpus {cpus}: {m:.3f} ms, spread {(max(meds) - min(meds)) / m:.1%} over {len(meds)} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
