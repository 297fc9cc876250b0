#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// RMSNorm then int8 quantization, the CPU's arithmetic bit for bit through fp64
// (shaderFloat64), 512 invocations a row and reductions by subgroup
// operations (subgroup arithmetic): norm_quantize.glsl.
#define BN_FP64 1
#define SUBGROUP 1
#include "norm_quantize.glsl"
