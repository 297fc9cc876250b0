#!/usr/bin/env bash
# The sanitizer build and the fuzzers: files are untrusted input, so the
# readers of GGUF, safetensors, config.json and tokenizer.json and the model
# loader must never crash, leak or hit undefined behaviour.
#
#   test_sanitizers.sh SOURCE_DIR BUILD_DIR
#
# 1. Builds this source tree again in BUILD_DIR/sanitize/build with clang,
#    AddressSanitizer (with LeakSanitizer) and UBSan (any undefined
#    behaviour is fatal), without CUDA, and runs the cpu-labelled tests
#    there, except the ones that are builds of their own (test_neon_qemu,
#    test_sanitizers).
# 2. Builds the libFuzzer targets of fuzz/ in BUILD_DIR/sanitize/fuzz and
#    runs each from its seed corpus (fuzz/corpus/<target>, plus the inputs
#    of fixed bugs in fuzz/crashes/<target>; fuzz/crashes/open is not
#    replayed) for BN_FUZZ_SECONDS (default 45) seconds, as many at once as
#    there are cores: on 2 cores the 7 targets take 4 rounds, 3 minutes.
# Both builds are reused by later runs. Exit 0: passed; 77: skipped (clang
# or its sanitizer runtimes are missing); 1: failed. docs/TESTING.md says
# how to run longer fuzzing sessions.
set -uo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
    exit 1
fi
src=$(cd "$1" && pwd) || exit 1
top=$(mkdir -p "$2/sanitize" && cd "$2/sanitize" && pwd) || exit 1
fuzz_seconds=${BN_FUZZ_SECONDS:-45}
jobs=$(nproc 2>/dev/null || echo 2)
started=$(date +%s)

fail() {
    echo "test_sanitizers: FAIL: $*" >&2
    exit 1
}
case $fuzz_seconds in
'' | *[!0-9]*) fail "BN_FUZZ_SECONDS must be a whole number of seconds, got '$fuzz_seconds'" ;;
esac

# Flags of the sanitizer build (fuzz/CMakeLists.txt uses the same for the
# fuzzers). -fno-sanitize-recover makes UBSan stop at the first
# report instead of printing it and going on (a test would still pass).
sanitize_flags=("-fsanitize=address,undefined" -fno-sanitize-recover=undefined)
cflags_list=("${sanitize_flags[@]}" -fno-omit-frame-pointer)
sanitize=${sanitize_flags[*]} # as one string, for CMake
cflags=${cflags_list[*]}

# ---------------------------------------------------------------------------
# clang and its runtimes: missing ones are a skip, with what to install.
# ---------------------------------------------------------------------------
skip() {
    echo "SKIP: $* (Debian/Ubuntu: apt-get install clang libclang-rt-14-dev," \
         "or run scripts/install-deps.sh)"
    exit 77
}
command -v clang >/dev/null 2>&1 || skip "clang is not installed"
probe=$top/probe
mkdir -p "$probe" || fail "cannot create $probe"
cat >"$probe/clean.c" <<'C'
#include <stdlib.h>
int main(void) { void *volatile p = malloc(16); free(p); return 0; }
C
cat >"$probe/leak.c" <<'C'
#include <stdlib.h>
void *volatile sink;
int main(void) { sink = malloc(16); sink = 0; return 0; }
C
cat >"$probe/fuzz.c" <<'C'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { (void)data; (void)size; return 0; }
C
for p in clean leak; do
    clang "${cflags_list[@]}" -g "$probe/$p.c" -o "$probe/$p" >"$probe/$p.log" 2>&1 ||
        skip "clang cannot link AddressSanitizer/UBSan programs ($(head -1 "$probe/$p.log"))"
done
clang "${cflags_list[@]}" -fsanitize=fuzzer "$probe/fuzz.c" -o "$probe/fuzz" >"$probe/fuzz.log" 2>&1 ||
    skip "clang cannot link libFuzzer targets ($(head -1 "$probe/fuzz.log"))"
# Linked but unable to run is not a missing package: that is a failure.
ASAN_OPTIONS=detect_leaks=0 "$probe/clean" >"$probe/run.log" 2>&1 ||
    fail "an AddressSanitizer program does not run here: $(head -3 "$probe/run.log")"

