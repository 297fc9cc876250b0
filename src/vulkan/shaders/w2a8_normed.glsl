// A W2A8 product that norms its own input: one activation row (a decode
// step's), given as floats, is normed and quantized by every workgroup
// into shared memory (norm_quantize_row: the norm + int8 kernel's
// arithmetic, the CPU's codes bit for bit), then multiplied by the
// ternary weights as w2a8_matvec.glsl does, with its epilogues (mode 0
// store, 1 the residual add). The norm's dispatch and the barrier before
// the product are gone.
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
// where a subgroup is not 32 invocations). Rows of up to MAX_K values.
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

layout(push_constant) uniform Params {
    uint n;             // outputs
    uint k;             // the row's values
    uint words;         // weight words a row (16 codes each)
    float weight_scale;
    uint mode;
    float up_scale;     // (the epilogue's; unused)
    float eps;
    uint groups;        // groups of outputs
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

shared int partial[THREADS];

// The first PRE of this invocation's words of weight row `row` (zero
// past them, or past the last row).
void load_words(uint row, uint sub, out uint pre[PRE])
{
    for (uint i = 0u; i < PRE; i++) {
        const uint j = sub + LANES * i;
        pre[i] = row < p.n && j < p.words ? w[row * p.words + j] : 0u;
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

    uint row = g0 * SLOTS + slot, pre[PRE];
    load_words(row, sub, pre);

    norm_quantize_row(0u, p.k, 4u * p.words, p.eps);
    barrier(); // the codes and scale in shared memory
    const float act_scale = sh_scale[0];

    for (uint g = g0; g < p.groups; g += stride) {
        if (g != g0) {
            row = g * SLOTS + slot;
            load_words(row, sub, pre);
        }
        int sum = 0;
        if (row < p.n) {
            for (uint i = 0u; i < PRE; i++) {
                const uint j = sub + LANES * i;
                if (j < p.words)
                    sum += dot_word(pre[i], j);
            }
            for (uint j = sub + LANES * PRE; j < p.words; j += LANES)
                sum += dot_word(w[row * p.words + j], j);
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
        if (sub == 0u && row < p.n)
            epilogue_store(row, partial[tid], 0, act_scale);
        barrier(); // partial is written again by the next group
    }
}
