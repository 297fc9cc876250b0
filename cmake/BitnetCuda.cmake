# Decides whether the CUDA backend is built and sets BITNET_HAVE_CUDA.
#
# Architectures: CMAKE_CUDA_ARCHITECTURES wins when given; otherwise the
# CUDA_ARCH environment variable or cache value (sm_90, 90, sm_80;sm_90 ...);
# otherwise 80;90 (A100 and H100/H200).
#
# The CUDA runtime is linked statically, so a binary built here starts on a
# machine with no driver and no libcudart: it then reports why CUDA is
# unavailable instead of failing at load time.

set(BITNET_HAVE_CUDA OFF)
set(BITNET_HAVE_CUDA_TEXT "off (BITNET_CUDA=${BITNET_CUDA})")

string(TOUPPER "${BITNET_CUDA}" _bn_cuda_mode)
if(NOT _bn_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BITNET_CUDA must be AUTO, ON or OFF (got '${BITNET_CUDA}')")
endif()

if(NOT _bn_cuda_mode STREQUAL "OFF")
  # Architectures must be known before enable_language(CUDA).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(_bn_arch "")
    if(DEFINED CUDA_ARCH AND NOT CUDA_ARCH STREQUAL "")
      set(_bn_arch "${CUDA_ARCH}")
    elseif(DEFINED ENV{CUDA_ARCH} AND NOT "$ENV{CUDA_ARCH}" STREQUAL "")
      set(_bn_arch "$ENV{CUDA_ARCH}")
    endif()
    if(_bn_arch STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    else()
      string(REPLACE "," ";" _bn_arch "${_bn_arch}")
      string(REGEX REPLACE "(^|;)(sm_|compute_)" "\\1" _bn_arch "${_bn_arch}")
      if(NOT _bn_arch MATCHES "^[0-9]+[af]?(;[0-9]+[af]?)*$")
        message(FATAL_ERROR "CUDA_ARCH must look like sm_90 or 80;90 (got '${_bn_arch}')")
      endif()
      set(CMAKE_CUDA_ARCHITECTURES "${_bn_arch}")
    endif()
  endif()

  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    set(BITNET_HAVE_CUDA ON)
    set(BITNET_HAVE_CUDA_TEXT
        "on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_bn_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "BITNET_CUDA=ON but no CUDA compiler (nvcc) was found. "
                        "Put nvcc on PATH or set CMAKE_CUDA_COMPILER, or use -DBITNET_CUDA=OFF.")
  else()
    set(BITNET_HAVE_CUDA_TEXT "off (nvcc not found)")
  endif()
endif()
