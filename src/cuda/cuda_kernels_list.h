/* The CUDA kernels this build contains, for `bitnet devices`: one line
 * each, "name: what it does (file)". Kept next to the kernels so a new
 * kernel file adds its line here; the variant counts come from the
 * launchers' own constants. */
#ifndef BN_CUDA_KERNELS_LIST_H
#define BN_CUDA_KERNELS_LIST_H

#include "w2a8_cuda.h"

#define BN_CUDA_KERNELS_STR_(x) #x
#define BN_CUDA_KERNELS_STR(x) BN_CUDA_KERNELS_STR_(x)

static const char *const bn_cuda_kernel_list[] = {
    "w2a8_gemv: ternary x int8 matvec, " BN_CUDA_KERNELS_STR(BN_W2A8_GEMV_VARIANTS)
    " variants: split-K, row staged per block or cluster, bulk copies, PDL (w2a8_kernels.cu)",
    "w2a8_gemm: ternary x int8 GEMM, " BN_CUDA_KERNELS_STR(BN_W2A8_GEMM_VARIANTS)
    " variants: tiled and skinny mma, cp.async pipelined (w2a8_gemm_pipelined.cu), "
    "Hopper wgmma warp-specialized with TMA and stream-K (w2a8_gemm_wgmma.cu), "
    "GEMV rows and mma rows for M <= 64",
    "quantize_rows: per-row absmax int8 activations",
    "embed_rows: embedding rows from F32/F16/BF16/Q8_0/Q4_K/Q6_K/TQ2_0 (ops_kernels.cu)",
    "attention_decode, attention_prefill: GQA attention over fp16/bf16 KV (attention_kernels.cu)",
    "attention_prefill_tiled: causal fp32 prefill attention, register tiles, in up to 8 "
    "merged parts (attn_prefill_tiled.cu)",
    "backend forward pass: norm + int8 (residual, squared ReLU), q|k|v scale + RoPE + KV "
    "store, decode attention with the q|k|v product in thread-block clusters, GEMVs with "
    "residual add and gate|up pairs (cuda_backend_kernels.cu)",
    "lm_head_gemv: F32/F16/BF16 LM head, x held in shared memory (cuda_backend_kernels.cu)",
    "lm_head_screen_int8: greedy LM head over an int8 copy with exact bounds (head_screen.cu)",
    "sample: greedy / top-k / top-p on the device (sample_kernels.cu)",
    NULL,
};

#endif
