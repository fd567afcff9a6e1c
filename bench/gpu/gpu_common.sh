# Sourced by the one-call GPU study scripts (bench/gpu/gpu_mt_warmup.sh, gpu_bert_xiong.sh,
# gpu_mt_fig2.sh, gpu_mt_liu_depth.sh): their shared command line and environment.
# Not run on its own.
#
#   gpu_parse_args SCRIPT HELP_LAST_LINE "$@"
#     --prepare, --out=DIR, --steps=N, --eval_every=N, --budget=SECONDS, --config.FIELD=VALUE
#     (collected in EXTRA, passed on to every run), -h/--help (prints the script's header up to
#     HELP_LAST_LINE); --cpu (sets CPU=1) and --collect=DIR (sets COLLECT) only where the
#     script declared CPU / COLLECT first. Sets PREPARE OUT STEPS EVAL_EVERY BUDGET EXTRA; the
#     caller sets their defaults first.
#   gpu_environment
#     Creates $OUT, sets START, and the environment of the suite: unbuffered Python, the
#     repository on PYTHONPATH, a JAX compilation cache and a TFDS folder under $OUT, the GPU's
#     name in $OUT/environment.txt. Defines left (seconds of the budget left).
#   gpu_cpu_mode (after gpu_environment)
#     A study script's --cpu: JAX on the CPU as one device, and CPU_BASE, the study flags of
#     tiny shapes (configs/mt.py:tiny on the synthetic copy task: no corpus to build) with
#     the compilation cache of gpu_environment, which bench/gpu/gpu_call.sh shares between its
#     studies (their runs of the same shape compile once: on 2 CPU cores compiling is most of
#     a CPU-mode run).
#   gpu_run_study, gpu_collect: below.

CPU_BASE=()

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
      --cpu) [ -n "${CPU+set}" ] || gpu_unknown "$script" "$1"; CPU=1 ;;
      --collect=*) [ -n "${COLLECT+set}" ] || gpu_unknown "$script" "$1"; COLLECT=${1#--collect=} ;;
      -h|--help) sed -n "2,${last}p" "$script"; exit 0 ;;
      *) gpu_unknown "$script" "$1" ;;
    esac
    shift
  done
}

gpu_unknown() {
  echo "$(basename "$1"): unknown argument $2; see --help" >&2
  exit 2
}

gpu_environment() {
  mkdir -p "$OUT"
  START=$(date +%s)
  export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/jax_cache}
  export TFDS_DATA_DIR=${TFDS_DATA_DIR:-$OUT/tfds}
  nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/environment.txt" 2>&1 || true
}

gpu_cpu_mode() {
  export JAX_PLATFORMS=cpu XLA_FLAGS="$(printf %s "${XLA_FLAGS:-}" \
    | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g')"
  CPU_BASE=(--config=configs/mt.py:tiny --config.data.dataset=synthetic:copy
            --config.data.vocab_size=36 --config.translation.max_source_length=16
            --config.translation.max_target_length=16 --config.translation.max_tokens=512
            --config.eval_batches=1 --config.log_every=1 --config.monitor.every=1
            --config.optim.warmup_steps=0 --config.compilation_cache="$JAX_COMPILATION_CACHE_DIR")
}

left() { echo $((BUDGET - ($(date +%s) - START))); }

# gpu_collect SRC DEST: the light files of a results folder (logs, JSON, metrics, tables) into
# DEST, without what does not travel back from a device machine: checkpoints, compilation
# caches, prepared data, a profile's trace, the suite's HLO dump and autotuning results
# (bench/gpu/gpu_call.sh adds the last two as one .tgz).
gpu_collect() {
  mkdir -p "$2"
  tar -C "$1" --exclude=checkpoints --exclude=jax_cache --exclude=jax_compilation \
    --exclude=tfds --exclude=tensorboard --exclude=trace --exclude=hlo --exclude=autotune \
    --exclude='*.lock' -cf - . | tar -C "$2" -xf -
}

# gpu_run_study RESERVE LOG ARGS...: `python -m ln_jax.experiments ARGS` in a process group of
# its own, its output in LOG. RESERVE seconds before the budget ends, the whole group gets a
# SIGTERM (each run saves a checkpoint at its next step and exits 0; 40 s later a SIGKILL).
# Returns the study's exit status once every run has exited (the runs are its children: after
# a SIGTERM they are still saving when it exits). Rerunning with the same --out resumes.
gpu_run_study() {
  local reserve=$1 log=$2 spid watch rc wait_s
  shift 2
  wait_s=$(( $(left) - reserve ))
  if [ "$wait_s" -le 10 ]; then
    echo "study: skipped (budget spent)"
    return 3
  fi
  echo "=== $(date +%T) study (stopped in ${wait_s}s at the latest): $*"
  setsid "$PY" -m ln_jax.experiments "$@" > "$log" 2>&1 &
  spid=$!
  setsid bash -c "sleep $wait_s; kill -TERM -- -$spid; sleep 40; kill -KILL -- -$spid" \
    > /dev/null 2>&1 &
  watch=$!
  wait $spid
  rc=$?
  while pgrep -g "$spid" > /dev/null 2>&1 && [ "$(left)" -gt 5 ]; do sleep 1; done
  kill -- -"$watch" 2>/dev/null
  tail -n 25 "$log"
  return $rc
}