# LeakSanitizer stops the world through ptrace; where that is forbidden
# (some containers) it dies with "LeakSanitizer has encountered a fatal
# error". Then leaks cannot be checked here: say so and go on without.
lsan=1
if ! ASAN_OPTIONS=detect_leaks=1 "$probe/clean" >"$probe/lsan.log" 2>&1; then
    lsan=0
    echo "WARNING: LeakSanitizer does not work in this environment (ptrace restricted?):" \
         "$(grep -m1 -i 'leak' "$probe/lsan.log")"
    echo "WARNING: running with detect_leaks=0: leaks are NOT checked in this run"
elif ASAN_OPTIONS=detect_leaks=1 "$probe/leak" >"$probe/lsan.log" 2>&1 ||
    ! grep -q 'LeakSanitizer: detected memory leaks' "$probe/lsan.log"; then
    fail "LeakSanitizer runs but misses a deliberate leak: $(head -3 "$probe/lsan.log")"
fi

results=()
failed=0
note() { results+=("$(printf '%-34s %s' "$1" "$2")"); }
bad() {
    note "$1" "FAIL  $2"
    failed=1
}
elapsed() { echo "$(($(date +%s) - $1)) s"; }

# ---------------------------------------------------------------------------
# 1. The cpu tests under AddressSanitizer, LeakSanitizer and UBSan.
# ---------------------------------------------------------------------------
build=$top/build
log=$top/build.log
t0=$(date +%s)
echo "== sanitizer build: $build"
# -O1: readable stack traces at a fraction of -O0's run time. Debug also
# compiles the BITNET_DEBUG paths. A shared library does not carry the
# sanitizer runtime (the executable that loads it does), so libbitnet.so is
# linked with -z undefs, overriding the tree's --no-undefined for this
# build only. Host CFLAGS and friends (gcc-specific ones, say) stay out.
if ! env -u CFLAGS -u CPPFLAGS -u LDFLAGS -u CC \
    cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DBITNET_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DCMAKE_C_FLAGS="$cflags" \
        -DCMAKE_EXE_LINKER_FLAGS="$sanitize" \
        -DCMAKE_SHARED_LINKER_FLAGS="$sanitize -Wl,-z,undefs" >"$log" 2>&1; then
    cat "$log" >&2
    fail "sanitizer configure failed"
fi
if ! cmake --build "$build" -j "$jobs" >"$log" 2>&1; then
    cat "$log" >&2
    fail "sanitizer build failed"
fi
note "sanitizer build" "ok    $(elapsed "$t0")"

# Sanitizer reports go to files as well as making the program fail: test
# scripts that expect a failing exit code (bad arguments, broken files)
# would otherwise take a sanitizer's exit code for the expected one.
reports=$top/reports
rm -rf "$reports"
mkdir -p "$reports" || fail "cannot create $reports"
# GPU detection dlopens the Vulkan and OpenCL loaders, which load whatever
# drivers are installed (Mesa's lavapipe and PoCL bring LLVM along). Those
# keep global state that becomes unreachable when bitnet dlcloses them, and
# LeakSanitizer reports it with no symbols (the library is unmapped by
# then), so it cannot be suppressed by name. Point both loaders at no
# driver: detection still runs through the loaders and reports "none", as
# on a CI machine, which has no drivers at all.
no_icd=$top/no-icd
mkdir -p "$no_icd" || fail "cannot create $no_icd"
san_env=(
    "ASAN_OPTIONS=detect_leaks=$lsan:allocator_may_return_null=1:log_path=$reports/asan"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
    "OCL_ICD_VENDORS=$no_icd"
    "VK_ICD_FILENAMES=$no_icd/none.json"
    "VK_DRIVER_FILES=$no_icd/none.json"
    # test_install links a program against the installed (sanitized)
    # libraries, which needs the sanitizer runtimes at link time.
    "CC=clang $sanitize"
)
# allocator_may_return_null: test_core asks for an impossible allocation on
# purpose and checks that it fails cleanly; by default ASan aborts instead.
excluded='^(test_neon_qemu|test_sanitizers)$'
t0=$(date +%s)
echo "== cpu tests under ASan/LSan/UBSan (detect_leaks=$lsan), excluding test_neon_qemu, test_sanitizers"
env "${san_env[@]}" ctest --test-dir "$build" -L cpu -E "$excluded" -j "$jobs" \
    --output-on-failure --no-tests=error
