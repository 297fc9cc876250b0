#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm then int8 quantization, the CPU's arithmetic bit for bit through fp64
// (shaderFloat64): norm_quantize.glsl.
#define BN_FP64 1
#include "norm_quantize.glsl"
