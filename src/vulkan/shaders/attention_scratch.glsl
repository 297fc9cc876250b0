// What attention.glsl and attention_group.glsl share beside
// attention_keys.glsl: the scores' scratch (binding 5) and the push
// constants, the last count the scratch's stride.

// Bindings 0 to 4 and 6 (the rows, the tables, q, the caches, att):
// attention_keys.glsl.
layout(std430, binding = 5) buffer Scratch { float scratch[]; };    // [rows][n_head][stride]

#define ATTN_EXTENT stride // scratch floats a (row, head)
#include "attention_params.glsl"
