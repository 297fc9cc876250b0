// W2A8 products that norm their own input, chained: up to STAGES of them
// in one dispatch (a decode step's layer tail: x += Wo q(norm(att)), then
// h = relu2(Wgate q(norm(x))) Wup q(norm(x)), then x += Wdown q(norm(h))).
// In stage s one activation row (a decode step's, as floats) is normed and
// quantized by every workgroup into shared memory (norm_quantize_row: the
// norm + int8 kernel's arithmetic, the CPU's codes bit for bit), then
// multiplied by the ternary weights as w2a8_matvec.glsl does, through its
// epilogue (mode 0 store, 1 the residual add, 2 the gate and up's squared
// ReLU product). The norm's dispatch and the barrier before the product
// are gone, and so are the dispatch boundaries between the stages: the
// stages meet at a grid barrier instead (each workgroup adds one to a
// counter in memory and waits until every workgroup has; ~1.8 us where a
// dispatch boundary costs ~3.9 on the H200, dev/vulkan/handoff_chain.c).
// A grid barrier needs every workgroup resident at once: the host runs
// chains of more than one stage over as many workgroups as it found fit
// (p.stages == 0 is that probe: the barrier alone), and each wait gives up
// after p.spin_limit polls and counts itself in link[0], so that a grid
// the device did not hold at once ends with a wrong result the host sees
// rather than never. One stage needs no barrier and takes any grid.
//
// Each workgroup norms a stage's row once and then takes groups of outputs
// g = its id, + the workgroups, ... Its first group's weight words are
// loaded before the norm (and before the barrier that precedes the stage),
// since they depend on nothing the stages write.
//
// A group is 16 outputs (mode 2: 8 gate rows and their 8 up rows), 32
// invocations an output, each its words j = sub, sub + 32, ...; their
// partial sums meet in a subgroup add (a tree where a subgroup is not 32
// invocations). Rows of up to MAX_K values.
#include "sdot.glsl"

#define THREADS 512u
#define LANES 32u
#define SLOTS (THREADS / LANES) // invocation groups a workgroup
#define PRE 16u                 // weight words an invocation holds ahead
#define MAX_K 8192u             // BN_VK_NORMED_MAX_K
#define STAGES 3u               // BN_VK_NORMED_STAGES
layout(local_size_x = THREADS) in;

// Stage s's weights, row to norm, outputs and norm weights. A buffer may be
// bound to several of these (x is stage 0's output and stage 1's row);
// rows and outputs are written by the stages before, so they are read
// coherent (from L2, not a stale L1 line).
layout(std430, binding = 0) readonly buffer W0 { uint w0[]; };
layout(std430, binding = 1) readonly buffer W1 { uint w1[]; };
layout(std430, binding = 2) readonly buffer W2 { uint w2[]; };
layout(std430, binding = 3) coherent buffer X0 { float x0[]; };
layout(std430, binding = 4) coherent buffer X1 { float x1[]; };
layout(std430, binding = 5) coherent buffer X2 { float x2[]; };
layout(std430, binding = 6) coherent buffer Y0 { float y0[]; };
layout(std430, binding = 7) coherent buffer Y1 { float y1[]; };
layout(std430, binding = 8) coherent buffer Y2 { float y2[]; };
layout(std430, binding = 9) readonly buffer N0 { float nw0[]; };
layout(std430, binding = 10) readonly buffer N1 { float nw1[]; };
layout(std430, binding = 11) readonly buffer N2 { float nw2[]; };
// [0] the waits that gave up; [link_at] this dispatch's arrivals.
layout(std430, binding = 12) coherent buffer Link { uint link[]; };

struct Stage {
    uint n;             // outputs
    uint k;             // the row's values
    uint words;         // weight words a row (16 codes each)
    float weight_scale; // (mode 2: the gate's)
    uint mode;          // the epilogue: 0 store, 1 add, 2 gate and up
    float up_scale;     // mode 2: the up's weight scale
    uint groups;        // groups of outputs
    uint unused;
};

layout(push_constant) uniform Params {
    Stage st[STAGES];
    float eps;
    uint stages;     // stages run; 0: the grid barrier alone
    uint link_at;    // this dispatch's arrival counter in Link
    uint spin_limit; // polls a wait makes before it gives up
} p;

// ---- stage s's buffers (s is the same for the whole workgroup)
uint weight_word(uint s, uint i)
{
    if (s == 0u)
        return w0[i];
    return s == 1u ? w1[i] : w2[i];
}

float row_value(uint s, uint i)
{
    if (s == 0u)
        return x0[i];
    return s == 1u ? x1[i] : x2[i];
}

float norm_weight(uint s, uint i)
{
    if (s == 0u)
        return nw0[i];
    return s == 1u ? nw1[i] : nw2[i];
}

float out_load(uint s, uint o)
{
    if (s == 0u)
        return y0[o];
    return s == 1u ? y1[o] : y2[o];
}

