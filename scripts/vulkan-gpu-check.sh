#!/usr/bin/env bash
# The Vulkan tests and benchmarks on a GPU machine, through its driver's
# Vulkan ICD, from a build made elsewhere: the GPU machine has no glslc (and
# may have no Vulkan loader). Logs go to $OUT (or ./vulkan-out).
#
# Where the tree is built (a machine with glslc and the Vulkan headers):
#   cmake -S . -B build-h200 -DCMAKE_BUILD_TYPE=Release -DCUDA_ARCH=sm_90a -DBITNET_VULKAN=ON
#   cmake --build build-h200 -j --target bitnet test_vulkan_w2a8 test_vulkan_norm \
#       test_vulkan_ops test_vulkan_head_screen test_vulkan_backend
#   scripts/vulkan-gpu-check.sh --fetch-loader .gl   # the loader's packages, amd64
# On the GPU machine, with the tree, the build, .gl and (for a machine without
# Debian's -dev packages' libraries) the --deps prefix of scripts/gpu-check.sh:
#   scripts/vulkan-gpu-check.sh BUILD [--loader .gl] [--deps PREFIX] [--no-bench]
#
#   --loader DIR: unpacks DIR's .deb files into / first (the Vulkan loader
#   and GL dispatch libraries), unless a loader is already installed.
#   --no-bench: the six tests only. Otherwise `bench e2e` on the 2B-4T shape
#   through Vulkan and CUDA in the same run (128 + 256, 1000 + 64, 4000 + 64)
#   and `bench batch` through Vulkan: docs/VULKAN.md, "Speed".
# environment: VK_DRIVER_FILES (the ICD's manifest; NVIDIA's under
#   /usr/local/nvidia when it is there and none is set).
set -uo pipefail
fetch=""
build=""
loader=""
deps=""
bench=1
while [ $# -gt 0 ]; do
    a=$1
    shift
    case "$a" in
    --fetch-loader) fetch=$1 && shift ;;
    --loader) loader=$1 && shift ;;
    --deps) deps=$(cd "$1" && pwd) && shift ;;
    --no-bench) bench=0 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) build=$a ;;
    esac
done

if [ -n "$fetch" ]; then # here: the packages, for the GPU machine's architecture
    mkdir -p "$fetch" /tmp/vulkan-apt/partial || exit 1
    o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/vulkan-apt"
    apt-get $o update >/dev/null &&
        (cd "$fetch" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 \
            libglx0 libgles2 >/dev/null) || { echo "downloading the loader failed"; exit 1; }
    ls "$fetch"
    exit 0
fi
[ -n "$build" ] && [ -x "$build/bitnet" ] || {
    echo "usage: $0 BUILD [--loader DIR] [--deps PREFIX] [--no-bench] (or --fetch-loader DIR)"
    exit 2
}
build=$(cd "$build" && pwd)
out=${OUT:-$PWD/vulkan-out}
mkdir -p "$out"
if [ -n "$loader" ] && ! ldconfig -p | grep -q libvulkan.so.1; then
    for f in "$loader"/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ]; then
    export VK_DRIVER_FILES=$nvidia_icd
fi
if [ -n "$deps" ]; then
    export LD_LIBRARY_PATH="$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
"$build/bitnet" devices 2>&1 | tee "$out/devices.log"

# The six Vulkan tests (each skipped, 77, without a Vulkan device).
data=$PWD/tests/data
model=$PWD/models/bitnet-kjv-7m
failed=0
run_test() { # name command...
    local name=$1
    shift
    timeout 600 "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc $(grep -E '^ok:|FAIL' "$out/$name.log" | head -2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || failed=1
}
t=$build/tests
run_test test_vulkan_w2a8 "$t/test_vulkan_w2a8"
run_test test_vulkan_norm "$t/test_vulkan_norm"
run_test test_vulkan_ops "$t/test_vulkan_ops"
run_test test_vulkan_head_screen "$t/test_vulkan_head_screen"
run_test test_vulkan_backend "$t/test_vulkan_backend" "$data/models" "$model/bitnet-kjv-7m-i2_s.gguf"
run_test test_vulkan_cli tests/test_vulkan_cli.sh "$build/bitnet" "$data/models" "$model"

if [ $bench -eq 1 ]; then
    bench_run() { # name args...
        local name=$1
        shift
        "$build/bitnet" bench e2e --shape 2b4t "$@" --warmup >"$out/$name.log" 2>&1
        echo "$name: $(grep -E '^(prefill|decode)' "$out/$name.log" | cut -c1-72 | tr '\n' '|')"
    }
    for pg in "128 256" "1000 64" "4000 64"; do
        set -- $pg
        bench_run "e2e_vulkan_$1" --device vulkan --prompt "$1" --gen "$2"
        bench_run "e2e_cuda_$1" --device cuda --prompt "$1" --gen "$2"
    done
    "$build/bitnet" bench batch --device vulkan --seqs 1,8,32,64 --prompt 128 --gen 64 \
        >"$out/batch_vulkan.log" 2>&1
    grep -E '^(prefix|- )' "$out/batch_vulkan.log"
fi
exit $failed
