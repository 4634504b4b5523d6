# The API image (CPU only): FastAPI + uvicorn over the shared artifacts volume. It never trains.
#   docker build -f docker/api.Dockerfile -t earl-api .
FROM python:3.11-slim

# build-essential: the fused RotatE C++ kernel (earl_service/kernels) compiles at first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# torch first, from the CPU index: `.[serve]` then finds torch==2.13.0 satisfied and pulls no CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml ./
COPY earl_service ./earl_service
COPY api ./api
RUN pip install --no-cache-dir ".[serve]"

ENV EARL_HOME=/data \
    PYTHONUNBUFFERED=1
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=3)"
# earl serve, not bare uvicorn: it refuses to open writes beyond loopback without EARL_API_TOKEN
# (or EARL_ALLOW_OPEN_WRITES=true).
CMD ["earl", "serve", "--no-worker", "--host", "0.0.0.0", "--port", "8000"]
