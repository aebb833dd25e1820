"""PyTorch's cuda-graph mode against a bare graph-replay loop, and the graph-replay fixture's expected
counts, for the GPU job (benches/gpu_job.sh's graph phase).

    python benches/graph_vs_bare.py compare OUT RUN_DIR   # OUT/bare_modes.jsonl (.gpu/torch_modes.py) and
                                                          # RUN_DIR/results.json -> OUT/graph_vs_bare.json
    python benches/graph_vs_bare.py fixture DIR           # DIR/trace.json.gz -> DIR/expected.json

Computing returns data (``compare``, ``expected``); ``main`` writes and prints it. Standard library only:
the fixture's counts are an independent reader of the raw Kineto JSON (device events correlating with a
cudaGraphLaunch)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

GRAPH_MODE = "cuda-graph"  # the mode's name in the bare probe's lines and in results.json
LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
DEVICE_CATS = ("kernel", "gpu_memset", "gpu_memcpy")
WITHIN = 0.10  # the bound on |kernelmap / bare - 1|


def compare(bare_lines: list[str], results: list[dict]) -> list[dict]:
    """One row per batch size that both the bare probe and kernelmap's cuda-graph clean pass have."""
    bare: dict = {}
    for line in bare_lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        bare.setdefault(r.get("bs"), {})[r.get("mode")] = r
    rows = []
    for r in results:
        if r.get("mode") != GRAPH_MODE or GRAPH_MODE not in bare.get(r["batch_size"], {}):
            continue
        b = bare[r["batch_size"]][GRAPH_MODE]
        k = r["median_step_s"] * 1e3
        ci = [None if r.get(x) is None else r[x] * 1e3 for x in ("ci95_low_s", "ci95_high_s")]
        rows.append({"bs": r["batch_size"], "kernelmap_ms": k, "kernelmap_ci95_ms": ci,
                     "kernelmap_trial_medians_ms": [x * 1e3 for x in r.get("trial_medians_s", [])],
                     "bare_ms": b["median_ms"], "bare_iqr_ms": b["iqr_ms"], "ratio": k / b["median_ms"],
                     "within_10pct": abs(k / b["median_ms"] - 1) <= WITHIN,
                     "bare_eager_ms": bare[r["batch_size"]].get("eager", {}).get("median_ms")})
    return rows


def expected(trace: Path) -> dict:
    """The replayed device events of a Kineto trace, counted from the raw JSON."""
    ev = json.loads(gzip.open(trace).read())["traceEvents"]
    launch = {e["args"]["correlation"] for e in ev if e.get("ph") == "X" and e.get("name") in LAUNCHES
              and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
           and e.get("args", {}).get("correlation") in launch]
    return {"graph_launches": len(launch), "replayed_device_events": len(dev),
            "replayed_kernels": sum(1 for e in dev if e["cat"] == "kernel"),
            "replayed_device_ns": sum(round(e["dur"] * 1000) for e in dev)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["compare"] and len(argv) == 3:
        out, run = Path(argv[1]), Path(argv[2])
        try:
            results = json.loads((run / "results.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"{run}: no results.json ({exc})", file=sys.stderr)
            results = []
        rows = compare((out / "bare_modes.jsonl").read_text().splitlines(), results)
        (out / "graph_vs_bare.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows, indent=1))
        return 0
    if argv[:1] == ["fixture"] and len(argv) == 2:
        d = Path(argv[1])
        exp = expected(d / "trace.json.gz")
        (d / "expected.json").write_text(json.dumps(exp, indent=1))
        print("graph fixture:", exp)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
