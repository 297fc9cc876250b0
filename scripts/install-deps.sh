#!/usr/bin/env bash
# Installs what building and testing bitnet needs on Debian/Ubuntu, and
# nothing when it is all there already. The CUDA toolkit is optional: with
# nvcc on PATH the CUDA backend is built too.
set -euo pipefail

# command -> Debian package
declare -A need=(
    [cc]=build-essential
    [make]=build-essential
    [cmake]=cmake
    [pkg-config]=pkg-config
    [python3]=python3
)
missing=()
for cmd in "${!need[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
# Libraries (cJSON for JSON, PCRE2 for the tokenizer), the aarch64 cross
# build that test_neon_qemu runs under qemu, clang with its sanitizer and
# libFuzzer runtimes for test_sanitizers (Debian 12 names; clang only
# recommends the runtimes, and recommends are not installed), and the
# Vulkan backend's build (headers, glslc) with Mesa's CPU Vulkan driver
# (lavapipe) and the loader for its tests: no command to look for, so ask
# dpkg.
pkg_need=(
    libcjson-dev
    libpcre2-dev
    gcc-aarch64-linux-gnu
    libc6-dev-arm64-cross
    qemu-user
    clang
    libclang-rt-14-dev
    libmicrohttpd-dev
    curl
    python3-venv
    chromium
    chromium-driver
    libvulkan-dev
    glslc
    mesa-vulkan-drivers
    libvulkan1
)
for pkg in "${pkg_need[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: every Debian package needed is installed"
else
    # Unique package names.
    mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "install-deps: installing ${pkgs[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    $sudo apt-get install -y -q --no-install-recommends "${pkgs[@]}"
fi

# From PyPI, in a virtual environment of their own: the official openai
# package, which tests/test_serve_openai.sh talks to `bitnet serve` with,
# selenium, which drives chromium in tests/test_serve_page.sh, pytest with
# setuptools and wheel for the Python package's tests (tests/test_python.sh,
# which builds it without the network), and Ray Serve for
# tests/test_ray_serve.sh (examples/ray_serve).
venv=${BITNET_TEST_VENV:-$HOME/.cache/bitnet/test-venv}
if "$venv/bin/python" -c 'import openai, selenium, pytest, setuptools, wheel, ray.serve' \
    2>/dev/null; then
    echo "install-deps: openai, selenium, pytest and ray are in $venv"
else
    echo "install-deps: installing openai, selenium, pytest and ray into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "openai>=1.0" "selenium>=4.10" "pytest>=7" "setuptools>=61" \
        wheel "ray[serve]>=2.9"
fi
