#!/usr/bin/env bash
# Issue 28 on the GPU machine: the GPU user's first hour, each step timed, from the checkout to the
# three-framework GPU report. Run from the repository root:
#   KERNELMAP_MXNET_HOME=/tmp/mxhome benches/gpu_house28.sh            # writes "$OUT/house28/"
# An MXNet tree for this GPU must already be under $KERNELMAP_MXNET_HOME (e.g. unpacked by
# `benches/gpu_mxnet_session.sh unpack KIT`); JAX and PyTorch are the machine's own python3's.
# STEPS (default 30) and BATCH (default "64 1024") size the run; PROFILE (default all) its passes.
# Produces: times.txt (one line per step: name, exit status, seconds), checks.txt (one line per
# expectation: ok/FAIL and what), and each step's log; run/ and report/ (report.html, overhead.png).
set -uo pipefail
out=$(realpath -m "$OUT/house28"); mkdir -p "$out"; repo=$(pwd)
export PYTHONUNBUFFERED=1 KERNELMAP_MXNET_HOME=${KERNELMAP_MXNET_HOME:-/tmp/mxhome}
STEPS=${STEPS:-30}; BATCH=${BATCH:-64 1024}; PROFILE=${PROFILE:-all}
: > "$out/times.txt"; : > "$out/checks.txt"

step() {  # step NAME CMD...: run CMD with its output in NAME.log; its exit status and seconds in times.txt
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-22s rc=%-3s %6d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$out/times.txt"
  return $rc
}
check() {  # check WHAT FILE PATTERN: grep -E PATTERN in FILE
  if grep -Eq -- "$3" "$2"; then echo "ok    $1" ; else echo "FAIL  $1 (no /$3/ in $(basename "$2"))"; fi \
    | tee -a "$out/checks.txt"
}
checknot() {
  if grep -Eq -- "$3" "$2"; then echo "FAIL  $1 (/$3/ in $(basename "$2"))"; else echo "ok    $1"; fi \
    | tee -a "$out/checks.txt"
}

nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
nproc >> "$out/gpu.txt"
# 1. install (the setuptools warning about the patches folder was ~45 lines in every session)
step install python3 -m pip install --no-deps --no-build-isolation --root-user-action=ignore -v .
checknot "install: no 'absent from the packages configuration' warning" "$out/install.log" "absent from the"
cd /tmp || exit 3  # the installed package, not the checkout's folders
km() { python3 -m kernelmap.cli "$@"; }

# 2. --help names the registry's frameworks and MXNet's own command
step help km --help
check "--help names all three frameworks" "$out/help.log" "PyTorch, MXNet and JAX side by side"
check "--help lists build-mxnet (from MXNet's descriptor)" "$out/help.log" "build-mxnet"

# 3. doctor without a built MXNet: names the one command and its time
mkdir -p /tmp/house28-empty-mxhome
KERNELMAP_MXNET_HOME=/tmp/house28-empty-mxhome step doctor-no-tree km doctor
# where a CPU mxnet is installed (nox): "mxnet on the GPU: kernelmap build-mxnet, about 16 min ...";
# where none is (this machine's python3): the install fix, which names build-mxnet for sm_90
check "doctor without a tree: missing names kernelmap build-mxnet" "$out/doctor-no-tree.log" \
  "^  mxnet.*kernelmap build-mxnet"
grep -E "^  mxnet" "$out/doctor-no-tree.log" | sed 's/^/info  /' >> "$out/checks.txt"

# 4. doctor with the tree, and --python
step doctor km doctor
check "doctor: MXNet on the GPU from the built tree" "$out/doctor.log" "^mxnet .*GPU: usable"
check "doctor: PyTorch on the GPU" "$out/doctor.log" "^pytorch .*GPU: usable"
check "doctor: JAX on the GPU" "$out/doctor.log" "^jax .*GPU: usable"
step doctor-python km doctor --json --python "jax=$(command -v python3)"
check "doctor --python jax=PATH probes that interpreter" "$out/doctor-python.log" "\"python\": \"$(command -v python3)\""

# 5. run without the tree: the note names build-mxnet (MXNet on the CPU, labelled)
KERNELMAP_MXNET_HOME=/tmp/house28-empty-mxhome step run-no-tree km run --framework mxnet --device auto \
  --steps 5 --batch-size 64 --profile none --trials 1 --max-repeats 0 --data synthetic --out "$out/run-no-tree"
check "run without a tree: the note names build-mxnet" "$out/run-no-tree.log" "build-mxnet"

# 6. the three-framework GPU report
# shellcheck disable=SC2086
step run km run --framework all --device gpu --profile "$PROFILE" --steps "$STEPS" --batch-size $BATCH \
  --trials 1 --max-repeats 0 --data synthetic --out "$out/run"
step report km report "$out/run" -o "$out/report"
python3 - "$out/run/manifest.json" >> "$out/checks.txt" 2>&1 <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for name, f in (m.get("frameworks") or {}).items():
    ok = "ok  " if f.get("device") == "gpu" else "FAIL"
    print(f"{ok}  {name} ran on {f.get('device')} (asked {f.get('device_requested')}; note: {f.get('device_note')})")
PY
ls -la "$out/report" > "$out/report-files.txt" 2>&1
cp "$out/report/overhead.png" "$out/overhead.png" 2>/dev/null
rm -rf "$out/run"/*/bs*/nsys.nsys-rep  # large, kept only for the GUI
du -sh "$out" >> "$out/times.txt"
cd "$repo" || true
cat "$out/checks.txt"
