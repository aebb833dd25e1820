#!/usr/bin/env bash
# Issue 26 on the GPU machine, one device call (about 6 min on an H100; MXNet and JAX only where time is left):
#   benches/gpu_custom_op.sh OUT [MXKIT] [NSYS_ENV]
# 1. probes what the three build routes need (nvcc, CUDA headers, ninja, cmake, setuptools) and builds
#    kernelmap's custom op (frameworks/pytorch/custom_op) with its CUDA kernels by each route, in
#    parallel; a route that cannot build says why in one line and the others go on; a second build of
#    each shows the cache (nothing compiled);
# 2. per route: the seed's AddModel (500 epochs, loss every 25, both parameters < 1e-3; its last 5
#    epochs traced), and parity of the custom-op CNN with the built-in one on the GPU (fp32);
# 3. per route: `kernelmap run --framework pytorch --device gpu --profile all --custom-op ROUTE`, and
#    the built-in model once (`--framework all` where MXKIT's MXNet tree unpacks and time is left, else
#    PyTorch alone); then fc1's kernels per run (benches/custom_op_compare.py: the custom kernels
#    beside the built-in gemm/reduce) and the report of all runs.
# OUT gets: probe.txt, build-<route>.json/.log, addmodel-<route>.json (+ its trace), parity-<route>.json,
# run-<name>.tar.xz (manifest, results, parity, records.parquet, attribution, worker json, logs),
# compare.txt, report.tar.xz, summary.txt. MXKIT: the folder with mxtree.tar.xz.NN (see
# benches/gpu_mxnet_session.sh); NSYS_ENV: a file to source for nsys (.gpu/nsys-env.sh).
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
out=$(realpath -m "$1"); kit=${2:-}; nsys_env=${3:-}
repo=$(pwd); t0=$(date +%s)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} KERNELMAP_CUSTOM_OP_HOME=${KERNELMAP_CUSTOM_OP_HOME:-/tmp/km-custom-op}
export PATH="$CUDA_HOME/bin:$PATH" NVIDIA_TF32_OVERRIDE=0
[ -n "$nsys_env" ] && [ -f "$nsys_env" ] && source "$nsys_env"
elapsed() { echo $(( $(date +%s) - t0 )); }
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
cd /tmp || exit 3
ROUTES="jit setuptools cmake"

# --- 1. probe and build -------------------------------------------------------------------------
{
  echo "nvcc:  $(command -v nvcc || echo none) $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "headers: $(ls "$CUDA_HOME/include/cuda_runtime.h" 2>/dev/null || echo "no $CUDA_HOME/include/cuda_runtime.h")"
  echo "c++:   $(command -v c++ || echo none) $(c++ --version 2>/dev/null | head -n 1)"
  echo "ninja: $(command -v ninja || echo none) $(ninja --version 2>/dev/null)"
  echo "cmake: $(command -v cmake || echo none) $(cmake --version 2>/dev/null | head -n 1)"
  python3 -c "import torch, setuptools; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'setuptools', setuptools.__version__, 'gpu', torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
  python3 -m kernelmap.cli doctor 2>&1 | grep "custom op"
} 2>&1 | tee "$out/probe.txt"
if ! command -v ninja >/dev/null; then  # torch's JIT needs ninja: the pip package, where one is cached here
  python3 -m pip install -q --no-index ninja 2>/dev/null && echo "ninja: installed from the local pip cache" | tee -a "$out/probe.txt"
fi
for r in $ROUTES; do
  ( python3 -m kernelmap.cli custom-op build --route "$r" --device gpu --out "$out/build-$r.json" \
      >"$out/build-$r.txt" 2>&1; echo $? >"$out/build-$r.rc" ) &
done
wait
ok=""
for r in $ROUTES; do
  rc=$(cat "$out/build-$r.rc"); rm -f "$out/build-$r.rc"
  cp "$KERNELMAP_CUSTOM_OP_HOME"/*"$r"-cuda-*/build.log "$out/build-$r.log" 2>/dev/null || \
    cp "$KERNELMAP_CUSTOM_OP_HOME"/"$r"-cuda-*.build.log "$out/build-$r.log" 2>/dev/null
  if [ "$rc" = 0 ]; then ok="$ok $r"; echo "build $r: $(tail -n 1 "$out/build-$r.txt")"
  else echo "build $r: FAILED (exit $rc): $(grep -v '^W' "$out/build-$r.txt" | tail -n 1)"; fi
  # the cache: a second build compiles nothing
  [ "$rc" = 0 ] && echo "  again: $(python3 -m kernelmap.cli custom-op build --route "$r" --device gpu 2>&1 | tail -n 1)"
