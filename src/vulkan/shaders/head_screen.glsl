// The screened LM head of a greedy step (the CPU's design and bound:
// src/kernels/head_screen.h): the int8 copy of the head (a row's codes q,
// its scale s and error factor e = 0.501 s + g m, made on the host by
// bn_head_screen_fill) against the normed hidden state x quantized here,
// in three stages, each a dispatch (STAGE):
//
//   1 quantize  one workgroup: sx = max |x| / (127 128), y = rint(x / sx)
//               in [-127 128, 127 128] as two int8 codes, y = 128 h + l
//               (|h| <= 127, |l| <= 64), L = sum |x|, ex = sum |x - sx y|
//               (doubles, widened by 1e-12 for their own rounding; NaN when
//               x holds a NaN or an infinity: every row is then a
//               candidate); the candidate count set to 0. (The CPU's x has
//               one int8 code a value; two make ex, the bound's largest
//               term there, 128 times smaller, as the CUDA path's screen.)
//   2 bounds    32 rows a workgroup, 8 invocations a row: the exact int32
//               sums of q h and q l (DOT_PRODUCT: the device's integer dot
//               products of four int8 pairs), a = s sx (128 sum qh + sum
//               ql), b = (L e + 127 s ex) (1 + 1e-9) + 1e-9 |a|; hi = a + b
//               stored a row, the largest lo = a - b of the workgroup's
//               rows stored a workgroup (a slot). Rows with s = 0 (not
//               bounded) get lo = -inf, hi = +inf.
//   3 select    T = the largest lo of all (every workgroup reduces the
//               slots), then each row with hi >= T appended to the
//               candidate list (an atomic counter; at most CAP listed, the
//               count goes on).
//   4 logits    each listed row's logit as the LM head computes it
//               (head_rows.glsl: eight lanes, element i in lane i % 8,
//               each lane in order, multiply then add, the lanes added
//               ((0+1)+(2+3))+((4+5)+(6+7))), a workgroup a row: its
//               invocations load the row and x into shared memory a tile at
//               a time, eight of them run the lanes over it (one invocation
//               a row, as the full head's kernel, would wait on each of its
//               loads in turn).
//
// The bound (head_screen.h's, with y for the CPU's y: |q| <= 127 is all it
// asks of the codes) holds for whatever y and sx are used (ex is computed
// from them), so the device's own division and rounding of sx and y cost
// nothing in exactness. The host takes the greedy rule over the candidates'
// logits (vk_head_screen.h).
#define CAP 4096u // candidates listed (BN_VK_SCREEN_CAP)
#define ROWS 32u  // rows a bounds workgroup
#define LANES 8u  // invocations a row

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };     // [dim] the normed row
layout(std430, binding = 1) buffer Y { uint y[]; };                // [2][lda / 4] h, l
layout(std430, binding = 2) buffer Stat { double stat[]; };        // sx, L, ex
layout(std430, binding = 3) readonly buffer Codes { uvec4 codes[]; }; // [vocab][lda / 16]
layout(std430, binding = 4) readonly buffer Scale { float scale[]; }; // [vocab] s
layout(std430, binding = 5) readonly buffer Err { double err[]; };    // [vocab] e
layout(std430, binding = 6) buffer Hi { double hi[]; };            // [vocab]
layout(std430, binding = 7) buffer Slots { double slot_lo[]; };    // [bounds workgroups]
layout(std430, binding = 8) buffer Result { uint result[]; };      // count, rows[CAP], logits
layout(std430, binding = 9) readonly buffer Head { uint head[]; }; // F16 pairs or F32 bits

layout(push_constant) uniform Params {
    uint vocab;
    uint dim;
    uint lda;     // bytes a code row: dim rounded up to 64
    uint n_slots; // bounds workgroups
    uint f16;     // 1: the head's rows are F16 (two to a word), 0: F32
} p;

#ifdef DOT_PRODUCT
#include "sdot.glsl"
#endif
#define ROUND_EVEN_DOUBLE
#include "round_even.glsl"

