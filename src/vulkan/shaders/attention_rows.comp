#version 450
#extension GL_GOOGLE_include_directive : require
// causal GQA attention in float, for devices without fp64, 128 invocations
// a workgroup (passes of many rows): attention.glsl.
#define WG_SIZE 128
#include "attention.glsl"
