#!/usr/bin/env bash
# Issue 64 section 4: Xiong et al.'s Fig. 2 as a 2x2 at the IWSLT width, in one call of at most
# 8 minutes on one H200: configs/mt.py:iwslt (6-6, 512 / 1024 / 4 heads) on the offline
# German -> English corpus exported to .gpu_data/, dropout 0.1 (Xiong's appendix), Post-LN and
# Pre-LN each without and with warm-up (python -m ln_jax.experiments mt_depth, arms post,
# post_warmup, pre, pre_warmup: an arm without _warmup has none), 1e-3, Adam (0.9, 0.98), the
# inverse square root (warmup_rsqrt), no clipping, label smoothing 0.1, seed 0, the four runs at
# once on the one GPU; --steps (6,000) with the warm-up 8% of the run (480: the paper's 4,000 of
# 50,000), validation NLL and greedy BLEU every --eval_every (1,000) steps, the monitor every
# 500 (step 1 included), the training loss every 20.
#
# PRE-REGISTERED READOUT (printed at the end, bench/gpu/gpu_study_readout.py fig2; fixed
# 2026-12-04 before any GPU ran it), per arm: the largest rise of the training loss (a trailing
# mean of 5 logged values, 100 steps) above its running minimum in the first 1,000 steps;
# validation NLL and greedy BLEU at each evaluation;
# the encoder output's collapse (mean cosine between positions) at step 1 and at the end; and
#   DiD = [NLL(post) - NLL(post_warmup)] - [NLL(pre) - NLL(pre_warmup)]
# at the last evaluation step the four share. Xiong predicts DiD >> 0 (warm-up is what Post-LN
# needs); a learning-rate-budget effect alone (issue 64: the CPU study's DiD was about -1 nat)
# predicts DiD <= 0. Verdict: "as Xiong" if DiD >= 0.2 nats (about 1.5x the 0.14 nats between
# two same-seed CPU reruns) or Post-LN without warm-up diverged alone; "budget" if DiD <= 0;
# "not separated" between. One seed: a first reading at the paper's width, not a test. Added
# 2026-12-05, before any GPU ran it: the readout first prints the gate (PLAN_MT2's rule: Post-LN
# with warm-up reaches 10 greedy BLEU and is level with Pre-LN with warm-up, within 0.10 nats and
# 1.0 BLEU, at the last evaluation they share) and reads no verdict where the baseline fails it.
#
# INITIALISATION (2026-12-05, before any GPU ran it): every run passes --config.model.init=fairseq,
# the papers' code's (Xavier with q, k and v drawn as fairseq's packed [3d, d] in-projection, Var
# 1/(2d); embeddings N(0, 1/d)). configs/mt.py's "xavier" gives q, k and v twice that variance,
# which left 6-6 Post-LN collapsed and untrained at width 256 (issue 64's gate, attempt 2:
# docs/results/studies/PLAN_MT2.md) and starts it as collapsed at width 512 (0.82 at step 1).
# SIZING: one H200 ran the iwslt train step in 11.75 ms blocked on the 4,096-token batch (85
# steps/s alone; ../shared/gpu/2026-12-04-h200/summary_mt.md). On the H100 of 2026-11-26 three
# runs at once made 34-38 steps/s each, 1.9x that H100's blocked rate of 58/s in all (17.1 ms):
# the runs fill each other's launch gaps (docs/results/gpu/journal.md, session 15). The same factor on
# the H200 (1.9 x 85 = 160 steps/s) shared by four runs is 40 steps/s each; planned at 30 (the
# evaluations, the monitor, a fourth process): 6,000 steps in about 200 s. Compilation took
# about 90 s with three processes on the H100 (first step 56-64 s, the second length bucket
# 33 s, the monitor's program), say 120 s with four; six evaluations of the 292 validation pairs
# (NLL and greedy decoding) about 5 s each: about 350 s of the 480 s budget. What does not fit
# stops at the budget (checkpoints saved) and the readout reads the runs as far as they got
# ("partial"); the same command again, on the same machine, continues them.
# The 4,096-token batches hold roughly 100-150 pairs: 6,000 steps are roughly 35-50 passes over
# the corpus's 17,143 training pairs, as the paper's 50,000 steps are about 40 over IWSLT14's
# 160k; the validation NLL may rise late from overfitting (the readout prints DiD at every
# evaluation beside the verdict's).
# STATUS: prepared, NOT RUN YET (no GPU was lent to the session that wrote it).
#
#   bench/gpu/gpu_mt_fig2.sh --prepare          # here, on the CPU: .gpu_data/ (once; shared with
#                                           # gpu_mt_warmup.sh and gpu_mt_liu_depth.sh)
#   bench/gpu/gpu_mt_fig2.sh [--out=DIR] [--steps=N] [--eval_every=N] [--budget=SECONDS]
#                        [--collect=DIR] [--config.FIELD=VALUE ...]  (on to every run)
#   bench/gpu/gpu_mt_fig2.sh --cpu --out=DIR    # tiny shapes, 1 layer, 2 steps (the tests)
#
#   device run: carry [".gpu_data"], command
#     "bench/gpu/gpu_mt_fig2.sh --out=/tmp/gpu/fig2 --collect=$OUT/fig2", timeout 540.
# The checkpoints (about 0.45 GB a run) stay in --out; --collect copies the rest (results,
# metrics, logs, the readout) to DIR. A second call on the still-warm machine with the same
# --out continues; a fresh machine starts over. As the accelerator suite: the python3 on PATH
# (or $PYTHON), nothing from a network, a JAX compilation cache in --out.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=/tmp/gpu_mt_fig2
STEPS=6000
EVAL_EVERY=1000
BUDGET=480
PREPARE=0
CPU=0
COLLECT=""
. bench/gpu/gpu_common.sh
gpu_parse_args "$0" 52 "$@"
[ "$PREPARE" = 1 ] && exec bash bench/gpu/gpu_mt_warmup.sh --prepare
PY=${PYTHON:-python3}
DATA=$ROOT/.gpu_data/gettext_de_en
if [ "$CPU" = 1 ]; then
  [ "$STEPS" = 6000 ] && STEPS=2
  [ "$EVAL_EVERY" = 1000 ] && EVAL_EVERY=2
  DEPTH=1
  BASE=(--jobs=1)
