// Fuzz target: tokenizer_encode on arbitrary bytes, with the small tokenizer of
// fuzz_small_tokenizer.h (Kimi pre-tokenizer pattern, BPE merges, special tokens).
//
// The first input byte picks allow_special (bit 0); the rest is the text. Checked against an
// independent UTF-8 validator: encoding fails exactly when the text is not valid UTF-8 (with
// a message naming the byte offset). On success every id is in the vocabulary, no special id
// appears unless allowed, the ids' bytes spell the text, the streaming decoder returns the text
// exactly, and text that contains no special-token name encodes the same either way.
#include "common.h"
#include "fuzz_common.h"
#include "fuzz_small_tokenizer.h"
#include "tokenizer.h"

static k25_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tok = fuzz_small_tokenizer();
    return 0;
}

static void check_decode(const int32_t *ids, size_t n, const unsigned char *text, size_t len) {
    size_t cap = 4 * (len + 8 * (n + 1)) + 64, at = 0;
    char *out = malloc(cap);
    if (!out) abort();
    k25_detok d;
    detok_init(&d, tok);
    for (size_t i = 0; i < n; i++) {
        size_t tl;
        if (!tokenizer_token_bytes(tok, ids[i], &tl)) fuzz_fail("id %d has no bytes", ids[i]);
        size_t room = 4 * (tl + 8);
        if (at + room > cap) fuzz_fail("decoder output larger than expected");
        at += detok_push(&d, ids[i], out + at, room);
    }
    at += detok_flush(&d, out + at, cap - at);
    if (at != len || memcmp(out, text, len)) fuzz_fail("decode(encode(text)) != text (%zu vs %zu bytes)", at, len);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int allow_special = data[0] & 1;
    const unsigned char *text = data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[K25_ERR_LEN];
    err[0] = 0;
    int rc = tokenizer_encode(tok, (const char *)text, len, allow_special, &ids, &n, err);
    int valid = fuzz_utf8_valid(text, len);
    if (rc) {
        if (valid) fuzz_fail("valid UTF-8 rejected: %s", err);
        if (!strstr(err, "offset")) fuzz_fail("message does not name the offset: '%s'", err);
        if (ids) fuzz_fail("failed encode left ids");
        return 0;
    }
    if (!valid) fuzz_fail("invalid UTF-8 accepted");
    int n_base = tokenizer_n_base(tok), n_vocab = tokenizer_n_vocab(tok), saw_special = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) fuzz_fail("id %d out of range", ids[i]);
        if (ids[i] >= n_base) {
            if (!allow_special) fuzz_fail("special id %d without allow_special", ids[i]);
            saw_special = 1;
        }
        size_t tl;
        const unsigned char *b = tokenizer_token_bytes(tok, ids[i], &tl);
        if (at + tl > len || memcmp(b, text + at, tl)) fuzz_fail("ids do not spell the text");
        at += tl;
    }
    if (at != len) fuzz_fail("ids spell %zu of %zu bytes", at, len);
    check_decode(ids, n, text, len);
    if (allow_special && !saw_special) {
        int32_t *ids2 = NULL;
        size_t n2 = 0;
        if (tokenizer_encode(tok, (const char *)text, len, 0, &ids2, &n2, err))
            fuzz_fail("encode without specials failed: %s", err);
        if (n2 != n || memcmp(ids, ids2, n * sizeof *ids)) fuzz_fail("allow_special changed a text without specials");
        free(ids2);
    }
    free(ids);
    return 0;
}
