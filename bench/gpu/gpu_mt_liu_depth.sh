#!/usr/bin/env bash
# Issue 64 section 4: Liu et al.'s Table 2 at two depths on one H200, in one call of at most 8
# minutes: encoder = decoder depth 6 against 18 at width 512, Post-LN, Admin and Pre-LN (mt_depth
# arms post_warmup, admin_warmup, pre_warmup), each with the same warm-up, 8% of the run (the
# paper's 8,000 of 100,000; the warm-up under which issue 64's gate has 6-6 Post-LN train),
# 1e-3, Adam (0.9, 0.98), the inverse square root, no clipping, label smoothing 0.1, dropout
# 0.1, seed 0, the six runs at once; --steps (3,000), validation NLL and greedy BLEU every
# --eval_every (500) steps, the monitor every 500 (step 1 included), the training loss every 20.
#
# SHAPE: configs/mt.py:iwslt's (512 / FFN 1,024 / 4 heads, 4,096 tokens a batch), not wmt_base's
# (512 / 2,048 / 8 heads, 8,192 tokens): the offline corpus (17,143 training pairs) is smaller
# than IWSLT14, let alone WMT14, and fairseq's IWSLT recipe is the one sized for it; the 6-6
# rows are then bench/gpu/gpu_mt_fig2.sh's with-warm-up model (a check of one against the other);
# and wmt_base's step does about twice the work (FFN and batch twice as large), which would halve
# the 18-18 runs' steps in the 8 minutes. The width and the depths are Liu's; the FFN and heads
# are IWSLT's.
#
# PRE-REGISTERED READOUT (printed at the end, bench/gpu/gpu_study_readout.py depth; fixed 2026-12-04
# before any GPU ran it), per depth and arm: final validation NLL and greedy BLEU (the last
# evaluation), diverged (a non-finite loss, or the last training losses above the first), stuck
# (did not diverge and ends below 1 greedy BLEU: translates nothing), the encoder output's
# collapse at step 1 and at the end; and per depth admin_warmup - pre_warmup and post_warmup -
# pre_warmup (NLL and BLEU) at the last evaluation step the three arms share. Liu predicts: at
# 6-6 Post-LN level with or ahead of Pre-LN (27.80 vs 27.27 BLEU) and Admin level; at 18-18
# Post-LN diverges (or trains far behind) under the same warm-up, Admin ahead of Pre-LN (28.80
# vs 28.26). One seed: a first reading at the paper's width, not a test.
#
# INITIALISATION (2026-12-05, before any GPU ran it): every run passes --config.model.init=fairseq,
# the papers' code's (Xavier with q, k and v drawn as fairseq's packed [3d, d] in-projection, Var
# 1/(2d); embeddings N(0, 1/d)). configs/mt.py's "xavier" gives q, k and v twice that variance,
# which left 6-6 Post-LN collapsed and untrained at width 256 (issue 64's gate, attempt 2:
# docs/results/studies/PLAN_MT2.md) and starts it as collapsed at width 512 (0.82 at step 1).
# SIZING (an estimate: nothing here has run on a GPU yet): the 6-6 runs as in
# bench/gpu/gpu_mt_fig2.sh (one H200: 11.75 ms a step alone); an 18-18 step launches three times the
# kernels of a 6-6 one and the recipe's batch is launch-bound, so about 35 ms alone. Six runs
# at once: a round of one step each is about 3 x 12 + 3 x 35 = 140 ms of GPU time, less the
# overlap three runs at once had on the H100 (1.9x): about 75 ms, 13 steps/s for each run while
# all six train (the 6-6 runs finish first, then the 18-18 ones go faster): 3,000 steps in about
# 230 s. Compiling an 18-18 program takes about three times a 6-6 one: about 150 s with six
# processes at once. About 400 s of the 480 s budget; what does not fit stops at the budget
# (checkpoints saved), the readout reads the runs as far as they got ("partial"), and the same
# command again on the same machine continues them.
# STATUS: prepared, NOT RUN YET (no GPU was lent to the session that wrote it).
#
#   bench/gpu/gpu_mt_liu_depth.sh --prepare     # here, on the CPU: .gpu_data/ (once; shared)
#   bench/gpu/gpu_mt_liu_depth.sh [--out=DIR] [--steps=N] [--eval_every=N] [--budget=SECONDS]
#                             [--collect=DIR] [--config.FIELD=VALUE ...]  (on to every run)
#   bench/gpu/gpu_mt_liu_depth.sh --cpu --out=DIR    # tiny shapes, depth 1, 2 steps (the tests)
#
#   device run: carry [".gpu_data"], command
#     "bench/gpu/gpu_mt_liu_depth.sh --out=/tmp/gpu/liu --collect=$OUT/liu", timeout 540.
# As bench/gpu/gpu_mt_fig2.sh: checkpoints stay in --out, --collect copies the rest; a second call
# on the still-warm machine with the same --out continues.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=/tmp/gpu_mt_liu_depth
STEPS=3000
EVAL_EVERY=500
BUDGET=480
PREPARE=0
CPU=0
COLLECT=""
. bench/gpu/gpu_common.sh
gpu_parse_args "$0" 48 "$@"
[ "$PREPARE" = 1 ] && exec bash bench/gpu/gpu_mt_warmup.sh --prepare
PY=${PYTHON:-python3}
DATA=$ROOT/.gpu_data/gettext_de_en
if [ "$CPU" = 1 ]; then
  [ "$STEPS" = 3000 ] && STEPS=2
  [ "$EVAL_EVERY" = 500 ] && EVAL_EVERY=2
  DEPTHS=1  # one depth: two would compile three more programs (the readout's tests have two)
  BASE=(--jobs=1)
