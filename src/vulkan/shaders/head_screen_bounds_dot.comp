#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
// The screened LM head's bounds with the device's integer dot products:
// head_screen.glsl.
#define STAGE 2
#define DOT_PRODUCT 1
#include "head_screen.glsl"
