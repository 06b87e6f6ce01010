// The BPE merge written the plain way, as a reference for the fuzz targets: a piece that is a
// token is that token; otherwise start from single bytes and repeatedly merge the adjacent
// pair whose concatenation has the lowest rank (leftmost on ties) until no concatenation is a
// token (tiktoken's byte_pair_merge). Quadratic; the fuzzers keep pieces short.
#pragma once
#include "bpe.h"
#include "fuzz_common.h"

// Appends the ids of s[0..len) to out; -1 when a byte has no token.
static inline int fuzz_bpe_reference(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out) {
    if (len == 0) return 0;
    int32_t whole = bpe_rank(v, s, len);
    if (whole >= 0) {
        bpe_ids_push(out, whole);
        return 0;
    }
    size_t *start = malloc((len + 1) * sizeof *start); // part i is s[start[i] .. start[i+1])
    if (!start) abort();
    size_t np = len;
    for (size_t i = 0; i <= len; i++) start[i] = i;
    for (size_t i = 0; i < len; i++)
        if (bpe_rank(v, s + i, 1) < 0) {
            free(start);
            return -1;
        }
    for (;;) {
        int32_t best = -1;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < np; i++) {
            int32_t r = bpe_rank(v, s + start[i], start[i + 2] - start[i]);
            if (r >= 0 && (best < 0 || r < best)) best = r, bi = i;
        }
        if (best < 0) break;
        memmove(start + bi + 1, start + bi + 2, (np - bi - 1) * sizeof *start);
        np--;
    }
    for (size_t i = 0; i < np; i++) bpe_ids_push(out, bpe_rank(v, s + start[i], start[i + 1] - start[i]));
    free(start);
    return 0;
}
