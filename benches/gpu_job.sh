#!/usr/bin/env bash
# The GPU job: one script for every GPU measurement, its options as environment variables. From the repo root
# on the GPU machine (carry .gpu/ and .mxtree/; kernelmap is installed into that machine's python3):
#   OUT=$OUT benches/gpu_job.sh      start the job detached (it may outlast one 10-minute call), wait up to WAIT_S
#                                    (default 540) and pack what is done into $OUT; again on the same warm machine:
#                                    wait more, pack again; FRESH=1: a new job once the last one is done; while
#                                    it runs, each run directory as it stands too (raw-N.tar.xz: the hold may end first)
#   OUT=DIR benches/gpu_job.sh job   the job itself, in the foreground (a machine of your own; `nox -s reference_loop`)
#   benches/gpu_job.sh stage         copy this call's MXNet tree parts ($MX_KIT) to /tmp/mxparts: a tree and the
#                                    checkout are over one call's carry, so parts may come in two calls
#   OUT=$OUT benches/gpu_job.sh build-mxnet   build the sm_90 tree from the carried kit .mxkit/, packed into $OUT
# PHASES: which steps (default "bare mxnet run report links"); they run in this order, whatever order is given:
#   bare       the reference bare loops (.gpu/probes: torch_modes.py, bare_loops.py per framework) at BARE_BS
#              (default "64 1024"), before kernelmap is installed; MXNet's after the tree is unpacked; BARE_MATH (default
#              fp32): fp32 the reference probes, bf16/fp16 benches/bare_mixed_loop.py per framework (MXNet fp16 only)
#   mxnet      unpack the carried sm_90 tree (mxtree.tar.xz.NN from `kernelmap build-mxnet --arch 90`, in MX_KIT,
#              default .mxtree, and /tmp/mxparts) into $KERNELMAP_MXNET_HOME; MX_PARTS=N waits for N parts first;
#              parts that do not unpack stop the job (exit 5), nothing half-unpacked left
#   smoke      benches/mxnet_smoke.py: one convolution of the tree on this GPU against PyTorch's (exit 6: stop)
#   reference  benches/bench_reference_loop.py: the bare step loop beside the clean pass (PyTorch)
#   run        kernelmap run $RUN_ARGS
#   bench      the step benchmarks of the same job (benches/bench_train_step.py per framework at BENCH_BS,
#              default "64 1024"), kernelmap save-job; the report then checks "clean vs step benchmark"
#   repeats    three clean-pass runs of PyTorch at 64/256/1024, their agreement (benches/repeats.py) and this
#              host's own spread (benches/gpu_host_noise.py)
#   harness    kernelmap's clean pass against a bare loop, interleaved processes at BARE_BS, synthetic data. HARNESS_MATH
#              (default fp32): fp32 the reference probes, HARNESS_N (default 5) processes each, every mode; bf16/fp16
#              (issue 38's 5%): benches/harness_vs_bare.py run, HARNESS_N (default 3) rounds of bare_mixed_loop.py and
#              kernelmap run --trials 3 per mode of HARNESS_MODES (default pytorch jax, + mxnet with a tree; MXNet
#              fp16), HARNESS_STEPS (default 200) timed steps each, HARNESS_TRIALS (default 3) kernelmap trials a
#              round, HARNESS_CPUS (a taskset -c list): every process of
#              both sides on those CPUs; the verdict per mode in harness/summary.txt
#   custom-op  per route in CUSTOM_ROUTES (default "jit setuptools cmake"): build, the seed's AddModel, parity,
#              kernelmap run --custom-op; fc1's kernels beside the run phase's built-in ones (custom_op_compare.py)
#   report     kernelmap report --strict on the run (exit 4: a self-check failed)
#   links      benches/link_summary.py: library-kernel time linked to its call per case and source
#   graph      benches/graph_vs_bare.py: the cuda-graph clean step against the bare replay (needs bare)
#   sweep      benches/option_sweep.py $SWEEP_ARGS (default --device gpu) in SWEEP_SHARDS shards side by side (default 1;
#              shard k on GPU (k-1) mod the GPUs), their rows merged into sweep.md; SWEEP_GPUS (e.g. "3" or "2,3"):
#              the shards start with the run sets, on those GPUs only (keep them apart from the sets' GPUs)
#   tests      the GPU tests (pytest -m gpu, TESTS_K: its -k) of TESTS_DIR (default the checkout's tests/) against
#              the installed package
#   findings   kernelmap findings on run set FINDINGS_SET (default 0) with FINDINGS_ARGS (default --batch-size 1024
#              --check-remedies 3): the findings' remedies run again on this GPU, their hit rate (FINDINGS_TIMEOUT s, default 900)
#   commands   CMDS: shell command lines separated by ' ;; ' (e.g. kernelmap parity ...), one after another from /tmp
#              (not with the tree's PYTHONPATH: its numpy 1.26 broke JAX's import; MXNet finds the tree through
#              KERNELMAP_MXNET_HOME), each one's output in cmd-I.log and its exit status printed
#   fixture    the run trimmed for tests/data (no .nsys-rep, nsys.sqlite trimmed, logs gzipped)
# RUN_ARGS   default: --framework all --device gpu --mode all --profile all --batch-size 64 --steps 20 --trials 1
#            --max-repeats 0 (no --data: see DATA_DIR)
# RUN_SETS   several runs at once: kernelmap run argument lists separated by ';', each into its own run directory
#            (report, links and pack then take each). Set i runs on GPU i, or on the GPUs its first word names
#            ("@2,3 --devices 2 ..."; CUDA_VISIBLE_DEVICES): sets of one GPU list run one after another, the lists
#            side by side. A set that says --devices and names no GPUs runs after the others, alone, on every GPU.
#            Default: one run of RUN_ARGS
# DATA_DIR   a directory of IDX files (Fashion-MNIST, carried as .gpu/fashion-mnist): the data of every phase but
#            bare and harness; default synthetic (the GPU machine has none)
# VENV       a virtual environment whose python3 runs the job, kernelmap installed there (nox's .nox/frameworks)
# Back in $OUT: job.tar.NN (15 MB parts, at most 8 files come back; cat job.tar.* | tar x): job.log, DONE (the
# job's exit status), each phase's output, the run's small files (run.tar.xz), the report (report.tar.xz).
set -uo pipefail
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
MXPARTS=${KERNELMAP_MXPARTS:-/tmp/mxparts}; kit=${MX_KIT:-.mxtree}
ALL="bare mxnet smoke reference run bench repeats harness custom-op report links graph sweep tests findings commands fixture"
phases=${PHASES:-bare mxnet run report links}
nsys=0  # nsys for the phases past the bare loops, the tree and its smoke
for p in $phases; do
  [[ " $ALL " == *" $p "* ]] || { echo "PHASES: unknown phase '$p' (known: $ALL)" >&2; exit 2; }
  case $p in bare|mxnet|smoke) ;; *) nsys=1;; esac
