#!/usr/bin/env bash
# Issue 30 on the GPU machine (from the repo root; the lead carries .mxtree/ and .gpu/):
#   OUT=... benches/gpu_modes.sh        starts the job detached (it may outlast one 10-minute call), then
#                                       waits up to WAIT_S (default 540 s); call again on the same warm
#                                       machine to wait more. Each call packs what is done so far into $OUT.
# FRAMEWORKS (default all) and BS (default "64 1024") are the run's --framework and --batch-size lists;
# GPU_TESTS=1 also runs tests/test_mxnet_build.py's GPU tests (against the installed package).
# The job (about 20 minutes on one H200 at the default STEPS and BS, mostly torch.compile's compilations):
# 1. the bare loops of the same model (.gpu/torch_modes.py: eager, one CUDA graph, compile default and
#    reduce-overhead; one JSON line per mode x bs), first: they need neither kernelmap nor MXNet, and a
#    hold that runs out during the run still has them
# 2. installs kernelmap, unpacks the carried sm_90 MXNet tree (benches/gpu_mxnet_session.sh unpack .mxtree);
#    MX_PARTS=N: first waits for N tree parts between .mxtree/ and /tmp/mxparts/ (a later call stages the
#    last ones: the tree and the checkout together are over one call's carry)
# 3. kernelmap run --framework all --device gpu --mode all --profile all --batch-size 64 1024
#    (STEPS timed steps, default 20; 1 clean trial, no repeats), nsys from .gpu/nsys-env.sh
# 4. kernelmap report --strict on it; the cuda-graph clean step against the bare replay (graph_vs_bare)
# Back in $OUT, packed as modes.tar.NN (15 MB parts, at most 8 files come back: cat modes.tar.* | tar x):
set -uo pipefail
final=${OUT:?set OUT}; job=/tmp/modes-job; steps=${STEPS:-20}; data=${DATA:-synthetic}
frameworks=${FRAMEWORKS:-all}; batch_sizes=${BS:-64 1024}  # kernelmap run's --framework and --batch-size
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$final"
running() { pgrep -f "gpu-modes-job.sh job" >/dev/null; }
if [ "${1:-}" != job ]; then
  if ! running && [ ! -e "$job/DONE" ]; then
    rm -rf "$job" /tmp/gpu-modes-repo; mkdir -p "$job"
    # from a copy: the next call lays the checkout anew under the running job
    cp -r "$(pwd)" /tmp/gpu-modes-repo && cp benches/gpu_modes.sh /tmp/gpu-modes-job.sh
    (cd /tmp/gpu-modes-repo && OUT="$job" setsid nohup bash /tmp/gpu-modes-job.sh job >"$job/job.log" 2>&1 </dev/null &)
    echo "started the modes job at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  tail -n 60 "$job/job.log"
  rm -f "$final"/modes.tar.*
  (cd "$job" && tar cf - --exclude='*.nsys-rep' --exclude='*.sqlite' . | split -b 15M -d - "$final/modes.tar.")
  ls -l "$final"
  [ -e "$job/DONE" ] || echo "still running: call again (same warm machine)"
  exit 0
fi
# --- the job (detached) ---
repo=$(pwd); out=$final
trap 'touch "$out/DONE"' EXIT  # a job that stops early still ends the wait
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader; nproc
stamp "bare loops"
if [ "${BARE:-1}" = 1 ]; then  # BARE=0: no bare loops (a run made only to check the modes end to end)
  (cd /tmp && NVIDIA_TF32_OVERRIDE=0 timeout 300 python3 "$repo/.gpu/torch_modes.py" 64 1024 \
     >"$out/bare_modes.jsonl" 2>"$out/bare_modes.err"; echo "bare exit $?")
  cat "$out/bare_modes.jsonl"
