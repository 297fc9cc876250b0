#version 450
#extension GL_GOOGLE_include_directive : require
// causal GQA attention, the CPU's arithmetic bit for bit through fp64
// (shaderFloat64), 128 invocations a workgroup (passes of many rows):
// attention.glsl.
#define BN_FP64 1
#define WG_SIZE 128
#include "attention.glsl"
