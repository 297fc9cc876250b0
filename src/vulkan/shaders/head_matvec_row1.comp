#version 450
#extension GL_GOOGLE_include_directive : require
// The LM head for one x row (a decode step): head_rows.glsl.
#define XROWS 1u
#include "head_rows.glsl"
