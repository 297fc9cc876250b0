// The attentions' push constants (vk_ops.c's attn_params): attention.glsl,
// attention_group.glsl and attention_split.glsl. The including shader
// names the last count, ATTN_EXTENT: the exact ones' scratch stride
// (floats a (row, head)), the split one's blocks (partial blocks a (row,
// head): positions up to blocks BLOCK).
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
    uint ATTN_EXTENT;
    float scale;
} p;
