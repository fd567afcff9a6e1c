#!/usr/bin/env bash
# The accelerator suite: what any session with a GPU runs first, in one call (8 minutes on one
# H100/H200, compilation included), writing one results folder and printing one table.
#
#   bench/gpu/accelerator_suite.sh [--cpu] [--out DIR] [--wheels DIR] [--budget SECONDS]
#                              [--skip STEP,...]   (steps: gpu_tests flash bench profile
#                                                   torch mt main_job cudnn_facts)
#                              [--arms NAME,...]   (the step arms to time; default all)
#                              [--tests EXPR]      (pytest -k EXPR for gpu_tests; default all)
#                              [--quick]           (the first part of bench/gpu/gpu_call.sh)
#
#   GPU (default): BERT-base, batch 256 x 128, bf16, dropout 0.1 everywhere:
#     1. the GPU tests (tests/test_accelerator.py: cuDNN dropout read off the kernel, ...)
#     2. the fused attention kernel alone (bench_flash.py): its Triton settings against XLA's
#        and cuDNN's attention; the fastest settings are exported (LN_JAX_FLASH_TUNING) for
#        the steps that follow
#     3. the step benchmark, arms side by side in one process (bench_accel.py --arm):
#        default (the config's "auto" choices), pallas (attention_impl=pallas: the fused
#        attention whose dropout is keyed by the step, ln_jax/nn/flash.py), hash
#        (dropout_rng=hash: fused counter-hash dropout bits), pallas_hash (both), cudnn_nodrop
#        (attention dropout 0: "auto" takes cuDNN's fused attention), gelu_tanh (the tanh GELU,
#        not the recipe's: what erf costs), xla_layout (model.activation_layout=xla: XLA's own
#        layout of the residual stream, the GPU default before 2026-11-27; "auto" pins it
#        row-major), cublas (XLA's Triton GEMMs off for its compile), no_dot_merge (XLA's
#        merging of GEMMs that share an operand off), cublas_no_merge (both), stacked (the
#        layers' parameters stacked, the scan unrolled: "auto"'s choice on a GPU since issue
#        67), unstacked (the layers as a list), graphs_off (XLA's CUDA graphs off
#        for its compile), main (default at the main job's
#        vocabulary, 8000: the step the main job is compared with); each also with
#        --pipeline=5 (5 steps in flight, one wait); a profile of $PROFILE_ARM (default:
#        default) summarised by kernel class (profile_summary.py) and the optimised HLO (hlo/)
#        to match its fusion names
#     4. the PyTorch anchor: HuggingFace BertForPreTraining, eager and torch.compile, MLM at
#        all positions and at the masked ones (bench_torch_anchor.py)
#     5. translation (bench_mt_accel.py): the `iwslt` model's train step (configs/mt.py:iwslt,
#        6-6, 512/1024/4, bf16) on the recipe's 4,096-token batch (128 x 32) and a larger one
#        (512 x 64), the layers stacked and as a list, blocked and 5 in flight: target tokens/s
#        and MFU by counted FLOPs; HuggingFace Marian + torch.compile of the same shape on the
#        recipe's batch, side by side; beam 5 on 256 sources, and against Marian's generate on
#        the same weights and sources (targets: >= 1.25x and >= 1.5x)
#     6. the main job: train.py, configs/bert_preln.py for 300 steps on the embedded corpus
#        (prepared in a fresh TFDS dir), loader, monitor and checkpoint at their defaults
#     7. cuDNN dropout facts (cudnn_dropout_facts.py), then the table (suite_report.py)
#   --cpu: the same steps at tiny shapes on the CPU (CI runs this so the suite never rots);
#     no GPU tests, cuDNN facts, cudnn_nodrop arm, HLO dump or torch.compile (the pallas
#     arms run Pallas's interpreter).
#   --quick: the suite as bench/gpu/gpu_call.sh runs it before the studies, about 6 minutes on an
#     H200 with --arms default,unstacked (estimated: arms 110 s, profile 15 s, torch 45 s,
#     translation 125 s, main job 110 s): no GPU tests, kernel tuning or cuDNN facts (skipped),
#     10 timed steps an arm, the PyTorch anchor as torch.compile with MLM at the masked
#     positions only (the like-for-like one), translation on the recipe's batch (128 x 32),
#     stacked and as a list, against Marian + torch.compile, and beam 5 against Marian's
#     generate once, the main job for 100 steps. With --cpu: the CPU mode's shapes, same skips.
#
# It installs nothing from a network: it uses the python3 on PATH (or $PYTHON) and its
# packages, plus the wheels in --wheels DIR if given (pip --no-index into a temporary folder).
# Each step runs under a time limit drawn from --budget (default 480 s); a step that fails or
# runs out of time is recorded in status.txt and the suite goes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MODE=gpu
OUT=/tmp/accelerator_suite
WHEELS=""
BUDGET=480
SKIP=""
ONLY=""
TESTS=""
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --out) OUT=$2; shift ;;
    --out=*) OUT=${1#--out=} ;;
    --wheels) WHEELS=$2; shift ;;
    --wheels=*) WHEELS=${1#--wheels=} ;;
    --budget) BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --skip) SKIP=$2; shift ;;
    --skip=*) SKIP=${1#--skip=} ;;
    --arms) ONLY=$2; shift ;;
    --arms=*) ONLY=${1#--arms=} ;;
    --tests) TESTS=$2; shift ;;
    --tests=*) TESTS=${1#--tests=} ;;
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "accelerator_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
[ "$QUICK" = 1 ] && SKIP="gpu_tests,flash,cudnn_facts${SKIP:+,$SKIP}"
mkdir -p "$OUT"
: > "$OUT/status.txt"
START=$(date +%s)
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/jax_cache}
if [ -n "$WHEELS" ]; then
  SITE=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { echo "installing $WHEELS failed" >&2; exit 2; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TFDS_DATA_DIR=${TFDS_DATA_DIR:-$OUT/tfds}

# step NAME SECONDS COMMAND...: runs COMMAND with its output in NAME.log, under the smaller of
# SECONDS and what the budget has left (less 20 s for the report), and records its exit code.
step() {
  local name=$1 limit=$2 left
  shift 2
  if [[ ",$SKIP," == *",$name,"* ]]; then
    echo "$name: skipped (--skip)" | tee -a "$OUT/status.txt"
    return
  fi
  left=$((BUDGET - ($(date +%s) - START) - 20))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "$name: skipped (budget spent)" | tee -a "$OUT/status.txt"
    return
  fi
  echo "=== $(date +%T) $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "$name: rc=$rc ($(( $(date +%s) - START ))s)" | tee -a "$OUT/status.txt"
}

"$PY" - > "$OUT/environment.txt" 2>&1 <<'EOF'
import platform, jax
print("python", platform.python_version(), "jax", jax.__version__, jax.devices())
for name in ("flax", "optax", "orbax.checkpoint", "torch", "transformers", "tensorflow_datasets"):
    try:
        module = __import__(name, fromlist=["_"])
        print(name, getattr(module, "__version__", "?"))
    except Exception as err:  # noqa: BLE001
        print(name, "MISSING", type(err).__name__, err)
EOF
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv \
  >> "$OUT/environment.txt" 2>&1 || true
cat "$OUT/environment.txt"

if [ "$MODE" = gpu ]; then
  SHAPE=(--size=base --batch=256 --steps=20 --warmup=3 --pipeline=5)
  TORCH=(--size=base --batch=256 --steps=10 --warmup=2 --pipeline=5)
  MAIN=(--config=configs/bert_preln.py --config.total_steps=300 --config.eval_batches=10)
  # translation: the layers stacked ("auto" on a GPU) and as a list, 5 steps in flight, against
  # HuggingFace Marian + torch.compile on the recipe's batch, beam 5 against its generate
  MT=(--batches=128x32,512x64 --steps=10 --warmup=2 --sentences=256 --rounds=2
      --layouts=auto,list --pipeline=5 --marian=compile)
  if [ "$QUICK" = 1 ]; then
    # H200, 2026-12-04: four arms compiled in 214 s, torch's four modes 99 s, the two
    # translation shapes and the search 141 s, the main job 110 s (81.5 s of set-up)
    SHAPE=(--size=base --batch=256 --steps=10 --warmup=2 --pipeline=5)
    TORCH=(--size=base --batch=256 --steps=10 --warmup=2 --pipeline=5 --modes=compile_masked)
    MAIN=(--config=configs/bert_preln.py --config.total_steps=100 --config.eval_batches=10)
    # the translation anchors (issue 67 item 4), estimated 125 s: start 20 s, the two layouts'
    # steps compiled in parallel 45 s (one took 40 s), Marian's torch.compile 30-40 s, the
    # searches on one Marian model's weights 15 s
    MT=(--batches=128x32 --steps=10 --warmup=2 --sentences=256 --rounds=1 --layouts=auto,list
        --pipeline=5 --marian=compile --decodes=marian)
  fi
  # tests/conftest.py defaults JAX to the CPU and XLA to fast (unoptimised) compiles: not here.
  # pyproject's addopts ask for pytest-xdist's workers, which the GPU image may lack: dropped
  step gpu_tests 150 env JAX_PLATFORMS=cuda,cpu LN_JAX_TEST_OPTIMIZED_COMPILE=1 \
    "$PY" -m pytest -q -o addopts= -p no:cacheprovider -rs tests/test_accelerator.py \
    ${TESTS:+-k "$TESTS"}
else
  # length 32, not 128: the steps' run time is a quarter, the same programs and checks
  SHAPE=(--size=tiny --batch=8 --seq=32 --steps=2 --warmup=1 --dtype=f32 --matmul=256
         --pipeline=2)
  TORCH=(--size=tiny --batch=8 --seq=32 --steps=2 --warmup=1 --vocab=8000
         --modes=eager_all,eager_masked --pipeline=2)
  MAIN=(--config=configs/bert_preln.py:tiny --config.total_steps=6 --config.log_every=2
        --config.eval_every=0 --config.eval_batches=1 --config.checkpoint_every=0)
  # one layout (the GPU's two are compared in tests/test_bench_mt_accel.py, in-process)
  MT=(--config=configs/mt.py:tiny --batches=8x16 --steps=2 --warmup=1 --sentences=4
      --max_length=8 --rounds=1 --layouts=auto --pipeline=2 --marian=eager)
fi
ARMS=(--arm=default)  # the config as a user runs it (its "auto" choices)
ARMS+=(--arm=pallas:model.attention_impl=pallas)  # fused attention, dropout keyed by the step
ARMS+=(--arm=hash:dropout_rng=hash)  # hidden dropout bits from a fused counter hash
ARMS+=(--arm=pallas_hash:model.attention_impl=pallas,dropout_rng=hash)
[ "$MODE" = gpu ] && ARMS+=(--arm=cudnn_nodrop:model.attention_dropout=0.0)  # -> cuDNN
# tanh GELU (not the recipe's erf): XLA can fuse bias + tanh GELU into cuBLASLt's epilogue; the
# erf GELU's forward alone took 3.7 ms of the 60.7 ms step on an H100 (docs/results/gpu/journal.md, session 15)
[ "$MODE" = gpu ] && ARMS+=(--arm=gelu_tanh:model.activation=gelu_tanh)
# XLA's own layout of the residual stream: on an H100 and an H200 it laid it out batch-minor
# and transposed around every residual add and LayerNorm backward; "auto" pins it row-major
# on a GPU since 2026-11-27 (H200: 67.8 -> 65.4 ms; docs/results/gpu/journal.md)
[ "$MODE" = gpu ] && ARMS+=(--arm=xla_layout:model.activation_layout=xla)
# XLA's Triton GEMMs off (cuBLAS for every matmul), for this arm's compile alone: on the H200
# of 2026-11-28 the step had 26 Triton GEMM fusions and 8.5 GB more elementwise traffic than
# the same step compiled for an H200 with them off (bench/probes/gpu_compile_arms.py;
# docs/results/gpu/journal.md)
[ "$MODE" = gpu ] && ARMS+=(--arm=cublas:xla.xla_gpu_enable_triton_gemm=false)
# XLA's dot merger off: on that H200 it merged each layer's key and value projections into
# one GEMM, so the backward concatenated dK and dV (12 copies of 2 x 50 MB a step)
[ "$MODE" = gpu ] && ARMS+=(--arm=no_dot_merge:xla.xla_gpu_dot_merger_threshold_mb=0)
# Both off: cuBLAS with its bias epilogues (the H200's compile had 1 where the cuBLAS-only
# compile has 76: 36 q/k/v bias adds ran as kernels of their own) and no merged GEMMs
[ "$MODE" = gpu ] && ARMS+=(--arm=cublas_no_merge:xla.xla_gpu_enable_triton_gemm=false,xla.xla_gpu_dot_merger_threshold_mb=0)
# The layers' parameters stacked and the scan unrolled (straight-line code): compiled for an
# H200 without one, 1,016 -> 780 kernels a step at the same bytes (each stacked parameter's
# AdamW update and cast one kernel for all 12 layers; docs/results/gpu/journal.md, sessions 29 and 34)
[ "$MODE" = gpu ] && ARMS+=(--arm=stacked:model.scan_layers=true,model.scan_unroll=12)
# The layers as a list: the default's layout before issue 67 ("auto" stacks them on a GPU
# since: H200 2026-12-04, 56.2 -> 52.3 ms blocked, 49.8 -> 49.4 in flight); the two layouts
# side by side again in each GPU call
[ "$MODE" = gpu ] && ARMS+=(--arm=unstacked:model.scan_layers=false)
# XLA's CUDA graphs off for this arm's compile (`xla_gpu_enable_command_buffer` empty): each
# kernel launched by the host. Between two blocked steps the H200 of 2026-11-27 idled 7-8 ms;
# this arm's blocked time and launch_ms against the default's say how much of that is the
# graphs' own update and launch
[ "$MODE" = gpu ] && ARMS+=(--arm=graphs_off:xla.xla_gpu_enable_command_buffer=)
ARMS+=(--arm=main:data.vocab_size=8000)  # default at the main job's vocabulary
PROFILE_ARM=${PROFILE_ARM:-default}
if [ -n "$ONLY" ]; then  # --arms: keep the named ones, in the order above
  KEPT=()
  for a in "${ARMS[@]}"; do
    n=${a#--arm=}; n=${n%%:*}
    [[ ",$ONLY," == *",$n,"* ]] && KEPT+=("$a")
  done
  ARMS=("${KEPT[@]}")
fi
if [ "$MODE" = gpu ]; then
  step flash 120 "$PY" bench/speed/bench_flash.py --out="$OUT/flash.json" --env_out="$OUT/tuning.env"
else
  step flash 120 "$PY" bench/speed/bench_flash.py --batch=2 --heads=2 --steps=2 --warmup=1 \
    --out="$OUT/flash.json" --env_out="$OUT/tuning.env"
fi
[ -f "$OUT/tuning.env" ] && . "$OUT/tuning.env" && echo "kernel settings: $LN_JAX_FLASH_TUNING"
BENCH_ENV=()
# CPU: the step benchmark on one device, as on one GPU (the tests' 8 fake devices spent half of
# each tiny step in collectives on 2 cores)
[ "$MODE" = cpu ] && BENCH_ENV=(env "XLA_FLAGS=$(printf %s "${XLA_FLAGS:-}" \
  | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g')")
# The optimised HLO, to match the profile's fusion names (input_transpose_fusion_25, ...).
[ "$MODE" = gpu ] && BENCH_ENV=(env "XLA_FLAGS=${XLA_FLAGS:-} --xla_dump_to=$OUT/hlo \
  --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*step_fn.*")
# GPU: each arm's autotuning results (autotune/ARM.textproto), for compiles without a GPU
DUMP=()
[ "$MODE" = gpu ] && DUMP=(--autotune_dump="$OUT/autotune")
# 360 s: seven arms compile one at a time on a GPU (autotuning each: ~30 s on the H200 of
# 2026-11-28, where four arms took 130 s in all); a bench cut off by its limit writes nothing
step bench 360 "${BENCH_ENV[@]}" "$PY" bench/speed/bench_accel.py "${SHAPE[@]}" "${ARMS[@]}" "${DUMP[@]}" \
  --profile_arm="$PROFILE_ARM" --profile_dir="$OUT/trace" --profile_steps=3 --out="$OUT/arms.json"
HLO_ARGS=()
[ "$MODE" = gpu ] && HLO_ARGS=(--hlo_dir="$OUT/hlo")  # classes and achieved rates from the HLO
step profile 60 "$PY" bench/gpu/profile_summary.py "$OUT/trace" --steps=3 "${HLO_ARGS[@]}" \
  --out="$OUT/profile.json"
step torch 200 "$PY" bench/speed/bench_torch_anchor.py "${TORCH[@]}" --out="$OUT/torch.json"
# on an H100 the two train shapes and the search compiled in 42 + 37 + 12 s, the whole step 147 s;
# with the list arm and Marian (torch.compile, generate) about 100 s more. It writes mt.json
# after each part, so a step cut by its limit keeps the train steps it timed
step mt 260 "$PY" bench/speed/bench_mt_accel.py "${MT[@]}" --out="$OUT/mt.json"
rm -rf "$OUT/main_job"
# 200 s: on an H200 110 s passed before the first step (the auto accumulation's compile
# among them) and the monitored first step compiled for 35 s (docs/results/gpu/journal.md, 2026-11-27)
step main_job 200 "$PY" train.py "${MAIN[@]}" --workdir="$OUT/main_job"
if [ "$MODE" = gpu ]; then
  step cudnn_facts 60 "$PY" bench/probes/cudnn_dropout_facts.py --out="$OUT/cudnn_facts.json"
fi
"$PY" bench/gpu/suite_report.py "$OUT"
echo "suite done in $(( $(date +%s) - START )) s; results in $OUT"
