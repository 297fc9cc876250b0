/*
 * convert.h - Hugging Face BitNet directories to GGUF files that other
 * runtimes load, in the conventions of the converter each runtime uses.
 *
 *   i2_s    Microsoft bitnet.cpp (utils/convert-helper-bitnet.py: the HF
 *           checkpoint through convert-ms-to-gguf-bitnet.py, then
 *           llama-quantize I2_S with --token-embedding-type f16 as
 *           setup_env.py --quant-embd does):
 *             general.architecture "bitnet-25", general.file_type 40
 *             (LLAMA_FTYPE_MOSTLY_I2_S), projections I2_S (ggml type 36:
 *             codes, then the float32 scale, padded to n/4 + 32 bytes),
 *             token_embd F16, norms F32, tied models without output.weight;
 *             tokenizer "gpt2" without tokenizer.ggml.pre, token scores
 *             (0 for the BPE vocabulary, -1000 for added tokens),
 *             add_bos_token true.
 *   tq1_0   upstream llama.cpp (convert_hf_to_gguf.py, BitnetModel):
 *   tq2_0     general.architecture "bitnet", general.file_type 36 / 37 / 1
 *   f16       (MOSTLY_TQ1_0 / MOSTLY_TQ2_0 / MOSTLY_F16), rope.scaling.type
 *             "linear" and rope.scaling.factor 1.0; the weight_scale is
 *             folded into the weights (code * scale), so no ".scale"
 *             tensors; projections TQ1_0/TQ2_0 (block scale = the tensor
 *             scale as fp16) or F16, falling back to F16 for a tensor whose
 *             rows are not a multiple of 256 as the converter does;
 *             token_embd and output F16; 1-D tensors and norms F32;
 *             tokenizer "gpt2" with pre "llama-bpe".
 *
 * Both: metadata keys <arch>.vocab_size, context_length, embedding_length,
 * block_count, feed_forward_length, rope.dimension_count,
 * attention.head_count, attention.head_count_kv,
 * attention.layer_norm_rms_epsilon, rope.freq_base; tensor names
 * token_embd, output_norm, [output], blk.N.{attn_norm, attn_q, attn_k,
 * attn_v, attn_output, attn_sub_norm, ffn_norm, ffn_gate, ffn_up, ffn_down,
 * ffn_sub_norm}.weight, Q/K rows not permuted; tokenizer tokens (GPT-2
 * byte-to-unicode strings as in tokenizer.json), token_type (NORMAL 1,
 * CONTROL 3 for special added tokens, USER_DEFINED 4 for other added
 * tokens, UNUSED 5 for "[PADn]" fillers up to the model's vocab), merges,
 * bos/eos/eot ids.
 *
 * The projections come from bn_checkpoint_projection_codes (packed checkpoints
 * as stored, bf16 master weights quantized with absmean as the model was
 * trained), so the file computes exactly what the source does, up to the
 * fp16 rounding of the scale in TQ1_0/TQ2_0/F16.
 */
#ifndef BN_CONVERT_H
#define BN_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "bitnet.h"

typedef enum bn_convert_type {
    BN_CONVERT_I2_S,
    BN_CONVERT_TQ2_0,
    BN_CONVERT_TQ1_0,
    BN_CONVERT_F16
} bn_convert_type;

/* "i2_s", "tq2_0", "tq1_0", "f16" -> type; false when unknown. */
bool bn_convert_type_parse(const char *name, bn_convert_type *out);
const char *bn_convert_type_name(bn_convert_type t);

/* stage is "packing" (done/total = tensors) or "writing" (bytes). */
typedef void (*bn_convert_progress_fn)(void *ctx, const char *stage, uint64_t done,
                                       uint64_t total);

typedef struct bn_convert_report {
    char architecture[32];
    int n_tensors;
    int n_ternary;         /* projections in the requested encoding      */
    int n_f16_fallback;    /* projections written as F16 instead         */
    uint64_t file_bytes;
} bn_convert_report;

/* Converts the directory and writes out_path atomically through
 * bn_gguf_writer_finish (a temporary file of its own, synced and renamed at
 * the end; bn_gguf_writer_remove_temp_files removes it from a signal
 * handler). report may be NULL. Errors: BN_ERR_IO when out_path exists and
 * is not a regular file (checked before any work) or cannot be written;
 * BN_ERR_FORMAT when a value the chosen encoding stores as F16 (embedding,
 * output, any scale but I2_S's) is outside the F16 range, since the file
 * would not load. */
bn_status bn_convert_hf_to_gguf(const char *hf_dir, const char *out_path, bn_convert_type type,
                                bn_convert_progress_fn progress, void *ctx,
                                bn_convert_report *report, bn_error *err);

#endif
