# Sourced by the one-call GPU study scripts (bench/gpu_mt_warmup.sh, bench/gpu_bert_xiong.sh):
# their shared command line and environment. Not run on its own.
#
#   gpu_parse_args SCRIPT HELP_LAST_LINE "$@"
#     --prepare, --out=DIR, --steps=N, --eval_every=N, --budget=SECONDS, --config.FIELD=VALUE
#     (collected in EXTRA, passed on to every run), -h/--help (prints the script's header up to
#     HELP_LAST_LINE). Sets PREPARE OUT STEPS EVAL_EVERY BUDGET EXTRA; the caller sets their
#     defaults first.
#   gpu_environment
#     Creates $OUT, sets START, and the environment of the suite: unbuffered Python, the
#     repository on PYTHONPATH, a JAX compilation cache and a TFDS folder under $OUT, the GPU's
#     name in $OUT/environment.txt. Defines left (seconds of the budget left).

gpu_parse_args() {
  local script=$1 last=$2
  shift 2
  EXTRA=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --prepare) PREPARE=1 ;;
      --out=*) OUT=${1#--out=} ;;
      --steps=*) STEPS=${1#--steps=} ;;
      --eval_every=*) EVAL_EVERY=${1#--eval_every=} ;;
      --budget=*) BUDGET=${1#--budget=} ;;
      --config.*) EXTRA+=("$1") ;;
      -h|--help) sed -n "2,${last}p" "$script"; exit 0 ;;
      *) echo "$(basename "$script"): unknown argument $1; see --help" >&2; exit 2 ;;
    esac
    shift
  done
}

gpu_environment() {
  mkdir -p "$OUT"
  START=$(date +%s)
  export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/jax_cache}
  export TFDS_DATA_DIR=${TFDS_DATA_DIR:-$OUT/tfds}
  nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/environment.txt" 2>&1 || true
}

left() { echo $((BUDGET - ($(date +%s) - START))); }