done
[[ " $phases " == *" commands "* ]] && [ -z "${CMDS:-}" ] && { echo "PHASES: the commands phase needs CMDS (command lines, ' ;; ' between them)" >&2; exit 2; }
[[ " ${RUN_ARGS:-} " == *" --data"* ]] && { echo "RUN_ARGS: no --data there; give a directory as DATA_DIR" >&2; exit 2; }
if [ -n "${DATA_DIR:-}" ] && [ ! -d "$DATA_DIR" ]; then
  echo "DATA_DIR=$DATA_DIR: no such directory (the IDX files, e.g. .gpu/fashion-mnist)" >&2; exit 2
fi
if [ -n "${VENV:-}" ] && [ ! -x "$VENV/bin/python3" ]; then echo "VENV=$VENV: no bin/python3 there" >&2; exit 2; fi
tree() { local t; for t in "$KERNELMAP_MXNET_HOME"/1.9.1-sm*; do [ -d "$t" ] && echo "$t" && return; done; }
if [ "${1:-}" = stage ]; then
  mkdir -p "$MXPARTS" && cp "$kit"/mxtree.tar.xz.* "$MXPARTS"/ && ls -l "$MXPARTS"; exit
fi
final=${OUT:?set OUT}; job=/tmp/gpu-job
if [ "${1:-}" = build-mxnet ]; then
  # .mxkit/: src/ (the offline source tarballs), whl/ (numpy 1.26 for Python 3.12; it may come in the next call:
  # a placeholder stands in until the install step), km-head.tar (the kernelmap that builds). Detached, as the job.
  mkdir -p "$final" /tmp/mxwhl; whl=/tmp/mxwhl/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
  [ -f .mxkit/whl/"$(basename "$whl")" ] && cp .mxkit/whl/"$(basename "$whl")" "$whl" && echo "numpy wheel staged"
  if [ -z "$(tree)" ] && ! pgrep -f "kernelmap.cli build-mxnet" >/dev/null; then
    [ -d .mxkit/src ] || { echo "no .mxkit/src carried and no build running"; exit 4; }
    rm -rf /tmp/mxsrc /tmp/km-head && mkdir -p /tmp/km-head && cp -r .mxkit/src /tmp/mxsrc && tar -xf .mxkit/km-head.tar -C /tmp/km-head
    python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore /tmp/km-head 2>&1 | tail -n 2
    [ -f "$whl" ] || touch "$whl"
    (cd /tmp && setsid nohup python3 -m kernelmap.cli build-mxnet --source /tmp/mxsrc --arch 90 --work /tmp/mxw \
       --jobs "$(nproc)" --numpy-wheel "$whl" >/tmp/mxbuild.log 2>&1 </dev/null &)
    echo "started build-mxnet on $(nproc) cores at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ -z "$(tree)" ] && pgrep -f "kernelmap.cli build-mxnet" >/dev/null && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 10; done
  tail -n 8 /tmp/mxbuild.log; cp /tmp/mxbuild.log "$final/"
  if [ -n "$(tree)" ]; then
    cat "$(tree)/kernelmap-mxnet.json"; du -sh "$(tree)"
    tar -C "$KERNELMAP_MXNET_HOME" -cf - "$(basename "$(tree)")" | xz -T0 -6 | split -b 15M -d - "$final/mxtree.tar.xz."
    ls -l "$final"
  else
    echo "still building: call again (same warm machine)"
  fi
  exit 0
