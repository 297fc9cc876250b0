#!/usr/bin/env bash
# Cross-builds this source tree for aarch64 and runs the kernel tests under
# qemu-user, so the NEON providers ("neon", "neondot") are checked against
# the scalar reference, bit for bit, on an x86 machine.
#
#   test_neon_qemu.sh SOURCE_DIR BUILD_DIR
#
# The cross build lives in BUILD_DIR/aarch64 and is reused by later runs.
# test_kernels runs four times: with the default selection (qemu's default
# CPU has SDOT, so that must be "neondot"), with BITNET_KERNEL=neon and
# =neondot, and on a CPU without SDOT (Cortex-A57: "neon" must be chosen,
# and nothing outside the dotprod file may use ARMv8.2 instructions).
# Exit 0: passed; 77: skipped (cross compiler or qemu missing); 1: failed.
set -uo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
    exit 1
fi
src=$(cd "$1" && pwd) || exit 1
cross=$2/aarch64
triple=aarch64-linux-gnu
sysroot=/usr/$triple
qemu="qemu-aarch64"

missing=()
command -v "$triple-gcc" >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
[ -e "$sysroot/include/stdio.h" ] || missing+=(libc6-dev-arm64-cross)
command -v "$qemu" >/dev/null 2>&1 || missing+=(qemu-user)
if [ ${#missing[@]} -ne 0 ]; then
    echo "SKIP: the aarch64 cross build needs ${missing[*]}:" \
         "apt-get install ${missing[*]} (or run scripts/install-deps.sh)"
    exit 77
fi

fail() {
    echo "test_neon_qemu: FAIL: $*" >&2
    exit 1
}

started=$(date +%s)
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$cross" || fail "cannot create $cross"

# Host compiler flags (say -march=native) would break the cross compiler.
log=$cross/test_neon_qemu.log
echo "== configure $cross"
if ! env -u CFLAGS -u CPPFLAGS -u LDFLAGS \
    cmake -S "$src" -B "$cross" \
        -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchain-aarch64-linux-gnu.cmake" \
        -DBITNET_CUDA=OFF -DBITNET_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release >"$log" 2>&1; then
    cat "$log" >&2
    fail "cross configure failed"
fi

# Only the tests that exercise the kernels: test_kernels, plus
# test_kernel_edges and every test_quant_* target this tree defines.
mapfile -t targets < <(cmake --build "$cross" --target help 2>/dev/null |
    grep -oE '\btest_(kernels|kernel_edges|quant_[A-Za-z0-9_]+)\b' | sort -u)
printf '%s\n' "${targets[@]}" | grep -qx test_kernels || fail "no test_kernels target in $src"
echo "== build ${targets[*]} (-j$jobs)"
if ! cmake --build "$cross" -j "$jobs" --target "${targets[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    fail "cross build failed"
fi
# Compiler warnings (only from the files rebuilt this time) are shown.
grep -E 'warning:' "$log" | sed 's/^/  cross build: /'

# Runs test_kernels under qemu with the given variables (and no other
# BITNET_KERNEL or QEMU_CPU) and checks which provider it selected.
run_kernels() {
    local want=$1
    shift
    echo "== test_kernels ${*:-(default selection)}"
    local out rc
    out=$(env -u BITNET_KERNEL -u QEMU_CPU "$@" "$qemu" -L "$sysroot" \
        "$cross/tests/test_kernels" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(providers:|ok:|FAILED|FAIL)' | head -20
    [ $rc -eq 0 ] || fail "test_kernels ${*:-} exited with $rc"
    local selected
    selected=$(printf '%s\n' "$out" | sed -n 's/^providers: .*; selected \(.*\)$/\1/p')
    [ "$selected" = "$want" ] || fail "test_kernels ${*:-} selected '$selected', expected '$want'"
}

run_kernels neondot
run_kernels neon BITNET_KERNEL=neon
run_kernels neondot BITNET_KERNEL=neondot
run_kernels neon QEMU_CPU=cortex-a57

# The rest through ctest, which knows their arguments and runs them under
# the toolchain file's emulator.
others=()
for t in "${targets[@]}"; do
    [ "$t" = test_kernels ] || others+=("$t")
done
if [ ${#others[@]} -ne 0 ]; then
    regex="^($(IFS='|'; echo "${others[*]}"))\$"
    echo "== ctest ${others[*]}"
    env -u BITNET_KERNEL -u QEMU_CPU ctest --test-dir "$cross" -R "$regex" --output-on-failure --no-tests=error ||
        fail "aarch64 tests failed: ${others[*]}"
fi

echo "test_neon_qemu: passed in $(( $(date +%s) - started )) s"
