/* The registry of encodings: one row per format, pointing at the module
 * that implements it. */
#include "qtype.h"

#include "fmt_bitnet.h"
#include "fmt_dense.h"
#include "fmt_tl.h"
#include "fmt_tq.h"

static const bn_qtype_info infos[] = {
    {BN_QTYPE_F32, "f32", 1, 4, false, bn_dequantize_row_f32, bn_quantize_row_f32, NULL, NULL,
     NULL, NULL},
    {BN_QTYPE_F16, "f16", 1, 2, false, bn_dequantize_row_f16, bn_quantize_row_f16, NULL, NULL,
     NULL, NULL},
    {BN_QTYPE_BF16, "bf16", 1, 2, false, bn_dequantize_row_bf16, bn_quantize_row_bf16, NULL, NULL,
     NULL, NULL},
    {BN_QTYPE_Q8_0, "q8_0", 32, 34, false, bn_dequantize_row_q8_0, bn_quantize_row_q8_0, NULL,
     NULL, NULL, NULL},
    {BN_QTYPE_Q4_K, "q4_k", 256, 144, false, bn_dequantize_row_q4_k, NULL, NULL, NULL, NULL, NULL},
    {BN_QTYPE_Q6_K, "q6_k", 256, 210, false, bn_dequantize_row_q6_k, NULL, NULL, NULL, NULL, NULL},
    {BN_QTYPE_TQ1_0, "tq1_0", 256, 54, true, bn_dequantize_row_tq1_0, bn_quantize_row_tq1_0,
     bn_unpack_tq1_0, bn_pack_tq1_0, NULL, NULL},
    {BN_QTYPE_TQ2_0, "tq2_0", 256, 66, true, bn_dequantize_row_tq2_0, bn_quantize_row_tq2_0,
     bn_unpack_tq2_0, bn_pack_tq2_0, NULL, NULL},
    {BN_QTYPE_I2_S, "i2_s", 128, 32, true, NULL, NULL, bn_unpack_i2s, bn_pack_i2s,
     bn_i2s_tensor_bytes, bn_i2s_shape_ok},
    {BN_QTYPE_TL1, "tl1", 1, 1, true, NULL, NULL, bn_unpack_tl1, bn_pack_tl1, bn_tl1_tensor_bytes,
     bn_tl1_shape_ok},
    {BN_QTYPE_TL2, "tl2", 1, 1, true, NULL, NULL, bn_unpack_tl2, bn_pack_tl2, bn_tl2_tensor_bytes,
     bn_tl2_shape_ok},
    {BN_QTYPE_HF_PACKED, "hf_packed", 1, 1, true, NULL, NULL, bn_unpack_hf_packed,
     bn_pack_hf_packed, bn_hf_packed_tensor_bytes, bn_hf_packed_shape_ok},
    {BN_QTYPE_BITNET32_F16, "bitnet32_f16", 32, 10, true, bn_dequantize_row_bitnet32,
     bn_quantize_row_bitnet32, bn_unpack_bitnet32, bn_pack_bitnet32, NULL, NULL},
};
#define N_INFOS (sizeof infos / sizeof infos[0])

const bn_qtype_info *bn_qtype_get(bn_qtype type)
{
    for (size_t i = 0; i < N_INFOS; i++)
        if (infos[i].type == type)
            return &infos[i];
    return NULL;
}

bn_status bn_qtype_tensor_size(bn_qtype type, int64_t rows, int64_t cols, size_t *bytes,
                               bn_error *err)
{
    const bn_qtype_info *q = bn_qtype_get(type);
    if (!q)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "unknown tensor type %d", (int)type);
    if (rows <= 0 || cols <= 0 || rows > (INT64_C(1) << 40) / cols)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s tensor shape %lld x %lld is empty or too large", q->name,
                            (long long)rows, (long long)cols);
    if (cols % q->block_elems != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a type whose block divides the row length",
                            "%s needs rows whose length is a multiple of %d; got %lld", q->name,
                            q->block_elems, (long long)cols);
    if (q->shape_ok && !q->shape_ok(rows, cols, err))
        return err ? err->status : BN_ERR_INVALID_ARGUMENT;
    if (q->tensor_bytes)
        *bytes = q->tensor_bytes(rows, cols);
    else
        *bytes = (size_t)(rows * (cols / q->block_elems) * q->block_bytes);
    return BN_OK;
}