fi
if [ "${1:-}" != job ]; then
  mkdir -p "$final"
  running() { pgrep -f "gpu-job-run.sh job" >/dev/null; }
  [ "${FRESH:-0}" = 1 ] && ! running && rm -rf "$job"
  if ! running && [ ! -e "$job/DONE" ]; then
    rm -rf "$job" /tmp/gpu-job-repo; mkdir -p "$job"
    # from a copy: the next call lays the checkout anew under the running job
    cp -r "$(pwd)" /tmp/gpu-job-repo && cp benches/gpu_job.sh /tmp/gpu-job-run.sh
    (cd /tmp/gpu-job-repo && OUT="$job" setsid nohup bash /tmp/gpu-job-run.sh job >"$job/job.log" 2>&1 </dev/null &)
    echo "started the GPU job at $(date +%T): $phases"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  tail -n 80 "$job/job.log"
  rm -f "$final"/job.tar.*
  (cd "$job" && tar cf - --exclude='*.nsys-rep' --exclude='*.sqlite' . | split -b 15M -d - "$final/job.tar.")
  if [ ! -e "$job/DONE" ]; then  # the job's own pack comes at its end: the hold may end first, so each run
    # directory as it stands (finished, or a run's .partial folder mid-run: no manifest yet), less nsys's files
    for d in /tmp/gpu-job-run-dir* /tmp/.gpu-job-run-dir*.partial; do [ -d "$d" ] || continue
      n=$(basename "$d" | sed 's/^\.//; s/\.partial$//; s/\.[a-z0-9_]*$//'); n=${n#gpu-job-run-dir}
      (cd "$d" && tar cJf "$final/raw${n:--}.tar.xz" --exclude='*.nsys-rep' --exclude='*.sqlite' . 2>/dev/null)
    done
  fi
  ls -l "$final"
  if [ -e "$job/DONE" ]; then echo "job exit $(cat "$job/DONE")"; else echo "still running: call again (same warm machine)"; fi
  exit 0
fi

# --- the job (detached, cwd a copy of the checkout; or in the foreground) ---
repo=$(pwd); out=$(realpath -m "$final"); mkdir -p "$out"; data=synthetic
[ -n "${DATA_DIR:-}" ] && data=$(realpath "$DATA_DIR")
trap 'echo $? >"$out/DONE"' EXIT  # a job that stops early still ends the wait
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
want() { [[ " $phases " == *" $1 "* ]]; }
with_tree() { local t; t=$(tree); if [ -n "$t" ]; then PYTHONPATH="$t/python" MXTREE="$t" KERNELMAP_MXNET_TREE="$t" "$@"; else "$@"; fi; }
export KERNELMAP_JOB=${KERNELMAP_JOB:-gpu-$(date -u +%Y%m%dT%H%M%SZ)}  # the run's and the step benchmarks' job
nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader; nproc
bs=${BARE_BS:-64 1024}
bare() {  # bare MODE: one bare loop at $bs, a JSON line per batch size
  # shellcheck disable=SC2086  # word-split on purpose: a list of batch sizes
  (cd /tmp && with_tree env NVIDIA_TF32_OVERRIDE=0 timeout 300 python3 "$repo/.gpu/probes/bare_loops.py" "$1" $bs)
}
mixed() {  # mixed FRAMEWORK MATH: benches/bare_mixed_loop.py at $bs, a JSON line per batch size
  # shellcheck disable=SC2086  # word-split on purpose: a list of batch sizes
  (cd /tmp && with_tree timeout 300 python3 "$repo/benches/bare_mixed_loop.py" "$1" "$2" $bs \
     >>"$out/bare_mixed.jsonl" 2>>"$out/bare.err"; echo "bare $1 $2 exit $?")
}
maths=${BARE_MATH:-fp32}  # fp32: the reference probes (.gpu/probes); bf16/fp16: benches/bare_mixed_loop.py
if want bare; then stamp "bare loops ($bs; $maths)"
  if [[ " $maths " == *" fp32 "* ]]; then
    # shellcheck disable=SC2086
    (cd /tmp && NVIDIA_TF32_OVERRIDE=0 timeout 300 python3 "$repo/.gpu/probes/torch_modes.py" $bs \
       >"$out/bare_modes.jsonl" 2>"$out/bare.err"; echo "torch_modes exit $?")
    bare jax >>"$out/bare_loops.jsonl" 2>>"$out/bare.err"; echo "bare jax exit $?"
  fi
  for m in $maths; do [ "$m" = fp32 ] || { mixed pytorch "$m"; mixed jax "$m"; }; done
fi
if [ -n "${VENV:-}" ]; then PATH="$(realpath "$VENV")/bin:$PATH"; else stamp "install"
  python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
fi
(cd /tmp && python3 -c "import kernelmap.frameworks") || { echo "kernelmap does not import"; exit 3; }
if want mxnet && [ -z "$(tree)" ]; then
  parts() { for f in "$kit"/mxtree.tar.xz.* "$MXPARTS"/mxtree.tar.xz.*; do [ -e "$f" ] && echo "$(basename "$f") $f"; done \
              | sort -u -k1,1 | cut -d' ' -f2-; }  # a part of this call's before a staged one of its number
  w=0; while [ "$(parts | wc -l)" -lt "${MX_PARTS:-0}" ] && [ $w -lt 600 ]; do sleep 2; w=$((w+2)); done
  mapfile -t files < <(parts)
  stamp "unpack the MXNet tree (${#files[@]} parts)"; if [ "${#files[@]}" = 0 ]; then
    echo "no MXNet tree in $KERNELMAP_MXNET_HOME and none carried ($kit/mxtree.tar.xz.NN): MXNet runs on the CPU, labelled"
  else
    unpack="$KERNELMAP_MXNET_HOME/.unpack-$$"  # moved in only when whole: no half tree passes for one
    if ! { rm -rf "$unpack" && mkdir -p "$unpack" && cat "${files[@]}" | xz -d | tar -x -C "$unpack" \
           && mv "$unpack"/* "$KERNELMAP_MXNET_HOME"/ && rmdir "$unpack"; }; then
      rm -rf "$unpack"
      echo "cannot unpack the carried MXNet tree from ${files[*]} (cat | xz -d | tar -x into $KERNELMAP_MXNET_HOME" \
           "failed, see above): the job stops" >&2
      exit 5
    fi
    echo "unpacked the carried tree: $(tree)"
  fi
fi
if want bare && [ -n "$(tree)" ]; then  # MXNet's bare loops need the tree
  if [[ " $maths " == *" fp32 "* ]]; then
    for m in mxnet mxnet-hybridized; do bare $m >>"$out/bare_loops.jsonl" 2>>"$out/bare.err"; echo "bare $m exit $?"; done
  fi
  [[ " $maths " == *" fp16 "* ]] && for m in mxnet mxnet-hybridized; do mixed "$m" fp16; done  # AMP: fp16 on the GPU
fi
cat "$out"/bare_*.jsonl 2>/dev/null
cd /tmp || exit 3  # the installed package: the checkout's kernelmap/ would shadow it
python3 -m kernelmap.cli doctor 2>&1 | tail -n 14
if want smoke; then stamp "smoke"
  [ -n "$(tree)" ] || { echo "smoke: no MXNet tree in $KERNELMAP_MXNET_HOME (the mxnet phase unpacks one): the job stops"; exit 6; }
  NVIDIA_TF32_OVERRIDE=0 timeout 180 python3 "$repo/benches/mxnet_smoke.py" "$(tree)" || { echo "smoke failed: the job stops"; exit 6; }
fi
# shellcheck disable=SC1091  # carried, not in the repository
[ "$nsys" = 1 ] && [ -f "$repo/.gpu/nsys-env.sh" ] && source "$repo/.gpu/nsys-env.sh"
custom=(); storage=()
if want reference; then stamp "reference loop"
  python3 -m pytest "$repo/benches/bench_reference_loop.py" --framework=pytorch --bench-data="$data" -m gpu -s \
    -p no:cacheprovider --benchmark-json="$out/reference.json" >"$out/reference.log" 2>&1
  echo "reference loop exit $?"; grep -E "^reference loop|passed|failed|skipped|Error" "$out/reference.log"
fi
run=/tmp/gpu-job-run-dir; runs=("$run")
sfx() { [ "${#runs[@]}" -gt 1 ] && echo "-${1##*-}"; }  # a run set's suffix in the file names
km_run() {  # km_run DIR NAME ARGS...: one kernelmap run into DIR, its output as NAME.json / NAME.err in $out
  local d=$1 n=$2; shift 2; rm -rf "$d"
  python3 -m kernelmap.cli run "$@" --data "$data" --out "$d" --json >"$out/$n.json" 2>"$out/$n.err"
}
gpu_count() { local g; g=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU"); [ "$g" -gt 0 ] && echo "$g" || echo 1; }
sweep_started=""; sweep_pids=()
sweep_start() {  # sweep_start "GPUS": the option sweep's SWEEP_SHARDS shards in the background, shard k on the
  local gl k n=${SWEEP_SHARDS:-1} real=()  # ((k-1) mod count)-th of GPUS, each its own rows and logs
  read -ra gl <<<"$1"; [ -n "${DATA_DIR:-}" ] && real=(--real-dir "$data"); sweep_started=1
  stamp "sweep: $n shards on GPUs ${gl[*]}"
  for k in $(seq 1 "$n"); do
    # shellcheck disable=SC2086
    (CUDA_VISIBLE_DEVICES=${gl[$(( (k - 1) % ${#gl[@]} ))]} python3 "$repo/benches/option_sweep.py" ${SWEEP_ARGS:---device gpu} \
       "${real[@]}" --shard "$k/$n" --out "$out/sweep-$k" >"$out/sweep-$k.md" 2>"$out/sweep-$k.err"
     rc=$?; echo "[$(( $(date +%s) - t0 )) s] sweep shard $k/$n exit $rc"; tail -n 3 "$out/sweep-$k.err") &
    sweep_pids+=($!)
  done
}
# SWEEP_GPUS (with RUN_SETS): the sweep starts with the run sets on these GPUs (none of the sets' GPUs); a set alone
# (--devices) waits for it
want sweep && want run && [ -n "${RUN_SETS:-}" ] && [ -n "${SWEEP_GPUS:-}" ] && sweep_start "${SWEEP_GPUS//,/ }"
if want run && [ -n "${RUN_SETS:-}" ]; then stamp "run sets"
  IFS=';' read -ra sets <<<"$RUN_SETS"; runs=(); alone=(); declare -A lane=()  # lane: GPUs -> its sets, in order
  for i in "${!sets[@]}"; do
    read -ra words <<<"${sets[$i]}"; g=""
    [[ "${words[0]:-}" == @* ]] && { g=${words[0]#@}; sets[i]=${sets[$i]#*"${words[0]}"}; }
    if [ -z "$g" ] && [[ " ${sets[$i]} " == *" --devices "* ]]; then alone+=("$i"); continue; fi
    [ -z "$g" ] && g=$i
    runs+=("$run-$i"); lane[$g]="${lane[$g]:-} $i"
  done
  for g in "${!lane[@]}"; do  # each lane in the background, its sets one after another
    (for i in ${lane[$g]}; do
       # shellcheck disable=SC2086  # word-split on purpose: kernelmap run's arguments
       CUDA_VISIBLE_DEVICES=$g km_run "$run-$i" "run-$i" ${sets[$i]}
       rc=$?; echo "[$(( $(date +%s) - t0 )) s] run set $i exit $rc (GPU $g):${sets[$i]}"; tail -n 12 "$out/run-$i.err"
     done) &
  done
  wait
  for i in "${alone[@]}"; do stamp "run set $i alone: ${sets[$i]}"; runs+=("$run-$i")
    # shellcheck disable=SC2086
    km_run "$run-$i" "run-$i" ${sets[$i]}; echo "run set $i exit $?"; tail -n 12 "$out/run-$i.err"
  done
  run=${runs[0]}
elif want run; then stamp "run"
  # shellcheck disable=SC2086  # word-split on purpose: kernelmap run's arguments
  km_run "$run" run ${RUN_ARGS:---framework all --device gpu --mode all --profile all --batch-size 64 --steps 20 --trials 1 --max-repeats 0}
  echo "run exit $?"; tail -n 25 "$out/run.err"
fi
if want run; then stamp "pack"  # each run's small files: records, attribution, results, logs, worker json
  for r in "${runs[@]}"; do [ -d "$r" ] || continue
    # the traces too where normalise did not write records.parquet (they are then the only way to read the run
    # again), and always those of several-device cases (issue 39's fixtures); each rank's folder of those
    (cd "$r" && traces=(./*-x*/bs*/trace.json.gz ./*-x*/bs*/*.hlo.txt.gz) && \
     { [ -f records.parquet ] || traces=(./*/bs*/trace.json.gz ./*/bs*/*.hlo.txt.gz); } && tar cJf "$out/run$(sfx "$r").tar.xz" --exclude='*.nsys-rep' --exclude='*.sqlite' manifest.json results.json \
       parity-*.json records.parquet attribution.json logs ./*/bs*/*.json ./*/bs*/*.log ./*/bs*/counters/ncu.csv ./*/bs*/counters/ncu.log \
       ./*/bs*/rank*/*.json ./*/bs*/rank*/*.log ./*/bs*/rank*/trace.json.gz "${traces[@]}" 2>/dev/null)
  done
