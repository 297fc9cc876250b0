#version 450
// The W2A8 product with the device's integer dot products (OpSDot on four
// packed int8, VK_KHR_shader_integer_dot_product) and the epilogue's
// division as the device does it: w2a8_matvec.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define DOT_PRODUCT 1
#include "w2a8_matvec.glsl"
