/* The CUDA kernels this build contains, for `bitnet devices`: one line
 * each, "name: what it does (file)". Kept next to the kernels so a new
 * kernel file adds its line here. */
#ifndef BN_CUDA_KERNELS_LIST_H
#define BN_CUDA_KERNELS_LIST_H

#include "w2a8_cuda.h"

#define BN_CUDA_KERNELS_STR_(x) #x
#define BN_CUDA_KERNELS_STR(x) BN_CUDA_KERNELS_STR_(x)

static const char *const bn_cuda_kernel_list[] = {
    "w2a8_gemv: ternary x int8 matvec, split-K, row staged per block or cluster, PDL "
    "(w2a8_gemv.cu)",
    "w2a8_gemm: ternary x int8 GEMM, the kernel picked by a table (w2a8_select.c): GEMV "
    "rows and mma rows for M <= 64 "
    "(w2a8_gemm_rows.cu), tiled and cp.async pipelined mma (w2a8_gemm_pipelined.cu), "
    "Hopper wgmma warp-specialized with TMA and stream-K (w2a8_gemm_wgmma.cu)",
    "quantize_rows: per-row absmax int8 activations (w2a8_quantize.cu)",
    "embed_rows: embedding rows from F32/F16/BF16/Q8_0/Q4_K/Q6_K/TQ2_0 (ops_kernels.cu)",
    "attention_decode, attention_prefill: GQA attention over fp16/bf16 KV (attention_kernels.cu)",
    "attention_prefill_tiled: causal fp32 prefill attention, register tiles, in up to 8 "
    "merged parts, over a contiguous or a paged cache (attn_prefill_tiled.cu)",
    "attention_paged: rows of many sequences over the paged fp32/fp16/e4m3 KV cache, position "
    "ranges merged (attn_paged.cu)",
    "lm_head_rows: the batched pass's head input as 16-bit parts for one GEMM over every row "
    "(rows_head.cu)",
    "lm_head_rows_pick: greedy tokens of many rows from a GEMM of their first parts, exact "
    "logits for the vocabulary rows its bounds leave (rows_head_pick.cu)",
    "norm_quantize: RMSNorm + int8 with the CPU's rounding (residual, squared ReLU, "
    "embedding row sources) and the output norm (norm_quantize.cu)",
    "qkv_rope_kv_store: q|k|v scales + RoPE + KV store, the RoPE table (rope_qkv.cu)",
    "attention_decode_f32: decode attention over the fp32 cache with its q|k|v epilogue, "
    "merged in thread-block clusters (the q|k|v product inside where it fits) or by a "
    "ticket (attn_decode.cu)",
    "attention_prefill_f32: warp-per-row fp32 prefill attention (attn_prefill.cu)",
    "lm_head_gemv: F32/F16/BF16 LM head, x held in shared memory (lm_head.cu)",
    "lm_head_screen_int8: greedy LM head over an int8 copy with exact bounds (head_screen.cu)",
    "sample: greedy / top-k / top-p on the device, one row or many (sample_kernels.cu)",
    NULL,
};

#endif
