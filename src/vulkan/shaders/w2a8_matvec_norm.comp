#version 450
// w2a8_matvec.glsl with NORM: each workgroup norms and codes its activation
// row itself (norm_row.glsl) before the product. The integer dot products,
// the exact division, fp64 and subgroup reductions: for devices with all
// of them (bn_vk_w2a8_norm_usable).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define DOT_PRODUCT 1
#define EXACT_DIVISION 1
#define BN_FP64 1
#define SUBGROUP 1
#define NORM 1
#include "w2a8_matvec.glsl"