void out_store(uint s, uint o, float v)
{
    if (s == 0u)
        y0[o] = v;
    else if (s == 1u)
        y1[o] = v;
    else
        y2[o] = v;
}

uint cur = 0u; // the stage running

// The row's codes (4 a word, zero-padded to 4 words a weight word), its
// scale and its codes' sum, as the norm + int8 kernel would write them.
shared uint sh_codes[MAX_K / 4u];
shared float sh_scale[1];
shared int sh_sum[1];
#define NORM_FUNCTION 1
#define NORM_X(i) row_value(cur, i)
#define NORM_W(i) norm_weight(cur, i)
#define NORM_CODES sh_codes
#define NORM_SCALES sh_scale
#define NORM_SUMS sh_sum
#include "norm_quantize.glsl"

#define EPI_Y_LOAD(o) out_load(cur, o)
#define EPI_Y_STORE(o, v) out_store(cur, o, v)
#define EPI_MODE p.st[cur].mode
#define EPI_WEIGHT_SCALE p.st[cur].weight_scale
#define EPI_UP_SCALE p.st[cur].up_scale
#include "w2a8_epilogue.glsl"

shared int partial[THREADS];

// Outputs a group of stage s: 16, or 8 gate and up pairs.
uint per_group(uint s) { return p.st[s].mode == 2u ? SLOTS / 2u : SLOTS; }

// Group g's output for invocation group slot, and its weight row (mode 2:
// the gate's rows, then the up's).
void group_rows(uint s, uint g, uint slot, out uint row, out uint w_row)
{
    const uint per = per_group(s);
    row = g * per + slot % per;
    w_row = slot >= per ? p.st[s].n + row : row;
}

// The first PRE of this invocation's words of group g's weight row in
// stage s (zero past them, or past the last row).
void load_words(uint s, uint g, uint slot, uint sub, out uint pre[PRE])
{
    uint row, w_row;
    group_rows(s, g, slot, row, w_row);
    const uint words = p.st[s].words;
    for (uint i = 0u; i < PRE; i++) {
        const uint j = sub + LANES * i;
        pre[i] = row < p.st[s].n && j < words ? weight_word(s, w_row * words + j) : 0u;
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

// Every workgroup's writes before it seen by every workgroup after it:
// the round-th barrier of the dispatch. Reached by the whole workgroup.
void grid_barrier(uint round)
{
    memoryBarrierBuffer(); // this invocation's writes, before the arrival
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        const uint target = round * gl_NumWorkGroups.x;
        atomicAdd(link[p.link_at], 1u);
        uint polls = 0u;
        while (atomicAdd(link[p.link_at], 0u) < target) {
            if (++polls >= p.spin_limit) {
                atomicAdd(link[0], 1u);
                break;
            }
        }
        memoryBarrierBuffer();
    }
    barrier();
}

// Stage s for this workgroup, its first group's words in pre.
void run_stage(uint s, uint pre[PRE])
{
    const uint tid = gl_LocalInvocationID.x, slot = tid / LANES, sub = tid % LANES;
    const uint g0 = gl_WorkGroupID.x, stride = gl_NumWorkGroups.x;
    const uint n = p.st[s].n, words = p.st[s].words, per = per_group(s);
    if (g0 >= p.st[s].groups)
        return; // the whole workgroup: no barrier is left waiting

    norm_quantize_row(0u, p.st[s].k, 4u * words, p.eps);
    barrier(); // the codes and scale in shared memory
    const float act_scale = sh_scale[0];

    for (uint g = g0; g < p.st[s].groups; g += stride) {
        if (g != g0)
            load_words(s, g, slot, sub, pre);
        uint row, w_row;
        group_rows(s, g, slot, row, w_row);
        int sum = 0;
        if (row < n) {
            for (uint i = 0u; i < PRE; i++) {
                const uint j = sub + LANES * i;
                if (j < words)
                    sum += dot_word(pre[i], j);
            }
            for (uint j = sub + LANES * PRE; j < words; j += LANES)
                sum += dot_word(weight_word(s, w_row * words + j), j);
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
        if (sub == 0u && row < n && slot < per)
            epilogue_store(row, partial[tid], per < SLOTS ? partial[tid + per * LANES] : 0,
                           act_scale);
        barrier(); // partial is written again by the next group
    }
}

void main()
{
    if (p.stages == 0u) { // the residency probe
        grid_barrier(1u);
        return;
    }
    const uint tid = gl_LocalInvocationID.x;
    uint pre[PRE];
    load_words(0u, gl_WorkGroupID.x, tid / LANES, tid % LANES, pre);
    for (uint s = 0u; s < p.stages && s < STAGES; s++) {
        if (s > 0u) {
            load_words(s, gl_WorkGroupID.x, tid / LANES, tid % LANES, pre);
            grid_barrier(s);
        }
        cur = s;
        run_stage(s, pre);
    }
}
