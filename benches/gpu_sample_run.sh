#!/usr/bin/env bash
# The GPU run behind docs/sample-report and the closing notes' repeat figures, in device calls:
#   benches/gpu_sample_run.sh sample  DATA OUT [NSYS_ENV] [MXKIT]
#       every framework that runs here (MXNet from the tree carried in MXKIT's parts, unpacked by
#       benches/gpu_mxnet_session.sh), all capture passes, batch 64 and 1024, 3 clean trials, and its
#       report -> OUT/sample.tar.xz (the run's small files), OUT/report.tar.xz, OUT/raw.tar.xz.NN (raw captures)
#       (about 12 min on an H100: detached, so two chained calls; see the phase)
#   benches/gpu_sample_run.sh repeats DATA OUT
#       three repeated clean-pass runs of PyTorch at batch 64/256/1024 -> OUT/repeatN.json, their
#       agreement (benches/repeats.py), and the host's own spread (benches/gpu_host_noise.py)
# DATA: synthetic, a directory of IDX files, or auto (Debian's Fashion-MNIST where installed, else synthetic).
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
phase=$1; data=$2; out=$(realpath -m "$3"); nsys_env=${4:-}; kit=${5:-}
repo=$(pwd)
if [ "$data" = auto ]; then
  data=synthetic; [ -d /usr/share/datasets/fashion-mnist ] && data=/usr/share/datasets/fashion-mnist
fi
mkdir -p "$out"
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
running() { pgrep -f "sample-job.sh sample-job" >/dev/null; }
# a sample job already running keeps the package it started with
[ "$phase" = sample-job ] || running || \
  python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
case $phase in
sample)  # started detached (it outlasts one 10-minute call), then waited for up to WAIT_S (default 560 s);
  # call again on the same warm machine to wait more. Its files reach OUT once it is done.
  job=/tmp/sample-job
  if ! running && [ ! -e "$job/DONE" ]; then
    [ -n "$kit" ] && bash "$repo/benches/gpu_mxnet_session.sh" unpack "$kit" "$out"
    rm -rf "$job"; mkdir -p "$job"
    # from a copy in /tmp: the next call lays the checkout anew under the running job
    cp "$repo/benches/gpu_sample_run.sh" /tmp/sample-job.sh
    if [ -n "$nsys_env" ]; then
      rm -rf /tmp/sample-nsys && cp -r "$(dirname "$nsys_env")" /tmp/sample-nsys && nsys_env=/tmp/sample-nsys/$(basename "$nsys_env")
    fi
    setsid nohup bash /tmp/sample-job.sh sample-job "$data" "$job" "$nsys_env" \
      >"$job/job.log" 2>&1 </dev/null &
    echo "started the sample run ($data) at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-560}" ]; do sleep 5; done
  tail -n 40 "$job/job.log"
  [ -e "$job/DONE" ] && cp "$job"/*.tar.xz* "$job"/sample.json "$job"/sample.err "$out"/ 2>/dev/null
  [ -e "$job/DONE" ] || echo "still running: call again"
  ;;
sample-job)  # the sample run itself (in the background; see sample)
  [ -n "$nsys_env" ] && source "$nsys_env"
  cd /tmp || exit 3
  python3 -m kernelmap.cli doctor 2>&1 | tail -n 12
  python3 -m kernelmap.cli run --framework all --device gpu --profile all --steps 50 --batch-size 64 1024 \
    --trials 3 --data "$data" --out /tmp/sample --json >"$out/sample.json" 2>"$out/sample.err"
  echo "sample run ($data) exit $?: $(tail -n 2 "$out/sample.err" | tr '\n' ' ')"
  (cd /tmp/sample 2>/dev/null && tar cJf "$out/sample.tar.xz" manifest.json results.json parity-*.json \
    records.parquet attribution.json logs */bs*/*.json 2>/dev/null)
  python3 -m kernelmap.cli report /tmp/sample --out /tmp/sample-report 2>&1 | tail -n 30
  (cd /tmp/sample-report && tar cJf "$out/report.tar.xz" .)
  # the raw captures, to normalise again elsewhere (kernelmap normalise RUN_DIR): every MXNet capture
  # (its kernels come from nsys), the other frameworks' but their nsys files; parts of 15 MB
  (cd /tmp/sample && tar cf - --exclude='*.nsys-rep' mxnet \
      $(find pytorch jax -type f ! -name '*.nsys-rep' ! -name '*.sqlite*' 2>/dev/null) 2>/dev/null | xz -3 -T0 \
    | split -b 15M -d - "$out/raw.tar.xz." && ls -l "$out"/raw.tar.xz.* | awk '{s+=$5} END {print "raw captures:", NR, "parts,", s, "bytes"}')
  ls "$out"/raw.tar.xz.* | tail -n +5 | xargs -r rm -v
  touch "$out/DONE"
  ;;
repeats)
  cd /tmp || exit 3
  for i in 1 2 3; do
    python3 -m kernelmap.cli run --framework pytorch --device gpu --steps 100 --batch-size 64 256 1024 \
      --data "$data" --out "/tmp/repeat$i" --json >"$out/repeat$i.json" 2>"$out/repeat$i.err" \
      || echo "repeat $i failed: $(tail -n 1 "$out/repeat$i.err")"
  done
  python3 "$repo/benches/repeats.py" "$out"/repeat*.json
  python3 "$repo/benches/gpu_host_noise.py" --batch-size 64 256 --repeats 3 --cpus all 2-3
  ;;
*) echo "unknown phase $phase (sample | repeats)"; exit 2;;
esac