// The exact sum of four int8 products.
int dot4(uint a, uint b)
{
#ifdef DOT_PRODUCT
    return sdot_packed(int(a), int(b), 0);
#else
    int s = 0;
    for (int k = 0; k < 4; k++)
        s += bitfieldExtract(int(a), 8 * k, 8) * bitfieldExtract(int(b), 8 * k, 8);
    return s;
#endif
}

// +infinity and a quiet NaN as doubles (from their bits: no int64 needed).
#define INF_D packDouble2x32(uvec2(0u, 0x7ff00000u))
#define NAN_D packDouble2x32(uvec2(0u, 0x7ff80000u))

shared double sh_d[256], sh_d2[256];
shared float sh_f[256];
shared uint sh_u[256];

// The largest v of the workgroup's (reached by all of it).
double workgroup_max(double v)
{
    const uint tid = gl_LocalInvocationID.x;
    sh_d[tid] = v;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h)
            sh_d[tid] = max(sh_d[tid], sh_d[tid + h]);
        barrier();
    }
    return sh_d[0];
}

#if STAGE == 1
void main()
{
    const uint tid = gl_LocalInvocationID.x;
    float amax = 0.0;
    uint bad = 0u;
    for (uint i = tid; i < p.dim; i += 256u) {
        const float v = x[i];
        bad |= isnan(v) || isinf(v) ? 1u : 0u;
        amax = max(amax, abs(v));
    }
    sh_f[tid] = amax;
    sh_u[tid] = bad;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h) {
            sh_f[tid] = max(sh_f[tid], sh_f[tid + h]);
            sh_u[tid] |= sh_u[tid + h];
        }
        barrier();
    }
    const float sx = sh_f[0] / 16256.0;
    const bool finite = sh_u[0] == 0u;
    barrier(); // everyone has read the slots before they are used again
    double l1 = 0.0, ex = 0.0;
    const uint words = p.lda / 4u;
    for (uint j = tid; j < words; j += 256u) {
        uint hw = 0u, lw = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint i = 4u * j + b;
            if (i >= p.dim)
                continue;
            const double v = double(x[i]);
            double c = sx > 0.0 ? round_even(v / double(sx)) : 0.0;
            c = finite ? clamp(c, -16256.0, 16256.0) : 0.0;
            const double h = round_even(c / 128.0), l = c - 128.0 * h; // exact
            l1 += abs(v);
            ex += abs(v - double(sx) * c); // sx c is exact in double
            hw |= (uint(int(h)) & 255u) << (8u * b);
            lw |= (uint(int(l)) & 255u) << (8u * b);
        }
        y[j] = hw;
        y[words + j] = lw;
    }
    sh_d[tid] = l1;
    sh_d2[tid] = ex;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h) {
            sh_d[tid] += sh_d[tid + h];
            sh_d2[tid] += sh_d2[tid + h];
        }
        barrier();
    }
    if (tid == 0u) {
        // Any order of the double sums errs by far less than the widening.
        stat[0] = double(sx);
        stat[1] = finite ? sh_d[0] * (1.0 + 1e-12) : NAN_D;
        stat[2] = finite ? sh_d2[0] * (1.0 + 1e-12) : NAN_D;
        result[0] = 0u;
    }
}
#elif STAGE == 2
shared int sh_h[256], sh_l[256];

