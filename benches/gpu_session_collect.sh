#!/usr/bin/env bash
# Collect what benches/gpu_session.sh's job has finished so far (a later call on the same warm machine):
#   OUT=... benches/gpu_session_collect.sh link|graph|custom WAIT_S
# link: waits for the issue-25 runs, then link_summary.py, report --strict of link-all, the trimmed runs.
set -uo pipefail
what=$1; wait_s=${2:-300}; J=/tmp/s; O=${OUT:?}; mkdir -p "$O"; t0=$(date +%s)
case $what in link) mark="run link-hyb exit";; graph) mark="3. issue 26";; custom) mark="4. summaries";; esac
while ! grep -q "$mark" "$J/out/job.log" && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do sleep 5; done
tail -n 12 "$J/out/job.log"
cd /tmp || exit 3
trim() {  # run dirs -> $O/$1.tar.xz.NN (no .nsys-rep, nsys trimmed, logs gzipped)
  local name=$1; shift; rm -rf "/tmp/fx-$name"; mkdir -p "/tmp/fx-$name"
  for d in "$@"; do
    [ -d "$d" ] || continue; n=$(basename "$d"); cp -r "$d" "/tmp/fx-$name/$n"
    find "/tmp/fx-$name/$n" \( -name '*.nsys-rep' -o -name '*.qdrep' \) -delete
    find "/tmp/fx-$name/$n" -name 'nsys.sqlite' | while read -r f; do
      python3 -c "import sys; sys.path.insert(0, '/tmp/gpu-session-repo/tests/data'); import record_gpu_fixtures as r; \
from pathlib import Path; r.trim_nsys(Path(sys.argv[1]), Path(sys.argv[1] + '.gz'))" "$f" && rm -f "$f"
    done
    find "/tmp/fx-$name/$n" -name '*.log' -size +0 -exec gzip -9 -f {} \;
  done
  (cd "/tmp/fx-$name" && tar cJf - . | split -b 15M -d - "$O/$name.tar.xz.")
}
case $what in
link)
  python3 /tmp/gpu-session-repo/benches/link_summary.py $J/link-all $J/link-hyb --json "$O/link-summary.json" \
    >"$O/link-summary.txt" 2>&1; head -n 100 "$O/link-summary.txt"
  cp "$J"/out/run-link-* "$O"/ 2>/dev/null
  trim link "$J/link-all" "$J/link-hyb"
  python3 -m kernelmap.cli report "$J/link-all" "$J/link-hyb" --out /tmp/rep-link --replace --strict >"$O/report-link.txt" 2>&1
  echo "report exit $?"; grep -E "^self-checks|^  FAIL" "$O/report-link.txt" | cut -c1-250 | head -n 20
  (cd /tmp/rep-link && tar cJf "$O/report-link.tar.xz" .) ;;
graph|custom)
  cp "$J"/out/*.json* "$J"/out/*.txt "$J"/out/*.err "$O"/ 2>/dev/null; cat "$O/graph_vs_bare.json" 2>/dev/null
  trim "$what" "$J/graph" $(ls -d $J/custom-* 2>/dev/null)
  [ -d "$O/../graph_fixture" ] || cp -r "$J/out/graph_fixture" "$O/" 2>/dev/null ;;
esac
cp "$J/out/job.log" "$O/"; ls -l "$O" | head -n 40
