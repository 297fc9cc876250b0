// y[a][r] = (sum_k w[r][k] * x[a][k]) / act_scale[a] * weight_scale for 8
// outputs r of one activation row a a workgroup: ternary weights
// (bn_vk_w2a8_pack's layout, 16 codes of weight + 1 to a word) times rows
// of int8 activations (4 to a word, zero-padded to whole words of codes)
// and their scales, both as the norm + int8 kernel writes them (rows
// act_row .. act_row + rows - 1 of many; y row a holds n outputs). 32
// invocations take an output, each its words j = sub, sub + 32, ... (they
// read a row's 128 contiguous bytes at a time), and their partial sums
// meet in a tree. The sum is exact in int32, as on the CPU: with
// DOT_PRODUCT by the device's integer dot products (four codes and four
// activations a step), else by portable integer arithmetic. The epilogue
// is the CPU's expression, its division correctly rounded where
// EXACT_DIVISION is defined (vk_w2a8.h says why); the output then goes to
// y as it is (mode 0) or is added to y's value there (mode 1: the residual
// add). Mode 2 is the feed-forward's gate and up at once: w holds the
// gate's n rows, then the up's, a workgroup takes four outputs, its first
// four groups of invocations their gate rows and the last four their up
// rows, and y gets (g g) u (the CPU's relu2_span of the two outputs).
// Each operation is rounded once, in the CPU's order.
// Included by w2a8_matvec.comp, w2a8_matvec_f64.comp, w2a8_matvec_dot.comp
// and w2a8_matvec_dot_f64.comp.

#ifdef DOT_PRODUCT
// OpSDot (4450) of two 32-bit words as four signed 8-bit lanes each
// (packed vector format 0, 4x8Bit): glslc knows no GLSL name for it.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot_packed(int a, int b, spirv_literal int packed_format);
#endif

#define OUTPUTS 8u // a workgroup's outputs (BN_VK_W2A8_OUTPUTS)
#define LANES 32u  // invocations an output
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Acts { uint x[]; };
layout(std430, binding = 2) buffer Out { float y[]; };
// The activation rows' scales, as the norm + int8 kernel writes them.
layout(std430, binding = 3) readonly buffer ActScales { float act_scales[]; };

layout(push_constant) uniform Params {
    uint n;           // rows
    uint words;       // words of codes a row (16 codes each)
    uint act_row;     // the first activation row: its codes and its scale
    float weight_scale;
    uint rows;        // activation rows
    uint mode;        // the epilogue: 0 store, 1 add, 2 gate and up
    float up_scale;   // mode 2: the up's weight scale (weight_scale the gate's)
} p;

shared int partial[OUTPUTS * LANES];

// The CPU's ((float)sum / act_scale) * weight_scale.
float epilogue_scale(int sum, float act_scale, float weight_scale)
{
#ifdef EXACT_DIVISION
    precise float q = float(double(float(sum)) / double(act_scale));
#else
    precise float q = float(sum) / act_scale;
#endif
    precise float v = q * weight_scale;
    return v;
}

void main()
{
    const bool gate_up = p.mode == 2u;
    const uint per = gate_up ? OUTPUTS / 2u : OUTPUTS;  // outputs a workgroup
    const uint blocks = (p.n + per - 1u) / per;         // workgroups an activation row
    const uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (id >= blocks * p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint a = id / blocks, tid = gl_LocalInvocationID.x, slot = tid / LANES;
    // The output this group of invocations sums for, and its weight row.
    const uint row = (id % blocks) * per + (gate_up ? slot % per : slot), sub = tid % LANES;
    const uint w_row = gate_up && slot >= per ? p.n + row : row;
    const uint act_base = (p.act_row + a) * p.words * 4u;
    // Four sums, one a word of activations, so that the adds do not wait
    // on each other (integer sums: the order does not matter).
    int acc[4] = int[4](0, 0, 0, 0);
    if (row < p.n) {
        for (uint j = sub; j < p.words; j += LANES) {
            const uint codes = w[w_row * p.words + j];
            for (uint q = 0u; q < 4u; q++) {
                const int acts = int(x[act_base + j * 4u + q]);
#ifdef DOT_PRODUCT
                // Codes 4q .. 4q + 3 (0, 1, 2) spread to the bytes of a word,
                // then sum code x - sum x: two dot products of four.
                const uint c = (codes >> (8u * q)) & 0xffu;
                const uint spread = (c & 3u) | ((c & 0xcu) << 6) | ((c & 0x30u) << 12) |
                                    ((c & 0xc0u) << 18);
                acc[q] += sdot_packed(int(spread), acts, 0) - sdot_packed(0x01010101, acts, 0);
#else
                for (uint b = 0u; b < 4u; b++) {
                    const int code = int((codes >> (2u * (4u * q + b))) & 3u) - 1;
                    acc[q] += code * bitfieldExtract(acts, int(8u * b), 8);
                }
#endif
            }
        }
    }
    partial[tid] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    barrier();
    for (uint h = LANES / 2u; h > 0u; h >>= 1u) {
        if (sub < h)
            partial[tid] += partial[tid + h];
        barrier();
    }
    if (sub == 0u && row < p.n && slot < per) {
        const float act_scale = act_scales[p.act_row + a];
        const float v = epilogue_scale(partial[tid], act_scale, p.weight_scale);
        const uint o = a * p.n + row;
        if (p.mode == 1u) {
            precise float r = y[o] + v;
            y[o] = r;
        } else if (gate_up) {
            const float u = epilogue_scale(partial[tid + per * LANES], act_scale, p.up_scale);
            // The test is on the bits (positive, at most +infinity), not a
            // compare a driver could turn into a max() that keeps a NaN.
            const int bits = floatBitsToInt(v);
            const float g = bits > 0 && bits <= 0x7f800000 ? v : 0.0;
            precise float r = (g * g) * u;
            y[o] = r;
        } else {
            y[o] = v;
        }
    }
}
