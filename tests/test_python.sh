#!/usr/bin/env bash
# The Python package (python/): `pip install ./python` into the test
# virtual environment that scripts/install-deps.sh makes, then its pytest
# suite against this build's libbitnet.so and bitnet CLI, importing the
# installed package (not the source tree). Skipped (77) without that
# environment or pytest in it.
# usage: test_python.sh SOURCE_DIR LIBBITNET BITNET
set -u
src=${1:?usage: test_python.sh SOURCE_DIR LIBBITNET BITNET}
lib=${2:?}
cli=${3:?}
venv=${BITNET_TEST_VENV:-$HOME/.cache/bitnet/test-venv}
py="$venv/bin/python"
"$py" -c 'import pytest, setuptools, wheel' 2>/dev/null ||
    { echo "SKIP: no pytest, setuptools or wheel in $venv (scripts/install-deps.sh makes it)"; exit 77; }
# A sanitizer build's library needs its runtime loaded first, which a
# plain Python does not do: the sanitizer run covers the library through
# the other tests.
grep -q __asan_init "$lib" &&
    { echo "SKIP: $lib is built with AddressSanitizer (the other tests cover it there)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A copy of the package's sources, so the build leaves nothing in the tree.
cp -r "$src/python" "$tmp/pkg"
"$py" -m pip install -q --no-build-isolation --force-reinstall --no-deps "$tmp/pkg" ||
    { echo "FAIL: pip install ./python"; exit 1; }
cd "$tmp" || exit 1
unset BITNET_DEVICE BITNET_MODEL
BITNET_LIBRARY="$lib" BN_TEST_CLI="$cli" BN_TEST_TEXT="$src/models/bitnet-kjv-7m/test.txt" \
    BITNET_NUM_THREADS=2 timeout 600 "$py" -m pytest -q -p no:cacheprovider "$tmp/pkg/tests"
