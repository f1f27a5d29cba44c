#!/usr/bin/env bash
# The GPU, checked in one go (issue 29, part 6), for when one is lent: within 8 minutes on
# one H100/H200, no network.
#
#   benchmarks/gpu_check.sh [--dry-run] [OUT]     (OUT default: $OUT/gpu-check, else
#                                                   benchmarks/results/gpu-check-<date>)
#
# 1. the CUDA tests (the ones skipped without CUDA, and the CUDA device paths);
# 2. host<->device copy bandwidth each way alone and both at once, the achieved FP32
#    matmul rate, three workloads of the benchmark on the card (eager and dbml at half
#    of eager's allocator peak, the allocator's peak and reserved bytes, bit-identity);
# 3. OUT/profile.json, an emulation profile from those figures, which
#    `python -m dbml bench --emulate OUT/profile.json` loads (benchmarks/emulate.py).
#
# --dry-run prints the steps and runs step 2 on the CPU at toy sizes (no tests, no
# training): it checks the script and the profile's format where there is no GPU.
# PYTHON picks the interpreter (default .venv/bin/python if present, else python3).
set -euo pipefail

cd "$(dirname "$0")/.."
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
DEST="${1:-${OUT:+$OUT/gpu-check}}"
DEST="${DEST:-benchmarks/results/gpu-check-$(date -u +%Y-%m-%d)}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$DEST"
LOG="$DEST/gpu_check.log"
: > "$LOG"
STATUS=0

step() {   # step SECONDS NAME COMMAND...: run with a time limit, log, keep going on failure
    local limit=$1 name=$2; shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
    if (( DRY )) && [[ "$name" != "measure" ]]; then return 0; fi
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1 || rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    if (( rc != 0 )); then STATUS=1; tail -n 30 "$LOG"; fi
}

echo "gpu_check: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), into $DEST" | tee -a "$LOG"
if (( ! DRY )); then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee -a "$LOG" || true
    "$PYTHON" -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if ok else 'NO CUDA'); sys.exit(0 if ok else 1)" | tee -a "$LOG"
fi

# 1. the CUDA tests: the executor's end-to-end CUDA step (skipped without CUDA), the CUDA
#    device's interface, NVML utilisation, the per-device shared scheduler (`grep -rn cuda
#    tests/` finds them; only the first is skipped without CUDA)
step 150 tests "$PYTHON" -m pytest -q -p no:cacheprovider -m "not heavy" \
    tests/test_executor.py tests/test_predictor.py tests/test_shared.py -k "cuda or one_per_device"

# 2 and 3. measurements, workloads, the profile (about 3-4 minutes on an H100)
MEASURE=("$PYTHON" -m dbml.bench.gpu_check --out "$DEST")
if (( DRY )); then MEASURE+=(--dry-run); fi
step 330 measure "${MEASURE[@]}"

if [[ -f "$DEST/profile.json" ]]; then
    "$PYTHON" -c "import sys; from dbml.bench import emulate; p = emulate.profile(sys.argv[1]); print('profile loads:', p.source)" "$DEST/profile.json" | tee -a "$LOG"
else
    echo "gpu_check: no profile written" | tee -a "$LOG"; STATUS=1
fi
echo "gpu_check: done in ${SECONDS} s, status $STATUS; see $LOG" | tee -a "$LOG"
exit $STATUS
