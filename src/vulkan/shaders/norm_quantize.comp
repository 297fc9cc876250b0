#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm then int8 quantization in float, for devices without fp64: norm_quantize.glsl.
#include "norm_quantize.glsl"
