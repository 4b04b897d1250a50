#!/usr/bin/env bash
# Start or resume oracle-smollm2 on the code it runs on (PREREGISTRATION.md, DEVIATIONS.md): commit 5019e35,
# WORKERS runs at once (default 2, the preregistration's count; one torch thread each).
# Finished runs kept in analysis/studies/kept/oracle-smollm2 (keep_finished.py) are restored into STUDY first
# (KEPT= for none).
# Usage: analysis/results/oracle-smollm2/start.sh CHECKOUT STUDY [WORKERS]   (e.g. ../ckout-oracle ../oracle-smollm2)
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 CHECKOUT STUDY [WORKERS]" >&2; exit 2; }
KEPT=${KEPT-$here/../../studies/kept/oracle-smollm2} exec "$here/../../studies/start_pinned.sh" 5019e35 - "$1" "$2" -- --preset oracle-smollm2 --workers "${3:-2}"
