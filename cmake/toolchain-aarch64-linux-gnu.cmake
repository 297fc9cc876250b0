# Cross-compiles for 64-bit Arm Linux with Debian's aarch64-linux-gnu-gcc
# (packages gcc-aarch64-linux-gnu and libc6-dev-arm64-cross), and runs what
# it builds under qemu-user: ctest in such a build directory executes the
# tests through CMAKE_CROSSCOMPILING_EMULATOR.
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(BITNET_AARCH64_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${BITNET_AARCH64_TRIPLE}-gcc)

# Debian installs the target's C library and headers here.
set(BITNET_AARCH64_SYSROOT /usr/${BITNET_AARCH64_TRIPLE})
set(CMAKE_FIND_ROOT_PATH ${BITNET_AARCH64_SYSROOT})
# Programs (python3, nvcc, ...) come from the host; libraries, headers and
# packages only from the target.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -L tells qemu where the target's dynamic loader and libraries are.
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64;-L;${BITNET_AARCH64_SYSROOT}")
