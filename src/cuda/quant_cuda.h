/*
 * quant_cuda.h - C launchers for ternary weight quantization on the GPU
 * (quant_kernels.cu): the absmean rule of quant_rules.h, packing the codes
 * into I2_S, TQ2_0, TL1 and TL2, and dequantizing I2_S.
 *
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return cudaGetLastError(), or cudaErrorInvalidValue for arguments
 * the kernels cannot honour (checked before anything is launched).
 *
 * Numerical contract, against the CPU (src/quant):
 *   - the packed bytes are bit-identical to bn_qtype_get(type)->pack of the
 *     same codes and scale (every byte of the tensor is written, padding
 *     included);
 *   - mean|W| is accumulated in double, like bn_quantize_weights_absmean,
 *     but in a fixed blocked order (8192-element chunks, then the chunks'
 *     sums), not left to right. The double sums differ in their last bits,
 *     so the float mean can differ from the CPU's by one ulp when the exact
 *     mean lies within ~1e-16 (relative) of a rounding boundary between two
 *     floats: practically never, but possible. Then q = 1/mean differs by
 *     an ulp and a code can differ only where |w * q| is within about 2 ulp
 *     of 0.5. The order is fixed, so results are the same run to run and
 *     on every GPU.
 */
#ifndef BN_QUANT_CUDA_H
#define BN_QUANT_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt_tl.h"
#include "qtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device bytes of scratch bn_cuda_absmean needs for n weights. */
size_t bn_cuda_absmean_workspace_bytes(int64_t n);

/* mean|w| over n weights into q_scale[0] = q = 1 / max(mean, 1e-5) (the
 * multiplier of the codes rule) and q_scale[1] = 1 / q (the tensor scale),
 * both device floats, as bn_quantize_weights_absmean: a NaN weight makes the
 * mean NaN and so 1e-5; an infinite one makes q 0 (all codes 0) and the
 * scale infinite. */
cudaError_t bn_cuda_absmean(const float *w, int64_t n, void *workspace, float *q_scale,
                            cudaStream_t stream);

/* codes[i] = clamp(rint(w[i] * q), -1, 1) with q = q_scale[0] (device),
 * round half to even, NaN -> 0: bn_round_clamp of quant_rules.h. */
cudaError_t bn_cuda_ternary_codes(const float *w, int64_t n, const float *q_scale, int8_t *codes,
                                  cudaStream_t stream);

/* Packers. codes are [rows][cols] values in {-1, 0, +1} (anything else
 * gives unspecified bytes; the CPU packers reject it), dst holds
 * bn_qtype_tensor_size(type, rows, cols) bytes.
 *
 * I2_S: cols % 128 == 0; the float scale follows the codes, then zeros up
 * to rows*cols/4 + 32 bytes. */
cudaError_t bn_cuda_pack_i2s(const int8_t *codes, int64_t rows, int64_t cols, float scale,
                             uint8_t *dst, cudaStream_t stream);
/* TQ2_0: cols % 256 == 0; each block's d is fp16(scale) (rounded as
 * bn_fp32_to_fp16) when the block holds a non-zero code, else 0. The CPU
 * packer rejects a scale that is not finite in fp16; the caller checks. */
cudaError_t bn_cuda_pack_tq2_0(const int8_t *codes, int64_t rows, int64_t cols, float scale,
                               uint8_t *dst, cudaStream_t stream);
/* TL1 / TL2 with an explicit tiling (bn_tl_tiling_for_shape or a
 * kernel_config.ini); the tiling must pass bn_tl_tiling_check. Each output
 * byte is gathered by one thread from the codes with the index mapping of
 * bn_pack_tl1_tiled / bn_pack_tl2_tiled; TL2's padding is zeroed. The
 * tensors hold no scale (it is the "<name>_scale" tensor). */
cudaError_t bn_cuda_pack_tl1(const int8_t *codes, int64_t rows, int64_t cols,
                             const bn_tl_tiling *tiling, uint8_t *dst, cudaStream_t stream);
cudaError_t bn_cuda_pack_tl2(const int8_t *codes, int64_t rows, int64_t cols,
                             const bn_tl_tiling *tiling, uint8_t *dst, cudaStream_t stream);

/* Dequantizes a whole I2_S tensor into y [rows][cols] (cols % 128 == 0),
 * bit for bit as bn_dequantize_tensor: (float)code * scale, with the scale
 * passed in (the caller reads it from the tensor and checks it is finite,
 * as the CPU unpacker does). A code 3 (invalid: the CPU unpacker rejects
 * the tensor) sets *bad (a device int the caller zeroed; may be NULL) and
 * yields NaN. TQ2_0 is a row format: bn_cuda_embed_rows (ops_cuda.h)
 * dequantizes it. */
cudaError_t bn_cuda_dequantize_i2s(const void *src, int64_t rows, int64_t cols, float scale,
                                   float *y, int *bad, cudaStream_t stream);

/* cudaSuccess when the current device can run these kernels (the binary
 * holds code for it); otherwise the reason, e.g.
 * cudaErrorNoKernelImageForDevice. */
cudaError_t bn_cuda_quant_probe(void);

/* The device quantizer's GPU table (quant_gpu_ops.c): quantize_weights
 * (host floats in, host packed bytes out; i2_s, tq2_0, tl1, tl2),
 * quantize_activations (bn_cuda_quantize_rows) and dequantize (i2_s and
 * the row formats of bn_cuda_embed_rows: f32, f16, bf16, q8_0, q4_k, q6_k,
 * tq2_0). Anything else returns BN_ERR_UNSUPPORTED, so the quantizer falls
 * back to the CPU; results equal the CPU path's bit for bit (weights: see
 * the absmean note above). Runs on the calling thread's current device and
 * its per-thread default stream, synchronously. NULL when no CUDA device
 * is usable. */
struct bn_gpu_quant_ops;
const struct bn_gpu_quant_ops *bn_cuda_quant_ops(void);

#ifdef __cplusplus
}
#endif

#endif
