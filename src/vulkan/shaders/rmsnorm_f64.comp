#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm of the final hidden rows, the CPU's arithmetic bit for bit through fp64
// (shaderFloat64): rmsnorm.glsl.
#define BN_FP64 1
#include "rmsnorm.glsl"
