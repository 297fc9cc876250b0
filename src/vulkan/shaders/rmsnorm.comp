#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm of the final hidden rows in float, for devices without fp64: rmsnorm.glsl.
#include "rmsnorm.glsl"
