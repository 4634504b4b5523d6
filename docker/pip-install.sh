#!/bin/sh
# pip install "$@" from the wheelhouse when the build context brought one (docker/wheels/ -> /wheels), else from
# the package index. Offline builds (make compose-test) fill docker/wheels/ on the host first.
set -eu
if ls /wheels/*.whl >/dev/null 2>&1; then
  exec pip install --no-cache-dir --no-index --find-links /wheels "$@"
fi
exec pip install --no-cache-dir "$@"
