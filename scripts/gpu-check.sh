#!/usr/bin/env bash
# Runs on the GPU machine: builds a snapshot of the tree (a tar of a commit,
# or the tree itself), then the gpu-labelled tests, the CPU suite, the CUDA
# provider through the generic kernel test, `bitnet devices`, the CUDA
# kernel benchmark and the GPU end-to-end benchmark. Logs go to $OUT (or
# ./gpu-out).
#
# usage: scripts/gpu-check.sh [SNAPSHOT.tar] [--deps PREFIX] [--sanitize] [--no-bench] [--no-tests]
#                             [--label L] [--sanitize-only T1,T2] [--all-kernels]
#   --deps PREFIX: where cJSON and PCRE2 headers/libraries are (a machine
#   without Debian's -dev packages gets them carried in); with microhttpd.h
#   and libmicrohttpd (and the libraries it loads: gnutls and its chain)
#   there too, `bitnet serve` is built.
#   --label L: run only the ctest tests labelled L (e.g. gpu).
#   --sanitize-only: the sanitizers over these gpu tests only.
#   --all-kernels: the kernel benchmark times every GEMM kernel of the table,
#   not only the one it picks (bench kernels --kernel all).
# environment: SAN_JOBS (sanitizer runs at a time: 8, or 6 a GPU on a host
#   with several, the runs spread over its GPUs), SAN_TIMEOUT (seconds
#   per run, 600), SAN_PARTS (processes for racecheck of test_cuda_kernels, 8),
#   SAN_TOOLS (the compute-sanitizer tools to run, "memcheck racecheck").
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
src=$PWD
sanitize=0
bench=1
tests=1
deps=""
label=""
sanitize_only=""
all_kernels=""
while [ $# -gt 0 ]; do
    a=$1
    shift
    case "$a" in
    --deps) deps=$(cd "$1" && pwd) && shift ;;
    --sanitize) sanitize=1 ;;
    --no-bench) bench=0 ;;
    --no-tests) tests=0 ;;
    --label) label=$1 && shift ;;
    --sanitize-only) sanitize=1 && sanitize_only=$1 && shift ;;
    --all-kernels) all_kernels="--kernel all" ;;
    *.tar) src=$(mktemp -d) && tar -xf "$a" -C "$src" ;;
    esac
done
if [ -n "$deps" ]; then
    export LD_LIBRARY_PATH="$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
build=$src/build-gpu
jobs=$(nproc)
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    cmake -S "$src" -B "$build" -DCUDA_ARCH=sm_90 -DCMAKE_BUILD_TYPE=Release \
        ${deps:+-DBITNET_DEPS_PREFIX="$deps"} >/dev/null &&
        cmake --build "$build" -j"$jobs" 2>&1 | grep -E "warning|error|Error" | head -40
} 2>&1 | tee "$out/build.log"
[ -x "$build/bitnet" ] || { echo "build failed"; exit 1; }

if [ $tests -eq 1 ]; then
    "$build/bitnet" devices 2>&1 | tee "$out/devices.txt"
    "$build/bitnet" devices --json | python3 -m json.tool >/dev/null && echo "devices --json: valid JSON"
    ctest --test-dir "$build" --output-on-failure -j4 ${label:+-L "$label"} 2>&1 |
        tee "$out/ctest.log" | tail -25
    echo "== test_kernels with BITNET_KERNEL=cuda"
    BITNET_KERNEL=cuda "$build/tests/test_kernels" 2>&1 | tail -3 | tee -a "$out/ctest.log"