fi
if want bench; then stamp "step benchmarks"
  b=/tmp/gpu-job-bench; rm -rf "$b"; mkdir -p "$b"; sizes=(); saved=()
  for n in ${BENCH_BS:-64 1024}; do sizes+=("--bench-batch-size=$n"); done
  for fw in pytorch mxnet jax; do
    with_tree python3 -m pytest "$repo/benches/bench_train_step.py" --framework="$fw" --benchmark-json="$b/$fw.json" \
      -p no:cacheprovider --benchmark-max-time=0.5 --bench-data="$data" "${sizes[@]}" >"$out/bench-$fw.txt" 2>&1
    echo "step benchmarks $fw exit $?: $(tail -n 1 "$out/bench-$fw.txt")"; [ -s "$b/$fw.json" ] && saved+=("$b/$fw.json")
  done
  python3 -m kernelmap.cli save-job --job "$KERNELMAP_JOB" --storage "$b/.benchmarks" "${saved[@]}" && storage=(--storage "$b/.benchmarks")
fi
if want repeats; then stamp "repeats"
  for i in 1 2 3; do
    python3 -m kernelmap.cli run --framework pytorch --device gpu --profile none --steps 200 --batch-size 64 256 1024 \
      --data "$data" --out "/tmp/gpu-job-repeat$i" --replace --json >"$out/repeat$i.json" 2>"$out/repeat$i.err" \
      || echo "repeat $i failed: $(tail -n 1 "$out/repeat$i.err")"
  done
  python3 "$repo/benches/repeats.py" "$out"/repeat*.json | tee "$out/repeats.txt"
  python3 "$repo/benches/gpu_host_noise.py" --batch-size 64 256 --repeats 3 --cpus all 2-3 | tee "$out/host_noise.txt"
