// A small Kimi-style tokenizer for the encode/decode fuzz targets, built once per process in
// the scratch directory: every single byte, some English and CJK merges, tokens that are
// only part of a UTF-8 character (so characters split across tokens), the Kimi pre-tokenizer
// pattern, and special tokens named by a tokenizer_config.json (two of them where one name
// is a prefix of another, one id left unnamed).
#pragma once
#include "fuzz_common.h"
#include "tokenizer.h"

static inline void fuzz_b64(const unsigned char *s, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        out[o++] = a[w >> 18 & 63];
        out[o++] = a[w >> 12 & 63];
        out[o++] = i + 1 < n ? a[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? a[w & 63] : '=';
    }
    out[o] = 0;
}

static const char *const fuzz_merges[] = {
    "th", "he", "the", " the", "in", "ing", " w", "or", "ld", "orld", " world", "He", "ll",
    "llo", "Hello", " a", "an", "and", " and", "\n\n", "  ", "    ", "'s", "12", "123",
    "\xc3\xa9",                          // é
    "\xe4\xb8",                          // first two bytes of 中
    "\xe4\xb8\xad", "\xe6\x96\x87",      // 中 文
    "\xe4\xb8\xad\xe6\x96\x87",          // 中文
    "\xf0\x9f",                          // start of an emoji
    "\xf0\x9f\x98\x80",                  // 😀
    "\xd0\xbf\xd1\x80",                  // пр
    "<|", "|>",
};
#define FUZZ_N_SPECIAL 8

static inline k25_tokenizer *fuzz_small_tokenizer(void) {
    size_t n_merges = sizeof fuzz_merges / sizeof fuzz_merges[0];
    size_t cap = (256 + n_merges) * 64, n = 0;
    char *text = malloc(cap), b64[64];
    if (!text) abort();
    int rank = 0;
    // Bytes in a scrambled order, so rank and byte value differ.
    for (int i = 0; i < 256; i++) {
        unsigned char b = (unsigned char)(i * 167 + 13);
        fuzz_b64(&b, 1, b64);
        n += (size_t)snprintf(text + n, cap - n, "%s %d\n", b64, rank++);
    }
    for (size_t i = 0; i < n_merges; i++) {
        fuzz_b64((const unsigned char *)fuzz_merges[i], strlen(fuzz_merges[i]), b64);
        n += (size_t)snprintf(text + n, cap - n, "%s %d\n", b64, rank++);
    }
    const char *tok = fuzz_write_file("small.tiktoken", text, n);
    char tok_path[1024];
    snprintf(tok_path, sizeof tok_path, "%s", tok);
    free(text);
    char json[1024];
    int b = rank; // first special id
    int jn = snprintf(json, sizeof json,
                      "{\"added_tokens_decoder\": {\"%d\": {\"content\": \"[BOS]\"}, \"%d\": {\"content\": "
                      "\"[EOS]\"}, \"%d\": {\"content\": \"<|im_end|>\"}, \"%d\": {\"content\": "
                      "\"<|im_user|>\"}, \"%d\": {\"content\": \"<think>\"}, \"%d\": {\"content\": "
                      "\"<|a|>\"}, \"%d\": {\"content\": \"<|a|>b\"}, \"999999\": {\"content\": \"x\"}}}",
                      b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6);
    const char *cfg = fuzz_write_file("tokenizer_config.json", json, (size_t)jn);
    k25_tokenizer *t = NULL;
    char err[K25_ERR_LEN];
    if (tokenizer_load(tok_path, cfg, NULL, rank + FUZZ_N_SPECIAL, &t, err)) {
        fprintf(stderr, "fuzz: building the small tokenizer: %s\n", err);
        abort();
    }
    return t;
}
