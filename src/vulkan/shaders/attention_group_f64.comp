#version 450
#extension GL_GOOGLE_include_directive : require
// causal GQA attention, the CPU's arithmetic bit for bit through fp64
// (shaderFloat64), a workgroup a row and KV head (passes of many rows):
// attention_group.glsl.
#define BN_FP64 1
#include "attention_group.glsl"