fi
if want harness && [ "${HARNESS_MATH:-fp32}" != fp32 ]; then  # issue 38: the mixed recipe, bare loop vs clean pass
  h="$out/harness"; mkdir -p "$h"; modes=${HARNESS_MODES:-pytorch jax}; tree_arg=()
  if [ -n "$(tree)" ]; then tree_arg=(--mxnet-tree "$(tree)"); [ -z "${HARNESS_MODES:-}" ] && modes="$modes mxnet"; fi
  stamp "harness $HARNESS_MATH: ${HARNESS_N:-3} rounds of $modes at $bs"
  pin=(); [ -n "${HARNESS_CPUS:-}" ] && pin=(--cpus "$HARNESS_CPUS")  # both sides on these CPUs (taskset -c)
  # shellcheck disable=SC2086  # word-split on purpose: lists of batch sizes and modes
  python3 "$repo/benches/harness_vs_bare.py" run "$h" --math "$HARNESS_MATH" --n "${HARNESS_N:-3}" --batch-size $bs "${pin[@]}" \
    --trials "${HARNESS_TRIALS:-3}" \
    --modes $modes --steps "${HARNESS_STEPS:-200}" "${tree_arg[@]}" 2>&1 | tee "$h/summary.txt"
  echo "harness exit ${PIPESTATUS[0]}"
