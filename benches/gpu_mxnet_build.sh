#!/usr/bin/env bash
# One device call of the MXNet sm_90 build (kernelmap build-mxnet), resumable across calls, with the
# GPU otherwise idle meanwhile put to use: the ResNet-50 traces of benches/record_resnet50_trace.py.
#   usage: benches/gpu_mxnet_build.sh KIT OUT BUDGET_S [resnet]
#   KIT: a folder with src/ (the kit's tarballs), whl/numpy-1.26*.whl, device/nsys-env.sh
#   the tree goes to $KERNELMAP_MXNET_HOME (default /tmp/mxhome), the build dir to /tmp/mxw (kept
#   between calls of one warm machine); once installed, the tree comes back as OUT/mxtree.tar.xz.NN
#   (16 MiB parts) when it fits in 48 MiB.
set -uo pipefail
kit=$(realpath "$1"); out=$(realpath -m "$2"); budget=$3; resnet=${4:-}
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3; (cd /tmp && python3 -c "import kernelmap.frameworks") || exit 3
source "$kit/device/nsys-env.sh"
pids=()
if [ -n "$resnet" ]; then
  (
    python3 benches/record_resnet50_trace.py kineto /tmp/resnet50_kineto.json.gz --steps 120 \
      && zcat /tmp/resnet50_kineto.json.gz | xz -T4 -6 | split -b 15M -d - "$out/resnet50_kineto.json.xz."
    nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o /tmp/r50 -f true \
      python3 benches/record_resnet50_trace.py nsys - --steps 40 >/dev/null \
      && nsys export --type sqlite -o /tmp/r50.sqlite -f true /tmp/r50.nsys-rep >/dev/null \
      && xz -T4 -6 -c /tmp/r50.sqlite | split -b 15M -d - "$out/resnet50_nsys.sqlite.xz."
    ls -l /tmp/resnet50_kineto.json.gz /tmp/r50.sqlite "$out"
  ) >"$out/resnet50.log" 2>&1 &
  pids+=($!)
fi
tree=$(ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1)
if [ -z "$tree" ]; then
  t0=$(date +%s)
  (cd /tmp && timeout -s INT "$budget" python3 -m kernelmap.cli build-mxnet --source "$kit/src" --work /tmp/mxw \
    --jobs "$(nproc)" --numpy-wheel "$kit"/whl/numpy-1.26*.whl) 2>&1 | grep -v "^\[" | tail -n 30
  echo "build call: $(( $(date +%s) - t0 )) s on $(nproc) cores; ninja: $(tail -n 1 /tmp/mxw/build/ninja.log 2>/dev/null | cut -c1-120)"
  tree=$(ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1)
fi
if [ -n "$tree" ] && ! ls "$out"/mxtree.tar.xz.* >/dev/null 2>&1; then
  cat "$tree/kernelmap-mxnet.json"
  du -sh "$tree"
  tar -C "$(dirname "$tree")" -cf - "$(basename "$tree")" | xz -T0 -6 > /tmp/mxtree.tar.xz
  size=$(stat -c %s /tmp/mxtree.tar.xz); echo "tree compressed: $size bytes"
  [ "$size" -le $((48 * 1024 * 1024)) ] && split -b 15M -d /tmp/mxtree.tar.xz "$out/mxtree.tar.xz."
fi
for p in "${pids[@]}"; do wait "$p"; done
cat "$out/resnet50.log" 2>/dev/null | tail -n 12
ls -l "$out"
