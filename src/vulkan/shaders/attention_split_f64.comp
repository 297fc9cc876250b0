#version 450
#extension GL_GOOGLE_include_directive : require
// Decode rows' attention split over blocks of positions, exp and the last
// division correctly rounded through fp64: attention_split.glsl.
#define BN_FP64 1
#include "attention_split.glsl"
