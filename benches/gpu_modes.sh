#!/usr/bin/env bash
# Issue 30 on the GPU machine, one device call (< 8 min on an H100 at the default STEPS):
#   benches/gpu_modes.sh            (from the repo root; the lead carries .mxtree/ and .gpu/)
# 1. installs kernelmap, unpacks the carried sm_90 MXNet tree (benches/gpu_mxnet_session.sh unpack .mxtree)
# 2. kernelmap run --framework all --device gpu --mode all --profile all --batch-size 64 1024
#    (STEPS timed steps, default 20; 1 clean trial, no repeats), nsys from .gpu/nsys-env.sh
# 3. kernelmap report --strict on it
# 4. the bare loops of the same model in the same session (.gpu/torch_modes.py: eager, one CUDA graph,
#    compile default and reduce-overhead), and the cuda-graph clean step against the bare graph replay
# Back in $OUT:
#   run.json / run.err        kernelmap run's --json summary and its console
#   report.log, report.tar.xz the report's console (self-checks) and the report (html + tables/)
#   run.tar.xz                the run dir trimmed (< 40 MB): manifest, results, parity, records.parquet,
#                             attribution.json, logs/, every */bs*/*.json, the PyTorch modes' Kineto traces
#   bare_modes.jsonl          one JSON line per mode x bs of .gpu/torch_modes.py
#   graph_vs_bare.json        kernelmap's pytorch-cuda-graph clean step (median, 95% CI) / the bare replay's
#                             (median, IQR) per bs: the "within 10%" figure
#   graph_fixture/            tests/data/gpu_cuda_graph for tests/test_graph_replay.py: the cuda-graph bs 64
#                             framework pass (trace.json.gz, graph-reference.json.gz) and expected.json, counted
#                             by an independent stdlib reader (device events correlating with cudaGraphLaunch)
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
repo=$(pwd); out=${OUT:?set OUT}; steps=${STEPS:-20}; data=${DATA:-synthetic}
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$out"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
bash benches/gpu_mxnet_session.sh unpack .mxtree "$out/mx" 2>&1 | tail -n 3   # installs kernelmap too
[ -f .gpu/nsys-env.sh ] && source .gpu/nsys-env.sh
cd /tmp || exit 3
stamp "run"
rm -rf /tmp/modes
timeout 420 python3 -m kernelmap.cli run --framework all --device gpu --mode all --profile all --batch-size 64 1024 \
  --steps "$steps" --trials 1 --max-repeats 0 --data "$data" --out /tmp/modes --json >"$out/run.json" 2>"$out/run.err"
echo "run exit $?"; tail -n 20 "$out/run.err"
stamp "report"
python3 -m kernelmap.cli report /tmp/modes --out /tmp/modes-report --replace --strict >"$out/report.log" 2>&1
echo "report --strict exit $?"; tail -n 30 "$out/report.log"
(cd /tmp/modes-report 2>/dev/null && tar cJf "$out/report.tar.xz" .)
stamp "bare loops"
NVIDIA_TF32_OVERRIDE=0 timeout 150 python3 "$repo/.gpu/torch_modes.py" 64 1024 >"$out/bare_modes.jsonl" 2>"$out/bare_modes.err"
echo "bare exit $?"; cat "$out/bare_modes.jsonl"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
bare = {}
for line in (out / "bare_modes.jsonl").read_text().splitlines():
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("mode") == "cuda-graph":
        bare[r["bs"]] = r
rows = []
try:
    results = json.loads(Path("/tmp/modes/results.json").read_text())
except (OSError, ValueError) as exc:
    results = []
    print("no results.json:", exc)
for r in results:
    if r["framework"] == "pytorch" and r["mode"] == "cuda-graph" and r["batch_size"] in bare:
        b = bare[r["batch_size"]]
        k = r["median_step_s"] * 1e3
        rows.append({"bs": r["batch_size"], "kernelmap_ms": k, "kernelmap_ci95_ms": [r["ci95_low_s"] * 1e3 if r["ci95_low_s"] else None,
                     r["ci95_high_s"] * 1e3 if r["ci95_high_s"] else None], "kernelmap_trials": r["n_trials"],
                     "bare_ms": b["median_ms"], "bare_iqr_ms": b["iqr_ms"], "ratio": k / b["median_ms"],
                     "within_10pct": abs(k / b["median_ms"] - 1) <= 0.10})
(out / "graph_vs_bare.json").write_text(json.dumps(rows, indent=1))
print(json.dumps(rows, indent=1))
PY
stamp "fixture"
fx="$out/graph_fixture"; src=/tmp/modes/pytorch-cuda-graph/bs64
if [ -f "$src/trace.json.gz" ] && [ -f "$src/graph-reference.json.gz" ]; then
  mkdir -p "$fx" && cp "$src/trace.json.gz" "$src/graph-reference.json.gz" "$fx/"
  python3 - "$fx" <<'PY'
import gzip, json, sys
from pathlib import Path
fx = Path(sys.argv[1])
ev = json.loads(gzip.open(fx / "trace.json.gz").read())["traceEvents"]
launch = {e["args"]["correlation"] for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
          and e.get("name") in ("cudaGraphLaunch", "cuGraphLaunch") and "correlation" in e.get("args", {})}
dev = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
       and e.get("args", {}).get("correlation") in launch]
exp = {"graph_launches": len(launch), "replayed_device_events": len(dev),
       "replayed_kernels": sum(1 for e in dev if e["cat"] == "kernel"),
       "replayed_device_ns": sum(round(e["dur"] * 1000) for e in dev)}
(fx / "expected.json").write_text(json.dumps(exp, indent=1))
print("fixture:", exp)
PY
fi
stamp "pack"
(cd /tmp/modes 2>/dev/null && tar cJf "$out/run.tar.xz" --exclude='*.nsys-rep' --exclude='*.sqlite' \
   manifest.json results.json parity-*.json records.parquet attribution.json logs */bs*/*.json \
   pytorch*/bs*/trace.json.gz pytorch*/bs*/graph-reference.json.gz 2>/dev/null)
ls -l "$out"; du -sh "$out"
stamp "done"
