/* attn_ref.h - the CPU's attention for the Vulkan labs' checks: one decode
 * row at position n_pos - 1 of a flat cache of [positions][n_kv][hd]
 * floats, attention_slot's arithmetic (cpu_backend.c) with exp in double
 * rounded to float, as the kernels compute it. Build with
 * -ffp-contract=off, as the Makefile does. */
#ifndef BN_VK_ATTN_REF_H
#define BN_VK_ATTN_REF_H

#include <math.h>
#include <stdlib.h>

/* dot_f32 of the CPU backend: element i in lane i % 8, each lane in order,
 * the lanes added ((0+1)+(2+3))+((4+5)+(6+7)). */
static float dot_f32(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    for (int i = 0; i < n; i++)
        acc[i % 8] = acc[i % 8] + a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* out[n_head][hd] for q[n_head][hd]. */
static void cpu_attention(const float *q, const float *kc, const float *vc, int n_pos, int n_head,
                          int n_kv, int hd, float *out)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *e = malloc((size_t)n_pos * sizeof *e);
    for (int h = 0; h < n_head; h++) {
        const int kv = h / (n_head / n_kv);
        float max = -INFINITY, sum = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            e[t] = dot_f32(q + h * hd, kc + ((size_t)t * n_kv + kv) * hd, hd) * scale;
            max = e[t] > max ? e[t] : max;
        }
        for (int t = 0; t < n_pos; t++) {
            e[t] = (float)exp((double)(e[t] - max));
            sum = sum + e[t];
        }
        const float inv = 1.0f / sum;
        for (int i = 0; i < hd; i++) {
            float o = 0.0f;
            for (int t = 0; t < n_pos; t++)
                o = o + (e[t] * inv) * vc[((size_t)t * n_kv + kv) * hd + i];
            out[h * hd + i] = o;
        }
    }
    free(e);
}

#endif
