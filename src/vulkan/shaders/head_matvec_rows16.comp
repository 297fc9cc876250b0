#version 450
#extension GL_GOOGLE_include_directive : require
// The LM head, x rows sixteen at a time (four invocations a head row, four
// x rows each): head_rows.glsl.
#define XROWS 4u
#define XGROUPS 4u
#include "head_rows.glsl"
