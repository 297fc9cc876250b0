#version 450
#extension GL_GOOGLE_include_directive : require
// The LM head, x rows four at a time: head_rows.glsl.
#define XROWS 4u
#include "head_rows.glsl"
