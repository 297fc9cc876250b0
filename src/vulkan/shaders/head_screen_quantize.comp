#version 450
#extension GL_GOOGLE_include_directive : require
// The screened LM head's stage 1 (quantize): head_screen.glsl.
#define STAGE 1
#include "head_screen.glsl"
