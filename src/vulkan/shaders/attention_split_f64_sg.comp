#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Decode rows' attention split over blocks of positions, exp and the last
// division correctly rounded through fp64, the workgroup's maximum and
// sums by subgroup operations (devices with subgroup arithmetic):
// attention_split.glsl.
#define BN_FP64 1
#define SUBGROUP 1
#include "attention_split.glsl"
