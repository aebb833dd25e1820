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
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = [json.loads((out / f"repeat{i}.json").read_text()) for i in (1, 2, 3) if (out / f"repeat{i}.json").stat().st_size]
by_bs = {}
for run in runs:
    for r in run["results"]:
        by_bs.setdefault(r["batch_size"], []).append(r)
print("repeated kernelmap runs (clean pass, step median ms [95% CI]; spread = max |x - median of the three| / median)")
for bs, rs in sorted(by_bs.items()):
    meds = [r["median_step_s"] * 1e3 for r in rs]
    mid = statistics.median(meds)
    spread = max(abs(m - mid) for m in meds) / mid
    cells = ", ".join(f"{r['median_step_s'] * 1e3:.3f} [{r['ci95_low_s'] * 1e3:.3f}-{r['ci95_high_s'] * 1e3:.3f}]" for r in rs)
    e2e = ", ".join(f"{r['e2e_step_s'] * 1e3:.3f}" for r in rs)
    print(f"bs {bs}: {cells}; spread {spread:.1%}; end-to-end with loader ms: {e2e}")
PY