fi
have_parts() { for f in .mxtree/mxtree.tar.xz.* /tmp/mxparts/mxtree.tar.xz.*; do [ -e "$f" ] && basename "$f"; done | sort -u | wc -l; }
w=0; while [ "$(have_parts)" -lt "${MX_PARTS:-0}" ] && [ $w -lt 600 ]; do sleep 2; w=$((w+2)); done
stamp "install, unpack ($(have_parts) tree parts)"
bash benches/gpu_mxnet_session.sh unpack .mxtree "$out/mx" 2>&1 | tail -n 3   # installs kernelmap too
[ -f .gpu/nsys-env.sh ] && source .gpu/nsys-env.sh
cd /tmp || exit 3
stamp "run"
rm -rf /tmp/modes
# shellcheck disable=SC2086  # word-split on purpose: lists of frameworks and batch sizes
python3 -m kernelmap.cli run --framework $frameworks --device gpu --mode all --profile all --batch-size $batch_sizes \
  --steps "$steps" --trials 1 --max-repeats 0 --data "$data" --out /tmp/modes --json >"$out/run.json" 2>"$out/run.err"
echo "run exit $?"; tail -n 20 "$out/run.err"
stamp "report"
python3 -m kernelmap.cli report /tmp/modes --out /tmp/modes-report --replace --strict >"$out/report.log" 2>&1
echo "report --strict exit $?"; tail -n 30 "$out/report.log"
(cd /tmp/modes-report 2>/dev/null && tar cJf "$out/report.tar.xz" .)
stamp "graph vs bare"
[ -s "$out/bare_modes.jsonl" ] && python3 "$repo/benches/graph_vs_bare.py" compare "$out" /tmp/modes
stamp "links"  # issue 25's table: library-kernel time linked to its call, per framework x mode x bs x source
python3 "$repo/benches/link_summary.py" /tmp/modes --json "$out/link_summary.json" >"$out/link_summary.txt" 2>&1
echo "link summary exit $?"; head -n 40 "$out/link_summary.txt"
if [ "${GPU_TESTS:-0}" = 1 ]; then  # the GPU tests that need a built MXNet (patch 0008) and the GPU
  stamp "gpu tests"
  # from /tmp: the checkout's kernelmap/ (without its frameworks/ link) would shadow the installed package
  (cd /tmp && timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider -c /dev/null --import-mode=append \
     "$repo/tests/test_mxnet_build.py" >"$out/gpu_tests.log" 2>&1; echo "gpu tests exit $?")
  tail -n 15 "$out/gpu_tests.log"
fi
stamp "fixture"
fx="$out/graph_fixture"; src=/tmp/modes/pytorch-cuda-graph/bs64
if [ -f "$src/trace.json.gz" ] && [ -f "$src/graph-reference.json.gz" ]; then
  mkdir -p "$fx" && cp "$src/trace.json.gz" "$src/graph-reference.json.gz" "$fx/"
  python3 "$repo/benches/graph_vs_bare.py" fixture "$fx"
fi
stamp "pack"
# Kineto traces at bs 64 only, and the cuda-graph mode's at every bs (keeps the tar under 16 MB). A run
# whose normalise failed is left in its .partial folder: that one is packed (without nsys), to mend at home.
run_dir=/tmp/modes; [ -d "$run_dir" ] || run_dir=$(ls -d /tmp/.modes.*.partial 2>/dev/null | head -n 1)
# and the compile modes' whole bs 64 case (nsys export, library logs, the libs pass's trace), the replay modes'
# whole bs 1024 case (cuDNN's FFT backward, linked through the libs pass's reference step): fixtures to come
(cd "$run_dir" 2>/dev/null && tar cJf "$out/run.tar.xz" --exclude='*.nsys-rep' \
   manifest.json results.json parity-*.json records.parquet attribution.json logs */bs*/*.json \
   pytorch*/bs64/*.json.gz pytorch-cuda-graph/bs*/*.json.gz pytorch-compile*/bs64 \
   pytorch-cuda-graph/bs1024 pytorch-compile-graphs/bs1024 2>/dev/null)
ls -l "$out"; du -sh "$out"
stamp "done"
