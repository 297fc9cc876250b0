// What attention.glsl and attention_group.glsl share beside
// attention_keys.glsl: the scores' scratch (binding 5) and the push
// constants (vk_ops.c's attn_params, `extent` as stride).

// Bindings 0 to 4 and 6 (the rows, the tables, q, the caches, att):
// attention_keys.glsl.
layout(std430, binding = 5) buffer Scratch { float scratch[]; };    // [rows][n_head][stride]

layout(push_constant) uniform Params {
    uint rows;
    uint n_head;
    uint head_dim;
    uint group;        // query heads a KV head serves
    uint kv_dim;
    uint block_size;
    uint max_blocks;
    uint n_seq;        // sequences the tables buffer holds
    uint cache_rows;   // rows of one layer's cache
    uint layer_off;    // floats before this layer's cache
    uint stride;       // scratch floats a (row, head)
    float scale;
} p;