fi
if [ $sanitize -eq 1 ]; then
    # Every gpu-labelled test under memcheck and racecheck, in quick mode
    # (BN_TEST_QUICK=1) where a test has one, with the command line ctest
    # runs (arguments included), SAN_JOBS runs at a time (default 8), each
    # within SAN_TIMEOUT seconds (default 600; a timeout is reported as
    # such, not as a pass). CUDA API errors are not counted: several tests
    # provoke them on purpose (impossible allocations, bad PTX).
    ctest --test-dir "$build" -N -L gpu --show-only=json-v1 >"$out/gpu-tests.json"
    # Under racecheck the longest tests take longer than one run may: they
    # run as several processes with BN_TEST_PART=i/n (and one seed), which
    # together check what one run does: test_cuda_kernels as SAN_PARTS
    # (default 8), test_cuda_backend as 40 (its quick mode's units: four
    # per fixture, one per encoding and other check, five per sampling
    # backend and the engine's sampled run; a sampling unit takes ~3-5 min
    # alone on an H200 and far longer beside four others),
    # test_default_model_cuda as 5 (one per greedy prompt), test_cuda_sample
    # as 6 (a unit is a vocabulary's checks, a candidate-list size or the
    # graph).
    python3 - "$out/gpu-tests.json" "$sanitize_only" "${SAN_PARTS:-8}" \
        "${SAN_TOOLS:-memcheck racecheck}" >"$out/sanitize-runs.txt" <<'PY'
import json, random, shlex, sys
only = [t for t in sys.argv[2].split(",") if t]
parts = int(sys.argv[3])
tools = sys.argv[4].split()
unknown = [t for t in tools if t not in ("memcheck", "racecheck")]
if unknown or not tools:
    sys.exit(f"SAN_TOOLS: expected memcheck and/or racecheck, got {sys.argv[4]!r}")
seed = random.randrange(1, 2**48)
for t in json.load(open(sys.argv[1]))["tests"]:
    if only and t["name"] not in only:
        continue
    command = " ".join(shlex.quote(c) for c in t["command"])
    for tool in tools:
        n = {"test_cuda_kernels": parts, "test_cuda_backend": 40,
             "test_default_model_cuda": 5, "test_cuda_sample": 6}.get(t["name"], 1)
        if tool == "racecheck" and n > 1:
            for i in range(n):
                print(tool, f"{t['name']}.part{i}", f"BN_TEST_PART={i}/{n},BN_TEST_SEED={seed}",
                      command)
        else:
            print(tool, t["name"], "-", command)
PY
    # On a host with several GPUs each run gets one, by its xargs slot
    # (CUDA_VISIBLE_DEVICES, unless the caller set it).
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$gpus" -ge 1 ] || gpus=1
    [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && gpus=1
    run_sanitizer() { # tool name env(VAR=value,... or -) command...
        local tool=$1 name=$2 vars=$3
        shift 3
        local log="$out/sanitize-$tool-$name.log"
        [ "$vars" = - ] && vars=""
        [ "$gpus" -gt 1 ] && vars="$vars${vars:+,}CUDA_VISIBLE_DEVICES=$((SAN_SLOT % gpus))"
        env ${vars//,/ } BN_TEST_QUICK=1 timeout "${SAN_TIMEOUT:-600}" compute-sanitizer --tool "$tool" \
            --report-api-errors no --error-exitcode 9 "$@" >"$log" 2>&1
        local rc=$?
        local summary
        summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
        [ $rc -eq 124 ] && summary="timed out after ${SAN_TIMEOUT:-600} s (no verdict)"
        echo "sanitize $tool $name: exit $rc ${summary#========= }"
    }
    export -f run_sanitizer
    export out SAN_TIMEOUT gpus
    xargs -P "${SAN_JOBS:-$((gpus > 1 ? 6 * gpus : 8))}" --process-slot-var=SAN_SLOT -L 1 \
        bash -c 'run_sanitizer "$@"' _ <"$out/sanitize-runs.txt" |
        sort | tee -a "$out/sanitize.log"
fi
if [ $bench -eq 1 ]; then
    "$build/bitnet" bench kernels --device cuda $all_kernels 2>&1 | tee "$out/bench_cuda.md"
    # The whole model on the GPU: prefill/decode tok/s, the step split by
    # kernel, memory and the byte floor (docs/PERFORMANCE.md).
    "$build/bitnet" bench e2e --shape 2b4t --device cuda 2>&1 | tee "$out/bench_e2e.md"
fi
