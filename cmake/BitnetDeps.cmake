# Finds cJSON and PCRE2 (8-bit) and wraps them as the imported targets
# bitnet_cjson and bitnet_pcre2. Debian packages: libcjson-dev, libpcre2-dev
# (scripts/install-deps.sh installs them). BITNET_DEPS_PREFIX names an extra
# prefix to search (include/ and lib/), e.g. a folder carried to a machine
# without the -dev packages.

set(BITNET_DEPS_PREFIX "" CACHE PATH "Extra prefix to search for cJSON and PCRE2")
set(_bn_hints ${BITNET_DEPS_PREFIX})

find_path(BITNET_CJSON_INCLUDE cjson/cJSON.h HINTS ${_bn_hints} PATH_SUFFIXES include)
find_library(BITNET_CJSON_LIB NAMES cjson HINTS ${_bn_hints} PATH_SUFFIXES lib)
find_path(BITNET_PCRE2_INCLUDE pcre2.h HINTS ${_bn_hints} PATH_SUFFIXES include)
# Static first: the CLI then runs where libpcre2 is not installed.
find_library(BITNET_PCRE2_LIB NAMES libpcre2-8.a pcre2-8 HINTS ${_bn_hints} PATH_SUFFIXES lib)

foreach(v BITNET_CJSON_INCLUDE BITNET_CJSON_LIB BITNET_PCRE2_INCLUDE BITNET_PCRE2_LIB)
  if(NOT ${v})
    message(FATAL_ERROR "${v} not found: install libcjson-dev and libpcre2-dev "
                        "(scripts/install-deps.sh), or set BITNET_DEPS_PREFIX")
  endif()
endforeach()

add_library(bitnet_cjson INTERFACE)
target_include_directories(bitnet_cjson INTERFACE ${BITNET_CJSON_INCLUDE})
target_link_libraries(bitnet_cjson INTERFACE ${BITNET_CJSON_LIB})
add_library(bitnet_pcre2 INTERFACE)
target_include_directories(bitnet_pcre2 INTERFACE ${BITNET_PCRE2_INCLUDE})
target_compile_definitions(bitnet_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
target_link_libraries(bitnet_pcre2 INTERFACE ${BITNET_PCRE2_LIB})

# Full paths: a prefix given with BITNET_DEPS_PREFIX is not on the linker path.
set(BITNET_DEPS_PC_LIBS "${BITNET_CJSON_LIB} ${BITNET_PCRE2_LIB}")

# libmicrohttpd (Debian: libmicrohttpd-dev) for `bitnet serve`. BITNET_SERVER:
# AUTO builds the command when the library is found, ON requires it, OFF
# leaves it out.
set(BITNET_SERVER AUTO CACHE STRING "Build bitnet serve: AUTO, ON or OFF")
if(NOT BITNET_SERVER STREQUAL "OFF")
  find_path(BITNET_MHD_INCLUDE microhttpd.h HINTS ${_bn_hints} PATH_SUFFIXES include)
  find_library(BITNET_MHD_LIB NAMES microhttpd HINTS ${_bn_hints} PATH_SUFFIXES lib)
  if(BITNET_MHD_INCLUDE AND BITNET_MHD_LIB)
    add_library(bitnet_mhd INTERFACE)
    target_include_directories(bitnet_mhd INTERFACE ${BITNET_MHD_INCLUDE})
    target_link_libraries(bitnet_mhd INTERFACE ${BITNET_MHD_LIB})
  elseif(BITNET_SERVER STREQUAL "ON")
    message(FATAL_ERROR "BITNET_SERVER=ON: libmicrohttpd not found (install libmicrohttpd-dev: "
                        "scripts/install-deps.sh)")
  else()
    message(STATUS "libmicrohttpd not found: bitnet serve is not built")
  endif()
endif()
