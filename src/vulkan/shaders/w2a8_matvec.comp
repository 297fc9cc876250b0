#version 450
// The W2A8 product with the epilogue's division as the device does it
// (for devices without fp64): w2a8_matvec.glsl.
#extension GL_GOOGLE_include_directive : require
#include "w2a8_matvec.glsl"
