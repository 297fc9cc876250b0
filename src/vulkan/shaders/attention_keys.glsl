// What attention.glsl and attention_split.glsl share: their buffers but
// binding 5 (scratch or partials), and the key side - a key's cache row and
// its score. Each declares the Params fields max_blocks, block_size,
// cache_rows, layer_off, kv_dim, head_dim and scale and the shared q_sh
// these read.

layout(std430, binding = 0) readonly buffer Info { int info[]; };   // [rows][2]: seq, pos
layout(std430, binding = 1) readonly buffer Tables { int tables[]; }; // [n_seq][max_blocks]
layout(std430, binding = 2) readonly buffer Q { float q[]; };       // [rows][n_head * head_dim]
layout(std430, binding = 3) readonly buffer KCache { float kc[]; };
layout(std430, binding = 3) readonly buffer KCache4 { vec4 kc4[]; }; // the same buffer
layout(std430, binding = 4) readonly buffer VCache { float vc[]; };
layout(std430, binding = 6) writeonly buffer Att { float att[]; };  // as q

// Where position t of sequence seq starts in the cache (floats), or
// ok = false when its block is outside the cache.
uint kv_at(uint seq, uint t, inout bool ok)
{
    const int block = tables[seq * p.max_blocks + t / p.block_size];
    if (block < 0 || uint(block) >= p.cache_rows / p.block_size + 1u) {
        ok = false;
        return 0u;
    }
    const uint cr = uint(block) * p.block_size + t % p.block_size;
    ok = ok && cr < p.cache_rows;
    return p.layer_off + cr * p.kv_dim;
}

// The score of the key at kb: the CPU's dot_f32 of q and k (eight lanes,
// element i in lane i % 8, each in order, then ((0+1)+(2+3))+((4+5)+(6+7))),
// times scale. KEY_CHUNK of the key's values are loaded before any is used
// (each chunk's loads wait for memory once), as vec4s where the keys start
// on 16 bytes (NVIDIA's H200: a decode row's attention at context 160 27.5
// us a dispatch with scalar loads, 19.3 with 16 values as vec4s;
// dev/vulkan/attention_chain.c). attention.glsl takes 16 (64 made the
// prompt passes 7-14 % slower: registers); attention_split.glsl 64 (its
// partials 29.5 us a layer against 33.3 with 16 at a 4000-token prompt,
// 14.3 against 15.7 at 1000, 12.4 against 16.0 at 384). The sums are the
// same either way.
#ifndef KEY_CHUNK
#define KEY_CHUNK 16u
#endif
// Whether a key's values lie on 16 bytes (then read as vec4s).
bool keys_by_vec4()
{
    return p.head_dim % 4u == 0u && p.kv_dim % 4u == 0u && p.layer_off % 4u == 0u;
}

// KEY_CHUNK values of the cache from float `at` on into the array kv, as
// vec4s where by_vec4 (a macro, so the loads sit in the loop as written:
// the split attention's 64 are registers).
#define LOAD_KEY_CHUNK(kv, at, by_vec4)                                                    \
    if (by_vec4) {                                                                         \
        for (uint u_ = 0u; u_ < KEY_CHUNK / 4u; u_++) {                                    \
            const vec4 a_ = kc4[(at) / 4u + u_];                                           \
            kv[4u * u_] = a_.x;                                                            \
            kv[4u * u_ + 1u] = a_.y;                                                       \
            kv[4u * u_ + 2u] = a_.z;                                                       \
            kv[4u * u_ + 3u] = a_.w;                                                       \
        }                                                                                  \
    } else {                                                                               \
        for (uint l_ = 0u; l_ < KEY_CHUNK; l_++)                                           \
            kv[l_] = kc[(at) + l_];                                                        \
    }

float score(uint kb)
{
    const uint hd = p.head_dim;
    precise float acc[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    uint i = 0u;
    const bool by_vec4 = keys_by_vec4();
    for (; i + KEY_CHUNK <= hd; i += KEY_CHUNK) {
        float kv[KEY_CHUNK];
        LOAD_KEY_CHUNK(kv, kb + i, by_vec4)
        for (uint r = 0u; r < KEY_CHUNK; r += 8u)
            for (uint l = 0u; l < 8u; l++)
                acc[l] = acc[l] + q_sh[i + r + l] * kv[r + l];
    }
    for (; i + 8u <= hd; i += 8u)
        for (uint l = 0u; l < 8u; l++)
            acc[l] = acc[l] + q_sh[i + l] * kc[kb + i + l];
    for (uint l = 0u; i < hd; i++, l++)
        acc[l] = acc[l] + q_sh[i] * kc[kb + i];
    precise float s =
        (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
        p.scale;
    return s;
}

#ifdef TREE_N
// The workgroup's largest v by a tree over the including shader's shared
// float red[TREE_N] (TREE_N its invocations; NaN never wins, as C's s > m).
// Reached by the whole workgroup.
float tree_max(float v)
{
    const uint tid = gl_LocalInvocationID.x;
    barrier(); // red's last use is over
    red[tid] = v;
    barrier();
    for (uint h = TREE_N / 2u; h > 0u; h >>= 1u) {
        if (tid < h && red[tid + h] > red[tid])
            red[tid] = red[tid + h];
        barrier();
    }
    return red[0];
}
#endif