elif want harness; then stamp "harness: ${HARNESS_N:-5} processes each"
  h="$out/harness"; mkdir -p "$h"; modes="pytorch jax"; [ -n "$(tree)" ] && modes="$modes mxnet mxnet-hybridized"
  for i in $(seq 1 "${HARNESS_N:-5}"); do
    for m in $modes; do
      fw=${m%-hybridized}; mode=(); [ "$m" != "$fw" ] && mode=(--mode hybridized)
      bare "$m" 2>>"$h/bare.err" | sed "s/^{/{\"mode\": \"$m\", \"process\": $i, /" >>"$h/bare.jsonl"
      # shellcheck disable=SC2086
      timeout 400 python3 -m kernelmap.cli run --framework "$fw" "${mode[@]}" --device gpu --profile none --steps 300 \
        --trials 1 --max-repeats 0 --batch-size $bs --data synthetic --out "/tmp/gpu-job-harness" --replace --json \
        >"$h/run-$m-$i.json" 2>>"$h/run.err" || echo "kernelmap run $m $i failed: $(tail -n 1 "$h/run.err")"
    done
  done
  python3 "$repo/benches/harness_vs_bare.py" "$h" | tee "$h/summary.txt"
fi
if want custom-op; then routes=${CUSTOM_ROUTES:-jit setuptools cmake}; stamp "custom op: $routes"
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} KERNELMAP_CUSTOM_OP_HOME=/tmp/gpu-job-custom-op; PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
  command -v ninja >/dev/null || python3 -m pip install -q --no-index ninja 2>/dev/null  # torch's JIT route needs it
  for r in $routes; do  # the builds in parallel (CPU only); a route that cannot build says why, the others go on
    (python3 -m kernelmap.cli custom-op build --route "$r" --device gpu --out "$out/build-$r.json" >"$out/build-$r.txt" 2>&1
     echo $? >"$out/build-$r.rc") &
  done
  wait
  for r in $routes; do
    echo "build $r exit $(cat "$out/build-$r.rc"): $(tail -n 1 "$out/build-$r.txt")"
    [ "$(cat "$out/build-$r.rc")" = 0 ] || continue
    python3 -m kernelmap.cli custom-op addmodel --route "$r" --device gpu --trace-dir "$out/addmodel-$r" \
      --out "$out/addmodel-$r.json" >"$out/addmodel-$r.txt" 2>&1; echo "addmodel $r exit $?: $(tail -n 2 "$out/addmodel-$r.txt")"
    python3 -m kernelmap.cli custom-op parity --route "$r" --device gpu --steps 10 --out "$out/parity-$r.json" 2>&1 | tail -n 3
    python3 -m kernelmap.cli run --framework pytorch --custom-op "$r" --device gpu --profile all --steps 20 --trials 1 \
      --max-repeats 0 --batch-size 64 --data "$data" --replace --out "/tmp/gpu-job-custom-$r" >"$out/run-custom-$r.txt" 2>&1
    echo "run --custom-op $r exit $?"; [ -d "/tmp/gpu-job-custom-$r" ] && custom+=("/tmp/gpu-job-custom-$r")
  done
  if [ -d "$run" ] && [ "${#custom[@]}" -gt 0 ]; then
    python3 "$repo/benches/custom_op_compare.py" "$run" "${custom[@]}" | tee "$out/custom_op_compare.txt"
  else echo "fc1 compared only with the run phase's built-in run and a route that built"; fi
