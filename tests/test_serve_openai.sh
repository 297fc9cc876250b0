#!/usr/bin/env bash
# bitnet serve through the official openai Python package
# (tests/test_serve_openai.py), on the shipped model, loopback only. The
# package lives in a virtual environment of its own that
# scripts/install-deps.sh makes (BITNET_TEST_VENV, default
# ~/.cache/bitnet/test-venv); without it, or without the server, the test
# is skipped (77).
# usage: test_serve_openai.sh /path/to/bitnet
set -u
BITNET=${1:?usage: test_serve_openai.sh BITNET}
here=$(cd "$(dirname "$0")" && pwd)
venv=${BITNET_TEST_VENV:-$HOME/.cache/bitnet/test-venv}
py="$venv/bin/python"
. "$here/serve_lib.sh"
serve_require "$BITNET"
"$py" -c 'import openai' 2>/dev/null ||
    { echo "SKIP: no openai package in $venv (scripts/install-deps.sh makes it)"; exit 77; }
serve_one "$BITNET" --parallel 4 --api-key test-key
"$BITNET" run -p "And it came to pass" -n 24 --temp 0 >"$tmp/run.txt" 2>/dev/null
"$py" "$here/test_serve_openai.py" "http://127.0.0.1:$port/v1" test-key "$tmp/run.txt"
rc=$?
status=$rc
serve_stop TERM
[ "$rc" = 0 ] || { echo "FAIL: SIGTERM: exit code $rc"; status=1; }
exit $status
