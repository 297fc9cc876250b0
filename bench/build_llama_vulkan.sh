#!/usr/bin/env bash
# Builds the Vulkan peer of bench/vulkan_2b4t.sh: llama.cpp's llama-bench with -DGGML_VULKAN=ON,
# from the llama.cpp tree that llama-cpp-python 0.3.36's source package vendors (commit 0c1e570).
#
# Its Vulkan code needs headers of 1.3.261 or later and its cooperative-matrix shaders a glslc of
# glslang 13 or later; Debian 12 has 1.3.239 and glslang 11.13. So this takes Debian 13's
# libvulkan-dev (headers 1.4.309) and glslc (shaderc 2025.2), unpacked into WORK without
# installing them; glslc runs through Debian 13's own C library, unpacked beside it. The binary
# links the system's Vulkan loader and runs wherever bitnet's Vulkan backend does.
#
# usage: bench/build_llama_vulkan.sh      (network: PyPI and deb.debian.org; ~10 min on 2 cores)
# WORK (default /tmp/llama-vulkan) ends with bin/llama-bench; its path is the last line printed.
set -eu
WORK=${WORK:-/tmp/llama-vulkan}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$WORK"
cd "$WORK"

# The llama.cpp source.
if [ ! -d src ]; then
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d dl >/dev/null
    mkdir -p unpack && tar xzf dl/llama_cpp_python-0.3.36.tar.gz -C unpack
    mv unpack/llama_cpp_python-0.3.36/vendor/llama.cpp src
fi

# Debian 13's Vulkan headers, glslc and the C and C++ libraries glslc needs.
if [ ! -x debian13/glslc ]; then
    mkdir -p debian13/lists debian13/archives/partial debian13/debs debian13/root
    echo "deb http://deb.debian.org/debian trixie main" >debian13/sources.list
    APT="-o Dir::Etc::SourceList=$WORK/debian13/sources.list -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists=$WORK/debian13/lists -o Dir::Cache::Archives=$WORK/debian13/archives"
    # shellcheck disable=SC2086
    apt-get $APT update >/dev/null
    # shellcheck disable=SC2086
    (cd debian13/debs && apt-get $APT download libvulkan-dev glslc libshaderc1 libc6 libstdc++6 \
        libgcc-s1 >/dev/null 2>&1)
    for deb in debian13/debs/*.deb; do dpkg -x "$deb" debian13/root; done
    R=$WORK/debian13/root
    cat >debian13/glslc <<EOF
#!/bin/sh
exec $R/usr/lib64/ld-linux-x86-64.so.2 --library-path $R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu $R/usr/bin/glslc "\$@"
EOF
    chmod +x debian13/glslc
fi
debian13/glslc --version | head -1 >&2

cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DVulkan_INCLUDE_DIR="$WORK/debian13/root/usr/include" \
    -DVulkan_GLSLC_EXECUTABLE="$WORK/debian13/glslc" >build.log 2>&1
grep -E "supported by glslc" build.log >&2 || true
cmake --build build --target llama-bench -j "$JOBS" >>build.log 2>&1
mkdir -p bin && cp build/bin/llama-bench bin/
echo "$WORK/bin/llama-bench"
