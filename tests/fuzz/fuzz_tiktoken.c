// Fuzz target: the tiktoken.model reader ("base64(token) rank" lines), from memory
// (bpe_vocab_parse, the input with its exact length and no NUL) and through the file loader
// (tokenizer_load), plus the BPE merge on the vocabulary it produced.
//
// An accepted vocabulary must be consistent: every rank's bytes look up to that rank, the
// single-byte table agrees with the lookup, and tokenizer_load accepts the same file with the
// same number of base tokens. Then a piece of the input is BPE-encoded by bpe_encode_piece, by
// both merge strategies, and by the plain reference merge (fuzz_bpe_ref.h): all must agree
// and the ids must spell the piece.
#include "bpe.h"
#include "common.h"
#include "fuzz_bpe_ref.h"
#include "fuzz_common.h"
#include "tokenizer.h"

// Cheap to compile; the Kimi pattern is exercised by fuzz_tokenize.
#define SIMPLE_PATTERN "\\S+|\\s+"

static void check_vocab(const bpe_vocab *v) {
    if (v->n < 1) fuzz_fail("accepted an empty vocabulary");
    for (int r = 0; r < v->n; r++) {
        uint32_t o = v->off[r], len = v->off[r + 1] - o;
        if (v->off[r + 1] < o || len == 0) fuzz_fail("rank %d has %u bytes", r, len);
        if (bpe_rank(v, v->bytes + o, len) != r) fuzz_fail("rank %d does not look up to itself", r);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (v->byte_rank[b] != bpe_rank(v, &c, 1)) fuzz_fail("byte_rank[%d] disagrees", b);
    }
}

static void same_ids(const bpe_ids *a, const bpe_ids *b, const char *what) {
    if (a->n != b->n || (a->n && memcmp(a->v, b->v, a->n * sizeof *a->v)))
        fuzz_fail("%s: %zu vs %zu ids", what, a->n, b->n);
}

static void check_encode(const bpe_vocab *v, const unsigned char *s, size_t len) {
    bpe_ids got = {0}, ref = {0};
    char err[K25_ERR_LEN];
    int rc = bpe_encode_piece(v, s, len, &got, err);
    int rrc = fuzz_bpe_reference(v, s, len, &ref);
    if (rc != rrc) fuzz_fail("bpe_encode_piece returned %d, reference %d", rc, rrc);
    if (rc == 0) {
        same_ids(&got, &ref, "bpe_encode_piece vs reference");
        size_t at = 0;
        for (size_t i = 0; i < got.n; i++) {
            int32_t r = got.v[i];
            if (r < 0 || r >= v->n) fuzz_fail("id %d out of range", r);
            uint32_t o = v->off[r], n = v->off[r + 1] - o;
            if (at + n > len || memcmp(v->bytes + o, s + at, n)) fuzz_fail("ids do not spell the piece");
            at += n;
        }
        if (at != len) fuzz_fail("ids spell %zu of %zu bytes", at, len);
        // Both strategies on pieces that are not a token themselves (their precondition).
        if (len >= 2 && len <= 128 && bpe_rank(v, s, len) < 0) {
            bpe_ids a = {0}, b = {0};
            bpe_merge_scan(v, s, len, &a);
            bpe_merge_heap(v, s, len, &b);
            same_ids(&a, &ref, "bpe_merge_scan vs reference");
            same_ids(&b, &ref, "bpe_merge_heap vs reference");
            free(a.v);
            free(b.v);
        }
    }
    free(got.v);
    free(ref.v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bpe_vocab v;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (bpe_vocab_parse(&v, "fuzz.tiktoken", (const char *)data, size, err)) {
        if (strncmp(err, "fuzz.tiktoken", 13)) fuzz_fail("message does not name the file: '%s'", err);
        return 0;
    }
    check_vocab(&v);
    // The first line's token text, then the whole input, as pieces to encode.
    size_t first = 0;
    while (first < size && data[first] != ' ' && data[first] != '\n') first++;
    check_encode(&v, data, first);
    check_encode(&v, data, size < 300 ? size : 300);

    const char *path = fuzz_write_file("tiktoken.model", data, size);
    k25_tokenizer *t = NULL;
    err[0] = 0;
    if (tokenizer_load(path, NULL, SIMPLE_PATTERN, 0, &t, err))
        fuzz_fail("bpe_vocab_parse accepted the file but tokenizer_load did not: %s", err);
    if (tokenizer_n_base(t) != v.n || tokenizer_n_vocab(t) != v.n + 256)
        fuzz_fail("tokenizer_load: %d base tokens, %d ids (parse: %d)", tokenizer_n_base(t),
                  tokenizer_n_vocab(t), v.n);
    tokenizer_free(t);
    bpe_vocab_free(&v);
    return 0;
}