void main()
{
    const uint tid = gl_LocalInvocationID.x, group = gl_WorkGroupID.x + gl_WorkGroupID.y *
                                                                           gl_NumWorkGroups.x;
    const uint words = p.lda / 4u, vecs = p.lda / 16u;
    const uint row = group * ROWS + tid / LANES, lane = tid % LANES;
    int acc_h = 0, acc_l = 0; // |sum| <= dim 127 127: int32 for any dim a buffer holds
    if (row < p.vocab)
        for (uint k = lane; k < vecs; k += LANES) {
            const uvec4 c = codes[row * vecs + k];
            const uvec4 h = uvec4(y[4u * k], y[4u * k + 1u], y[4u * k + 2u], y[4u * k + 3u]);
            const uint o = words + 4u * k;
            const uvec4 l = uvec4(y[o], y[o + 1u], y[o + 2u], y[o + 3u]);
            acc_h += dot4(c.x, h.x) + dot4(c.y, h.y) + dot4(c.z, h.z) + dot4(c.w, h.w);
            acc_l += dot4(c.x, l.x) + dot4(c.y, l.y) + dot4(c.z, l.z) + dot4(c.w, l.w);
        }
    sh_h[tid] = acc_h;
    sh_l[tid] = acc_l;
    barrier();
    for (uint h = LANES / 2u; h > 0u; h >>= 1u) {
        if (lane < h) {
            sh_h[tid] += sh_h[tid + h];
            sh_l[tid] += sh_l[tid + h];
        }
        barrier();
    }
    double lo = -INF_D;
    if (lane == 0u && row < p.vocab) {
        const double sc = double(scale[row]), l1 = stat[1];
        double h_ = INF_D;
        if (!isnan(l1) && sc != 0.0) {
            const double sum = 128.0 * double(sh_h[tid]) + double(sh_l[tid]); // exact
            precise double a = sc * stat[0] * sum;
            precise double b = (l1 * err[row] + 127.0 * sc * stat[2]) * (1.0 + 1e-9) +
                               1e-9 * abs(a);
            lo = a - b;
            h_ = a + b;
        }
        hi[row] = h_;
    }
    // The largest lo of the workgroup's rows (lanes other than 0 hold -inf).
    const double most = workgroup_max(lo);
    if (tid == 0u)
        slot_lo[group] = most;
}
#elif STAGE == 3
void main()
{
    const uint tid = gl_LocalInvocationID.x;
    double t = -INF_D;
    for (uint s = tid; s < p.n_slots; s += 256u)
        t = max(t, slot_lo[s]);
    const double cut = workgroup_max(t);
    const uint stride = gl_NumWorkGroups.x * 256u;
    for (uint r = gl_WorkGroupID.x * 256u + tid; r < p.vocab; r += stride)
        if (!(hi[r] < cut)) { // the CPU's test (cpu_backend.c: screen_exact_slot)
            const uint k = atomicAdd(result[0], 1u);
            if (k < CAP)
                result[1u + k] = r;
        }
}
#elif STAGE == 4
#include "half_bits.glsl"

#define TILE 2048u // values of a row and of x in shared memory at a time
shared float sh_w[TILE], sh_x[TILE];
shared float sh_lane[8];

void main()
{
    const uint tid = gl_LocalInvocationID.x, n = min(result[0], CAP);
    for (uint k = gl_WorkGroupID.x; k < n; k += gl_NumWorkGroups.x) {
        const uint row = result[1u + k];
        precise float acc = 0.0; // lane tid's sum (tid < 8)
        for (uint t0 = 0u; t0 < p.dim; t0 += TILE) {
            const uint len = min(TILE, p.dim - t0);
            barrier(); // the tile before is used up
            for (uint i = tid; i < len; i += 256u) {
                const uint at = row * p.dim + t0 + i;
                sh_w[i] = p.f16 != 0u
                              ? half_bits_to_float((head[at / 2u] >> (16u * (at % 2u))) & 0xffffu)
                              : uintBitsToFloat(head[at]);
                sh_x[i] = x[t0 + i];
            }
            barrier();
            if (tid < 8u) // t0 and TILE are multiples of 8: lane tid holds i % 8 == tid
                for (uint i = tid; i < len; i += 8u) {
                    precise float prod = sh_w[i] * sh_x[i];
                    acc = acc + prod;
                }
        }
        if (tid < 8u)
            sh_lane[tid] = acc;
        barrier();
        if (tid == 0u) {
            precise float sum = ((sh_lane[0] + sh_lane[1]) + (sh_lane[2] + sh_lane[3])) +
                                ((sh_lane[4] + sh_lane[5]) + (sh_lane[6] + sh_lane[7]));
            result[1u + CAP + k] = floatBitsToUint(sum);
        }
    }
}
#endif