done | tee "$out/summary.txt"
echo "builds done at $(elapsed) s" | tee -a "$out/summary.txt"

# --- 2. AddModel and parity per route --------------------------------------------------------------
for r in $ok; do
  python3 -m kernelmap.cli custom-op addmodel --route "$r" --device gpu --trace-dir "/tmp/addmodel-$r" \
    --out "$out/addmodel-$r.json" 2>"$out/addmodel-$r.err" | tee "$out/addmodel-$r.txt" | \
    { head -n 1; tail -n 2; } | sed "s/^/addmodel $r: /"
  python3 -m kernelmap.cli normalise "/tmp/addmodel-$r/trace.json.gz" -o "/tmp/addmodel-$r/records.parquet" --replace \
    >/dev/null 2>>"$out/addmodel-$r.err" && python3 - "$r" <<'PY'
import sys
from kernelmap import schema
r = sys.argv[1]
df = schema.read_parquet(f"/tmp/addmodel-{r}/records.parquet")
k = df[(df["kind"] == "kernel") & (df["library"] == "custom")]
print(f"addmodel {r}: records: {len(k)} custom kernels in 5 traced epochs:",
      dict(k.groupby(["kernel_name", "canonical_op", "direction"]).size()),
      f"median {k['dur_ns'].median() / 1e3:.1f} µs")
PY
  cp "/tmp/addmodel-$r/trace.json.gz" "$out/addmodel-$r.trace.json.gz" 2>/dev/null
  python3 -m kernelmap.cli custom-op parity --route "$r" --device gpu --steps 10 --out "$out/parity-$r.json" \
    2>"$out/parity-$r.err" | sed "s/^/parity $r: /"
done 2>&1 | tee -a "$out/summary.txt"
echo "addmodel and parity done at $(elapsed) s" | tee -a "$out/summary.txt"

# --- 3. kernelmap run per route, and the built-in model ---------------------------------------------
RUN="--device gpu --profile all --steps 20 --trials 1 --max-repeats 0 --data synthetic --batch-size 64"
runs=""
for r in $ok; do
  python3 -m kernelmap.cli run --framework pytorch --custom-op "$r" $RUN --out "/tmp/run-$r" --replace \
    >"$out/run-$r.txt" 2>&1; echo "run $r: exit $? at $(elapsed) s: $(tail -n 4 "$out/run-$r.txt" | head -n 2 | tr '\n' ' ')"
done 2>&1 | tee -a "$out/summary.txt"
for r in $ok; do [ -d "/tmp/run-$r" ] && runs="$runs /tmp/run-$r"; done
fw=pytorch
if [ -n "$kit" ] && [ "$(elapsed)" -lt 200 ]; then  # MXNet and JAX too where time is left (the call has 10 min)
  bash "$repo/benches/gpu_mxnet_session.sh" unpack "$kit" "$out/mx" >"$out/mxnet-unpack.txt" 2>&1 && fw=all
fi
python3 -m kernelmap.cli run --framework "$fw" $RUN --out /tmp/run-builtin --replace >"$out/run-builtin.txt" 2>&1
echo "run built-in (--framework $fw): exit $? at $(elapsed) s" | tee -a "$out/summary.txt"
[ -d /tmp/run-builtin ] && runs="/tmp/run-builtin $runs"
for d in $runs; do
  (cd "$d" && tar cJf "$out/$(basename "$d").tar.xz" manifest.json results.json parity-*.json records.parquet \
    attribution.json logs */bs*/*.json 2>/dev/null)
done

# --- 4. fc1: the custom kernels beside the built-in ones; the report --------------------------------
python3 "$repo/benches/custom_op_compare.py" $runs 2>&1 | tee "$out/compare.txt"
python3 -m kernelmap.cli report $runs --out /tmp/custom-report >"$out/report.txt" 2>&1
(cd /tmp/custom-report 2>/dev/null && tar cJf "$out/report.tar.xz" .)
python3 - "$out" $runs <<'PY' 2>&1 | tee -a "$out/summary.txt"
import sys
from kernelmap.reports import analysis as A
runs = [A.load_run(d) for d in sys.argv[2:]]
lt = A.layer_table(runs)
fc1 = lt[lt["layer"] == "fc1"][["run", "direction", "framework", "libraries", "kernels", "ms_per_step"]]
print("report's fc1 rows (GPU kernel time per step, ms):")
print(fc1.to_string(index=False, max_colwidth=70))
PY
echo "done at $(elapsed) s; OUT holds $(du -sh "$out" | cut -f1)" | tee -a "$out/summary.txt"
