// y[a][r] = (sum_k w[r][k] * x[a][k]) / act_scale[a] * weight_scale for one
// output r of one activation row a a workgroup: ternary weights
// (bn_vk_w2a8_pack's layout, 16 codes of weight + 1 to a word) times rows
// of int8 activations (4 to a word, zero-padded to whole words of codes)
// and their scales, both as the norm + int8 kernel writes them (rows
// act_row .. act_row + rows - 1 of many; y row a holds n outputs). The sum is exact in int32, as on the CPU; the
// epilogue is the CPU's expression, its division correctly rounded where
// EXACT_DIVISION is defined (w2a8_matvec_f64.comp; vk_w2a8.h says why).
// Included by w2a8_matvec.comp and w2a8_matvec_f64.comp.

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Acts { uint x[]; };
layout(std430, binding = 2) writeonly buffer Out { float y[]; };
// The activation rows' scales, as the norm + int8 kernel writes them.
layout(std430, binding = 3) readonly buffer ActScales { float act_scales[]; };

layout(push_constant) uniform Params {
    uint n;           // rows
    uint words;       // words of codes a row (16 codes each)
    uint act_row;     // the first activation row: its codes and its scale
    float weight_scale;
    uint rows;        // activation rows
} p;

shared int partial[64];

void main()
{
    const uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (id >= p.n * p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint a = id / p.n, row = id % p.n;
    const uint tid = gl_LocalInvocationID.x;
    const uint act_base = (p.act_row + a) * p.words * 4u;
    int acc = 0;
    for (uint j = tid; j < p.words; j += 64u) {
        const uint codes = w[row * p.words + j];
        for (uint q = 0u; q < 4u; q++) {
            const int acts = int(x[act_base + j * 4u + q]);
            for (uint b = 0u; b < 4u; b++) {
                const int code = int((codes >> (2u * (4u * q + b))) & 3u) - 1;
                acc += code * bitfieldExtract(acts, int(8u * b), 8);
            }
        }
    }
    partial[tid] = acc;
    barrier();
    for (uint half_n = 32u; half_n > 0u; half_n >>= 1u) {
        if (tid < half_n)
            partial[tid] += partial[tid + half_n];
        barrier();
    }
    if (tid == 0u) {
        const float act_scale = act_scales[p.act_row + a];
#ifdef EXACT_DIVISION
        precise float q = float(double(float(partial[0])) / double(act_scale));
#else
        precise float q = float(partial[0]) / act_scale;
#endif
        precise float v = q * p.weight_scale;
        y[a * p.n + row] = v;
    }
}
