#!/bin/bash
# A whole study on a lent GPU in one call of at most 10 minutes: the e2e-smollm2 preset at seeds 0-2 (9 runs:
# per seed the aided run, its z-free control and the `complete` oracle) as concurrent processes on one device
# (`--workers` = runs per device, capped by the device's memory: docs/howto/large-models.md), then its report.
# Under $OUT: the study folder's tables (summary.csv, gains.csv, seed_gains.csv, seed_rows.parquet,
# estimate.json, timings.json, every run's per_example.parquet, metrics.jsonl and summary.json; no
# checkpoints), run.log and smi.csv (nvidia-smi every 2 s).
#
# SmolLM2's weights travel as in gpu_session.sh: the GGUF in parts of at most ~40 MB under an ignored path,
# one part per call while the machine stays warm, the gguf wheel in .whl/; the last call runs this script:
#   run(carry=[".gpu/gguf-part-ac", ".whl"], command="GGUF_PARTS='.gpu/gguf-part-aa .gpu/gguf-part-ab
#       .gpu/gguf-part-ac' bash analysis/benchmarks/gpu_study.sh")
#
#   bash analysis/benchmarks/gpu_study.sh            # on the GPU machine, from the repository root
#   STUDY_ARGS="--preset oracle-smollm2 --seeds 0-2" WORKERS=12 bash analysis/benchmarks/gpu_study.sh   # another study
#   bash analysis/benchmarks/gpu_study.sh --tiny     # CPU dry run: the smoke preset, 2 runs at once
set -u
TINY=0; [ "${1:-}" = "--tiny" ] && TINY=1
O=${OUT:-${TMPDIR:-/tmp}/zfree-gpu-study}; mkdir -p "$O"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
export ZFREE_MODELS=${ZFREE_MODELS:-${TMPDIR:-/tmp}/zfree-models} ZFREE_CACHE_DIR=${ZFREE_CACHE_DIR:-${TMPDIR:-/tmp}/zfree-scores}
BUDGET=${BUDGET_S:-560}  # seconds for the study; the rest of the call copies its tables
STUDY=${TMPDIR:-/tmp}/zfree-gpu-study-folder
log() { echo "[$(date -u +%T) +${SECONDS}s] $*" | tee -a "$O/run.log"; }

if [ "$TINY" = 1 ]; then
  PRESET=(--preset smoke); WORKERS=2; log "dry run on the CPU (--tiny): the smoke preset"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$O/run.log"
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=$PYTHONPATH:/tmp/site && log "wheels: $(ls .whl | tr '\n' ' ')"
  fi
  if [ -n "${GGUF_PARTS:-}" ]; then
    d="$ZFREE_MODELS/smollm2-135m-instruct-gguf"; mkdir -p "$d"
    cat $GGUF_PARTS > "$d/SmolLM2-135M-Instruct.Q4_1.gguf"
    log "gguf $(sha256sum "$d/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -c1-16) $(stat -c %s "$d/SmolLM2-135M-Instruct.Q4_1.gguf") bytes"
  fi
  read -r -a PRESET <<< "${STUDY_ARGS:---preset e2e-smollm2 --seeds 0-2}"; WORKERS=${WORKERS:-9}
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$O/smi.csv" 2>/dev/null & SMI=$!
fi
log "start: zfree study ${PRESET[*]} --workers $WORKERS"
timeout "$BUDGET" "$PY" -m zfree_lab.cli study "${PRESET[@]}" --workers "$WORKERS" --out "$STUDY" \
  >> "$O/run.log" 2>&1
log "study rc $?"
[ "$TINY" = 1 ] || kill "${SMI:-0}" 2>/dev/null
# what comes back: the tables, not the weights (a finished run's checkpoint is its LoRA; 64 MiB per call)
(cd "$STUDY" && find . -type f \( -name '*.csv' -o -name '*.json' -o -name '*.jsonl' -o -name '*.parquet' -o -name '*.html' \) \
   -not -path '*/checkpoint*' -not -path './base/*' -size -8M -print0 | tar --null -T - -cf - ) | (mkdir -p "$O/study" && cd "$O/study" && tar -xf -)
log "copied $(find "$O/study" -type f | wc -l) files ($(du -sh "$O/study" | cut -f1)); done"
