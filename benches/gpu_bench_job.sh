#!/usr/bin/env bash
# One bench job on the GPU machine as `nox -s bench` makes it (that machine has no nox): `kernelmap run`
# (clean pass, PROFILE capture passes), the step benchmarks of the same job (one pytest process per
# framework; MXNet from the tree that benches/gpu_mxnet_session.sh unpacks), `kernelmap save-job`, then
# `kernelmap report --strict --storage`: the "clean vs step benchmark" check on a GPU job.
#   benches/gpu_bench_job.sh DATA OUT [PROFILE (default none)] [STEPS (default 50)]
# Back in OUT: run.err, bench-<fw>.txt, report.txt (its self-checks), job.tar.xz (results.json,
# manifest.json, the saved benchmark run, the report's tables).
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
data=$1; out=$(realpath -m "$2"); profile=${3:-none}; steps=${4:-50}
repo=$(pwd); mkdir -p "$out"
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
export KERNELMAP_JOB=gpu-$(date -u +%Y%m%dT%H%M%SZ)
w=/tmp/benchjob; rm -rf "$w"; mkdir -p "$w"; cp -r "$repo/benches" "$w/"; cd "$w" || exit 3
tree=$(ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1)
t0=$(date +%s)
python3 -m kernelmap.cli run --framework all --device gpu --profile "$profile" --steps "$steps" --batch-size 64 1024 \
  --trials 3 --data "$data" --out "$w/run" >"$out/run.txt" 2>"$out/run.err"
echo "run exit $? after $(( $(date +%s) - t0 )) s"; tail -n 12 "$out/run.txt"
for fw in pytorch mxnet jax; do
  extra=(); [ "$fw" = mxnet ] && [ -n "$tree" ] && extra=(PYTHONPATH="$tree/python" KERNELMAP_MXNET_TREE="$tree")
  env "${extra[@]}" python3 -m pytest benches/bench_train_step.py --framework="$fw" --benchmark-json="$w/$fw.json" \
    -p no:cacheprovider --benchmark-max-time=0.5 --bench-data="$data" --bench-batch-size=64 --bench-batch-size=1024 \
    >"$out/bench-$fw.txt" 2>&1
  echo "step benchmarks $fw exit $? ($(( $(date +%s) - t0 )) s): $(tail -n 1 "$out/bench-$fw.txt")"
done
parts=(); for fw in pytorch mxnet jax; do [ -s "$w/$fw.json" ] && parts+=("$w/$fw.json"); done
python3 -m kernelmap.cli save-job --job "$KERNELMAP_JOB" --storage "$w/.benchmarks" "${parts[@]}"
python3 -m kernelmap.cli report "$w/run" -o "$w/report" --storage "$w/.benchmarks" --strict >"$out/report.txt" 2>&1
echo "report --strict exit $?"; grep -E "self-checks|FAIL|clean vs step" "$out/report.txt" | cut -c1-400 | head -n 20
(cd "$w" && tar cJf "$out/job.tar.xz" run/manifest.json run/results.json .benchmarks report/tables report/report.html \
  report/*.png 2>/dev/null)
ls -l "$out"
