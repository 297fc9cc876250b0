#version 450
// The W2A8 product with the device's integer dot products and the exact
// division whose last workgroup of an activation row then norms the row
// it wrote (the residual add's or the gate and up's: modes 1 and 2), the
// norm + int8 of norm_quantize_f64_sg.comp run by 256 invocations:
// w2a8_matvec.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define DOT_PRODUCT 1
#define EXACT_DIVISION 1
#define BN_FP64 1
#define SUBGROUP 1
#define NORM_TAIL 1
#include "w2a8_matvec.glsl"
