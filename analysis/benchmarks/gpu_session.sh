#!/bin/bash
# Issue 56's device checks, one prepared script of at most 10 minutes for a lent GPU (an H200, no network):
#   1. SmolLM2-135M: the control, K = 4 soft and hard-EM steps at batch 8 and in throughput mode (batch 64),
#      fp32 (products on TF32) and bf16 (the frozen LoRA body stored in bf16);
#   2. a random-initialised Llama of ~1.2B parameters (Llama 3.2 1B's shape), bf16 and fp32, same steps;
#   3. a random-initialised Llama of ~8.0B parameters (Llama 3.1 8B's shape), bf16, batch 8 and 32;
# each row: seconds per step, tokens/s, counted TFLOP/s, MFU, peak memory, CUDA syncs in one step
# (analysis/benchmarks/bench_large_step.py). Tables under $OUT: large_steps.txt, large_steps.jsonl, run.log,
# smi.csv (nvidia-smi every 2 s). The random models are built on the device from their shapes: no weights travel.
#
# SmolLM2's own weights: the GGUF file (94 MB, Q4_1) travels in parts of at most ~40 MB (the working tree
# and the carried paths together must stay under 64 MiB a call), one part per call while the machine stays
# warm, each under its own ignored path (echo /.gpu/ >> .git/info/exclude; split -b 40M the .gguf .gpu/gguf-part-),
# with the gguf package's wheel (zfree reads GGUF with it; the image lacks it) in .whl/:
#   run(carry=[".gpu/gguf-part-aa"], command="true")                      # and -ab, then:
#   run(carry=[".gpu/gguf-part-ac", ".whl"], command="GGUF_PARTS='.gpu/gguf-part-aa .gpu/gguf-part-ab
#       .gpu/gguf-part-ac' bash analysis/benchmarks/gpu_session.sh")
# Without GGUF_PARTS (or when the GGUF does not load) SmolLM2 is its shape with random weights and synthetic
# rows of E2E's lengths (|[bos] x sep| = 40, |y eos| = 30, +-4): a step's time does not depend on the weights.
#
#   bash analysis/benchmarks/gpu_session.sh            # on the GPU machine, from the repository root
#   bash analysis/benchmarks/gpu_session.sh --tiny     # CPU dry run: tiny random models, one step each
set -u
TINY=0; [ "${1:-}" = "--tiny" ] && TINY=1
O=${OUT:-${TMPDIR:-/tmp}/zfree-gpu-session}; mkdir -p "$O"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ZFREE_MODELS=${ZFREE_MODELS:-${TMPDIR:-/tmp}/zfree-models} ZFREE_CACHE_DIR=${ZFREE_CACHE_DIR:-${TMPDIR:-/tmp}/zfree-scores}
BENCH=analysis/benchmarks/bench_large_step.py
BUDGET=${BUDGET_S:-570}  # seconds for the whole script (the device's command limit is 600)
log() { echo "[$(date -u +%T) +${SECONDS}s] $*" | tee -a "$O/run.log"; }
left() { echo $(( BUDGET - SECONDS )); }
# stage NAME SECONDS ARGS...: the benchmark under timeout, skipped when less than SECONDS are left
stage() {
  local name=$1 want=$2; shift 2
  if [ "$(left)" -lt "$want" ]; then log "skip $name: $(left) s left, it needs $want"; return; fi
  log "start $name"
  timeout "$want" "$PY" $BENCH --out "$O" "$@" >> "$O/run.log" 2>&1
  log "end $name rc $?"
}

if [ "$TINY" = 1 ]; then
  log "dry run on the CPU (--tiny)"
  COMMON=(--device cpu --llama tiny --warmup 1 --steps 1 --batches 8,16)
  stage smollm2-fp32 300 "${COMMON[@]}" --precision fp32
  stage smollm2-bf16 300 "${COMMON[@]}" --precision bf16
  stage llama-1b-bf16 300 "${COMMON[@]}" --precision bf16 --kinds control
  stage llama-8b-bf16 300 "${COMMON[@]}" --precision bf16 --kinds soft --batches 8
  log done
  exit 0
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$O/run.log"
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" 2>&1 | tee -a "$O/run.log"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site && log "wheels: $(ls .whl | tr '\n' ' ')"
fi
SMOL=(--llama smollm2)
if [ -n "${GGUF_PARTS:-}" ]; then
  d="$ZFREE_MODELS/smollm2-135m-instruct-gguf"; mkdir -p "$d"
  cat $GGUF_PARTS > "$d/SmolLM2-135M-Instruct.Q4_1.gguf"
  log "gguf $(sha256sum "$d/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -c1-16) $(stat -c %s "$d/SmolLM2-135M-Instruct.Q4_1.gguf") bytes"
  M=$(timeout 120 "$PY" -m zfree_lab.cli model fetch smollm2-135m-instruct 2>>"$O/run.log" | tail -1)
  if [ -n "$M" ] && [ -d "$M" ]; then SMOL=(--model "$M"); log "SmolLM2 from $M"; else log "SmolLM2: the GGUF did not load; its shape, random"; fi
fi
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$O/smi.csv" 2>/dev/null & SMI=$!
stage smollm2-fp32 110 "${SMOL[@]}" --precision fp32
stage smollm2-bf16 110 "${SMOL[@]}" --precision bf16
stage llama-1b-bf16 90 --llama 1b --precision bf16
stage llama-1b-fp32 80 --llama 1b --precision fp32
stage llama-8b-bf16 150 --llama 8b --precision bf16 --batches 8,32 --steps 3
kill $SMI 2>/dev/null
log done
