#!/usr/bin/env bash
# make compose-test: build the images from a local Debian base and a wheelhouse, then run the compose stack end to
# end on 127.0.0.1 (docker/compose_scenario.py). Needs no image registry and no package index inside the builds.
#   1. apt-get installs docker.io, debootstrap and docker-compose where missing
#   2. starts dockerd (no bridge, no iptables) where none answers; where it cannot start, says so and exits 0
#   3. checks that docker's data root has room for the images (NEED_GB; SKIPPED with the figures where not)
#   4. builds the base image (debootstrap --variant=minbase bookworm + docker import) where it is absent
#   5. fills docker/wheels/ on the host (pip download: the project's dependencies, torch 2.13.0 CPU)
#   6. builds the Redis, API and CPU worker images through docker/compose.test.yml (host networking)
#   7. runs the scenario; the stack is taken down with its volumes (down -v) however it ends
# Figures go to bench/results/compose_test.{json,md}; logs to .compose-test/.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=.compose-test
PROJECT=earl-compose-test
MIRROR=${EARL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export EARL_TEST_BASE_IMAGE=${EARL_TEST_BASE_IMAGE:-earl-base:bookworm}
export EARL_TEST_API_PORT=${EARL_TEST_API_PORT:-18090}
export EARL_TEST_REDIS_PORT=${EARL_TEST_REDIS_PORT:-16390}
# The classic builder, through docker-compose's own client: the same on any docker version, no buildx needed.
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
COMPOSE="docker-compose -p $PROJECT -f docker-compose.yml -f docker/compose.test.yml"
LOG_NAME=compose-test
# The base, API and worker images with their build layers take ~5 GB, the wheelhouse ~1 GB (measured on a fresh
# machine).
NEED_GB=${EARL_COMPOSE_TEST_NEED_GB:-8} NEED_GB_VAR=EARL_COMPOSE_TEST_NEED_GB
STACK_UP=0
mkdir -p "$WORK"
# shellcheck source=docker/docker-lib.sh
source docker/docker-lib.sh

# The images' Python is Debian bookworm's 3.11: the host's pip must pick wheels for the same version. Its patch
# release (3.11.2) is older than most hosts': redis then also wants async-timeout, which a newer 3.11 skips.
fill_wheelhouse() {
  local stamp="$WORK/wheels.stamp" want
  want=$(sha256sum pyproject.toml | cut -c1-64)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && ls docker/wheels/torch-2.13.0*.whl >/dev/null 2>&1; then
    say "wheelhouse docker/wheels/ is up to date with pyproject.toml"
    return
  fi
  python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || { say "the wheelhouse needs the host's python3 to be 3.11, as in the images"; return 1; }
  say "filling docker/wheels/ (pip download; torch==2.13.0 is the CPU build)"
  python3 -m pip download -q --disable-pip-version-check -d docker/wheels torch==2.13.0 '.[serve]' 'setuptools>=68' \
    'async-timeout>=4.0.3' \
    >"$WORK/wheels.log" 2>&1 || { tail -n 20 "$WORK/wheels.log" >&2; return 1; }
  echo "$want" >"$stamp"
}

build_service() {
  say "building $1 (log: $WORK/build-$1.log)"
  $COMPOSE build "$1" >"$WORK/build-$1.log" 2>&1 || { tail -n 30 "$WORK/build-$1.log" >&2; return 1; }
}

teardown() {
  local status=$?
  if [ "$STACK_UP" -eq 1 ]; then
    if [ "$status" -ne 0 ]; then
      say "failed; the services' last log lines:"
      timeout 60 $COMPOSE logs --no-color --tail 40 2>&1 | tail -n 120 || true
    fi
    say "tearing the stack down (down -v)"
    timeout 180 $COMPOSE down -v --remove-orphans >"$WORK/down.log" 2>&1 || say "down -v failed: $WORK/down.log"
  fi
  stop_dockerd
  exit "$status"
}

write_setup() {
  local out="$WORK/setup.json" first=1
  {
    echo '{"seconds": {'
    for step in "${STEPS[@]}"; do
      [ $first -eq 1 ] || echo ','
      first=0
      printf '"%s": %s' ${step}
    done
    echo '}, "image_bytes": {'
    first=1
    for image in "$EARL_TEST_BASE_IMAGE" "${PROJECT}_api" "${PROJECT}_worker-cpu" earl-compose-test-redis; do
      [ $first -eq 1 ] || echo ','
      first=0
      printf '"%s": %s' "$image" "$(docker image inspect -f '{{.Size}}' "$image")"
    done
    echo '}}'
  } >"$out"
}

trap teardown EXIT
timed install_tools install_tools
timed start_dockerd start_dockerd
check_disk
timed base_image build_base_image
timed wheelhouse fill_wheelhouse
STACK_UP=1  # from here on a failure may leave containers: the trap takes them down
timed build_redis build_service redis
timed build_api build_service api
timed build_worker_cpu build_service worker-cpu
write_setup
EARL_API_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
export EARL_API_TOKEN
python3 docker/compose_scenario.py --compose "$COMPOSE" --api "http://127.0.0.1:$EARL_TEST_API_PORT" \
  --worker-image "${PROJECT}_worker-cpu" --setup "$WORK/setup.json"