else
  [ -f "$DATA.train.src" ] || { echo "no $DATA.train.src: run bench/gpu/gpu_mt_liu_depth.sh --prepare here first and carry .gpu_data" >&2; exit 2; }
  DEPTHS=6,18
  BASE=(--config=configs/mt.py:iwslt --config.data.dataset=paralleltext:$DATA
        --config.log_every=20 --config.monitor.every=500 --jobs=6)
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.15  # six runs share the GPU
fi
gpu_environment
[ "$CPU" = 1 ] && gpu_cpu_mode
WARMUP=$(( STEPS * 8 / 100 ))
[ "$WARMUP" -ge 1 ] || WARMUP=1
STUDY=(mt_depth --out="$OUT/study" "${BASE[@]}" "${CPU_BASE[@]}" --depths=$DEPTHS
       --arms=post_warmup,admin_warmup,pre_warmup --lrs=1e-3 --warmup_steps=$WARMUP --seeds=0
       --config.model.hidden_dropout=0.1 --config.model.init=fairseq --config.total_steps=$STEPS
       --config.eval_every=$EVAL_EVERY --config.checkpoint_every=$EVAL_EVERY
       --config.translation.eval_beam=1 "${EXTRA[@]}")
# the runs' SIGTERM 60 s before the budget ends: 40 s to save, then the readout
gpu_run_study 60 "$OUT/study.log" "${STUDY[@]}"
echo "study: rc=$? ($(( $(date +%s) - START ))s)" | tee "$OUT/status.txt"
"$PY" bench/gpu/gpu_study_readout.py depth "$OUT/study" --out="$OUT/readout.json" \
  | tee "$OUT/readout.txt"
echo "readout: rc=${PIPESTATUS[0]} ($(( $(date +%s) - START ))s)" | tee -a "$OUT/status.txt"
[ -n "$COLLECT" ] && gpu_collect "$OUT" "$COLLECT"
echo "done in $(( $(date +%s) - START )) s; results in $OUT (readout.txt, study/runs/*/result.json)"
