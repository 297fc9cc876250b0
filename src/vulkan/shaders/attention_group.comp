#version 450
#extension GL_GOOGLE_include_directive : require
// causal GQA attention in float, for devices without fp64, a workgroup a
// row and KV head (passes of many rows): attention_group.glsl.
#include "attention_group.glsl"
