#!/usr/bin/env bash
# Issue 25 on the GPU: every library kernel linked to the call that launched it, at every batch size, in every
# framework. From the repo root on the GPU machine:
#   benches/gpu_link.sh KIT OUT [NSYS_ENV]
# KIT: the MXNet sm_90 tree's parts (mxtree.tar.xz.NN, the lead's .mxtree), unpacked by
# benches/gpu_mxnet_session.sh unpack; NSYS_ENV: the file that puts nsys on PATH (the lead's .gpu/nsys-env.sh).
# Two runs, detached in one job (they outlast one 10-minute call: call again on the same warm machine to wait
# more; a finished job is not run again):
#   1. kernelmap run --framework all --device gpu --profile all --batch-size 64 256 1024 (PyTorch, MXNet
#      imperative, JAX), 1 clean trial, STEPS (default 20) timed steps, no repeats  -> /tmp/link/all
#   2. the same for MXNet hybridized (--hybridize)                                    -> /tmp/link/hyb
# Then benches/link_summary.py prints, per framework x mode x batch size x source, the linked share of
# library-kernel time (attribution.json), every unlinked remainder with its reason, what the libs pass's own
# trace owned, the layers where a timing pass ran other kernels, and the library calls per step against the
# model; `kernelmap report --strict` on each run. Estimate on an H100: ~36 + 12 worker processes of 5-25 s
# (imports, JIT, nsys start and export): about 10-14 min for both runs.
# Back in OUT: link-summary.txt/.json, run-*.json/.err, report-*.txt, and gpu_link_run.tar.xz: both run dirs
# trimmed (.nsys-rep dropped, nsys.sqlite trimmed to the adapter's tables and gzipped, logs gzipped; < 40 MB),
# the fixture tests/test_gpu_link_run.py reads (unpack into tests/data/gpu_link_run/).
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
kit=$(realpath "$1"); out=$(realpath -m "$2"); nsys_env=${3:-}
repo=$(pwd); job=/tmp/link
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$out"
running() { pgrep -f "gpu-link-job.sh" >/dev/null; }
if ! running && [ ! -e "$job/DONE" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
  bash "$repo/benches/gpu_mxnet_session.sh" unpack "$kit" "$out" || echo "MXNet tree not unpacked: MXNet will be skipped"
  rm -rf "$job"; mkdir -p "$job"
  cp "$repo/benches/link_summary.py" "$repo/tests/data/record_gpu_fixtures.py" "$job"/
  cat >"$job/gpu-link-job.sh" <<'JOB'
set -uo pipefail
job=$1; nsys_env=$2; steps=${STEPS:-20}
[ -n "$nsys_env" ] && source "$nsys_env"
cd /tmp || exit 3
python3 -m kernelmap.cli doctor 2>&1 | tail -n 14
t0=$(date +%s)
common=(--device gpu --profile all --batch-size 64 256 1024 --steps "$steps" --trials 1 --max-repeats 0 --data synthetic --replace --json)
python3 -m kernelmap.cli run --framework all "${common[@]}" --out "$job/all" >"$job/run-all.json" 2>"$job/run-all.err"
echo "run all exit $? after $(( $(date +%s) - t0 )) s: $(tail -n 2 "$job/run-all.err" | tr '\n' ' ')"
python3 -m kernelmap.cli run --framework mxnet --hybridize "${common[@]}" --out "$job/hyb" >"$job/run-hyb.json" 2>"$job/run-hyb.err"
echo "run hybridized exit $? after $(( $(date +%s) - t0 )) s: $(tail -n 2 "$job/run-hyb.err" | tr '\n' ' ')"
dirs=(); for d in "$job/all" "$job/hyb"; do [ -f "$d/attribution.json" ] && dirs+=("$d"); done
python3 "$job/link_summary.py" "${dirs[@]}" --json "$job/link-summary.json" >"$job/link-summary.txt" 2>&1
for d in "${dirs[@]}"; do
  python3 -m kernelmap.cli report "$d" --out "$d-report" --strict >"$job/report-$(basename "$d").txt" 2>&1
  echo "report $(basename "$d") exit $?" >>"$job/report-$(basename "$d").txt"
done
# the fixture: both run dirs, trimmed
rm -rf "$job/fixture"; mkdir -p "$job/fixture"
for d in "${dirs[@]}"; do
  n=$(basename "$d"); cp -r "$d" "$job/fixture/$n"
  find "$job/fixture/$n" \( -name '*.nsys-rep' -o -name '*.qdrep' \) -delete
  find "$job/fixture/$n" -name 'nsys.sqlite' | while read -r f; do
    python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import record_gpu_fixtures as r; from pathlib import Path; \
r.trim_nsys(Path(sys.argv[2]), Path(sys.argv[2] + '.gz'))" "$job" "$f" && rm -f "$f"
  done
  find "$job/fixture/$n" -name '*.log' -size +0 -exec gzip -9 -f {} \;
done
(cd "$job/fixture" && tar cJf "$job/gpu_link_run.tar.xz" .)
size=$(stat -c %s "$job/gpu_link_run.tar.xz")
if [ "$size" -gt 40000000 ]; then  # records.parquet can be made again (kernelmap normalise RUN_DIR)
  find "$job/fixture" -name records.parquet -delete
  (cd "$job/fixture" && tar cJf "$job/gpu_link_run.tar.xz" .)
  echo "fixture over 40 MB ($size bytes): records.parquet left out, now $(stat -c %s "$job/gpu_link_run.tar.xz") bytes"
fi
echo "done after $(( $(date +%s) - t0 )) s"
touch "$job/DONE"
JOB
  setsid nohup bash "$job/gpu-link-job.sh" "$job" "$nsys_env" >"$job/job.log" 2>&1 </dev/null &
  echo "started the link runs at $(date +%T)"
fi
t0=$(date +%s)
while [ ! -e "$job/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-560}" ]; do sleep 5; done
tail -n 30 "$job/job.log"
if [ -e "$job/DONE" ]; then
  cat "$job/link-summary.txt"
  tail -n 20 "$job"/report-*.txt
  cp "$job"/link-summary.* "$job"/run-*.json "$job"/run-*.err "$job"/report-*.txt "$job"/gpu_link_run.tar.xz "$job/job.log" "$out"/ 2>/dev/null
  ls -l "$out"
else
  echo "still running: call again (same command) on this warm machine"
fi
