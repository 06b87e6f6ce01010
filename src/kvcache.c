// Paged allocator of the MLA latent cache blocks (see kvcache.h): a free stack of block ids, a
// block table per sequence slot, and promises made at admission.
#include "kvcache.h"

#include <string.h>

static int owed_by(const k25_kvcache *c, int s) {
    int d = c->promised[s] - c->held[s];
    return d > 0 ? d : 0;
}

int kvcache_init(k25_kvcache *c, int n_blocks, int kv_block, int max_seqs,
                 int max_blocks_per_seq, char *err) {
    memset(c, 0, sizeof *c);
    if (n_blocks <= 0 || kv_block <= 0 || max_seqs <= 0 || max_blocks_per_seq <= 0)
        return k25_err(err, "kv cache: sizes must be positive (blocks %d, block size %d, "
                            "slots %d, blocks per sequence %d)",
                       n_blocks, kv_block, max_seqs, max_blocks_per_seq);
    c->n_blocks = n_blocks;
    c->kv_block = kv_block;
    c->max_seqs = max_seqs;
    c->max_blocks_per_seq = max_blocks_per_seq;
    c->block_table = k25_malloc((size_t)max_seqs * max_blocks_per_seq * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)max_seqs * max_blocks_per_seq; i++) c->block_table[i] = -1;
    c->len = k25_calloc(max_seqs, sizeof(int));
    c->held = k25_calloc(max_seqs, sizeof(int));
    c->promised = k25_calloc(max_seqs, sizeof(int));
    c->open = k25_calloc(max_seqs, 1);
    c->free_stack = k25_malloc((size_t)n_blocks * sizeof(int32_t));
    // Low block ids come out first (easier to read in dumps).
    for (int i = 0; i < n_blocks; i++) c->free_stack[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    return 0;
}

void kvcache_destroy(k25_kvcache *c) {
    free(c->block_table);
    free(c->len);
    free(c->held);
    free(c->promised);
    free(c->open);
    free(c->free_stack);
    memset(c, 0, sizeof *c);
}

int kvcache_blocks_for(const k25_kvcache *c, int n_tokens) {
    return n_tokens <= 0 ? 0 : (n_tokens + c->kv_block - 1) / c->kv_block;
}

int kvcache_available(const k25_kvcache *c) { return c->n_free - c->owed; }

int kvcache_fits(const k25_kvcache *c, int max_tokens) {
    int nb = kvcache_blocks_for(c, max_tokens);
    return max_tokens >= 0 && nb <= c->max_blocks_per_seq && nb <= c->n_blocks;
}

int kvcache_open(k25_kvcache *c, int slot, int max_tokens) {
    if (slot < 0 || slot >= c->max_seqs || c->open[slot] || !kvcache_fits(c, max_tokens))
        return -1;
    int nb = kvcache_blocks_for(c, max_tokens);
    if (nb > kvcache_available(c)) return -1;
    c->open[slot] = 1;
    c->len[slot] = 0;
    c->held[slot] = 0;
    c->promised[slot] = nb;
    c->owed += nb;
    return 0;
}

int kvcache_grow(k25_kvcache *c, int slot, int n_tokens) {
    if (slot < 0 || slot >= c->max_seqs || !c->open[slot]) return -1;
    int need = kvcache_blocks_for(c, n_tokens);
    if (need > c->max_blocks_per_seq) return -1;
    int extra = need - c->held[slot];
    if (extra > 0) {
        // Blocks within the promise are already counted in owed; the rest must be unpromised.
        int within = owed_by(c, slot);
        int beyond = extra > within ? extra - within : 0;
        if (beyond > kvcache_available(c)) return -1;
        int32_t *row = c->block_table + (size_t)slot * c->max_blocks_per_seq;
        int before = owed_by(c, slot);
        for (int i = 0; i < extra; i++) row[c->held[slot]++] = c->free_stack[--c->n_free];
        c->owed += owed_by(c, slot) - before;
    }
    if (n_tokens > c->len[slot]) c->len[slot] = n_tokens;
    return 0;
}

void kvcache_truncate(k25_kvcache *c, int slot, int n_tokens) {
    K25_CHECK(slot >= 0 && slot < c->max_seqs && c->open[slot], "kv cache: truncate of slot %d "
              "that is not open", slot);
    K25_CHECK(n_tokens >= 0 && n_tokens <= c->len[slot], "kv cache: truncate slot %d to %d "
              "positions, it holds %d", slot, n_tokens, c->len[slot]);
    int keep = kvcache_blocks_for(c, n_tokens);
    int32_t *row = c->block_table + (size_t)slot * c->max_blocks_per_seq;
    int before = owed_by(c, slot);
    while (c->held[slot] > keep) {
        int i = --c->held[slot];
        c->free_stack[c->n_free++] = row[i];
        row[i] = -1;
    }
    c->owed += owed_by(c, slot) - before;
    c->len[slot] = n_tokens;
}

void kvcache_close(k25_kvcache *c, int slot) {
    if (slot < 0 || slot >= c->max_seqs || !c->open[slot]) return;
    kvcache_truncate(c, slot, 0);
    c->owed -= owed_by(c, slot);
    c->promised[slot] = 0;
    c->open[slot] = 0;
}

int kvcache_check(const k25_kvcache *c, char *err) {
    uint8_t *seen = k25_calloc(c->n_blocks, 1);
    int rc = 0, owed = 0, held = 0;
    for (int i = 0; i < c->n_free && rc == 0; i++) {
        int b = c->free_stack[i];
        if (b < 0 || b >= c->n_blocks || seen[b]++)
            rc = k25_err(err, "kv cache: free stack entry %d holds bad or repeated block %d", i,
                         b);
    }
    for (int s = 0; s < c->max_seqs && rc == 0; s++) {
        const int32_t *row = c->block_table + (size_t)s * c->max_blocks_per_seq;
        if (!c->open[s] && (c->held[s] || c->promised[s] || c->len[s]))
            rc = k25_err(err, "kv cache: closed slot %d still holds blocks", s);
        else if (kvcache_blocks_for(c, c->len[s]) != c->held[s])
            rc = k25_err(err, "kv cache: slot %d has length %d but holds %d blocks", s, c->len[s],
                         c->held[s]);
        for (int i = 0; i < c->max_blocks_per_seq && rc == 0; i++) {
            int b = row[i];
            if (i >= c->held[s]) {
                if (b != -1) rc = k25_err(err, "kv cache: slot %d entry %d past its blocks is %d",
                                          s, i, b);
            } else if (b < 0 || b >= c->n_blocks || seen[b]++) {
                rc = k25_err(err, "kv cache: slot %d entry %d holds bad or shared block %d", s, i,
                             b);
            }
        }
        owed += owed_by(c, s);
        held += c->held[s];
    }
    if (rc == 0 && held + c->n_free != c->n_blocks)
        rc = k25_err(err, "kv cache: %d held + %d free != %d blocks", held, c->n_free,
                     c->n_blocks);
    if (rc == 0 && owed != c->owed)
        rc = k25_err(err, "kv cache: owed count %d, slots owe %d", c->owed, owed);
    if (rc == 0 && c->owed > c->n_free)
        rc = k25_err(err, "kv cache: %d blocks promised but only %d free", c->owed, c->n_free);
    free(seen);
    return rc;
}
