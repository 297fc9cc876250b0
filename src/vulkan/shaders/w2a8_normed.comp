#version 450
// The W2A8 product that norms its input row (w2a8_normed.glsl): integer
// dot products, the exact division, the norm's fp64 arithmetic and
// subgroup reductions (as norm_quantize_f64_sg.comp).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define DOT_PRODUCT 1
#define EXACT_DIVISION 1
#define BN_FP64 1
#define SUBGROUP 1
#include "w2a8_normed.glsl"
