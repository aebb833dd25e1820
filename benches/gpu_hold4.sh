#!/usr/bin/env bash
# Issues 25, 28 and 30 in one hold of a machine with (at least) 3 GPUs, three jobs side by side, each on
# its own GPU (CUDA_VISIBLE_DEVICES), from the repo root with .gpu/ and .mxtree/ carried:
#   OUT=... benches/gpu_hold4.sh      first call: starts the hold's job detached, waits up to WAIT_S (540 s);
#                                     later calls on the same warm machine wait again. Every call leaves
#                                     what is done so far in $OUT as hold.tar.NN (15 MB parts: cat | tar x)
# The job:
#  0. install kernelmap and unpack the carried sm_90 MXNet tree (timed: issue 28's "build-mxnet" step
#     where the tree was built elsewhere)
#  then, side by side:
#  GPU 2  benches/gpu_house28.sh: the GPU user's path, each step timed (install, doctor, run, report)
#  GPU 0  benches/gpu_modes.sh's job: kernelmap run --framework all --mode all --profile all
#         --batch-size $BS (default 64 256 1024), report --strict, issue 25's link summary, graph fixture
#  GPU 1  the bare loops of the same model (.gpu/torch_modes.py 64 1024), then the GPU tests
#         (pytest -m gpu on the four test files that have them)
#  last   benches/graph_vs_bare.py compare (kernelmap's cuda-graph clean step against the bare replay)
# GPU 0 and 1 start only after GPU 2's install step: two pip installs into one site-packages would race.
# The three jobs share the host (its CPUs, PCIe): every timing from this hold says so.
set -uo pipefail
final=${OUT:?set OUT}; job=/tmp/hold; repo_copy=/tmp/hold-repo
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$final"
pack() {  # everything under $job, as 15 MB parts in $final (at most 8 files come back)
  rm -f "$final"/hold.tar.*
  (cd "$job" && tar cf - --exclude='*.nsys-rep' --exclude='*.sqlite' --exclude='./house28/run/*/bs*' --exclude='./modes/graph_fixture' . | split -b 15M -d - "$final/hold.tar.")
  ls -l "$final"
}
if [ "${1:-}" != job ]; then
  if ! pgrep -f "gpu-hold-job.sh job" >/dev/null && [ ! -e "$job/DONE" ]; then
    rm -rf "$job" "$repo_copy"; mkdir -p "$job"
    cp -r "$(pwd)" "$repo_copy" && cp benches/gpu_hold4.sh /tmp/gpu-hold-job.sh
    (cd "$repo_copy" && OUT="$job" setsid nohup bash /tmp/gpu-hold-job.sh job >"$job/hold.log" 2>&1 </dev/null &)
    echo "started the hold's job at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  tail -n 25 "$job/hold.log"; tail -n 8 "$job/modes/job.log" 2>/dev/null
  cat "$job/house28/times.txt" 2>/dev/null
  pack
  [ -e "$job/DONE" ] || echo "still running: call again (same warm machine)"
  exit 0
fi
# --- the job (detached) ---
out=$final; repo=$(pwd)
trap 'touch "$out/DONE"' EXIT
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader; nproc
[ -f .gpu/nsys-env.sh ] && source .gpu/nsys-env.sh  # every job's nsys (house28's included)
stamp "0. install and unpack the carried MXNet tree"
ts=$(date +%s%N)
bash benches/gpu_mxnet_session.sh unpack .mxtree "$out/unpack" 2>&1 | tail -n 5
echo "unpack+install $(( ($(date +%s%N) - ts) / 1000000 )) ms" | tee "$out/unpack_time.txt"
stamp "GPU 2: house28"
(CUDA_VISIBLE_DEVICES=2 OUT="$out" STEPS=30 BATCH="64 1024" PROFILE=all \
   bash benches/gpu_house28.sh >"$out/house28.log" 2>&1; echo "house28 exit $?" >>"$out/house28.log") &
h=$!
w=0; until grep -q '^install' "$out/house28/times.txt" 2>/dev/null || [ $w -ge 300 ]; do sleep 2; w=$((w+2)); done
stamp "GPU 0: modes run; GPU 1: bare loops, GPU tests"
(CUDA_VISIBLE_DEVICES=0 OUT="$out/modes" BS="${BS:-64 256 1024}" BARE=0 GPU_TESTS=0 KERNELMAP_SKIP_INSTALL=1 \
   bash benches/gpu_modes.sh job >"$out/modes.log" 2>&1; echo "modes exit $?" >>"$out/modes.log") &
m=$!
(export CUDA_VISIBLE_DEVICES=1; cd /tmp || exit 3
 NVIDIA_TF32_OVERRIDE=0 timeout 400 python3 "$repo/.gpu/torch_modes.py" 64 1024 >"$out/bare_modes.jsonl" 2>"$out/bare_modes.err"
 echo "bare exit $?"
 timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider -c /dev/null --import-mode=append -rs \
   "$repo"/tests/test_math.py "$repo"/tests/test_mxnet_build.py "$repo"/tests/test_parity.py "$repo"/tests/test_runner.py \
   >"$out/gpu_tests.log" 2>&1
 echo "gpu tests exit $?") >"$out/gpu1.log" 2>&1 &
g=$!
wait $g; stamp "GPU 1 done: $(tr '\n' ' ' <"$out/gpu1.log")"; tail -n 6 "$out/gpu_tests.log"
wait $h; stamp "GPU 2 done: $(tail -n 1 "$out/house28.log")"
wait $m; stamp "GPU 0 done: $(tail -n 1 "$out/modes.log")"
mkdir -p "$out/modes"; cp "$out/bare_modes.jsonl" "$out/modes/" 2>/dev/null
(cd /tmp && python3 "$repo/benches/graph_vs_bare.py" compare "$out/modes" /tmp/modes)
stamp "done"
