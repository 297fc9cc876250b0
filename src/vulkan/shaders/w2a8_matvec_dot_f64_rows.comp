#version 450
// The W2A8 product with the device's integer dot products and the exact
// division, eight activation rows a workgroup (a pass of many rows):
// w2a8_matvec.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define DOT_PRODUCT 1
#define EXACT_DIVISION 1
#define RB 8u
#include "w2a8_matvec.glsl"
