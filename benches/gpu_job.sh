#!/usr/bin/env bash
# The GPU job: one script for every GPU measurement, its options as environment variables. From the repo
# root on the GPU machine (the device tool lays the checkout there; carry .gpu/ and .mxtree/):
#   OUT=$OUT benches/gpu_job.sh          start the job detached (it may outlast one 10-minute call), wait up
#                                        to WAIT_S (default 540) and pack what is done into $OUT
#   OUT=$OUT benches/gpu_job.sh          again, on the same warm machine: wait more, pack again
#   benches/gpu_job.sh stage             copy this call's MXNet tree parts (.mxtree/) to /tmp/mxparts: a tree
#                                        and the checkout are over one call's carry, so parts come in two calls
# Options:
#   PHASES     which steps, in this order (default "bare mxnet run report links"):
#              bare    the reference bare loops (.gpu/probes: torch_modes.py, bare_loops.py per framework) at
#                      BARE_BS (default "64 1024"), before anything of kernelmap is installed
#              mxnet   unpack the carried sm_90 MXNet tree (kernelmap build-mxnet --arch 90, tar | xz parts
#                      mxtree.tar.xz.NN) into $KERNELMAP_MXNET_HOME; MX_PARTS=N waits for N parts first
#              run     kernelmap run $RUN_ARGS --out /tmp/gpu-job/run
#              report  kernelmap report --strict on it (exit 4: a self-check failed)
#              links   benches/link_summary.py: library-kernel time linked to its call per case and source
#              sweep   benches/option_sweep.py $SWEEP_ARGS (every option combination ran or refused by name)
#              tests   the GPU tests (pytest -m gpu) against the installed package
#   RUN_ARGS   default: --framework all --device gpu --mode all --profile all --batch-size 64 --steps 20
#              --trials 1 --max-repeats 0 --data synthetic
#   SWEEP_ARGS default: --device gpu
# Back in $OUT: job.tar.NN (15 MB parts, at most 8 files come back; cat job.tar.* | tar x): job.log, the
# bare loops' JSON lines, the run's small files (no nsys reports), the report, the sweep's table.
set -uo pipefail
final=${OUT:?set OUT}; job=/tmp/gpu-job
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
MXPARTS=${KERNELMAP_MXPARTS:-/tmp/mxparts}
if [ "${1:-}" = stage ]; then
  mkdir -p "$MXPARTS" && cp .mxtree/mxtree.tar.xz.* "$MXPARTS"/ && ls -l "$MXPARTS"; exit 0
fi
if [ "${1:-}" = build-mxnet ]; then
  # `kernelmap build-mxnet` on this machine's cores from the carried kit .mxkit/ (src/: the offline
  # source tarballs; whl/: numpy 1.26 for Python 3.12; km-head.tar: the kernelmap that builds it), detached,
  # then the tree packed into $OUT as mxtree.tar.xz.NN, to carry to later holds. The kit and the checkout
  # are over one call's carry: whl/ may come in the next call (a placeholder stands in until the install step).
  mkdir -p "$final" /tmp/mxwhl; whl=/tmp/mxwhl/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
  [ -f .mxkit/whl/"$(basename "$whl")" ] && cp .mxkit/whl/"$(basename "$whl")" "$whl" && echo "numpy wheel staged"
  tree() { ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1; }
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
running() { pgrep -f "gpu-job-run.sh job" >/dev/null; }
if [ "${1:-}" != job ]; then
  mkdir -p "$final"
  if ! running && [ ! -e "$job/DONE" ]; then
    rm -rf "$job" /tmp/gpu-job-repo; mkdir -p "$job"
    # from a copy: the next call lays the checkout anew under the running job
    cp -r "$(pwd)" /tmp/gpu-job-repo && cp benches/gpu_job.sh /tmp/gpu-job-run.sh
    (cd /tmp/gpu-job-repo && OUT="$job" setsid nohup bash /tmp/gpu-job-run.sh job >"$job/job.log" 2>&1 </dev/null &)
    echo "started the GPU job at $(date +%T): ${PHASES:-bare mxnet run report links}"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-540}" ]; do sleep 5; done
  tail -n 80 "$job/job.log"
  rm -f "$final"/job.tar.*
  (cd "$job" && tar cf - --exclude='*.nsys-rep' --exclude='*.sqlite' --exclude=run-dir . | split -b 15M -d - "$final/job.tar.")
  ls -l "$final"
  [ -e "$job/DONE" ] || echo "still running: call again (same warm machine)"
  exit 0
fi

# --- the job (detached; cwd: a copy of the checkout) ---
repo=$(pwd); out=$final; phases=${PHASES:-bare mxnet run report links}
trap 'touch "$out/DONE"' EXIT  # a job that stops early still ends the wait
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
want() { [[ " $phases " == *" $1 "* ]]; }
tree() { ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1; }
nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader; nproc
if want bare; then
  stamp "bare loops (${BARE_BS:-64 1024})"
  # shellcheck disable=SC2086  # word-split on purpose: a list of batch sizes
  (cd /tmp && NVIDIA_TF32_OVERRIDE=0 timeout 300 python3 "$repo/.gpu/probes/torch_modes.py" ${BARE_BS:-64 1024} \
     >"$out/bare_torch_modes.jsonl" 2>"$out/bare.err"; echo "torch_modes exit $?")
  for fw in jax; do
    # shellcheck disable=SC2086
    (cd /tmp && NVIDIA_TF32_OVERRIDE=0 timeout 200 python3 "$repo/.gpu/probes/bare_loops.py" $fw ${BARE_BS:-64 1024} \
       >>"$out/bare_loops.jsonl" 2>>"$out/bare.err"; echo "bare $fw exit $?")
  done
  cat "$out"/bare_*.jsonl
