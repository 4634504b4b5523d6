#!/bin/bash
# make cuda-check: the two scripts under per-stage timeouts, their results and a log copied to $OUT (on the lent
# machine, what the device tool brings back: at most 8 files), so that a stage that runs out of time still returns
# what the others wrote. Here first: `make cuda-wheels`; then run `bash bench/cuda_device_run.sh` (or `make
# cuda-check`) there with .cuda-wheels and .cuda-data carried (docs/scaling.md#the-device-check). CHECK_S,
# PROFILE_S and COMPRESS_MIN set the stages' seconds and the compress's minutes (defaults: 500 s, 150 s, 1.5 min;
# 266 s in all on an H200 before the --parallel compress, ~100 s more with it); DATA the datasets folder (.cuda-data), PY the Python, CHECK_ARGS more cuda_check flags.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PYTEST_ADDOPTS="--timeout=120"
OUT=${OUT:-runs/cuda_device_run}
mkdir -p "$OUT"
log=$OUT/run.log
files="cuda_check.json cuda_check.md cuda_check_tests.log cuda_profile.json cuda_profile.md cuda_profile_earl.txt
cuda_profile_rotate.txt"
started=$OUT/.started  # what comes back is this run's results or nothing (a stage that died wrote none)
touch "$started"
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$log"
PY=${PY:-python3}
DATA=${DATA:-.cuda-data}
if [ -d .cuda-wheels ]; then $PY -m pip install -q --no-index --no-deps .cuda-wheels/*.whl 2>&1 | tail -2 | tee -a "$log"; fi
SECONDS=0
# shellcheck disable=SC2086  # CHECK_ARGS: several flags
timeout "${CHECK_S:-500}" $PY bench/cuda_check.py --datasets "$DATA" --compress-minutes "${COMPRESS_MIN:-1.5}" \
  $CHECK_ARGS 2>&1 | tee -a "$log"
echo "cuda_check: rc $? in $SECONDS s" | tee -a "$log"
SECONDS=0
timeout "${PROFILE_S:-150}" $PY bench/cuda_profile.py --graph --datasets "$DATA" 2>&1 | tail -40 | tee -a "$log"
echo "cuda_profile: rc $? in $SECONDS s" | tee -a "$log"
for f in $files; do if [ "bench/results/$f" -nt "$started" ]; then cp "bench/results/$f" "$OUT/"; fi; done
rm -f "$started"
ls -la "$OUT" | tee -a "$log"
