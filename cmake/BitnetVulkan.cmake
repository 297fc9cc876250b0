# Decides whether the Vulkan backend is built and sets BITNET_HAVE_VULKAN.
#
# Building it needs the Vulkan headers (Debian: libvulkan-dev) and glslc
# (Debian: glslc), which compiles the compute shaders to SPIR-V; the SPIR-V
# is embedded in the library. At run time the library opens the Vulkan
# loader (libvulkan.so.1) itself, so a binary built with Vulkan still starts
# where there is no loader and reports why Vulkan is unavailable.

set(BITNET_HAVE_VULKAN OFF)
set(BITNET_HAVE_VULKAN_TEXT "off (BITNET_VULKAN=${BITNET_VULKAN})")

string(TOUPPER "${BITNET_VULKAN}" _bn_vk_mode)
if(NOT _bn_vk_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BITNET_VULKAN must be AUTO, ON or OFF (got '${BITNET_VULKAN}')")
endif()

if(NOT _bn_vk_mode STREQUAL "OFF")
  find_path(BITNET_VULKAN_INCLUDE_DIR vulkan/vulkan.h)
  find_program(BITNET_GLSLC glslc)
  set(_bn_vk_missing "")
  if(NOT BITNET_VULKAN_INCLUDE_DIR)
    list(APPEND _bn_vk_missing "the Vulkan headers (libvulkan-dev)")
  endif()
  if(NOT BITNET_GLSLC)
    list(APPEND _bn_vk_missing "glslc")
  endif()
  if(_bn_vk_missing STREQUAL "")
    set(BITNET_HAVE_VULKAN ON)
    set(BITNET_HAVE_VULKAN_TEXT "on (${BITNET_GLSLC})")
  else()
    string(REPLACE ";" " and " _bn_vk_missing "${_bn_vk_missing}")
    if(_bn_vk_mode STREQUAL "ON")
      message(FATAL_ERROR "BITNET_VULKAN=ON but ${_bn_vk_missing} not found "
                          "(scripts/install-deps.sh installs them)")
    endif()
    set(BITNET_HAVE_VULKAN_TEXT "off (${_bn_vk_missing} not found)")
  endif()
endif()
