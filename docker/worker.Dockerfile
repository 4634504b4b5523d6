# The worker image: claims jobs from the shared store and trains them, on the GPU (DEVICE=cuda, the default) or the
# CPU (DEVICE=cpu). The C++ kernel is compiled here, in the build stage, not at the first job; the runtime stage
# copies the venv and torch's build folder of the kernel, and carries no compiler. The CUDA libraries come with
# PyPI's torch and faiss-gpu wheels; the host's driver, mounted by the NVIDIA Container Toolkit, with the
# capabilities NVIDIA_DRIVER_CAPABILITIES names (set below, as nvidia/cuda bases set it).
#   docker build -f docker/worker.Dockerfile -t earl-worker .       (CUDA; offline from a Debian base: make cuda-image)
#   docker build -f docker/worker.Dockerfile --build-arg DEVICE=cpu .
# No nvidia/cuda base: the CUDA libraries come with the wheels (a CUDA base would add a second, unused set).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG DEVICE=cuda
# The CUDA image's torch and FAISS (make cuda-image passes its wheelhouse's). torch 2.13.0's CUDA wheel, the CPU
# pin elsewhere, asks for an NCCL release that the package index reachable here lacks; 2.14.1 resolves.
ARG TORCH_CUDA=2.14.1
ARG FAISS_GPU=1.15.1
# -march for the kernel: the image may run on other CPUs than the one that builds it, so not `native` by default
# (x86-64-v3: AVX2 and FMA, any x86-64 server CPU since 2013). On arm64 pass e.g. armv8-a.
ARG KERNEL_MARCH=x86-64-v3
ENV DEBIAN_FRONTEND=noninteractive
COPY docker/install-python.sh docker/pip-install.sh /opt/earl-setup/
RUN sh /opt/earl-setup/install-python.sh build && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    TORCH_EXTENSIONS_DIR=/opt/earl-kernels \
    EARL_KERNEL_MARCH=${KERNEL_MARCH}
COPY docker/wheels/ /wheels/
# One FAISS per image: faiss-gpu must replace faiss-cpu, never sit beside it, so not `.[serve]` (faiss-cpu).
#   cuda: PyPI's Linux torch wheel is the CUDA build and brings its own CUDA 13 libraries; faiss-gpu its CUDA 12 ones.
#   cpu:  torch from PyTorch's CPU index (no CUDA libraries); faiss-cpu.
RUN case "$DEVICE" in \
      cuda) if ls /wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then \
              echo "docker/wheels/ holds make compose-test's CPU wheelhouse: build the CUDA image with make" \
                   "cuda-image, or empty docker/wheels/ to install from the package index" >&2; exit 1; fi \
            && sh /opt/earl-setup/pip-install.sh "torch==${TORCH_CUDA}" \
            && sh /opt/earl-setup/pip-install.sh "faiss-gpu==${FAISS_GPU}" ;; \
      cpu) sh /opt/earl-setup/pip-install.sh torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
            && sh /opt/earl-setup/pip-install.sh faiss-cpu==1.15.1 ;; \
      *) echo "DEVICE must be cuda or cpu, not '$DEVICE'" >&2; exit 1 ;; \
    esac
WORKDIR /src
COPY pyproject.toml README.md ./
COPY earl_service ./earl_service
# The worker needs only the library with its train extra, the Redis client and FAISS (above).
RUN sh /opt/earl-setup/pip-install.sh ".[train]" "redis>=5.0"
# Compile the kernel into TORCH_EXTENSIONS_DIR now; fail the build if it cannot be built.
# (`earl worker` passes EARL_KERNEL_MARCH the same way, so it finds this build.)
RUN python -c "import os; from earl_service.model import kernels; kernels.configure(march=os.environ['EARL_KERNEL_MARCH']); \
assert kernels.extension_available(), 'the C++ kernel did not build'"

FROM ${BASE_IMAGE}
ARG KERNEL_MARCH=x86-64-v3
ENV DEBIAN_FRONTEND=noninteractive
COPY docker/install-python.sh /opt/earl-setup/
RUN sh /opt/earl-setup/install-python.sh runtime
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/earl-kernels /opt/earl-kernels
# torch finds the kernel built (ninja has nothing to do); without the ABI check it asks for no compiler either.
ENV PATH=/opt/venv/bin:$PATH \
    TORCH_EXTENSIONS_DIR=/opt/earl-kernels \
    EARL_KERNEL_MARCH=${KERNEL_MARCH} \
    TORCH_DONT_CHECK_COMPILER_ABI=1 \
    EARL_HOME=/data \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /data
VOLUME /data
# SIGTERM checkpoints the running job and puts it back in the queue (allow time: stop_grace_period).
CMD ["earl", "worker", "--threads", "2"]
