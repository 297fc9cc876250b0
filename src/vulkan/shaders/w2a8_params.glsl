// The bindings and push constants of the W2A8 products over activation
// rows given as codes: w2a8_matvec.glsl (a workgroup eight outputs) and
// w2a8_tiles.comp (a workgroup a tile of rows and outputs). vk_w2a8.c's
// matvec_params mirrors Params.

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// A row's activation words four at a time (a weight word's 16 codes' 16
// activations: one 16-byte load; rows start on whole weight words).
layout(std430, binding = 1) readonly buffer Acts { uvec4 x4[]; };
layout(std430, binding = 2) buffer Out { float y[]; };
// The activation rows' scales, as the norm + int8 kernel writes them.
layout(std430, binding = 3) readonly buffer ActScales { float act_scales[]; };
// Mode 3 only (the other modes bind any buffers here and never touch them):
layout(std430, binding = 4) readonly buffer Info { int info[]; };     // [rows][2]: seq, pos
layout(std430, binding = 5) readonly buffer Tables { int tables[]; }; // [n_seq][max_blocks]
layout(std430, binding = 6) readonly buffer CosSin { float cs[]; };   // [rows][rope_dim]
layout(std430, binding = 7) writeonly buffer KCache { float kc[]; };
layout(std430, binding = 8) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint n;           // rows (mode 3: q's, k's and v's together)
    uint words;       // words of codes a row (16 codes each)
    uint act_row;     // the first activation row: its codes and its scale
    float weight_scale; // (mode 3: q's)
    uint rows;        // activation rows
    uint mode;        // the epilogue: 0 store, 1 add, 2 gate and up, 3 q, k, v
    float up_scale;   // mode 2: the up's weight scale; mode 3: k's
    float v_scale;    // mode 3: v's weight scale, then the attention's shape,
    uint n_head, n_kv, head_dim, rope_dim;      // the cache through the
    uint block_size, max_blocks, n_seq;          // block tables (as
    uint cache_rows, layer_off;                  // vk_ops.h describes them)
} p;
