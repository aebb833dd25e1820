#!/usr/bin/env bash
# One GPU hold for issues 25, 30 and 26 (device time is short: one job, detached, in priority order; each
# device call waits up to WAIT_S and copies what is done so far to $OUT):
#   OUT=... benches/gpu_session.sh          start (first call) or wait (later calls, same warm machine)
# The job, in this order (each phase's console in job.log, stamped with its elapsed seconds):
#  0. install kernelmap, unpack the carried MXNet sm_90 tree (.mxtree), nsys from .gpu/nsys-env.sh; the custom
#     op's three builds start in the background (CPU only: nvcc/ninja/cmake), before any timed work
#  1. issue 25: kernelmap run --framework all --profile all --batch-size 64 256 1024 (PyTorch eager, MXNet
#     imperative, JAX jit) and the same for MXNet hybridized: 20 steps, 1 trial, no repeats -> /tmp/s/link-*
#  2. issue 30: PyTorch's cuda-graph mode (clean pass, 3 trials, and its framework pass) at bs 64 and 1024,
#     then the bare loops of .gpu/torch_modes.py in the same session -> graph_vs_bare.json, graph fixture
#  3. issue 26: per build route, the seed's AddModel, the custom-op CNN's parity on the GPU, and a
#     kernelmap run (framework pass, bs 64) of the custom-op CNN; fc1 custom kernels beside the built-in
#     ones of phase 1's PyTorch run (benches/custom_op_compare.py)
#  4. summaries and reports (after every timed run: nothing else runs beside them): link_summary.py,
#     report --strict of each run; trimmed run dirs packed for fixtures
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
final=${OUT:?set OUT}; job=/tmp/s; steps=${STEPS:-20}
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} KERNELMAP_CUSTOM_OP_HOME=${KERNELMAP_CUSTOM_OP_HOME:-/tmp/km-custom-op}
mkdir -p "$final"
running() { pgrep -f "gpu-session-job.sh job" >/dev/null; }
if [ "${1:-}" != job ]; then
  if ! running && [ ! -e "$job/out/DONE" ]; then
    rm -rf "$job" /tmp/gpu-session-repo; mkdir -p "$job/out"
    cp -r "$(pwd)" /tmp/gpu-session-repo && cp benches/gpu_session.sh /tmp/gpu-session-job.sh
    (cd /tmp/gpu-session-repo && OUT="$job/out" setsid nohup bash /tmp/gpu-session-job.sh job \
       >"$job/out/job.log" 2>&1 </dev/null &)
    echo "started the session job at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/out/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  tail -n 80 "$job/out/job.log"
  cp -r "$job/out"/. "$final"/ 2>/dev/null
  [ -e "$job/out/DONE" ] || echo "still running: call again (same warm machine)"
  exit 0
fi
# --- the job (detached) ---
repo=$(pwd); out=$final
trap 'touch "$out/DONE"' EXIT
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp "0. install, unpack"
bash benches/gpu_mxnet_session.sh unpack .mxtree "$out/mx" 2>&1 | tail -n 3
[ -f .gpu/nsys-env.sh ] && source .gpu/nsys-env.sh
export PATH="$CUDA_HOME/bin:$PATH"
cd /tmp || exit 3
python3 -m kernelmap.cli doctor >"$out/doctor.txt" 2>&1; tail -n 14 "$out/doctor.txt"
ROUTES="jit setuptools cmake"
{ echo "nvcc: $(command -v nvcc) | ninja: $(command -v ninja || echo none) | cmake: $(command -v cmake || echo none)"
  for r in $ROUTES; do
    ( python3 -m kernelmap.cli custom-op build --route "$r" --device gpu --out "$out/build-$r.json" \
        >"$out/build-$r.txt" 2>&1; echo "build $r exit $?: $(tail -n 1 "$out/build-$r.txt")" ) &
  done; wait; } >"$out/builds.txt" 2>&1 &
builds=$!

stamp "1. issue 25 runs"
common=(--device gpu --profile all --steps "$steps" --trials 1 --max-repeats 0 --data synthetic --replace --json)
python3 -m kernelmap.cli run --framework all --batch-size 64 256 1024 "${common[@]}" --out "$job/link-all" \
  >"$out/run-link-all.json" 2>"$out/run-link-all.err"
stamp "run link-all exit $?: $(tail -n 2 "$out/run-link-all.err" | tr '\n' ' ')"
wait "$builds"; cat "$out/builds.txt"
python3 -m kernelmap.cli run --framework mxnet --mode hybridized --batch-size 64 256 1024 "${common[@]}" \
  --out "$job/link-hyb" >"$out/run-link-hyb.json" 2>"$out/run-link-hyb.err"
stamp "run link-hyb exit $?: $(tail -n 2 "$out/run-link-hyb.err" | tr '\n' ' ')"

stamp "2. issue 30: cuda-graph"
python3 -m kernelmap.cli run --framework pytorch --mode cuda-graph --device gpu --profile framework --steps 50 \
  --trials 3 --data synthetic --batch-size 64 1024 --replace --json --out "$job/graph" \
  >"$out/run-graph.json" 2>"$out/run-graph.err"
