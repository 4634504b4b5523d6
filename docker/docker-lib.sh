#!/usr/bin/env bash
# Shared by the offline image builds (docker/compose_test.sh, docker/cuda_image.sh): source it after setting
#   WORK (logs), MIRROR (Debian mirror), EARL_TEST_BASE_IMAGE (the base image's tag), NEED_GB (free disk wanted)
#   and NEED_GB_VAR (the variable that sets it), LOG_NAME (the prefix of every message).
# It defines say, skip, timed, install_tools, start_dockerd, stop_dockerd, check_disk and build_base_image.
SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo -n"
DOCKERD_PID=""
STEPS=()  # "name seconds" for the results file

say() { echo "[$LOG_NAME $(date +%H:%M:%S)] $*"; }

skip() {
  say "SKIPPED: $*"
  exit 0
}

# Run "$@" and record its wall time under the name $1 (the command is the rest).
timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  STEPS+=("$name $((SECONDS - start))")
}

install_tools() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]} with apt-get"
  $SUDO apt-get update -qq || true
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >"$WORK/apt.log" 2>&1 \
    || skip "could not install ${missing[*]} with apt-get (see $WORK/apt.log)"
}

start_dockerd() {
  if docker info >/dev/null 2>&1; then
    say "using the docker daemon that is running"
    return
  fi
  [ "$(id -u)" -eq 0 ] || skip "no docker daemon answers and starting one needs root"
  say "starting dockerd --bridge=none --iptables=false (log: $WORK/dockerd.log)"
  dockerd --bridge=none --iptables=false >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 1
  done
  tail -n 5 "$WORK/dockerd.log" >&2 || true
  skip "dockerd cannot start here (no privileges for containers?); see $WORK/dockerd.log"
}

# A build that fills the disk fails halfway through a layer, so check first and say what is missing.
check_disk() {
  local root free_gb
  root=$(docker info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
  [ -d "$root" ] || root=/
  free_gb=$(df -Pk "$root" | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt "$NEED_GB" ]; then
    skip "docker's data root $root has ${free_gb} GB free; the images need about ${NEED_GB} GB" \
      "(free space, e.g. docker image prune, or set $NEED_GB_VAR)"
  fi
  say "docker's data root $root has ${free_gb} GB free (need ${NEED_GB})"
}

build_base_image() {
  if docker image inspect "$EARL_TEST_BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $EARL_TEST_BASE_IMAGE is there"
    return
  fi
  say "building $EARL_TEST_BASE_IMAGE: debootstrap --variant=minbase bookworm from $MIRROR"
  local root="$WORK/rootfs"
  rm -rf "$root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log" >&2; return 1; }
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$EARL_TEST_BASE_IMAGE" >/dev/null
  rm -rf "$root"
}

# Stop the dockerd that start_dockerd started (none when one was running already).
stop_dockerd() {
  if [ -n "$DOCKERD_PID" ]; then
    kill "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
  fi
}
