#!/bin/sh
# Give an image `python3.11` (with venv); with `build`, also g++ and Python's headers for the C++ kernel.
#   sh install-python.sh runtime|build
# The Dockerfiles' bases differ: python:3.11-slim has Python and its headers, Debian bookworm has python3.11 without
# headers, the CUDA image (Ubuntu 22.04) has no Python. Only what is missing is installed, with apt-get.
set -eu
stage=${1:-runtime}
pkgs=""
if ! command -v python3.11 >/dev/null 2>&1; then
  pkgs="python3.11 python3.11-venv"
fi
if [ "$stage" = build ]; then
  pkgs="$pkgs g++"
  headers='import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
  python3.11 -c "$headers" 2>/dev/null || pkgs="$pkgs python3.11-dev"
fi
if [ -n "$pkgs" ]; then
  apt-get update
  # shellcheck disable=SC2086  # a list of package names
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs
  rm -rf /var/lib/apt/lists/*
fi
