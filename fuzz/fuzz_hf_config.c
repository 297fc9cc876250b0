/*
 * fuzz_hf_config.c - config.json parsing (bn_hf_config_load in
 * src/model/hf_dir.c) on arbitrary bytes.
 *
 * The loader takes a path, so the input goes into a memfd opened as
 * /proc/self/fd/N. When it is accepted, the result must keep the promises
 * callers rely on: terminated strings, positive sizes, at most eight EOS
 * ids, head_dim set.
 *
 * Seeds: fuzz/corpus/hf_config (tests/data/hf/configs and the fixtures'
 * config.json files).
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TERMINATED(field) (memchr((field), '\0', sizeof(field)) != NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    bn_hf_config cfg;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_hf_config_load(path, &cfg, &err);
    close(fd);
    fuzz_check_error(st, &err);
    if (st != BN_OK)
        return 0;

    if (!TERMINATED(cfg.architecture) || !TERMINATED(cfg.model_type) ||
        !TERMINATED(cfg.hidden_act) || !TERMINATED(cfg.quant_method) ||
        !TERMINATED(cfg.linear_class) || !TERMINATED(cfg.quantization_mode))
        fuzz_die("bn_hf_config_load left a string field unterminated", NULL);
    if (cfg.hidden_size < 1 || cfg.intermediate_size < 1 || cfg.num_hidden_layers < 1 ||
        cfg.num_attention_heads < 1 || cfg.num_key_value_heads < 1 || cfg.head_dim < 1 ||
        cfg.vocab_size < 1)
        fuzz_die("bn_hf_config_load accepted a size below 1", NULL);
    if (cfg.n_eos_token_ids < 0 ||
        cfg.n_eos_token_ids > (int)(sizeof cfg.eos_token_ids / sizeof cfg.eos_token_ids[0]))
        fuzz_die("bn_hf_config_load: EOS id count out of range", NULL);
    return 0;
}