stamp "run graph exit $?: $(tail -n 3 "$out/run-graph.err" | tr '\n' ' ')"
NVIDIA_TF32_OVERRIDE=0 timeout 400 python3 "$repo/.gpu/torch_modes.py" 64 1024 >"$out/bare_modes.jsonl" 2>"$out/bare_modes.err"
stamp "bare loops exit $?"; cat "$out/bare_modes.jsonl"
python3 "$repo/benches/graph_vs_bare.py" compare "$out" "$job/graph"
fx="$out/graph_fixture"; src="$job/graph/pytorch-cuda-graph/bs64"
if [ -f "$src/trace.json.gz" ] && [ -f "$src/graph-reference.json.gz" ]; then
  mkdir -p "$fx" && cp "$src/trace.json.gz" "$src/graph-reference.json.gz" "$fx/"
  python3 "$repo/benches/graph_vs_bare.py" fixture "$fx"
fi

stamp "3. issue 26: custom op"
ok=""; for r in $ROUTES; do grep -q "^build $r exit 0" "$out/builds.txt" && ok="$ok $r"; done
for r in $ok; do
  python3 -m kernelmap.cli custom-op build --route "$r" --device gpu 2>&1 | tail -n 1 | sed "s/^/cache $r: /"
  python3 -m kernelmap.cli custom-op addmodel --route "$r" --device gpu --trace-dir "/tmp/addmodel-$r" \
    --out "$out/addmodel-$r.json" >"$out/addmodel-$r.txt" 2>"$out/addmodel-$r.err"
  echo "addmodel $r exit $?: $(head -n 1 "$out/addmodel-$r.txt") ... $(tail -n 2 "$out/addmodel-$r.txt" | tr '\n' ' ')"
  cp "/tmp/addmodel-$r/trace.json.gz" "$out/addmodel-$r.trace.json.gz" 2>/dev/null
  python3 -m kernelmap.cli custom-op parity --route "$r" --device gpu --steps 10 --out "$out/parity-$r.json" \
    2>"$out/parity-$r.err" | sed "s/^/parity $r: /"
  python3 -m kernelmap.cli run --framework pytorch --custom-op "$r" --device gpu --profile framework --steps "$steps" \
    --trials 1 --max-repeats 0 --data synthetic --batch-size 64 --replace --out "$job/custom-$r" \
    >"$out/run-custom-$r.txt" 2>&1
  stamp "run custom $r exit $?"
done
custom_runs=""; for r in $ok; do [ -d "$job/custom-$r" ] && custom_runs="$custom_runs $job/custom-$r"; done

stamp "4. summaries and reports"
dirs=(); for d in "$job/link-all" "$job/link-hyb"; do [ -f "$d/attribution.json" ] && dirs+=("$d"); done
python3 "$repo/benches/link_summary.py" "${dirs[@]}" --json "$out/link-summary.json" >"$out/link-summary.txt" 2>&1
cat "$out/link-summary.txt" | head -n 120
for d in "${dirs[@]}" "$job/graph"; do
  n=$(basename "$d")
  python3 -m kernelmap.cli report "$d" --out "$d-report" --replace --strict >"$out/report-$n.txt" 2>&1
  echo "report $n --strict exit $?: $(grep -E '^self-checks' "$out/report-$n.txt")"
  grep -E "^  FAIL" "$out/report-$n.txt" | cut -c1-300 | head -n 12
done
[ -n "$custom_runs" ] && python3 "$repo/benches/custom_op_compare.py" "$job/link-all" $custom_runs 2>&1 | tee "$out/compare.txt"
[ -n "$custom_runs" ] && python3 -m kernelmap.cli report "$job/link-all" $custom_runs --out /tmp/custom-report \
  --replace >"$out/report-custom.txt" 2>&1 && (cd /tmp/custom-report && tar cJf "$out/report-custom.tar.xz" .)
(cd "$job/link-all-report" 2>/dev/null && tar cJf "$out/report-link-all.tar.xz" .)
(cd "$job/graph-report" 2>/dev/null && tar cJf "$out/report-graph.tar.xz" .)
stamp "pack"
cp "$repo/tests/data/record_gpu_fixtures.py" /tmp/ 2>/dev/null
rm -rf "$job/fixture"; mkdir -p "$job/fixture"
for d in "${dirs[@]}" "$job/graph" $custom_runs; do
  n=$(basename "$d"); cp -r "$d" "$job/fixture/$n"
  find "$job/fixture/$n" \( -name '*.nsys-rep' -o -name '*.qdrep' \) -delete
  find "$job/fixture/$n" -name 'nsys.sqlite' | while read -r f; do
    python3 -c "import sys; sys.path.insert(0, '/tmp'); import record_gpu_fixtures as r; from pathlib import Path; \
r.trim_nsys(Path(sys.argv[1]), Path(sys.argv[1] + '.gz'))" "$f" && rm -f "$f"
  done
  find "$job/fixture/$n" -name '*.log' -size +0 -exec gzip -9 -f {} \;
done
(cd "$job/fixture" && tar cJf - . | split -b 15M -d - "$out/session_runs.tar.xz.")
ls -l "$out"; du -sh "$out"
stamp "done"
