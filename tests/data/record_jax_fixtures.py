"""Record the JAX profiler fixtures (real traces) and time the jitted step.

    python tests/data/record_jax_fixtures.py trace OUT_DIR --device cpu|gpu [--data DIR] [--steps 10]
    python tests/data/record_jax_fixtures.py libs OUT_DIR [--data DIR]     # under cuDNN/cuBLASLt log env
    python tests/data/record_jax_fixtures.py time OUT_DIR --device gpu [--batch-sizes 64,256,1024]
    python tests/data/record_jax_fixtures.py fixture OUT_DIR NAME            # -> tests/data/NAME/

``trace``: the JAX Workload at batch size 64, 5 warm-up steps, then ``--steps`` steps under
``frameworks/jax/capture.profiler_trace`` each in ``kernelmap:step#N`` and synchronised after
it (as ``kernelmap run``'s worker does); writes OUT_DIR/trace.json.gz, the HLO text
(``jit_train_step.hlo.txt.gz``) and OUT_DIR/trace_meta.json (versions, steps, data).
``time``: per batch size, one batch placed on the device once, 20 warm-up steps, then 200 steps
each timed to ``block_until_ready`` (median, quartiles) and 200 steps dispatched back to back with
one wait at the end (mean). ``fixture``: copies the trace and HLO text from OUT_DIR to
tests/data/NAME/ (gzip level 9, mtime 0), unchanged in content.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _workload(device: str, batch_size: int, data: str):
    from kernelmap.frameworks import load_workload, spec

    cfg = spec.TrainConfig(device=device, batch_size=batch_size, data=data if data else "synthetic")
    return load_workload("jax")(cfg), spec


def trace(out: Path, device: str, data: str | None, steps: int, warmup: int = 5) -> None:
    from kernelmap.frameworks.jax.capture import profiler_trace

    w, spec = _workload(device, 64, data)
    n = warmup + steps
    order = spec.training_order(w.data_info.n_train, 0, n * 64)
    batches = list(w.batches("train", 64, order))
    for i in range(warmup):
        with w.region(f"kernelmap:step#{i}"):
            w.train_step(*batches[i])
        w.synchronize()
    losses = []
    with profiler_trace(out, w):
        for i in range(warmup, n):
            with w.region(f"kernelmap:step#{i}"):
                loss = w.train_step(*batches[i])
            w.synchronize()
            losses.append(float(loss))
    meta = {"versions": w.versions(), "warmup_steps": warmup, "steps": steps, "batch_size": 64,
            "data": w.data_info.to_dict(), "losses": losses}
    (out / "trace_meta.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta["versions"]), losses[-1])


def timing(out: Path, device: str, data: str | None, batch_sizes: list[int], n: int = 200) -> None:
    import jax

    res = {}
    for bs in batch_sizes:
        w, spec = _workload(device, bs, data)
        order = spec.training_order(w.data_info.n_train, 0, bs)
        x, y = next(w.batches("train", bs, order))
        for _ in range(20):
            w.train_step(x, y)
        w.synchronize()
        t = []
        for _ in range(n):
            t0 = time.perf_counter()
            w.train_step(x, y)
            w.synchronize()
            t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(n):
            w.train_step(x, y)
        w.synchronize()
        back_to_back = (time.perf_counter() - t0) / n
        q25, med, q75 = np.percentile(np.array(t) * 1e3, [25, 50, 75])
        res[bs] = {"median_ms": med, "q25_ms": q25, "q75_ms": q75, "min_ms": min(t) * 1e3,
                   "back_to_back_mean_ms": back_to_back * 1e3, "steps": n}
        print(bs, json.dumps(res[bs]), flush=True)
    res["versions"] = w.versions()
    res["device"] = str(jax.devices()[0])
    (out / "timing.json").write_text(json.dumps(res, indent=1))


def fixture(out: Path, name: str) -> None:
    dest = HERE / name
    dest.mkdir(exist_ok=True)
    for src in [out / "trace.json.gz", *sorted(out.glob("*.hlo.txt.gz"))]:
        with gzip.open(src, "rb") as fi, gzip.GzipFile(dest / src.name, "wb", compresslevel=9, mtime=0) as fo:
            fo.write(fi.read())
        print(dest / src.name, (dest / src.name).stat().st_size)
    meta = out / "trace_meta.json"
    if meta.is_file():
        (dest / "trace_meta.json").write_text(meta.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("trace", "libs", "time", "fixture"))
    p.add_argument("out")
    p.add_argument("name", nargs="?")
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=None, help="directory of MNIST IDX files (default: synthetic)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-sizes", default="64,256,1024")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.what == "trace":
        trace(out, a.device, a.data, a.steps)
    elif a.what == "libs":  # the library-log env is the caller's; only a few steps, no profiler
        w, spec = _workload("gpu", 64, a.data)
        order = spec.training_order(w.data_info.n_train, 0, 4 * 64)
        steps = 0
        for x, yb in w.batches("train", 64, order):
            w.train_step(x, yb)
            w.synchronize()
            steps += 1
        print("libs steps", steps)
    elif a.what == "time":
        timing(out, a.device, a.data, [int(b) for b in a.batch_sizes.split(",")])
    else:
        fixture(out, a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
