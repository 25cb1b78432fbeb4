#!/usr/bin/env bash
# GPU checks for chapter 0.4, one script, under 8 minutes on a CUDA machine.
#   (a) AMP table on the GPU: fp32/bf16/fp16 speed + torch.cuda.max_memory_allocated, and
#       fp16 without a GradScaler (gradients underflow to zero, weights stop updating)
#   (b) every solution notebook under nbval on the GPU: python -m pytest solutions/ -q -n 0
#       (one notebook at a time: a second one on the same GPU would skew the AMP timings)
#   (c) kill-and-resume exactness with the determinism switch on (SIGKILL + --resume,
#       per-step losses compared exactly)
#   (d) the professional script under torchrun with NCCL, one process per GPU (a single GPU still
#       takes the NCCL path): a run, SIGKILL of the whole job + --resume, SIGTERM to one rank +
#       --resume, each compared step by step; with one GPU also against a plain python run
#   (e) the training step's MFU on the GPU (08b §2): SmallCNN model FLOPs (FlopCounterMode) x steps/s,
#       fp32 and bf16 autocast, over a matmul peak of the same dtype measured there (bench/mfu_check.py)
#
# Usage (from anywhere; needs the repo's requirements installed with a CUDA build of torch):
#   bash bench/gpu_check.sh [OUTDIR]          # default OUTDIR: bench/results/gpu_check
# Outputs in OUTDIR: amp.txt/amp_cuda.json, notebooks.txt/notebooks.xml, resume_exact.txt/.json,
# ddp.txt/ddp.json, mfu.txt/mfu.json, summary.txt. Exit status: number of failed parts (0 = all passed).
# Smoke test without a GPU: GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 bash bench/gpu_check.sh /tmp/gc
#   (GPU_CHECK_NOTEBOOKS=0 skips part (b); PYTHON picks the interpreter.)
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/bench/results/gpu_check}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
QUICK="${GPU_CHECK_QUICK:-0}"
NOTEBOOKS="${GPU_CHECK_NOTEBOOKS:-1}"
PY="${PYTHON:-python}"
# per-part time limits; a CPU smoke run on a busy machine gets more room
if [ "$DEVICE" = "cpu" ]; then T_AMP=1200; T_EXACT=1200; T_DDP=1200; T_MFU=600; else T_AMP=180; T_EXACT=240; T_DDP=240; T_MFU=90; fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT" || exit 99
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1
START=$(date +%s)
failures=0
summary="$OUT/summary.txt"
: > "$summary"

log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*" | tee -a "$summary"; }

if [ "$DEVICE" = "cuda" ]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    log "FAIL: torch.cuda.is_available() is False (set GPU_CHECK_DEVICE=cpu for a CPU smoke test)"
    exit 99
  fi
  "$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}, torch {torch.__version__}, CUDA {torch.version.cuda}")' | tee -a "$summary"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$summary" 2>/dev/null || true
fi

# (a) AMP table: ~1 minute on a GPU
if [ "$QUICK" = "1" ]; then
  amp_args=(--steps 1 --repeats 1 --small-batch 16 --large-batch 8 --large-width 48)
else
  amp_args=(--steps 30 --repeats 3 --large-width 128 --large-batch 256 --small-batch 512)
fi
log "(a) AMP table on $DEVICE"
if timeout "$T_AMP" "$PY" bench/amp.py --device "$DEVICE" "${amp_args[@]}" --json "$OUT/amp_${DEVICE}.json" > "$OUT/amp.txt" 2>&1; then
  log "(a) ok: $OUT/amp.txt"
else
  log "(a) FAILED (exit $?): see $OUT/amp.txt"; failures=$((failures + 1))
fi
tail -n 20 "$OUT/amp.txt"

# (c) kill-and-resume exactness with --deterministic: ~1 minute
if [ "$QUICK" = "1" ]; then
  exact_args=(--steps 14 --ckpt-every 5 --kill-after 7)
else
  exact_args=(--steps 40 --ckpt-every 10 --kill-after 15)
fi
log "(c) kill-and-resume exactness on $DEVICE, deterministic"
if timeout "$T_EXACT" "$PY" bench/resume_exact.py --device "$DEVICE" --deterministic "${exact_args[@]}" \
     --json "$OUT/resume_exact.json" > "$OUT/resume_exact.txt" 2>&1; then
  log "(c) ok: $(tail -n 1 "$OUT/resume_exact.txt")"
else
  log "(c) FAILED (exit $?): $(tail -n 3 "$OUT/resume_exact.txt" | tr '\n' ' ')"; failures=$((failures + 1))
fi

# (d) torchrun, one process per GPU (NCCL); on a CPU smoke run 2 processes with gloo: ~1 minute
if [ "$DEVICE" = "cuda" ]; then
  NPROC=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
else
  NPROC=2
fi
log "(d) torchrun --nproc-per-node $NPROC on $DEVICE: run, SIGKILL + --resume, SIGTERM to one rank + --resume"
if timeout "$T_DDP" "$PY" bench/ddp_check.py --device "$DEVICE" --nproc "$NPROC" --deterministic \
     --json "$OUT/ddp.json" > "$OUT/ddp.txt" 2>&1; then
  log "(d) ok: $(tail -n 1 "$OUT/ddp.txt")"
else
  log "(d) FAILED (exit $?): $(grep FAIL "$OUT/ddp.txt" | head -n 3 | tr '\n' ' ')"; failures=$((failures + 1))
fi

# (e) the training step's MFU: ~20 s on a GPU
mfu_args=()
[ "$QUICK" = "1" ] && mfu_args=(--quick)
log "(e) training-step MFU on $DEVICE"
if timeout "$T_MFU" "$PY" bench/mfu_check.py --device "$DEVICE" "${mfu_args[@]}" --json "$OUT/mfu.json" > "$OUT/mfu.txt" 2>&1; then
  log "(e) ok: $OUT/mfu.txt"
else
  log "(e) FAILED (exit $?): $(tail -n 3 "$OUT/mfu.txt" | tr '\n' ' ')"; failures=$((failures + 1))
fi
tail -n 4 "$OUT/mfu.txt"

# (b) every solution notebook under nbval on the GPU, with the time left (8 minutes in all)
if [ "$NOTEBOOKS" = "1" ]; then
  left=$(( 470 - ($(date +%s) - START) ))
  [ "$left" -lt 60 ] && left=60
  log "(b) python -m pytest solutions/ -q on $DEVICE (timeout ${left}s)"
  if CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout "$left" "$PY" -m pytest solutions/ -q -n 0 \
       --junitxml="$OUT/notebooks.xml" > "$OUT/notebooks.txt" 2>&1; then
    log "(b) ok: $(tail -n 1 "$OUT/notebooks.txt")"
  else
    log "(b) FAILED (exit $?): $(tail -n 1 "$OUT/notebooks.txt")"; failures=$((failures + 1))
  fi
else
  log "(b) skipped (GPU_CHECK_NOTEBOOKS=0)"
fi

log "done in $(( $(date +%s) - START ))s, failed parts: $failures; outputs in $OUT"
exit "$failures"
