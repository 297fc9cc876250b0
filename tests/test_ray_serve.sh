#!/usr/bin/env bash
# examples/ray_serve on a local Ray instance (tests/test_ray_serve.py):
# two CPU replicas, concurrent requests, loopback only. Needs ray[serve]
# in the test virtual environment (scripts/install-deps.sh); skipped (77)
# without it, or with a sanitizer build's library.
# usage: test_ray_serve.sh SOURCE_DIR LIBBITNET BITNET
set -u
src=${1:?usage: test_ray_serve.sh SOURCE_DIR LIBBITNET BITNET}
lib=${2:?}
cli=${3:?}
venv=${BITNET_TEST_VENV:-$HOME/.cache/bitnet/test-venv}
py="$venv/bin/python"
"$py" -c 'import ray.serve' 2>/dev/null ||
    { echo "SKIP: no ray[serve] in $venv (scripts/install-deps.sh installs it)"; exit 77; }
grep -q __asan_init "$lib" &&
    { echo "SKIP: $lib is built with AddressSanitizer (the other tests cover it there)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset BITNET_DEVICE BITNET_MODEL
"$cli" run -p "And it came to pass" -n 24 --temp 0 >"$tmp/want.txt" 2>/dev/null
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cd "$tmp" || exit 1
BITNET_LIBRARY="$lib" PYTHONPATH="$src/python" RAY_TMPDIR="$tmp" \
    timeout 500 "$py" "$src/tests/test_ray_serve.py" "$src" "$tmp/want.txt" "$port"
