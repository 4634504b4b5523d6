#!/usr/bin/env bash
# make cuda-image: build the CUDA worker image (docker/worker.Dockerfile, DEVICE=cuda) offline, record its size,
# and run its smoke test inside it on the CPU. Needs no image registry and no GPU; the package index only to fill
# the wheelhouse on the host (none inside the build).
#   1. apt-get installs docker.io and debootstrap where missing; starts dockerd where none answers (exits 0,
#      SKIPPED, where it cannot)
#   2. builds the Debian base image (as make compose-test does) where it is absent: no nvidia/cuda image is
#      reachable, and none is needed: PyPI's CUDA torch and faiss-gpu bring their own CUDA libraries, the driver
#      comes from the host (nvidia-container-toolkit) at run time
#   3. fills .cuda-image/wheels/ on the host: torch (CUDA 13 build), faiss-gpu (CUDA 12 build), the train extra
#   4. builds the image from a context of the package and that wheelhouse (.cuda-image/context/), so that the
#      multi-GB wheelhouse never enters the CPU images' build context
#   5. smoke test inside: torch and faiss import with their CUDA builds, the C++ kernel loads without a compiler,
#      and `earl train --device cpu` trains CoDEx-S for a few steps and writes its bundle
# Figures go to bench/results/cuda_image.{json,md}; logs to .cuda-image/.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=.cuda-image
LOG_NAME=cuda-image
MIRROR=${EARL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
EARL_TEST_BASE_IMAGE=${EARL_TEST_BASE_IMAGE:-earl-base:bookworm}
IMAGE=${EARL_CUDA_IMAGE:-earl-worker:cuda}
DATASETS=${DATASETS:-../shared/datasets}
# torch 2.13.0's CUDA wheel (the CPU pin elsewhere) asks for nvidia-nccl-cu13 2.29.7, which the package index
# reachable here lacks; 2.14.1 resolves. Override with EARL_CUDA_TORCH where the index has 2.13.0's.
TORCH_CUDA=${EARL_CUDA_TORCH:-2.14.1}
FAISS_GPU=${EARL_FAISS_GPU:-1.15.1}
# The wheelhouse (~5 GB), the build stage (~7 GB) and the image (~6 GB) at once.
NEED_GB=${EARL_CUDA_IMAGE_NEED_GB:-20} NEED_GB_VAR=EARL_CUDA_IMAGE_NEED_GB
export DOCKER_BUILDKIT=0  # the classic builder, as make compose-test uses
mkdir -p "$WORK"
# shellcheck source=docker/docker-lib.sh
source docker/docker-lib.sh

# Bookworm's Python is 3.11 (3.11.2, older than most hosts': redis then also wants async-timeout).
fill_wheelhouse() {
  local stamp="$WORK/wheels.stamp" want
  want=$(cat pyproject.toml <(echo "$TORCH_CUDA $FAISS_GPU") | sha256sum | cut -c1-64)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && ls "$WORK"/wheels/torch-"$TORCH_CUDA"-*.whl >/dev/null 2>&1; then
    say "wheelhouse $WORK/wheels/ is up to date"
    return
  fi
  python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || { say "the wheelhouse needs the host's python3 to be 3.11, as in the image"; return 1; }
  say "filling $WORK/wheels/ (pip download from PyPI: torch==$TORCH_CUDA, CUDA build; faiss-gpu==$FAISS_GPU)"
  # --isolated: this machine's pip settings point torch at a local CPU wheel and cap its version.
  python3 -m pip download --isolated -q --index-url "${EARL_CUDA_INDEX:-https://pypi.org/simple}" \
    --cert /etc/ssl/certs/ca-certificates.crt --timeout 180 -d "$WORK/wheels" "torch==$TORCH_CUDA" \
    "faiss-gpu==$FAISS_GPU" '.[train]' 'redis>=5.0' 'setuptools>=68' 'async-timeout>=4.0.3' \
    >"$WORK/wheels.log" 2>&1 || { tail -n 20 "$WORK/wheels.log" >&2; return 1; }
  echo "$want" >"$stamp"
}

# What the Dockerfile copies, with the CUDA wheelhouse as its docker/wheels/ (hard links: no copy of 5 GB).
make_context() {
  local ctx="$WORK/context"
  rm -rf "$ctx"
  mkdir -p "$ctx/docker"
  cp pyproject.toml README.md "$ctx/"
  cp -r earl_service "$ctx/"
  find "$ctx/earl_service" -name __pycache__ -prune -exec rm -rf {} +
  cp docker/worker.Dockerfile docker/install-python.sh docker/pip-install.sh "$ctx/docker/"
  cp -al "$WORK/wheels" "$ctx/docker/wheels"
}

build_image() {
  say "building $IMAGE (log: $WORK/build.log)"
  docker build --network host -f "$WORK/context/docker/worker.Dockerfile" -t "$IMAGE" \
    --build-arg BASE_IMAGE="$EARL_TEST_BASE_IMAGE" --build-arg DEVICE=cuda --build-arg TORCH_CUDA="$TORCH_CUDA" \
    --build-arg FAISS_GPU="$FAISS_GPU" "$WORK/context" >"$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log" >&2; return 1; }
}

# Inside the image, without network: the libraries' builds, then a short CPU training of CoDEx-S.
smoke() {
  say "smoke test: imports, then earl train --device cpu inside $IMAGE (log: $WORK/smoke.log)"
  local data
  data=$(cd "$DATASETS/codex-s" && pwd)
  {
    docker run --rm --network none "$IMAGE" python -c '
import json, os, faiss, torch
from earl_service.model import kernels
kernels.configure(march=os.environ["EARL_KERNEL_MARCH"])  # as `earl worker` does: the build made in the image
print("SMOKE " + json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda,
      "cudnn": torch.backends.cudnn.version(), "cuda_available": torch.cuda.is_available(),
      "faiss": faiss.__version__, "faiss_gpu_classes": hasattr(faiss, "StandardGpuResources"),
      "faiss_gpus": faiss.get_num_gpus(), "kernel": kernels.extension_available()}))'
    docker run --rm --network none -v "$data:/in:ro" "$IMAGE" sh -c \
      'earl train /in --out /data/run --device cpu --threads 2 --steps 30 --dim 32 --eval-every 0 --no-progress \
         --no-labels && ls -l /data/run/bundle.safetensors'
  } >"$WORK/smoke.log" 2>&1 || { tail -n 30 "$WORK/smoke.log" >&2; return 1; }
}

write_results() {
  python3 docker/cuda_image_results.py --image "$IMAGE" --base "$EARL_TEST_BASE_IMAGE" --smoke "$WORK/smoke.log" \
    --steps "${STEPS[@]/ /=}" --out bench/results/cuda_image
}

trap 'stop_dockerd' EXIT
timed install_tools install_tools
timed start_dockerd start_dockerd
check_disk
timed base_image build_base_image
timed wheelhouse fill_wheelhouse
timed context make_context
timed build build_image
timed smoke smoke
write_results
say "done: $IMAGE; bench/results/cuda_image.md"
