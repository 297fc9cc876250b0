/* batch_rows.c - the checks every batching backend makes of a pass's rows
 * (batch_rows.h). */
#include "batch_rows.h"

bn_status bn_batch_rows_check(const bn_batch_rows *r, int64_t kv_len, int64_t n_blocks,
                              int64_t max_seqs, int64_t max_blocks, const char *who,
                              bn_error *err)
{
    for (int64_t i = 0; i < r->n_rows; i++) {
        const int64_t p = r->pos[i], blk = p / r->block_size;
        const int32_t s = r->seq[i];
        if (p < 0 || p >= kv_len || s < 0 || (max_seqs > 0 && s >= max_seqs) ||
            blk >= r->table_len[s] || (max_blocks > 0 && blk >= max_blocks) ||
            r->tables[s][blk] < 0 || r->tables[s][blk] >= n_blocks)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "%s forward_rows: row %lld (sequence %d, position %lld) has no "
                                "block in the cache",
                                who, (long long)i, (int)s, (long long)p);
    }
    for (int64_t k = 0; k < r->n_logits; k++)
        if (r->logit_rows[k] < 0 || r->logit_rows[k] >= r->n_rows ||
            (k > 0 && r->logit_rows[k] <= r->logit_rows[k - 1]))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "%s forward_rows: logit rows must be rows, in increasing order",
                                who);
    return BN_OK;
}