ctest_rc=$?
# Errors only: with allocator_may_return_null ASan still logs a WARNING for
# each refused allocation.
found=()
for f in "$reports"/*; do
    [ -e "$f" ] && grep -q -E 'ERROR: |runtime error:|SUMMARY: ' "$f" && found+=("$f")
done
if [ ${#found[@]} -ne 0 ]; then
    echo "== sanitizer reports (${#found[@]} files in $reports):"
    for f in "${found[@]}"; do
        echo "--- $f"
        head -60 "$f"
    done
fi
if [ $ctest_rc -ne 0 ]; then
    bad "cpu tests (sanitized)" "ctest exit code $ctest_rc   $(elapsed "$t0")"
elif [ ${#found[@]} -ne 0 ]; then
    bad "cpu tests (sanitized)" "${#found[@]} sanitizer reports   $(elapsed "$t0")"
else
    note "cpu tests (sanitized)" "ok    $(elapsed "$t0")"
fi

# ---------------------------------------------------------------------------
# 2. The fuzzers.
# ---------------------------------------------------------------------------
fbuild=$top/fuzz
t0=$(date +%s)
echo "== fuzz build: $fbuild"
if ! env -u CFLAGS -u CPPFLAGS -u LDFLAGS -u CC \
    cmake -S "$src/fuzz" -B "$fbuild" -DCMAKE_C_COMPILER=clang >"$log" 2>&1; then
    cat "$log" >&2
    fail "fuzz configure failed"
fi
if ! cmake --build "$fbuild" -j "$jobs" >"$log" 2>&1; then
    cat "$log" >&2
    fail "fuzz build failed"
fi
note "fuzz build" "ok    $(elapsed "$t0")"

targets=()
for f in "$src"/fuzz/fuzz_*.c; do
    [ -e "$f" ] && targets+=("$(basename "$f" .c)")
done
[ ${#targets[@]} -ne 0 ] || fail "no fuzz targets in $src/fuzz"
work=$top/fuzz-work
artifacts=$top/fuzz-artifacts
rm -rf "$work" "$artifacts"

# One target: a fresh corpus folder (where libFuzzer adds what it finds)
# plus the committed seeds, read only. -error_exitcode and
# -timeout_exitcode are set because libFuzzer's default (77) is ctest's
# "skipped". An input running over 25 s is a hang; an input of at most a
# few hundred KB that makes the library ask for 512 MB at once, or use 2 GB
# in all, is a bug too.
run_fuzzer() {
    local name=$1 short=${1#fuzz_}
    local dirs=("$work/$short" "$src/fuzz/corpus/$short")
    [ -d "$src/fuzz/crashes/$short" ] && dirs+=("$src/fuzz/crashes/$short")
    mkdir -p "$work/$short" "$artifacts/$short"
    ASAN_OPTIONS=detect_leaks=$lsan UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$fbuild/$name" -max_total_time="$fuzz_seconds" -timeout=25 -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -error_exitcode=1 -timeout_exitcode=1 -detect_leaks="$lsan" \
        -print_final_stats=1 -artifact_prefix="$artifacts/$short/" "${dirs[@]}" \
        >"$work/$short.log" 2>&1
    echo $? >"$work/$short.rc"
}

t0=$(date +%s)
echo "== fuzzing ${#targets[@]} targets for $fuzz_seconds s each, $jobs at a time"
running=0
for name in "${targets[@]}"; do
    if [ $running -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    run_fuzzer "$name" &
    running=$((running + 1))
done
wait
for name in "${targets[@]}"; do
    short=${name#fuzz_}
    rc=$(cat "$work/$short.rc" 2>/dev/null || echo "no exit code")
    flog=$work/$short.log
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$flog" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+' "$flog" | tail -1)
    if [ "$rc" = 0 ]; then
        note "$name" "ok    ${runs:-?} runs, ${cov:-cov: ?}"
    else
        echo "== $name FAILED (exit code $rc); log $flog:"
        grep -v -E '^#[0-9]+' "$flog" | tail -80
        for f in "$artifacts/$short"/*; do
            [ -e "$f" ] && echo "   reproducer: $f"
        done
        echo "   replay: $fbuild/$name REPRODUCER"
        bad "$name" "exit code $rc, ${runs:-?} runs; see $flog"
    fi
done
note "fuzzing (wall)" "$(elapsed "$t0")"

echo
echo "test_sanitizers summary (LeakSanitizer $([ $lsan -eq 1 ] && echo on || echo OFF)):"
printf '  %s\n' "${results[@]}"
echo "test_sanitizers: $([ $failed -eq 0 ] && echo passed || echo FAILED) in $(elapsed "$started")"
exit $failed