fi
stamp "install"
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
(cd /tmp && python3 -c "import kernelmap.frameworks") || { echo "kernelmap does not import"; exit 3; }
if want mxnet && [ -z "$(tree)" ]; then
  have_parts() { for f in .mxtree/mxtree.tar.xz.* "$MXPARTS"/mxtree.tar.xz.*; do [ -e "$f" ] && basename "$f"; done | sort -u | wc -l; }
  w=0; while [ "$(have_parts)" -lt "${MX_PARTS:-0}" ] && [ $w -lt 600 ]; do sleep 2; w=$((w+2)); done
  stamp "unpack the MXNet tree ($(have_parts) parts)"
  mapfile -t files < <(for f in .mxtree/mxtree.tar.xz.* "$MXPARTS"/mxtree.tar.xz.*; do [ -e "$f" ] && echo "$(basename "$f") $f"; done | sort -u -k1,1 | cut -d' ' -f2-)
  unpack="$KERNELMAP_MXNET_HOME/.unpack-$$"  # moved in only when whole: no half tree passes for one
  if [ "${#files[@]}" -gt 0 ] && rm -rf "$unpack" && mkdir -p "$unpack" && cat "${files[@]}" | xz -d | tar -x -C "$unpack" \
     && mv "$unpack"/* "$KERNELMAP_MXNET_HOME"/ && rmdir "$unpack"; then
    echo "unpacked the carried tree: $(tree)"
  else
    rm -rf "$unpack"; echo "cannot unpack the carried MXNet tree from ${files[*]:-(no parts)}: MXNet runs on the CPU, labelled"
  fi
fi
if want bare && [ -n "$(tree)" ]; then  # MXNet's bare loops need the tree
  for fw in mxnet mxnet-hybridized; do
    # shellcheck disable=SC2086
    (cd /tmp && PYTHONPATH="$(tree)/python" MXTREE="$(tree)" NVIDIA_TF32_OVERRIDE=0 timeout 200 \
       python3 "$repo/.gpu/probes/bare_loops.py" $fw ${BARE_BS:-64 1024} >>"$out/bare_loops.jsonl" 2>>"$out/bare.err"
     echo "bare $fw exit $?")
  done
fi
[ -f .gpu/nsys-env.sh ] && source .gpu/nsys-env.sh
cd /tmp || exit 3
run=/tmp/gpu-job-run-dir
if want run; then
  stamp "run"
  rm -rf "$run"
  # shellcheck disable=SC2086  # word-split on purpose: kernelmap run's arguments
  python3 -m kernelmap.cli run ${RUN_ARGS:---framework all --device gpu --mode all --profile all --batch-size 64 --steps 20 --trials 1 --max-repeats 0 --data synthetic} \
    --out "$run" --json >"$out/run.json" 2>"$out/run.err"
  echo "run exit $?"; tail -n 25 "$out/run.err"
fi
if want report; then
  stamp "report"
  python3 -m kernelmap.cli report "$run" --out /tmp/gpu-job-report --replace --strict >"$out/report.log" 2>&1
  echo "report --strict exit $?"; tail -n 30 "$out/report.log"
  (cd /tmp/gpu-job-report 2>/dev/null && tar cJf "$out/report.tar.xz" .)
fi
if want links; then
  stamp "links"
  python3 "$repo/benches/link_summary.py" "$run" --json "$out/link_summary.json" >"$out/link_summary.txt" 2>&1
  echo "link summary exit $?"; head -n 40 "$out/link_summary.txt"
fi
if want sweep; then
  stamp "sweep"
  # shellcheck disable=SC2086
  python3 "$repo/benches/option_sweep.py" ${SWEEP_ARGS:---device gpu} >"$out/sweep.md" 2>"$out/sweep.err"
  echo "sweep exit $?"; cat "$out/sweep.md"; tail -n 5 "$out/sweep.err"
fi
if want tests; then
  stamp "gpu tests"
  # from /tmp: the checkout's kernelmap/ would shadow the installed package
  timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider -c /dev/null --import-mode=append "$repo/tests" \
    >"$out/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -n 15 "$out/gpu_tests.log"
fi
stamp "pack"
# the run's small files: records, attribution, results, logs; the traces only at bs 64 (16 MiB a file back)
if [ -d "$run" ]; then
  (cd "$run" && tar cJf "$out/run.tar.xz" --exclude='*.nsys-rep' --exclude='*.sqlite' manifest.json results.json \
     parity-*.json records.parquet attribution.json logs ./*/bs*/*.json 2>/dev/null)
fi
ls -l "$out"; du -sh "$out"
stamp "done"
