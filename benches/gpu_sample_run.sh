#!/usr/bin/env bash
# The GPU run behind docs/sample-report and the closing notes' repeat figures, in one device call:
#   1. every framework that runs here, all capture passes, batch 64 and 1024 -> OUT/sample.tgz (small files)
#   2. three repeated clean-pass runs of PyTorch at batch 64/256/1024     -> OUT/repeatN.json
# usage: benches/gpu_sample_run.sh DATA OUT [NSYS_ENV]
set -uo pipefail
data=$1; out=$2; nsys_env=${3:-}
[ -n "$nsys_env" ] && source "$nsys_env"
mkdir -p "$out"
python3 -m kernelmap.cli run --framework all --device gpu --profile all --steps 100 --batch-size 64 1024 \
  --data "$data" --out /tmp/sample --json >"$out/sample.json" 2>"$out/sample.err"
echo "sample run exit $?: $(tail -n 2 "$out/sample.err" | tr '\n' ' ')"
(cd /tmp/sample 2>/dev/null && tar czf "$out/sample.tgz" manifest.json results.json parity-*.json records.parquet \
  attribution.json logs */bs*/*.json 2>/dev/null)
for i in 1 2 3; do
  python3 -m kernelmap.cli run --framework pytorch --device gpu --steps 100 --batch-size 64 256 1024 \
    --data "$data" --out "/tmp/repeat$i" --json >"$out/repeat$i.json" 2>"$out/repeat$i.err" \
    || echo "repeat $i failed: $(tail -n 1 "$out/repeat$i.err")"
done
python3 benches/repeats.py "$out"/repeat*.json
