# The API image (CPU only): FastAPI + uvicorn over the shared artifacts volume. It never trains, so it needs no
# C++ kernel and no compiler. Two stages: the venv is built with the wheels at hand, the runtime copies only it.
#   docker build -f docker/api.Dockerfile -t earl-api .
#   docker build -f docker/api.Dockerfile --build-arg BASE_IMAGE=earl-base:bookworm .   (offline: docker/wheels/)
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
COPY docker/install-python.sh docker/pip-install.sh /opt/earl-setup/
RUN sh /opt/earl-setup/install-python.sh runtime && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/wheels/ /wheels/
# torch first, from the CPU index: `.[serve]` then finds torch==2.13.0 satisfied and pulls no CUDA build.
RUN sh /opt/earl-setup/pip-install.sh torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY earl_service ./earl_service
COPY api ./api
RUN sh /opt/earl-setup/pip-install.sh ".[serve]"

FROM ${BASE_IMAGE}
COPY docker/install-python.sh /opt/earl-setup/
RUN sh /opt/earl-setup/install-python.sh runtime
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    EARL_HOME=/data \
    EARL_PORT=8000 \
    PYTHONUNBUFFERED=1
WORKDIR /data
VOLUME /data
EXPOSE 8000
# EARL_PORT: the port the health check asks; set it with the command's --port (the compose test serves on another).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"EARL_PORT\"]}/healthz', timeout=3)"
# earl serve, not bare uvicorn: it refuses to open writes beyond loopback without EARL_API_TOKEN
# (or EARL_ALLOW_OPEN_WRITES=true).
CMD ["earl", "serve", "--no-worker", "--host", "0.0.0.0", "--port", "8000"]
