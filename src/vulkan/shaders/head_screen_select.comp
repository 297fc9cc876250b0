#version 450
#extension GL_GOOGLE_include_directive : require
// The screened LM head's stage 3 (select): head_screen.glsl.
#define STAGE 3
#include "head_screen.glsl"
