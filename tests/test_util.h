// Pieces every C test program shares: the failure count and the check macros that report a
// failed condition and keep going, a small deterministic random stream, and the tiny-model
// stack (config/tiny.ini, synthetic weights, a backend and the model) that the engine and
// speculative-decoding tests build. Header-only: the Makefile builds each tests/test_*.c as a
// program of its own.
#pragma once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "instance.h"

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

// Failed checks so far; a test exits non-zero when any failed.
static int test_failures;

// One failure line on stderr: "FAIL [rank R ]file:line: [condition: ]message". The rank is
// named once MPI is up (dist_init sets k25_log_rank), so multi-rank runs say who failed.
static inline void test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void test_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    test_failures++;
    fprintf(stderr, "FAIL ");
    if (k25_log_rank >= 0) fprintf(stderr, "rank %d ", k25_log_rank);
    fprintf(stderr, "%s:%d: ", file, line);
    if (cond) fprintf(stderr, "%s: ", cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

// CHECK(cond, fmt, ...): on failure prints the condition's text and the message.
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) test_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)

// EXPECT(cond, fmt, ...): the same for checks whose message says on its own what went wrong.
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) test_fail(__FILE__, __LINE__, NULL, __VA_ARGS__);                             \
    } while (0)

// ------------------------------------------------------------------------------------------
// Random stream
// ------------------------------------------------------------------------------------------

// xorshift64: the next value of *state in [0, n). *state must start non-zero.
static inline int test_rnd(uint64_t *state, int n) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (int)(*state % (uint64_t)n);
}

// ------------------------------------------------------------------------------------------
// The tiny model stack
// ------------------------------------------------------------------------------------------

// config/tiny.ini with one CPU thread. Dies on error.
static inline void test_tiny_config(k25_config *cfg) {
    char err[K25_ERR_LEN] = "";
    config_init_defaults(cfg);
    if (config_load_ini(cfg, "config/tiny.ini", err) != 0) K25_DIE("%s", err);
    cfg->threads = 1;
}

// Splits the world for cfg and opens synthetic weights (seed 1) on `backend` with the model
// options mo. cfg and d must outlive the instance. Dies on error.
static inline void test_open_instance(k25_instance *in, const k25_config *cfg, k25_dist *d,
                                      const char *backend, k25_model_opts mo) {
    char err[K25_ERR_LEN] = "";
    if (instance_setup_dist(d, cfg, err) != 0) K25_DIE("%s", err);
    k25_instance_opts io = {.synth_seed = 1, .backend = backend, .model = mo};
    if (instance_open(in, cfg, d, &io, err) != 0) K25_DIE("%s", err);
}

// A fresh directory under /tmp (template ends in XXXXXX) made by rank 0 and named to every
// rank of d's world, for files that rank 0 writes and all ranks read.
static inline void test_shared_tmpdir(const k25_dist *d, char dir[256]) {
    if (d->world_rank == 0 && !mkdtemp(dir)) K25_DIE("mkdtemp failed");
    MPI_CHECK(MPI_Bcast(dir, 256, MPI_CHAR, 0, d->world));
}

// Rank 0 removes a directory made by test_shared_tmpdir (a leftover is only a warning).
static inline void test_remove_tmpdir(const k25_dist *d, const char *dir) {
    if (d->world_rank != 0) return;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

// Reference decoding of one request alone, straight on model_step (no engine, no cache
// allocator): the whole prompt in one step, then one token per step, the sequence in slot
// `slot` of a block table of max_seqs rows holding ctx / kv_block contiguous blocks each. The
// sampling counter is the index of the token drawn. Stops after max_new tokens or, unless
// ignore_eos, at an end-of-sequence id of eos_cfg. Returns the number of tokens put in out.
static inline int test_decode_alone(k25_model *m, const k25_config *eos_cfg,
                                    const int32_t *prompt, int n_prompt, int max_new,
                                    int ignore_eos, k25_sampling sp, int slot, int max_seqs,
                                    int ctx, int kv_block, int32_t *out) {
    int mbps = ctx / kv_block;
    int32_t *table = k25_malloc(sizeof(int32_t) * (size_t)(max_seqs * mbps));
    for (int i = 0; i < max_seqs * mbps; i++) table[i] = -1;
    for (int i = 0; i < mbps; i++) table[slot * mbps + i] = i;
    size_t n = (size_t)(n_prompt > 0 ? n_prompt : 1);
    int32_t *tok = k25_malloc(sizeof(int32_t) * n), *pos = k25_malloc(sizeof(int32_t) * n);
    int32_t *seq = k25_malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n_prompt; i++) tok[i] = prompt[i], pos[i] = i, seq[i] = slot;
    k25_batch b = {.T = n_prompt, .tokens = tok, .pos = pos, .seq = seq,
                   .block_table = table, .max_seqs = max_seqs, .max_blocks_per_seq = mbps};
    int32_t row = n_prompt - 1, next;
    int n_out = 0;
    for (;;) {
        sp.counter = (uint64_t)n_out;
        model_step(m, &b, &row, 1, &sp, &next, NULL);
        out[n_out++] = next;
        if ((!ignore_eos && config_is_eos(eos_cfg, next)) || n_out == max_new) break;
        tok[0] = next;
        pos[0] = n_prompt + n_out - 1;
        b.T = 1;
        row = 0;
    }
    free(table);
    free(tok);
    free(pos);
    free(seq);
    return n_out;
}
