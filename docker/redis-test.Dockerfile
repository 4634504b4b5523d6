# Redis for make compose-test: Debian's redis-server on the local base image, so no image registry is needed.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
VOLUME /data
CMD ["redis-server", "--appendonly", "yes", "--dir", "/data"]
