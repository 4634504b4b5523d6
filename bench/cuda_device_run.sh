#!/bin/bash
# make cuda-check as one call of the device tool: the two scripts under per-stage timeouts, their results and a log
# copied to $OUT (what the tool brings back: at most 8 files), so that a stage that runs out of time still returns
# what the others wrote. Here first: `make cuda-wheels`; then run `bash bench/cuda_device_run.sh` there with
# .cuda-wheels and .cuda-data carried (docs/scaling.md#the-device-check). CHECK_S, PROFILE_S and COMPRESS_MIN
# set the stages' seconds and the compress's minutes (defaults: 390 s, 150 s, 1.5 min; 266 s in all on an H200).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PYTEST_ADDOPTS="--timeout=120"
OUT=${OUT:-runs/cuda_device_run}
mkdir -p "$OUT"
log=$OUT/run.log
files="cuda_check.json cuda_check.md cuda_check_tests.log cuda_profile.json cuda_profile.md cuda_profile_earl.txt
cuda_profile_rotate.txt"
for f in $files; do rm -f "bench/results/$f"; done  # what comes back is this run's or nothing
date -u | tee "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$log"
python3 -m pip install -q --no-index --no-deps .cuda-wheels/*.whl 2>&1 | tail -2 | tee -a "$log"
SECONDS=0
timeout "${CHECK_S:-390}" python3 bench/cuda_check.py --datasets .cuda-data --compress-minutes "${COMPRESS_MIN:-1.5}" \
  2>&1 | tee -a "$log"
echo "cuda_check: rc $? in $SECONDS s" | tee -a "$log"
SECONDS=0
timeout "${PROFILE_S:-150}" python3 bench/cuda_profile.py --graph --datasets .cuda-data 2>&1 | tail -40 | tee -a "$log"
echo "cuda_profile: rc $? in $SECONDS s" | tee -a "$log"
for f in $files; do cp "bench/results/$f" "$OUT/" 2>/dev/null; done
ls -la "$OUT" | tee -a "$log"
