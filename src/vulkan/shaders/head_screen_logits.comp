#version 450
#extension GL_GOOGLE_include_directive : require
// The screened LM head's stage 4 (the candidates' logits): head_screen.glsl.
#define STAGE 4
#include "head_screen.glsl"
