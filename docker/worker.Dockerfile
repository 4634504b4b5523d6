# The worker image (CUDA): claims jobs from the shared store and trains them on the GPU (CPU if none).
#   docker build -f docker/worker.Dockerfile -t earl-worker .
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive
# python3.11-dev + build-essential: the fused RotatE C++ kernel compiles at first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /app
# PyPI's Linux torch wheel is the CUDA build and brings its own CUDA 12 libraries.
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml ./
COPY earl_service ./earl_service
# Not `.[serve]`: that extra brings faiss-cpu, and faiss-gpu must replace it, never sit beside it.
# The worker needs only the library with its train extra, the Redis client and FAISS.
RUN pip install --no-cache-dir ".[train]" "redis>=5.0" "faiss-gpu-cu12>=1.11"

ENV EARL_HOME=/data \
    PYTHONUNBUFFERED=1
VOLUME /data
# SIGTERM checkpoints the running job and puts it back in the queue (allow time: stop_grace_period).
CMD ["earl", "worker", "--threads", "2"]
