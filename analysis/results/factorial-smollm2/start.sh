#!/usr/bin/env bash
# Start or resume factorial-smollm2 on the code it runs on (DEVIATIONS.md): e04a751 + code.patch, which is
# 13f4399, 7829dc5 and 19c974d cherry-picked onto it (the study branch `factorial-entangled`).
# Finished runs kept in analysis/studies/kept/factorial-smollm2 (keep_finished.py) are restored into STUDY first
# (KEPT= for none).
# WORKERS runs at once (default 1, the preregistration's count; one torch thread each).
# Usage: analysis/results/factorial-smollm2/start.sh CHECKOUT STUDY [WORKERS]   (e.g. ../ckout-factorial ../factorial-smollm2)
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 CHECKOUT STUDY [WORKERS]" >&2; exit 2; }
KEPT=${KEPT-$here/../../studies/kept/factorial-smollm2} exec "$here/../../studies/start_pinned.sh" e04a751 "$here/code.patch" "$1" "$2" -- \
  --preset factorial-smollm2 --seeds 0-2 --workers "${3:-1}"
