#!/usr/bin/env bash
# The Python packages the GPU machine's image lacks, as cp312 wheels in .whl/ (ignored by git),
# for `bench/gpu/accelerator_suite.sh --wheels .whl` (the device tool carries them: carry [".whl"]).
#
#   bench/gpu_wheels.sh            # here, on the CPU host, with network access to the registry
#
# The versions are this environment's (pip's), so the GPU runs what the tests ran. The image
# (jax 0.11, flax 0.12.10, optax, torch, transformers, sentencepiece, sacrebleu, tensorstore,
# protobuf, pyarrow, psutil, ...) lacks these; `promise` exists only as a source archive and is
# built here (pure Python). On 2026-11-27 a set without portpicker (grain imports it) failed
# both the step benchmark and the main job on an H200 (docs/results/gpu/journal.md, session 25).
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDED=(ml_collections grain tensorflow-datasets tensorboardX array_record dm-tree simple-parsing
        immutabledict tensorflow-metadata termcolor toml orbax-checkpoint portpicker
        docstring-parser googleapis-common-protos)
BUILT=(promise)
PLATFORMS=()
for n in 1 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pinned() { python3 -m pip show "$1" 2>/dev/null | awk '/^Version:/ {print $2}'; }
specs=()
for name in "${NEEDED[@]}" "${BUILT[@]}"; do
  version=$(pinned "$name")
  [ -n "$version" ] || { echo "gpu_wheels.sh: $name is not installed here: pip install -e \".[test]\" first" >&2; exit 2; }
  specs+=("$name==$version")
done
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl "${specs[@]:0:${#NEEDED[@]}}"
python3 -m pip wheel -q --no-deps -w .whl "${specs[@]:${#NEEDED[@]}}"
ls .whl
du -sh .whl
