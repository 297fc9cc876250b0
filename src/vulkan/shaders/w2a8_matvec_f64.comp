#version 450
// w2a8_matvec.glsl with its epilogue's division correctly rounded: the
// float quotient of two floats rounded from their double quotient, which
// Vulkan's allowance (2.5 ulp of a double) leaves correct, since the exact
// quotient of two floats is never that close to halfway between two
// floats. For devices with fp64 (shaderFloat64).
#extension GL_GOOGLE_include_directive : require
#define EXACT_DIVISION 1
#include "w2a8_matvec.glsl"
