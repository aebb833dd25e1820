#!/usr/bin/env bash
# First screens of `kernelmap report` on other people's traces (issue 27), CPU only:
#   bash benches/foreign_first_screens.sh [OUT_DIR]      (default docs/issue27)
# Renders the page of the DDP/NCCL trace and of the single-GPU H100 inference trace
# (tests/data/foreign/, README.md there) and screenshots each with headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/issue27}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pair in "ddp_nccl:tests/data/foreign/hta_ddp_nccl_step5.json.gz" \
            "h100_inference:tests/data/foreign/tracelens_h100_bert_inference.json.gz"; do
  name=${pair%%:*}
  trace=${pair#*:}
  python -m kernelmap.cli report "$trace" -o "$tmp/$name"
  cp "$tmp/$name/report.html" "$OUT/$name.html"
  mkdir -p "$OUT/${name}_tables"
  cp "$tmp/$name/tables/"*.csv "$OUT/${name}_tables/"
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1400 \
    --screenshot="$OUT/$name.png" "file://$PWD/$OUT/$name.html" 2>/dev/null
  echo "wrote $OUT/$name.png"
done
