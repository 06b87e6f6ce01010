// Fuzz target: the streaming decoder (detok_push / detok_flush) on arbitrary id sequences,
// with the small tokenizer of fuzz_small_tokenizer.h (its vocabulary has tokens that are
// parts of UTF-8 characters, so characters straddle tokens).
//
// Input: byte 0 picks the mode, then 2 bytes per id (little-endian, mapped onto
// -32 .. n_vocab+31 so negative and too-large ids occur; 0xFFFF / 0xFFFE give INT32_MAX /
// INT32_MIN).
//   mode bit 0 clear: each push gets exactly the documented room, 4 * (token length + 8), in
//     its own allocation; the concatenated output must equal an independent reference: the
//     token bytes (special tokens as their names) decoded with one U+FFFD per maximal
//     ill-formed subpart (Unicode ch. 3, "U+FFFD Substitution of Maximal Subparts", as
//     Python's bytes.decode(errors="replace")), and one U+FFFD per id outside the vocabulary
//     (which also ends any incomplete character before it).
//   mode bit 0 set: pushes get small buffers (0..15 bytes, from the input); nothing may be
//     written past cap and the result must be at most cap.
#include "common.h"
#include "fuzz_common.h"
#include "fuzz_small_tokenizer.h"
#include "tokenizer.h"

static k25_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok = fuzz_small_tokenizer();
    return 0;
}

typedef struct buf {
    unsigned char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const void *s, size_t n) {
    if (n == 0) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->s = realloc(b->s, b->cap);
        if (!b->s) abort();
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
}

static const unsigned char FFFD[3] = {0xEF, 0xBF, 0xBD};

// Bytes -> text with maximal-subpart replacement (Unicode Table 3-7 for the ranges).
static void ref_decode(const unsigned char *s, size_t n, buf *out) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            put(out, s + i, 1);
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else {
            put(out, FFFD, 3);
            i++;
            continue;
        }
        size_t j = i + 1, k = 0;
        for (; k < need && j < n; k++, j++) {
            unsigned l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
            if (s[j] < l || s[j] > h) break;
        }
        if (k == need) put(out, s + i, need + 1);
        else put(out, FFFD, 3); // the maximal subpart s[i..j); s[j] starts afresh
        i = j;
    }
}

static int32_t map_id(unsigned v) {
    if (v == 0xFFFF) return INT32_MAX;
    if (v == 0xFFFE) return INT32_MIN;
    return (int32_t)(v % (unsigned)(tokenizer_n_vocab(tok) + 64)) - 32;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int small = data[0] & 1;
    size_t n_ids = (size - 1) / 2;
    k25_detok d;
    detok_init(&d, tok);
    buf got = {0}, ref = {0}, seg = {0};
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = map_id(data[1 + 2 * i] | (unsigned)data[2 + 2 * i] << 8);
        size_t tl = 0;
        const unsigned char *b = tokenizer_token_bytes(tok, id, &tl);
        if (b) {
            put(&seg, b, tl);
        } else {
            ref_decode(seg.s, seg.n, &ref);
            seg.n = 0;
            put(&ref, FFFD, 3);
        }
        size_t cap = small ? data[2 + 2 * i] % 16 : 4 * (tl + 8);
        char *out = malloc(cap ? cap : 1);
        if (!out) abort();
        size_t w = detok_push(&d, id, out, cap);
        if (w > cap) fuzz_fail("detok_push wrote %zu into %zu", w, cap);
        if (w < cap && out[w] != 0) fuzz_fail("detok_push did not terminate its output");
        put(&got, out, w);
        free(out);
    }
    ref_decode(seg.s, seg.n, &ref);
    char tail[16];
    size_t cap = small ? 2 : sizeof tail;
    size_t w = detok_flush(&d, tail, cap);
    if (w > cap) fuzz_fail("detok_flush wrote %zu into %zu", w, cap);
    put(&got, tail, w);
    if (!small) {
        if (!fuzz_utf8_valid(got.s, got.n)) fuzz_fail("decoder output is not valid UTF-8");
        if (got.n != ref.n || (got.n && memcmp(got.s, ref.s, got.n)))
            fuzz_fail("decoder output differs from the reference (%zu vs %zu bytes)", got.n, ref.n);
    }
    free(got.s);
    free(ref.s);
    free(seg.s);
    return 0;
}
