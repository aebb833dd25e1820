#!/usr/bin/env bash
# MXNet on the GPU machine in one 30-minute hold, as a chain of device calls (each <= 10 min):
#   benches/gpu_mxnet_session.sh build KIT OUT BUDGET_S  # build-mxnet detached; waits up to BUDGET_S
#   benches/gpu_mxnet_session.sh wait  KIT OUT BUDGET_S  # the same build, still running: wait again
#   benches/gpu_mxnet_session.sh run   DATA OUT NSYS_ENV # every framework, every pass (+ timings, parity)
#   benches/gpu_mxnet_session.sh times DATA OUT MODE     # clean-pass step times, bs 64/256/1024 (imperative|hybridized)
# KIT: src/ (the kit's tarballs), whl/numpy-1.26*.whl; or mxtree.tar.xz.NN, parts of a tree built
# elsewhere (`kernelmap build-mxnet --arch 90` needs no GPU), unpacked instead of building. The build runs in its own session (setsid), so
# that it outlives the call that started it: `timeout -s INT` restarts ninja's in-flight objects, and
# MXNet's slowest CUDA objects take longer than one call. The tree: $KERNELMAP_MXNET_HOME/1.9.1-sm90
# (default /tmp/mxhome). A carried tree that does not unpack stops the script (exit 5), naming its parts.
# Everything runs from /tmp with the installed package: the checkout's kernelmap/ would shadow it.
set -uo pipefail
phase=$1; src=$(realpath "$2"); out=$(realpath -m "$3"); arg4=${4:-}
export KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome} PYTHONUNBUFFERED=1
mkdir -p "$out"; repo=$(pwd)
python3 -m pip install -q --no-deps --no-build-isolation --root-user-action=ignore . 2>&1 | tail -n 3
cd /tmp && python3 -c "import kernelmap.frameworks" || exit 3
tree() { ls -d "$KERNELMAP_MXNET_HOME"/1.9.1-sm* 2>/dev/null | head -n 1; }
case $phase in
build|wait)
  if [ -z "$(tree)" ] && ls "$src"/mxtree.tar.xz.* >/dev/null 2>&1; then  # a tree built elsewhere, carried
    # unpacked beside the home under a hidden name (no tree to kernelmap), moved in only when whole
    unpack="$KERNELMAP_MXNET_HOME/.unpack-$$"
    if ! { rm -rf "$unpack" && mkdir -p "$unpack" && cat "$src"/mxtree.tar.xz.* | xz -d | tar -x -C "$unpack" \
           && mv "$unpack"/* "$KERNELMAP_MXNET_HOME"/ && rmdir "$unpack"; }; then
      rm -rf "$unpack"
      echo "cannot unpack the carried MXNet tree from $(echo "$src"/mxtree.tar.xz.*) (cat | xz -d | tar -x" \
           "into $KERNELMAP_MXNET_HOME failed, see above)" >&2
      exit 5
    fi
    echo "unpacked the carried tree: $(tree)"
  fi
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
  [ -n "$(tree)" ] || { echo "no MXNet tree in $KERNELMAP_MXNET_HOME"; exit 4; }
  python3 -m kernelmap.cli doctor 2>&1 | tail -n 12
  python3 -m kernelmap.cli run --framework all --device gpu --profile all --steps 50 --batch-size 64 \
    --data "$src" --out /tmp/runall --json >"$out/runall.json" 2>"$out/runall.err"
  echo "run all exit $?: $(tail -n 3 "$out/runall.err" | tr '\n' ' ')"
  python3 -m kernelmap.cli report /tmp/runall --out /tmp/report 2>&1 | tail -n 25
  # back: the run's small files; MXNet's raw captures at bs 64 (nsys trimmed as the fixtures are); the report
  (cd /tmp/runall && tar cJf "$out/runall.tar.xz" manifest.json results.json parity-*.json records.parquet \
     attribution.json logs */bs*/*.json 2>/dev/null)
  python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import record_gpu_fixtures as r; \
from pathlib import Path; r.trim_nsys(Path('/tmp/runall/mxnet/bs64/nsys.sqlite'), Path('/tmp/mx-nsys.sqlite.gz'))" \
    "$repo/tests/data" && (cd /tmp/runall/mxnet/bs64 && gzip -k -9 -f cudnn.log cublas*.log 2>/dev/null; \
    tar cJf "$out/mxnet-bs64-raw.tar.xz" trace.json.gz *.log.gz -C /tmp mx-nsys.sqlite.gz)
  (cd /tmp/report && tar cJf "$out/report.tar.xz" .); ls -l "$out"
  python3 -m kernelmap.cli parity --device gpu --frameworks pytorch,mxnet --data "$src" --json \
    >"$out/parity-mxnet-gpu.json" 2>"$out/parity.err"; echo "parity pytorch,mxnet gpu exit $?"
  python3 -m kernelmap.cli parity --device gpu --frameworks pytorch,jax --data "$src" --json \
    >"$out/parity-jax-gpu.json" 2>>"$out/parity.err"; echo "parity pytorch,jax gpu exit $?"
  ;;
times)  # arg4: imperative (every framework) or hybridized (MXNet): one device call each
  mode=${arg4:-imperative}
  flag=$([ "$mode" = hybridized ] && echo --hybridize)
  fws=$([ "$mode" = hybridized ] && echo mxnet || echo all)
  python3 -m kernelmap.cli run --framework "$fws" --device gpu --steps 100 --batch-size 64 256 1024 $flag \
    --data "$src" --out "/tmp/times-$mode" --json >"$out/times-$mode.json" 2>"$out/times-$mode.err"
  echo "times $mode exit $?: $(tail -n 2 "$out/times-$mode.err" | tr '\n' ' ')"
  (cd "/tmp/times-$mode" && tar cJf "$out/times-$mode.tar.xz" manifest.json results.json parity-*.json logs 2>/dev/null)
  ;;
*) echo "unknown phase $phase"; exit 2;;
esac
