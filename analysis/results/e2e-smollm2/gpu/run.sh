#!/bin/bash
# The e2e-smollm2 preset on a CUDA machine (issue 37 item 6), as it ran on the lent H200 (2026-12-04):
#   the study (zfree study --preset e2e-smollm2, the command of the CPU measurement, device "auto" = cuda),
#   then the preset's three step kinds (analysis/benchmarks/preset_step.py) in fp32 and bf16.
# On any CUDA machine with zfree installed and the model fetched (zfree model fetch smollm2-135m-instruct):
#   OUT=/some/folder bash analysis/results/e2e-smollm2/gpu/run.sh
# On the lent machine (no network there) the GGUF file travelled in three parts (../README.md, "On a GPU");
# GGUF_PARTS names them, in order, and they are joined into ZFREE_MODELS first.
set -u
O=${OUT:-${TMPDIR:-/tmp}/zfree-gpu-out}; mkdir -p "$O"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
export ZFREE_MODELS=${ZFREE_MODELS:-${TMPDIR:-/tmp}/zfree-models} ZFREE_CACHE_DIR=${ZFREE_CACHE_DIR:-${TMPDIR:-/tmp}/zfree-scores}
log() { echo "[$(date -u +%T)] $*" | tee -a "$O/run.log"; }
if [ -n "${GGUF_PARTS:-}" ]; then
  d="$ZFREE_MODELS/smollm2-135m-instruct-gguf"; mkdir -p "$d"
  cat $GGUF_PARTS > "$d/SmolLM2-135M-Instruct.Q4_1.gguf"
  log "gguf $(sha256sum "$d/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -c1-16) $(stat -c %s "$d/SmolLM2-135M-Instruct.Q4_1.gguf") bytes"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$O/run.log"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$O/run.log"
t=$(date +%s); M=$(python3 -m zfree_lab.cli model fetch smollm2-135m-instruct 2>>"$O/run.log" | tail -1); log "model $M ($(( $(date +%s) - t )) s)"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$O/smi.csv" 2>/dev/null & SMI=$!
t=$(date +%s)
timeout "${STUDY_TIMEOUT:-360}" python3 -m zfree_lab.cli study --preset e2e-smollm2 --out runs/gpu-e2e-smollm2 --workers 2 > "$O/study.log" 2>&1
log "study rc $? wall $(( $(date +%s) - t )) s"
kill $SMI 2>/dev/null
for p in fp32 bf16; do
  timeout 120 python3 analysis/benchmarks/preset_step.py --model "$M" --device cuda --precision $p --steps 20 \
    --json "$O/step.jsonl" >> "$O/run.log" 2>&1 || log "preset_step $p failed: $?"
done
tar czf "$O/study.tgz" --exclude=checkpoint --exclude='*.safetensors' runs/gpu-e2e-smollm2 2>>"$O/run.log"
log done