fi
if want report; then
  for r in "${runs[@]}"; do [ -d "$r" ] || continue; x=$(sfx "$r"); stamp "report $r"; more=("${custom[@]}")
    [ "$r" = "${runs[0]}" ] || more=()  # the custom-op runs are compared with the first run only
    (python3 -m kernelmap.cli report "$r" "${more[@]}" "${storage[@]}" --out "/tmp/gpu-job-report$x" --replace \
       --strict >"$out/report$x.log" 2>&1; echo $? >"$out/report$x.rc"
     cd "/tmp/gpu-job-report$x" 2>/dev/null && tar cJf "$out/report$x.tar.xz" .) &  # the reports side by side
  done
  wait
  for r in "${runs[@]}"; do x=$(sfx "$r"); [ -e "$out/report$x.rc" ] || continue
    echo "report$x --strict exit $(cat "$out/report$x.rc")"; tail -n 30 "$out/report$x.log"
  done
fi
if want links; then stamp "links"
  linked=(); for r in "${runs[@]}"; do [ -e "$r/attribution.json" ] && linked+=("$r"); done  # runs with a capture pass
  python3 "$repo/benches/link_summary.py" "${linked[@]}" --json "$out/link_summary.json" >"$out/link_summary.txt" 2>&1
  echo "link summary exit $?"; head -n 40 "$out/link_summary.txt"
