#!/usr/bin/env bash
# Issue 67 item 5: the next GPU call, one command of at most --budget seconds (480) on one
# H100/H200 that serves the benchmarks and the science, in one results folder (--out):
#   1. OUT/suite/: bench/gpu/accelerator_suite.sh --quick (the arms that answer an open question,
#      default: --arms default,unstacked: the stacked layers "auto" chooses on a GPU since
#      issue 67 against the list; the like-for-like PyTorch anchor; translation; the main
#      job) in at most --suite_budget seconds (330: with issue 67's translation anchors the quick
#      suite is estimated at 305 s without the main job, which, last, is cut; 410 s keeps it;
#      0: no suite);
#   2. OUT/fig2/: bench/gpu/gpu_mt_fig2.sh (Xiong et al.'s Fig. 2 as a 2x2 at the IWSLT width) with
#      the time left;
#   3. OUT/liu/: bench/gpu/gpu_mt_liu_depth.sh (Liu et al.'s 6-6 against 18-18) with what is left
#      after it, if at least --study_min seconds (150; 20 with --cpu);
# then OUT/status.txt (one line a part) and OUT/readout.txt (the studies' pre-registered
# readouts, also printed). Resumable: the suite runs once per --out (skipped when
# OUT/suite/summary.json exists) and each study continues its runs, so the same command again,
# on the same machine with the same --out, goes on with the studies (8 minutes hold the suite and
# part of fig2; a second call finishes fig2 and runs liu).
#
#   bench/gpu_wheels.sh && bench/gpu/gpu_mt_warmup.sh --prepare       # here, once
#   bench/gpu/gpu_call.sh [--cpu] [--out=DIR] [--budget=S] [--suite_budget=S] [--study_min=S]
#                     [--wheels=DIR] [--collect=DIR] [--arms=NAME,...] [--suite_skip=STEP,...]
#                     [--studies=fig2,liu]
#
#   device run: carry [".whl", ".gpu_data"], timeout_s 560, command
#     "bench/gpu/gpu_call.sh --wheels=.whl --out=/tmp/gpu/call --collect=$OUT/call"
# --collect copies the results without checkpoints, caches or the profile's trace (the
# optimised HLO and autotuning results as suite/hlo.tgz). --cpu: the suite's and the studies'
# CPU modes (tiny shapes; the tests run it with --suite_skip naming every suite step).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=/tmp/gpu_call
BUDGET=480
SUITE_BUDGET=330
STUDY_MIN=""
WHEELS=""
COLLECT=""
ARMS=default,unstacked
SUITE_SKIP=""
STUDIES=fig2,liu
CPU=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --out=*) OUT=${1#--out=} ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --suite_budget=*) SUITE_BUDGET=${1#--suite_budget=} ;;
    --study_min=*) STUDY_MIN=${1#--study_min=} ;;
    --wheels=*) WHEELS=${1#--wheels=} ;;
    --collect=*) COLLECT=${1#--collect=} ;;
    --arms=*) ARMS=${1#--arms=} ;;
    --suite_skip=*) SUITE_SKIP=${1#--suite_skip=} ;;
    --studies=*) STUDIES=${1#--studies=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_call.sh: unknown argument $1; see --help" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
[ -n "$STUDY_MIN" ] || { [ "$CPU" = 1 ] && STUDY_MIN=20 || STUDY_MIN=150; }
if [ "$CPU" = 0 ] && [[ ",$STUDIES," == *,fig2,* || ",$STUDIES," == *,liu,* ]]; then
  [ -f .gpu_data/gettext_de_en.train.src ] || { echo "no .gpu_data/gettext_de_en.train.src: run bench/gpu/gpu_mt_warmup.sh --prepare here first and carry .gpu_data" >&2; exit 2; }
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/status.txt"
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
# one compilation cache, TFDS folder and set of wheels for every part
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/jax_cache}
export TFDS_DATA_DIR=${TFDS_DATA_DIR:-$OUT/tfds} PYTHON=$PY
if [ -n "$WHEELS" ]; then
  SITE=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { echo "installing $WHEELS failed" >&2; exit 2; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
MODE=()
[ "$CPU" = 1 ] && MODE=(--cpu)

# part NAME COMMAND...: runs a part, its exit status and time in OUT/status.txt
part() {
  local name=$1
  shift
  echo "=== $(date +%T) $name (${BUDGET}s budget, $(left)s left): $*"
  "$@"
  echo "$name: rc=$? ($(( $(date +%s) - START ))s)" | tee -a "$OUT/status.txt"
}

if [ -f "$OUT/suite/summary.json" ]; then
  echo "suite: skipped (done: $OUT/suite/summary.json)" | tee -a "$OUT/status.txt"
elif [ "$SUITE_BUDGET" -le 0 ]; then
  echo "suite: skipped (--suite_budget=$SUITE_BUDGET)" | tee -a "$OUT/status.txt"
else
  budget=$SUITE_BUDGET
  [ "$(left)" -lt "$budget" ] && budget=$(left)
  part suite bash bench/gpu/accelerator_suite.sh "${MODE[@]}" --quick --out "$OUT/suite" \
    --budget "$budget" --arms "$ARMS" ${SUITE_SKIP:+--skip "$SUITE_SKIP"}
fi
for study in fig2 liu; do
  [[ ",$STUDIES," == *",$study,"* ]] || continue
  script=bench/gpu/gpu_mt_fig2.sh
  [ "$study" = liu ] && script=bench/gpu/gpu_mt_liu_depth.sh
  if [ "$(left)" -lt "$STUDY_MIN" ]; then
    echo "$study: skipped (budget spent: $(left)s left, $STUDY_MIN needed)" \
      | tee -a "$OUT/status.txt"
    continue
  fi
  part "$study" bash "$script" "${MODE[@]}" --out="$OUT/$study" --budget="$(left)"
done
: > "$OUT/readout.txt"
for study in fig2 liu; do
  [ -f "$OUT/$study/readout.txt" ] && cat "$OUT/$study/readout.txt" >> "$OUT/readout.txt"
done
echo "=== the call: $(tr '\n' ';' < "$OUT/status.txt")"
cat "$OUT/readout.txt"
if [ -n "$COLLECT" ]; then
  . bench/gpu/gpu_common.sh
  gpu_collect "$OUT" "$COLLECT"
  if [ -d "$OUT/suite/hlo" ] || [ -d "$OUT/suite/autotune" ]; then
    tar -C "$OUT/suite" -czf "$COLLECT/suite/hlo.tgz" \
      $( [ -d "$OUT/suite/hlo" ] && echo hlo ) $( [ -d "$OUT/suite/autotune" ] && echo autotune )
  fi
fi
echo "call done in $(( $(date +%s) - START )) s; results in $OUT"
