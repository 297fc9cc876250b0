#version 450
#extension GL_GOOGLE_include_directive : require
// Decode rows' attention split over blocks of positions, in float (devices
// without fp64): attention_split.glsl.
#include "attention_split.glsl"
