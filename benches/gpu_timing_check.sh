#!/usr/bin/env bash
# GPU timing figures: the reference loop (bare loop vs the clean pass, benches/bench_reference_loop.py)
# and three repeated `kernelmap run`s of the clean pass at batch 64/256/1024, then their agreement.
# usage: benches/gpu_timing_check.sh [DATA] [OUTDIR]    (DATA: synthetic | a directory of IDX files)
set -uo pipefail
data=${1:-synthetic}
out=${2:-runs/timing-check}
mkdir -p "$out"
python3 -m pytest benches/bench_reference_loop.py --framework=pytorch --bench-data="$data" -m gpu -s \
  -p no:cacheprovider --benchmark-json="$out/reference.json" 2>&1 | tee "$out/reference.log" \
  | grep -E "^reference loop|passed|failed|skipped|Error"
for i in 1 2 3; do
  python3 -m kernelmap.cli run --framework pytorch --device gpu --steps 200 --batch-size 64 256 1024 \
    --data "$data" --out "$out/repeat$i" --json >"$out/repeat$i.json" 2>"$out/repeat$i.err" \
    || echo "repeat $i failed: $(tail -n 1 "$out/repeat$i.err")"
done
python3 benches/repeats.py "$out"/repeat*.json