fi
if want graph; then stamp "graph"  # needs bare and a run with --mode cuda-graph (or all)
  python3 "$repo/benches/graph_vs_bare.py" compare "$out" "$run"
fi
if want sweep; then [ -z "$sweep_started" ] && sweep_start "$(seq -s " " 0 $(( $(gpu_count) - 1 )))"
  wait "${sweep_pids[@]}"
  python3 "$repo/benches/option_sweep.py" --table $(seq -f "$out/sweep-%g" 1 "${SWEEP_SHARDS:-1}") >"$out/sweep.md"
  echo "sweep table exit $?"; tail -n 2 "$out/sweep.md"; grep -hE "FAIL|blocked|held by other processes" "$out"/sweep-*.err | head -n 20
fi
if want tests; then stamp "gpu tests ${TESTS_K:+-k $TESTS_K}"  # TESTS_DIR: the tests (.gpuhead has none)
  k=(); [ -n "${TESTS_K:-}" ] && k=(-k "$TESTS_K")
  # a test file that imports benches/ cannot be collected from a copy outside the checkout: the others still run
  timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider -c /dev/null --import-mode=append "${k[@]}" -rfs \
    --continue-on-collection-errors \
    "${TESTS_DIR:-$repo/tests}" >"$out/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -n 15 "$out/gpu_tests.log"
fi
if want findings; then f=${runs[${FINDINGS_SET:-0}]}; stamp "findings $f"  # run the findings' remedies again
  # shellcheck disable=SC2086  # word-split on purpose: kernelmap findings' arguments
  timeout "${FINDINGS_TIMEOUT:-900}" python3 -m kernelmap.cli findings "$f" ${FINDINGS_ARGS:---batch-size 1024 --check-remedies 3} --check-out /tmp/gpu-job-checks \
    --check-csv "$out/findings-checks.csv" >"$out/findings.txt" 2>&1
  echo "findings exit $?"; tail -n 40 "$out/findings.txt"
fi
if want commands; then stamp "commands"
  i=0; while IFS= read -r c; do [ -n "${c// }" ] || continue; i=$((i+1)); stamp "command $i: $c"
    timeout "${CMD_TIMEOUT:-600}" bash -c "$c" </dev/null >"$out/cmd-$i.log" 2>&1; echo "command $i exit $?"; tail -n 12 "$out/cmd-$i.log"
  done < <(awk 'BEGIN { RS = " ;; " } { print }' <<<"$CMDS")
fi
if want fixture && [ -d "$run" ]; then stamp "fixture"
  fx=/tmp/gpu-job-fixture; rm -rf "$fx"; cp -r "$run" "$fx"
  find "$fx" \( -name '*.nsys-rep' -o -name '*.qdrep' \) -delete
  find "$fx" -name nsys.sqlite | while read -r f; do
    python3 -c "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import record_gpu_fixtures as r; \
r.trim_nsys(Path(sys.argv[2]), Path(sys.argv[2] + '.gz'))" "$repo/tests/data" "$f" && rm -f "$f"
  done
  find "$fx" -name '*.log' -size +0 -exec gzip -9 -f {} \;
  (cd "$fx" && tar cJf - . | split -b 15M -d - "$out/run_fixture.tar.xz.")
fi
ls -l "$out"; du -sh "$out"
stamp "done"
