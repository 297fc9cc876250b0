/* The CUDA kernels this build contains, for `bitnet devices`: one line
 * each, "name: what it does". Kept next to the kernels so a new kernel
 * file adds its line here. */
#ifndef BN_CUDA_KERNELS_LIST_H
#define BN_CUDA_KERNELS_LIST_H

static const char *const bn_cuda_kernel_list[] = {
    "w2a8_gemv: ternary x int8 matvec, split-K, 5 variants (w2a8_kernels.cu)",
    "w2a8_gemm_mma_rows: the GEMV's weight stream into int8 mma fragments, M <= 64",
    "w2a8_gemm_skinny: int8 tensor cores, fragments from packed weights (tests, bench)",
    "w2a8_gemm_tiled: int8 tensor cores, 64x64 tiles, M > 32",
    "quantize_rows: per-row absmax int8 activations",
    "rmsnorm, rmsnorm_quantize: RMSNorm, fused with int8 quantization (ops_kernels.cu)",
    "rope_neox: rotate-half RoPE at device-held positions",
    "relu2_mul, relu2_mul_norm_quantize: squared-ReLU gate x up, fused with sub-norm",
    "add_rows, store_rows: residual add; fp32 -> fp16/bf16 KV stores",
    "embed_rows: embedding rows from F32/F16/BF16/Q8_0/Q4_K/Q6_K/TQ2_0",
    "absmean, pack_i2s/tq2_0/tl1/tl2, dequantize_i2s: weight quantization (quant_kernels.cu)",
    "attention_decode, attention_prefill: GQA attention over fp16/bf16 KV (attention_kernels.cu)",
    "lm_head: F16/BF16 through cuBLAS, or int8 rows (lm_head.c)",
    "sample: greedy / top-k / top-p on the device (sample_kernels.cu)",
    "convert_f32_f16/bf16: precision conversion for mixed-precision matmul",
    NULL,
};

#endif
