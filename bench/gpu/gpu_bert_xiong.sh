#!/usr/bin/env bash
# Issue 35, "at the papers' width on a GPU": Xiong et al. section 4.2's own BERT setting,
# BERT-base (12 layers, width 768), in one call of at most 8 minutes on one H100/H200:
#   Pre-LN without warm-up at 3e-4 (configs/bert_preln.py: linear decay from the peak) against
#   Post-LN with warm-up at 1e-4 (configs/bert_postln.py: Devlin's 10k warm-up of 1M steps, 1%,
#   scaled to the run), each --steps steps (the GPU ran the main job at 15 steps/s: 2,500 each
#   fit), validation MLM loss every --eval_every steps to metrics.jsonl, on the ln_jax_sitedocs
#   corpus of THIS machine, exported to text and carried.
# STATUS: prepared, NOT RUN YET (no GPU was lent to the session that wrote it).
#
#   bench/gpu/gpu_bert_xiong.sh --prepare        # here, on the CPU: .gpu_data/sitedocs/*.txt (once)
#   bench/gpu/gpu_bert_xiong.sh [--out DIR] [--steps N] [--eval_every N] [--budget SECONDS]
#
# ln_jax_sitedocs is built from the packages installed where it runs (its name hashes them), so
# the GPU machine's own would be another corpus: --prepare writes this machine's documents
# (train and validation splits) as .txt files, read there as textdir:.gpu_data/sitedocs.
#   device run: carry [".gpu_data"], command "bench/gpu/gpu_bert_xiong.sh --out=$OUT/bert", timeout 540.
# As the accelerator suite: the python3 on PATH (or $PYTHON), nothing from a network, a JAX
# compilation cache, each run under a time limit from --budget (default 480 s); a run cut off
# resumes from its last checkpoint when the script runs again with the same --out.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=/tmp/gpu_bert_xiong
STEPS=2500
EVAL_EVERY=250
BUDGET=480
PREPARE=0
. bench/gpu/gpu_common.sh
gpu_parse_args "$0" 20 "$@"
PY=${PYTHON:-python3}
TEXT=$ROOT/.gpu_data/sitedocs
if [ "$PREPARE" = 1 ]; then
  mkdir -p "$TEXT"
  grep -qx '/.gpu_data/' .git/info/exclude 2>/dev/null || echo '/.gpu_data/' >> .git/info/exclude
  "$PY" - "$TEXT" <<'PYEOF'
import sys
from ln_jax.data.config import DataConfig
from ln_jax.data.sources import open_sources

folder, per_file = sys.argv[1], 2000
(source, _), = open_sources(DataConfig(dataset="ln_jax_sitedocs"))
for split in ("train", "validation"):
    docs, part = [], 0
    def flush():
        global docs, part
        if docs:
            with open(f"{folder}/{split}_{part:04d}.txt", "w") as f:
                f.write("\n\n".join(docs) + "\n")
            docs, part = [], part + 1
    for sentences in source.documents(split):
        docs.append("\n".join(" ".join(s.split()) for s in sentences))
        if len(docs) == per_file:
            flush()
    flush()
    print(f"{split}: {part} files in {folder}")
PYEOF
  exit $?
fi
ls "$TEXT"/*.txt > /dev/null 2>&1 || { echo "no $TEXT/*.txt: run bench/gpu/gpu_bert_xiong.sh --prepare here first and carry .gpu_data" >&2; exit 2; }
gpu_environment
COMMON=(--config.data.dataset=textdir:$TEXT --config.data.vocab_size=8000
        --config.total_steps=$STEPS --config.eval_every=$EVAL_EVERY --config.eval_batches=10
        --config.checkpoint_every=$EVAL_EVERY --config.log_every=100 "${EXTRA[@]}")
: > "$OUT/status.txt"
n=0
for arm in bert_preln bert_postln; do
  n=$((n + 1))
  left=$(( (BUDGET - ($(date +%s) - START) - 10) / (3 - n) ))
  echo "=== $(date +%T) $arm (limit ${left}s)"
  timeout --kill-after=10 "$left" "$PY" train.py --config=configs/$arm.py "${COMMON[@]}" \
    --workdir="$OUT/$arm" > "$OUT/$arm.log" 2>&1
  echo "$arm: rc=$? ($(( $(date +%s) - START ))s)" | tee -a "$OUT/status.txt"
  tail -n 5 "$OUT/$arm.log"
done
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/table.md"
import json, os, sys
out = sys.argv[1]
print("| step | Pre-LN 3e-4, no warm-up: val MLM | Post-LN 1e-4, warm-up 1%: val MLM |")
print("|---|---|---|")
curves = {}
for arm in ("bert_preln", "bert_postln"):
    path = os.path.join(out, arm, "metrics.jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    curves[arm] = {r["step"]: r.get("mlm_loss") for r in rows if r.get("split") == "eval"}
for step in sorted(set(curves["bert_preln"]) | set(curves["bert_postln"])):
    cell = lambda a: "–" if curves[a].get(step) is None else f"{curves[a][step]:.3f}"
    print(f"| {step} | {cell('bert_preln')} | {cell('bert_postln')} |")
PYEOF
echo "done in $(( $(date +%s) - START )) s; results in $OUT"
