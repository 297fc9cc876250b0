#!/usr/bin/env bash
# `cmake --install` puts the header, both libraries, the pkg-config file,
# the CLI and the default model under a prefix; the CLI finds the model
# there and a program built from the libraries alone runs.
# usage: test_install.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: test_install.sh BUILD_DIR}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null

fail() { echo "FAIL: $*"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name bitnet.pc | head -1)")/..
[ -f "$prefix/include/bitnet.h" ] || fail "bitnet.h not installed"
[ -f "$prefix/include/bitnet_version.h" ] || fail "bitnet_version.h not installed"
[ -x "$prefix/bin/bitnet" ] || fail "bitnet CLI not installed"
[ -f "$libdir/libbitnet.a" ] || fail "static library not installed"
ls "$libdir"/libbitnet.so* >/dev/null 2>&1 || fail "shared library not installed"
"$prefix/bin/bitnet" --version | grep -q '^bitnet ' || fail "installed CLI does not run"
# The default model is installed and the installed CLI finds it there.
model="$(realpath "$prefix")/share/bitnet/models/bitnet-kjv-7m/bitnet-kjv-7m-i2_s.gguf"
[ -f "$model" ] || fail "default model not installed"
"$prefix/bin/bitnet" run -p "And it came to pass" -n 4 --temp 0 --device cpu --verbose \
    2>"$prefix/run.err" >/dev/null || fail "installed CLI cannot run the default model"
grep -qF "$model" "$prefix/run.err" || fail "installed CLI does not use the installed model"

cat >"$prefix/hello.c" <<'C'
#include <bitnet.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    bn_config cfg;
    bn_config_defaults(&cfg);
    const bn_cpu_features *f = bn_cpu_features_get();
    printf("bitnet %s on %s\n", bn_version(), f->arch);
    return strcmp(bn_version(), BITNET_VERSION_STRING) != 0;
}
C
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc=${CC:-cc}
# Static: the archive itself plus its private dependencies (pthread, dl,
# m, and the static CUDA runtime in CUDA builds) from pkg-config --static.
private_libs=$(pkg-config --libs --static bitnet | sed 's/-lbitnet//')
$cc -std=c11 "$prefix/hello.c" -o "$prefix/hello_static" $(pkg-config --cflags bitnet) \
    "$libdir/libbitnet.a" $private_libs || fail "cannot link against the static library"
"$prefix/hello_static" || fail "static program failed"
# Shared.
$cc -std=c11 "$prefix/hello.c" -o "$prefix/hello_shared" $(pkg-config --cflags --libs bitnet) ||
    fail "cannot link against the shared library"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/hello_shared" || fail "shared program failed"
# The Python package on the installed library: the shipped model comes
# with it (python/README.md's install). Not for a sanitizer build's
# library, which a plain Python cannot load.
src=$(cd "$(dirname "$0")/.." && pwd)
if ! grep -q __asan_init "$libdir/libbitnet.so"; then
    PYTHONPATH="$src/python" BITNET_LIBRARY="$libdir/libbitnet.so" python3 -c '
import sys, bitnet
with bitnet.Model(device="cpu") as m:
    assert m.info["path"] == sys.argv[1], m.info["path"]
    assert m.generate("And it came to pass", max_tokens=4, temperature=0)
' "$model" || fail "the Python package cannot use the installed library and model"
fi
echo "ok: install layout, default model, pkg-config, static and shared linking, Python"