else
  [ -f "$DATA.train.src" ] || { echo "no $DATA.train.src: run bench/gpu/gpu_mt_fig2.sh --prepare here first and carry .gpu_data" >&2; exit 2; }
  DEPTH=6
  BASE=(--config=configs/mt.py:iwslt --config.data.dataset=paralleltext:$DATA
        --config.log_every=20 --config.monitor.every=500 --jobs=4)
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.22  # four runs share the GPU
fi
gpu_environment
[ "$CPU" = 1 ] && gpu_cpu_mode
WARMUP=$(( STEPS * 8 / 100 ))
[ "$WARMUP" -ge 1 ] || WARMUP=1
STUDY=(mt_depth --out="$OUT/study" "${BASE[@]}" "${CPU_BASE[@]}" --depths=$DEPTH
       --arms=post,post_warmup,pre,pre_warmup --lrs=1e-3 --warmup_steps=$WARMUP --seeds=0 --config.model.hidden_dropout=0.1
       --config.model.init=fairseq
       --config.total_steps=$STEPS --config.eval_every=$EVAL_EVERY
       --config.checkpoint_every=$EVAL_EVERY --config.translation.eval_beam=1 "${EXTRA[@]}")
# the runs' SIGTERM 60 s before the budget ends: 40 s to save, then the readout
gpu_run_study 60 "$OUT/study.log" "${STUDY[@]}"
echo "study: rc=$? ($(( $(date +%s) - START ))s)" | tee "$OUT/status.txt"
"$PY" bench/gpu/gpu_study_readout.py fig2 "$OUT/study" --out="$OUT/readout.json" \
  | tee "$OUT/readout.txt"
echo "readout: rc=${PIPESTATUS[0]} ($(( $(date +%s) - START ))s)" | tee -a "$OUT/status.txt"
[ -n "$COLLECT" ] && gpu_collect "$OUT" "$COLLECT"
echo "done in $(( $(date +%s) - START )) s; results in $OUT (readout.txt, study/runs/*/result.json)"
