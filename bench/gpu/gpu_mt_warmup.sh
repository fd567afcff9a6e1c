#!/usr/bin/env bash
# Issue 35, "at the papers' width on a GPU": Xiong et al.'s key warm-up cells on translation at
# the IWSLT width (configs/mt.py:iwslt: 6-6, 512 / 1024 / 4 heads, dropout 0.3) on the offline
# German -> English corpus, in one call of at most 8 minutes on one H100/H200:
#   Post-LN 1e-3 without warm-up, Post-LN 1e-3 with the full warm-up (the paper's 4,000 of
#   50,000 steps scaled to the run: 8%), Pre-LN 1e-3 without; Adam (0.9, 0.98), inverse sqrt,
#   gradient clipping off, label smoothing 0.1 (python -m ln_jax.experiments mt_warmup), the
#   three runs at once on the one GPU, greedy BLEU and validation NLL every --eval_every steps,
#   beam-5 BLEU of each final checkpoint at the end.
# STATUS: tried once (2026-11-26, one H100, docs/results/gpu/journal.md "session 15") with 320 s after the
# accelerator suite: compilation (about a minute a program, three processes at once) left the
# runs at step 200-250 of 2,000, no BLEU. Give it a call of its own (the default 480 s budget).
#
# INITIALISATION (2026-12-05; the one try of 2026-11-26 ran "xavier"): --config.model.init=fairseq,
# the papers' code's (Xavier with q, k and v drawn as fairseq's packed [3d, d] in-projection, Var
# 1/(2d); embeddings N(0, 1/d)). configs/mt.py's "xavier" gives q, k and v twice that variance,
# which left 6-6 Post-LN collapsed and untrained at width 256 (issue 64's gate, attempt 2:
# docs/results/studies/PLAN_MT2.md) and starts it as collapsed at width 512 (0.82 at step 1).
#   bench/gpu/gpu_mt_warmup.sh --prepare            # here, on the CPU: writes .gpu_data/ (once)
#   bench/gpu/gpu_mt_warmup.sh [--out DIR] [--steps N] [--eval_every N] [--budget SECONDS]
#                          [--config.FIELD=VALUE ...]   (passed on to every run of the study)
#
# --prepare exports the ln_jax_gettext/de-en pairs of THIS machine to plain files
# (.gpu_data/gettext_de_en.{train,valid,test}.{src,tgt}, read as paralleltext:PREFIX): the
# gettext corpus is built from the catalogues installed where it runs, so the GPU machine's own
# would be another corpus. .gpu_data/ is ignored (.git/info/exclude) and carried:
#   device run: carry [".gpu_data"], command "bench/gpu/gpu_mt_warmup.sh --out=$OUT/mt", timeout 540.
# As the accelerator suite: the python3 on PATH (or $PYTHON), nothing installed from a network,
# a JAX compilation cache, every step under a time limit drawn from --budget (default 480 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=/tmp/gpu_mt_warmup
STEPS=3000
EVAL_EVERY=500
BUDGET=480
PREPARE=0
. bench/gpu/gpu_common.sh
gpu_parse_args "$0" 24 "$@"
PY=${PYTHON:-python3}
DATA=$ROOT/.gpu_data/gettext_de_en
if [ "$PREPARE" = 1 ]; then
  mkdir -p "$ROOT/.gpu_data"
  grep -qx '/.gpu_data/' .git/info/exclude 2>/dev/null || echo '/.gpu_data/' >> .git/info/exclude
  "$PY" - "$DATA" <<'PYEOF'
import sys
from ln_jax.data.config import DataConfig
from ln_jax.data.translation.parallel import open_parallel

prefix = sys.argv[1]
source = open_parallel(DataConfig(dataset="ln_jax_gettext/de-en"))
for split, infix in (("train", "train"), ("validation", "valid"), ("test", "test")):
    pairs = source.pairs(split)
    one_line = lambda s: " ".join(s.split())
    for side, index in (("src", 0), ("tgt", 1)):
        with open(f"{prefix}.{infix}.{side}", "w") as f:
            f.writelines(one_line(p[index]) + "\n" for p in pairs)
    print(f"{split}: {len(pairs)} pairs -> {prefix}.{infix}.src/tgt")
PYEOF
  exit $?
fi
[ -f "$DATA.train.src" ] || { echo "no $DATA.train.src: run bench/gpu/gpu_mt_warmup.sh --prepare here first and carry .gpu_data" >&2; exit 2; }
gpu_environment
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.28  # three runs share the GPU
FULL=$(( STEPS * 8 / 100 ))
STUDY=(mt_warmup --out="$OUT/study" --config=configs/mt.py:iwslt --lrs=1e-3 --pre_lrs=1e-3
       --warmup_steps=0,full --full_warmup=$FULL --seeds=0 --jobs=3 --config.model.init=fairseq
       --config.data.dataset=paralleltext:$DATA --config.total_steps=$STEPS
       --config.eval_every=$EVAL_EVERY --config.checkpoint_every=$EVAL_EVERY
       --config.log_every=100 --config.monitor.every=250 "${EXTRA[@]}")
echo "=== $(date +%T) study: ${STUDY[*]}"
# The runs stop at the budget less 90 s for the beam-5 scoring: SIGTERM to the study's whole
# process group (its --jobs children save a checkpoint at their next step; 40 s later SIGKILL);
# rerunning this script resumes.
setsid "$PY" -m ln_jax.experiments "${STUDY[@]}" > "$OUT/study.log" 2>&1 &
SPID=$!
( sleep $(( $(left) - 90 )); kill -TERM -- -$SPID 2>/dev/null; sleep 40; kill -KILL -- -$SPID 2>/dev/null ) &
WATCH=$!
wait $SPID
echo "study: rc=$? ($(( $(date +%s) - START ))s)" | tee "$OUT/status.txt"
# The study's runs are its children: after a SIGTERM they are still saving when it exits.
while pgrep -g "$SPID" > /dev/null 2>&1 && [ "$(left)" -gt 30 ]; do sleep 1; done
kill $WATCH 2>/dev/null
tail -n 30 "$OUT/study.log"
for run in "$OUT"/study/runs/*/; do
  [ "$(left)" -gt 15 ] || break
  name=$(basename "$run")
  timeout --kill-after=5 $(( $(left) - 10 )) "$PY" -m ln_jax.translate --workdir="$run" \
    --beam=5 --output="$OUT/$name.beam5.txt" > "$OUT/$name.beam5.log" 2>&1
  echo "beam5 $name: rc=$? $(grep -o 'BLEU[^|]*' "$OUT/$name.beam5.log" | tail -1)" | tee -a "$OUT/status.txt"
done
cp "$OUT/study/table.md" "$OUT/table.md" 2>/dev/null
echo "done in $(( $(date +%s) - START )) s; results in $OUT (table.md, study/runs/*/result.json)"
