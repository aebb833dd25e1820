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
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
by_bs = {}
for i in (1, 2, 3):
    f = out / f"repeat{i}.json"
    if f.is_file() and f.stat().st_size:
        for r in json.loads(f.read_text())["results"]:
            by_bs.setdefault(r["batch_size"], []).append(r)
print("repeats (clean pass step median ms [95% CI]); spread = max |x - median of the runs| / median")
for bs, rs in sorted(by_bs.items()):
    meds = [r["median_step_s"] * 1e3 for r in rs]
    mid = statistics.median(meds)
    print(f"bs {bs}: " + ", ".join(f"{r['median_step_s']*1e3:.3f} [{r['ci95_low_s']*1e3:.3f}-{r['ci95_high_s']*1e3:.3f}]"
                                   for r in rs) + f"; spread {max(abs(m - mid) for m in meds) / mid:.1%}")
PY
