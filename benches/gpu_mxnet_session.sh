#!/usr/bin/env bash
# MXNet on the GPU machine in one 30-minute hold, as a chain of device calls (each <= 10 min):
#   benches/gpu_mxnet_session.sh build KIT OUT BUDGET_S  # build-mxnet detached; waits up to BUDGET_S
#   benches/gpu_mxnet_session.sh wait  KIT OUT BUDGET_S  # the same build, still running: wait again
#   benches/gpu_mxnet_session.sh run   DATA OUT NSYS_ENV # every framework, every pass (+ timings, parity)
#   benches/gpu_mxnet_session.sh times DATA OUT MODE     # clean-pass step times, bs 64/256/1024 (imperative|hybridized)
#   benches/gpu_mxnet_session.sh stage KIT                # copy carried tree parts to /tmp/mxparts (a tree too big for one call's carry)
#   benches/gpu_mxnet_session.sh unpack KIT               # only unpack the carried tree (benches/gpu_sample_run.sh)
#   benches/gpu_mxnet_session.sh session KIT OUT NSYS_ENV # one call: unpack, smoke test, run (with its parity), times, report
# TRIALS (default 3; session: 1) is the clean pass's --trials; STEPS_TIMES (default 100) the times phase's --steps;
# TIMES_FRAMEWORK (default all; session: mxnet) the imperative times' --framework.
# KIT: src/ (the kit's tarballs), whl/numpy-1.26*.whl; or mxtree.tar.xz.NN, parts of a tree built
# elsewhere (`kernelmap build-mxnet --arch 90` needs no GPU), unpacked instead of building. The build runs in its own session (setsid), so
# that it outlives the call that started it: `timeout -s INT` restarts ninja's in-flight objects, and
# MXNet's slowest CUDA objects take longer than one call. The tree: $KERNELMAP_MXNET_HOME/1.9.1-sm90
# (default /tmp/mxhome). A carried tree that does not unpack stops the script (exit 5), naming its parts.
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
phase=$1; src=$(realpath "$2"); out=$(realpath -m "$3"); arg4=${4:-}
data=$src  # run, times: DATA is the second argument; session: $DATA, default synthetic
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$out"; repo=$(pwd)
# KERNELMAP_SKIP_INSTALL=1: kernelmap is installed already (a caller that runs other jobs beside this one)
[ "${KERNELMAP_SKIP_INSTALL:-0}" = 1 ] || python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
cd /tmp && python3 -c "import kernelmap.frameworks" || exit 3
tree() { ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1; }
MXPARTS=${KERNELMAP_MXPARTS:-/tmp/mxparts}  # parts staged by earlier calls on this machine
parts() {  # this call's parts, and staged ones of other numbers, in part order
  { for f in "$src"/mxtree.tar.xz.*; do [ -e "$f" ] && echo "$(basename "$f") $f"; done
    for f in "$MXPARTS"/mxtree.tar.xz.*; do [ -e "$f" ] && [ ! -e "$src/$(basename "$f")" ] && echo "$(basename "$f") $f"; done
  } | sort | cut -d' ' -f2-
}
unpack_carried() {  # a tree built elsewhere, carried in parts (this call's and those staged by earlier calls)
  [ -z "$(tree)" ] && [ -n "$(parts)" ] || return 0
  # unpacked beside the home under a hidden name (no tree to kernelmap), moved in only when whole
  local unpack="$KERNELMAP_MXNET_HOME/.unpack-$$"
  local files; mapfile -t files < <(parts)
  if ! { rm -rf "$unpack" && mkdir -p "$unpack" && cat "${files[@]}" | xz -d | tar -x -C "$unpack" \
         && mv "$unpack"/* "$KERNELMAP_MXNET_HOME"/ && rmdir "$unpack"; }; then
    rm -rf "$unpack"
    echo "cannot unpack the carried MXNet tree from ${files[*]} (cat | xz -d | tar -x" \
         "into $KERNELMAP_MXNET_HOME failed, see above)" >&2
    exit 5
  fi
  echo "unpacked the carried tree: $(tree)"
}
smoke() {  # the built MXNet on this GPU: one convolution forward and backward, against PyTorch's
  python3 -m kernelmap.cli doctor 2>&1 | tail -n 12
  local t; t=$(tree)
  PYTHONPATH="$t/python" KERNELMAP_MXNET_TREE="$t" timeout 120 python3 - "$t" <<'PY' 2>&1 | tail -n 15
import sys, time
from kernelmap.frameworks.mxnet import built
pre = built.preload(sys.argv[1]); print("preload:", pre.describe())
t0 = time.time(); import mxnet as mx; import numpy as np
print("mxnet", mx.__version__, mx.__file__, "numpy", np.__version__, "import %.1f s" % (time.time() - t0))
print("features:", [f.name for f in mx.runtime.Features().values() if f.enabled and f.name in ("CUDA", "CUDNN", "NVTX", "BLAS_OPEN")])
x = mx.nd.array(np.random.RandomState(0).rand(2, 1, 28, 28).astype("float32"), ctx=mx.gpu(0))
w = mx.nd.array(np.random.RandomState(1).rand(4, 1, 5, 5).astype("float32"), ctx=mx.gpu(0))
x.attach_grad(); w.attach_grad()
with mx.autograd.record():
    y = mx.nd.Convolution(x, w, kernel=(5, 5), num_filter=4, no_bias=True)
y.backward(); mx.nd.waitall()
import torch
tx = torch.tensor(x.asnumpy(), requires_grad=True); tw = torch.tensor(w.asnumpy(), requires_grad=True)
ty = torch.nn.functional.conv2d(tx, tw); ty.backward(torch.ones_like(ty))
print("conv on", y.context, "max |mx - torch|: y %.2e dx %.2e dw %.2e" % (
    abs(y.asnumpy() - ty.detach().numpy()).max(), abs(x.grad.asnumpy() - tx.grad.numpy()).max(),
    abs(w.grad.asnumpy() - tw.grad.numpy()).max()))
PY
  local rc=${PIPESTATUS[0]}
  echo "smoke exit $rc"
  return "$rc"
}
do_run() {  # every framework, every pass at bs 64 (the run checks GPU parity itself)
  [ -n "$(tree)" ] || { echo "no MXNet tree in $KERNELMAP_MXNET_HOME"; exit 4; }
  python3 -m kernelmap.cli doctor 2>&1 | tail -n 12
  python3 -m kernelmap.cli run --framework all --device gpu --profile all --steps 50 --batch-size 64 \
    --trials "${TRIALS:-3}" --data "$data" --out /tmp/runall --json >"$out/runall.json" 2>"$out/runall.err"
  echo "run all exit $?: $(tail -n 3 "$out/runall.err" | tr '\n' ' ')"
  # back: the run's small files; MXNet's raw captures at bs 64 (nsys trimmed as the fixtures are)
  (cd /tmp/runall && tar cJf "$out/runall.tar.xz" manifest.json results.json parity-*.json records.parquet \
     attribution.json logs */bs*/*.json 2>/dev/null)
  python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import record_gpu_fixtures as r; \
from pathlib import Path; r.trim_nsys(Path('/tmp/runall/mxnet/bs64/nsys.sqlite'), Path('/tmp/mx-nsys.sqlite.gz'))" \
    "$repo/tests/data" && (cd /tmp/runall/mxnet/bs64 && gzip -k -9 -f cudnn.log cublas*.log 2>/dev/null; \
    tar cJf "$out/mxnet-bs64-raw.tar.xz" trace.json.gz *.log.gz -C /tmp mx-nsys.sqlite.gz)
  ls -l "$out"
}
do_report() {
  python3 -m kernelmap.cli report /tmp/runall --out /tmp/report 2>&1 | tail -n 25
  (cd /tmp/report && tar cJf "$out/report.tar.xz" .)
}
do_parity() {  # explicit GPU parity, each pair on its own
  for fw in mxnet jax; do
    timeout 300 python3 -m kernelmap.cli parity --device gpu --frameworks "pytorch,$fw" --data "$data" --json \
      >"$out/parity-$fw-gpu.json" 2>>"$out/parity.err"; echo "parity pytorch,$fw gpu exit $?"
  done
}
do_times() {  # $1: imperative (every framework) or hybridized (MXNet)
  local mode=$1 flag fws
  flag=$([ "$mode" = hybridized ] && echo --hybridize)
  fws=$([ "$mode" = hybridized ] && echo mxnet || echo "${TIMES_FRAMEWORK:-all}")
  python3 -m kernelmap.cli run --framework "$fws" --device gpu --steps "${STEPS_TIMES:-100}" --batch-size 64 256 1024 \
    $flag --trials "${TRIALS:-3}" --data "$data" --out "/tmp/times-$mode" --json >"$out/times-$mode.json" 2>"$out/times-$mode.err"
  echo "times $mode exit $?: $(tail -n 2 "$out/times-$mode.err" | tr '\n' ' ')"
  (cd "/tmp/times-$mode" && tar cJf "$out/times-$mode.tar.xz" manifest.json results.json logs 2>/dev/null)
}
case $phase in
unpack)
  unpack_carried; [ -n "$(tree)" ] || { echo "no MXNet tree in $KERNELMAP_MXNET_HOME and none carried"; exit 4; }
  ;;
stage)
  mkdir -p "$MXPARTS" && cp "$src"/mxtree.tar.xz.* "$MXPARTS"/ && ls -l "$MXPARTS"
  ;;
build|wait)
  unpack_carried
  if [ -z "$(tree)" ] && ! pgrep -f "kernelmap.cli build-mxnet" >/dev/null; then
    [ "$phase" = wait ] && echo "no build running (the machine is a fresh one?): starting it again"
    setsid nohup python3 -m kernelmap.cli build-mxnet --source "$src/src" --work /tmp/mxw --jobs "$(nproc)" \
      --numpy-wheel "$src"/whl/numpy-1.26*.whl >/tmp/mxbuild.log 2>&1 < /dev/null &
    echo "started build-mxnet (pid $!) on $(nproc) cores at $(date +%T)"
  fi
  t0=$(date +%s)
  while [ -z "$(tree)" ] && pgrep -f "kernelmap.cli build-mxnet" >/dev/null \
        && [ $(( $(date +%s) - t0 )) -lt "$arg4" ]; do sleep 10; done
  grep -v "^\[" /tmp/mxbuild.log | tail -n 6
  echo "ninja: $(grep -E '^\[[0-9]+/' /tmp/mxw/build/ninja.log 2>/dev/null | tail -n 1 | cut -c1-120)"
  echo "running: $(pgrep -af 'nvcc|cicc|ptxas' | grep -o 'src/[^ ]*\.cu' | sort -u | tr '\n' ' ')"
  [ -n "$(tree)" ] && cat "$(tree)/kernelmap-mxnet.json" && du -sh "$(tree)"
  cp /tmp/mxbuild.log "$out/" 2>/dev/null
  awk 'NR>1 {printf "%.1f %s\n", ($2-$1)/1000, $4}' /tmp/mxw/build/.ninja_log 2>/dev/null | sort -rn | head -n 40 > "$out/slowest.txt"
  ;;
run)
  [ -n "$arg4" ] && source "$arg4"
  do_run; do_report; do_parity
  ;;
times)  # arg4: imperative (every framework) or hybridized (MXNet): one device call each
  do_times "${arg4:-imperative}"
  ;;
session)  # everything in one call; TRIALS defaults to 1 here. Back: session.tar.xz (packed again after each
  # step, so a call stopped at its limit still returns what was done) and mxnet-bs64-raw.tar.xz
  export TRIALS=${TRIALS:-1} STEPS_TIMES=${STEPS_TIMES:-100} TIMES_FRAMEWORK=${TIMES_FRAMEWORK:-mxnet}
  data=${DATA:-synthetic}
  final=$out; out=/tmp/session-out; rm -rf "$out"; mkdir -p "$out"
  pack() { tar cJf "$final/session.tar.xz" --exclude=mxnet-bs64-raw.tar.xz --exclude=report.tar.xz -C "$out" . ; \
           for f in mxnet-bs64-raw.tar.xz report.tar.xz; do [ -f "$out/$f" ] && cp "$out/$f" "$final/"; done; return 0; }
  unpack_carried
  [ -n "$(tree)" ] || { echo "no MXNet tree in $KERNELMAP_MXNET_HOME and none carried"; exit 4; }
  cat "$(tree)/kernelmap-mxnet.json"; echo
  [ -n "$arg4" ] && source "$arg4"
  smoke 2>&1 | tee "$out/smoke.log"; [ "${PIPESTATUS[0]}" = 0 ] || { pack; exit 6; }
  do_run; pack
  if [ -z "${ONLY_RUN:-}" ]; then  # ONLY_RUN=1: the run and its report, nothing else
    do_times hybridized; pack
    do_times imperative; pack
  fi
  do_report; pack
  [ -n "${ONLY_RUN:-}" ] && exit 0
  # issue 11's second input: a real model's Kineto trace (gzip; at most 16 MiB comes back)
  timeout 120 python3 "$repo/benches/record_resnet50_trace.py" kineto "$final/resnet50-kineto.json.gz" --steps 40 \
    2>&1 | tail -n 2
  ;;
*) echo "unknown phase $phase"; exit 2;;
esac
