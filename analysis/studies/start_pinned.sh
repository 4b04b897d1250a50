#!/usr/bin/env bash
# Start, or resume, a preregistered study on the exact code it runs on: a checkout of its own (a git worktree
# of the pinned commit, plus a patch where the study's DEVIATIONS.md names later fixes), with its own .venv,
# never the editable install being edited; one torch thread; `zfree study --out STUDY ARGS...`.
# Rerunning it resumes the study (finished runs are skipped, an interrupted one resumes from its checkpoint).
#
# Usage: analysis/studies/start_pinned.sh COMMIT PATCH CHECKOUT STUDY -- ZFREE_STUDY_ARGS...
#   COMMIT    the commit the study pins
#   PATCH     `git diff COMMIT` of the study's code, applied on COMMIT, or - for none
#   CHECKOUT  the checkout's folder (made on first use; later uses check it still holds that code). Resume a
#             study with the CHECKOUT it started with: code before ae1e491 writes the checkout's absolute data
#             paths into plan.json and refuses a rerun from another folder ("planned for another request")
#   STUDY     the study folder
# START_PINNED_CHECK_ONLY=1: make and check the checkout, then stop (no install, no study).
# KEPT=DIR: first put the finished runs kept in DIR (analysis/studies/keep_finished.py) into STUDY where it lacks
#   them, so that a study whose machine was replaced resumes after its kept runs instead of from scratch; then,
#   every KEEP_EVERY seconds (600) while the study runs, keep its newly finished runs in DIR (log: STUDY.keep.log).
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 COMMIT PATCH CHECKOUT STUDY -- ZFREE_STUDY_ARGS..." >&2; exit 2; }
commit=$1 patch=$2 checkout=$3 study=$4
shift 4
[ "${1:-}" = "--" ] && shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
# git without the notebook filter (it runs the checkout's .venv, which a new checkout does not have yet)
g() { git -c filter.nbstripout.clean=cat -c filter.nbstripout.smudge=cat -c filter.nbstripout.required=false "$@"; }
[ "$patch" = "-" ] || patch=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
if [ ! -e "$checkout" ]; then
  g -C "$repo" worktree add -q --detach "$checkout" "$commit"
  [ "$patch" = "-" ] || g -C "$checkout" apply "$patch"
fi
# the checkout must hold exactly COMMIT + PATCH (git patch-id: the same changes, whatever the line numbers)
g -C "$checkout" add -A -N
want=$([ "$patch" = "-" ] || git patch-id --stable < "$patch" | cut -d' ' -f1)
have=$(g -C "$checkout" diff --no-textconv "$commit" -- . | git patch-id --stable | cut -d' ' -f1)
if [ "$(g -C "$checkout" rev-parse HEAD)" != "$(g -C "$repo" rev-parse "$commit^{commit}")" ] || [ "$want" != "$have" ]; then
  echo "$checkout does not hold $commit + ${patch}: use a new CHECKOUT folder" >&2
  exit 2
fi
label=$commit
[ "$patch" = "-" ] || label="$commit + $(basename "$patch")"
if [ -n "${START_PINNED_CHECK_ONLY:-}" ]; then  # the checkout is made and checked; nothing installed or run
  echo "$checkout holds $label"
  exit 0
fi
make -C "$checkout" install >/dev/null
cd "$checkout"
if [ -n "${KEPT:-}" ]; then
  keep=$repo/analysis/studies/keep_finished.py
  [ -d "$KEPT/runs" ] && python3 "$keep" restore "$KEPT" "$study"  # STUDY as the study reads it, from the checkout
  # while the study runs (this process, once exec'd), and once after it ends: keep its newly finished runs
  pid=$$ every=${KEEP_EVERY:-600}
  (while kill -0 "$pid" 2>/dev/null; do sleep "$every"; [ -d "$study/runs" ] && { python3 "$keep" keep "$study" "$KEPT" || true; }; done) \
    >> "$study.keep.log" 2>&1 &
fi
echo "== $(date -u +%FT%TZ) zfree study --out $study $* (at $label)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec .venv/bin/zfree study --out "$study" "$@"
