#version 450
#extension GL_GOOGLE_include_directive : require
// causal GQA attention in float, for devices without fp64: attention.glsl.
#include "attention.glsl"
