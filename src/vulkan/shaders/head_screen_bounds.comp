#version 450
#extension GL_GOOGLE_include_directive : require
// The screened LM head's stage 2 (bounds): head_screen.glsl.
#define STAGE 2
#include "head_screen.glsl"
