// Streaming decode: token ids -> UTF-8 text, one token at a time.
//
// Tokens are byte strings and a multi-byte character can be split across tokens, so bytes of
// an incomplete character wait in the decoder until the character completes. Bytes that cannot
// be part of valid UTF-8 become U+FFFD, one per maximal ill-formed subpart (the Unicode
// recommendation, and what Python's bytes.decode("utf-8", "replace") does), so the stream
// matches tiktoken's decode of the whole sequence. Special tokens decode to their names; ids
// outside the vocabulary decode to U+FFFD.
#include <string.h>

#include "tokenizer.h"
#include "tokenizer_internal.h"

static const unsigned char REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};

typedef struct sink {
    char *out;
    size_t cap, n;
} sink;

static void put(sink *k, const unsigned char *s, size_t n) {
    if (n > k->cap - k->n) n = k->cap - k->n; // what does not fit is dropped
    memcpy(k->out + k->n, s, n);
    k->n += n;
}

// Total length of the sequence a lead byte starts (0: not a lead byte).
static int seq_len(unsigned char c) {
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

// Whether c may follow the pending bytes (second-byte ranges exclude overlongs, surrogates
// and code points above U+10FFFF).
static int continues(const unsigned char *pending, int n_pending, unsigned char c) {
    if (n_pending == 1) {
        unsigned char lead = pending[0];
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
    }
    return (c & 0xC0) == 0x80;
}

static void push_byte(k25_detok *d, unsigned char c, sink *k) {
    if (d->n_pending) {
        if (continues(d->pending, d->n_pending, c)) {
            d->pending[d->n_pending++] = c;
            if (d->n_pending == seq_len(d->pending[0])) {
                put(k, d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        put(k, REPLACEMENT, 3); // the incomplete sequence; c starts afresh
        d->n_pending = 0;
    }
    if (c < 0x80) {
        put(k, &c, 1);
    } else if (seq_len(c)) {
        d->pending[0] = c;
        d->n_pending = 1;
    } else {
        put(k, REPLACEMENT, 3);
    }
}

static void terminate(sink *k) {
    if (k->n < k->cap) k->out[k->n] = 0;
}

void detok_init(k25_detok *d, const k25_tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->t = t;
}

size_t detok_push(k25_detok *d, int32_t id, char *out, size_t cap) {
    sink k = {out, cap, 0};
    size_t len;
    const unsigned char *s = tokenizer_token_bytes(d->t, id, &len);
    if (!s) {
        if (d->n_pending) put(&k, REPLACEMENT, 3);
        d->n_pending = 0;
        put(&k, REPLACEMENT, 3);
    } else {
        for (size_t i = 0; i < len; i++) push_byte(d, s[i], &k);
    }
    terminate(&k);
    return k.n;
}

size_t detok_flush(k25_detok *d, char *out, size_t cap) {
    sink k = {out, cap, 0};
    if (d->n_pending) put(&k, REPLACEMENT, 3);
    d->n_pending = 0;
    terminate(&k);
    return k.n;
}
