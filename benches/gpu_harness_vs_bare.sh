#!/usr/bin/env bash
# Issue 29's harness check on the GPU: kernelmap's clean pass against an independent bare loop of the same
# model, in separate processes, interleaved (bare, kernelmap, bare, kernelmap, ...), N processes each, per
# framework mode at batch 64 and 1024. The bare loops are the reference probes (not project code):
#   benches/gpu_harness_vs_bare.sh PROBES_DIR OUT [N=5] [MODES="pytorch jax mxnet mxnet-hybridized"]
# Resumable across device calls on one warm machine: results gather in $HARNESS_DIR (default /tmp/harness),
# a pair already measured is not run again, and no new pair starts after DEADLINE_S seconds (default 540)
# of this call; each call copies what is there to OUT. STEPS (default 300) is the clean pass's --steps.
# PROBES_DIR holds bare_loops.py (carry a copy of ../shared/probes). MXNet needs a built tree in
# $KERNELMAP_MXNET_HOME (benches/gpu_mxnet_session.sh unpack). Summary: benches/harness_vs_bare.py OUT.
# Runs from /tmp with the installed package (the checkout's kernelmap/ would shadow it).
set -uo pipefail
probes=$(realpath "$1"); out=$(realpath -m "$2"); n=${3:-5}
modes=${4:-pytorch jax mxnet mxnet-hybridized}
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1 NVIDIA_TF32_OVERRIDE=0
mkdir -p "$out"; repo=$(pwd); t0=$(date +%s)
work=${HARNESS_DIR:-/tmp/harness}; mkdir -p "$work"
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
cd /tmp
tree=$(ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1)
for i in $(seq 1 "$n"); do
  for mode in $modes; do
    [ -s "$work/run-$mode-$i.json" ] && continue
    [ $(( $(date +%s) - t0 )) -ge "${DEADLINE_S:-540}" ] && continue
    fw=${mode%-hybridized}; flag=; [ "$mode" != "$fw" ] && flag=--hybridize
    env_mx=(); [ "$fw" = mxnet ] && env_mx=(PYTHONPATH="$tree/python" MXTREE="$tree")
    env "${env_mx[@]}" timeout 300 python3 "$probes/bare_loops.py" "$mode" 64 1024 2>>"$work/bare.err" \
      | sed "s/^{/{\"mode\": \"$mode\", \"process\": $i, /" >>"$work/bare.jsonl"
    timeout 400 python3 -m kernelmap.cli run --framework "$fw" $flag --device gpu --profile none --steps "${STEPS:-300}" \
      --trials 1 --max-repeats 0 --batch-size 64 1024 --data synthetic --out "/tmp/harness-$mode-$i" --replace --json \
      >"$work/run-$mode-$i.json" 2>>"$work/run.err" || echo "kernelmap run $mode $i failed: $(tail -n 1 "$work/run.err")"
  done
done
python3 "$repo/benches/harness_vs_bare.py" "$work" | tee "$work/summary.txt"
(cd "$work" && tar cJf "$out/harness.tar.xz" .)
