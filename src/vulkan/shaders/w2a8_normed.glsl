// A W2A8 product that norms its own input: one activation row (a decode
// step's), given as floats, is normed and quantized by every workgroup
// into shared memory (norm_quantize_row: the norm + int8 kernel's
// arithmetic, the CPU's codes bit for bit), then multiplied by the
// ternary weights as w2a8_matvec.glsl does, with its epilogues (mode 0
// store, 1 the residual add, 3 the attention's q, k and v with RoPE and
// the cache store: w2a8_qkv.glsl). The norm's dispatch and the barrier
// before the product are gone.
//
// Each workgroup norms the row once and then takes groups of outputs
// g = its id, + the workgroups, ... (the host sizes the grid so that
// every workgroup can be resident at once: the norm is paid once, not
// once a wave). Its first group's weight words are loaded before the
// norm, since they do not depend on it, and are in registers when the
// codes are ready.
//
// A group is 16 outputs, 32 invocations an output, each its words j =
// sub, sub + 32, ...; their partial sums meet in a subgroup add (a tree
// where a subgroup is not 32 invocations). In mode 3 a group is two of
// w2a8_matvec.glsl's workgroups of eight outputs (qkv_geometry), so that
// a RoPE pair's two sums meet in one workgroup. Rows of up to MAX_K
// values.
#include "sdot.glsl"

#define THREADS 512u
#define LANES 32u
#define SLOTS (THREADS / LANES) // outputs a group
#define PRE 16u                 // weight words an invocation holds ahead
#define MAX_K 8192u             // BN_VK_NORMED_MAX_K
layout(local_size_x = THREADS) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Row { float x[]; };       // the row to norm
layout(std430, binding = 2) buffer Out { float y[]; };
layout(std430, binding = 3) readonly buffer NormWeights { float nw[]; };
// Mode 3 only (the other modes bind any buffers here and never touch them):
layout(std430, binding = 4) readonly buffer Info { int info[]; };     // [1][2]: seq, pos
layout(std430, binding = 5) readonly buffer Tables { int tables[]; }; // [n_seq][max_blocks]
layout(std430, binding = 6) readonly buffer CosSin { float cs[]; };   // [1][rope_dim]
layout(std430, binding = 7) writeonly buffer KCache { float kc[]; };
layout(std430, binding = 8) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint n;             // outputs (mode 3: q's, k's and v's together)
    uint k;             // the row's values
    uint words;         // weight words a row (16 codes each)
    float weight_scale; // (mode 3: q's)
    uint mode;
    float up_scale;     // mode 3: k's weight scale (else unused)
    float eps;
    uint groups;        // groups of outputs
    float v_scale;      // mode 3: v's weight scale, then the attention's shape
    uint n_head, n_kv, head_dim, rope_dim;    // and the cache through the block
    uint block_size, max_blocks, n_seq;       // tables (w2a8_matvec.glsl's)
    uint cache_rows, layer_off;
} p;

// The row's codes (4 a word, zero-padded to 4 words a weight word), its
// scale and its codes' sum, as the norm + int8 kernel would write them.
shared uint sh_codes[MAX_K / 4u];
shared float sh_scale[1];
shared int sh_sum[1];
#define NORM_FUNCTION 1
#define NORM_X(i) x[i]
#define NORM_W(i) nw[i]
#define NORM_CODES sh_codes
#define NORM_SCALES sh_scale
#define NORM_SUMS sh_sum
#include "norm_quantize.glsl"

#include "w2a8_epilogue.glsl"
#include "w2a8_qkv.glsl"

shared int partial[THREADS];

// Group g's output for invocation group slot: whether there is one, and
// its weight row; in mode 3 also its part, whether it is a RoPE pair's
// and its index in its part (qkv_geometry of the group's half).
bool group_row(uint g, uint slot, out uint w_row, out uint part, out bool pair, out uint at)
{
    part = 0u;
    pair = false;
    at = 0u;
    if (p.mode != 3u) {
        w_row = g * SLOTS + slot;
        return w_row < p.n;
    }
    bool live;
    qkv_geometry(2u * g + slot / 8u, slot % 8u, part, pair, at, live);
    const uint q_dim = p.n_head * p.head_dim, kv_dim = p.n_kv * p.head_dim;
    w_row = at + (part == 0u ? 0u : part == 1u ? q_dim : q_dim + kv_dim);
    return live;
}

// The first PRE of this invocation's words of weight row w_row (zero past
// them, or where there is no row).
void load_words(bool live, uint w_row, uint sub, out uint pre[PRE])
{
    for (uint i = 0u; i < PRE; i++) {
        const uint j = sub + LANES * i;
        pre[i] = live && j < p.words ? w[w_row * p.words + j] : 0u;
    }
}

// Weight word j's 16 codes times their 16 activations.
int dot_word(uint codes, uint j)
{
    int acc = 0;
    for (uint q = 0u; q < 4u; q++)
        acc += ternary_dot(spread_codes((codes >> (8u * q)) & 0xffu), int(sh_codes[j * 4u + q]));
    return acc;
}

void main()
{
    const uint tid = gl_LocalInvocationID.x, slot = tid / LANES, sub = tid % LANES;
    const uint g0 = gl_WorkGroupID.x, stride = gl_NumWorkGroups.x;
    if (g0 >= p.groups)
        return; // the whole workgroup: no barrier is left waiting

    uint w_row, part, at, pre[PRE];
    bool pair, live = group_row(g0, slot, w_row, part, pair, at);
    load_words(live, w_row, sub, pre);

    norm_quantize_row(0u, p.k, 4u * p.words, p.eps);
    barrier(); // the codes and scale in shared memory
    const float act_scale = sh_scale[0];

    for (uint g = g0; g < p.groups; g += stride) {
        if (g != g0) {
            live = group_row(g, slot, w_row, part, pair, at);
            load_words(live, w_row, sub, pre);
        }
        int sum = 0;
        if (live) {
            for (uint i = 0u; i < PRE; i++) {
                const uint j = sub + LANES * i;
                if (j < p.words)
                    sum += dot_word(pre[i], j);
            }
            for (uint j = sub + LANES * PRE; j < p.words; j += LANES)
                sum += dot_word(w[w_row * p.words + j], j);
        }
        if (gl_SubgroupSize == LANES) { // an output's lanes are one subgroup
            partial[tid] = subgroupAdd(sum);
            barrier();
        } else {
            partial[tid] = sum;
            barrier();
            for (uint h = LANES / 2u; h > 0u; h >>= 1u) {
                if (sub < h)
                    partial[tid] += partial[tid + h];
                barrier();
            }
        }
        if (sub == 0u && live) {
            if (p.mode != 3u)
                epilogue_store(w_row, partial[tid], 0, act_scale);
            else if (!pair || slot % 8u < 4u) // a pair's second sum four groups on
                qkv_epilogue(0u, 0u, act_scale, part, pair, at, partial[tid],
                             pair ? partial[tid + 4u * LANES] : 0);
        }
        barrier(); // partial is written again by the next group
    }
}
