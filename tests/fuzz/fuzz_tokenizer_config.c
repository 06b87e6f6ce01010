// Fuzz target: tokenizer_config.json as read by tokenizer_load (the "added_tokens_decoder"
// names of the special tokens), with a fixed 300-token tiktoken file and 20 special ids.
// src/tokenizer.c reads it only from a file, so each input is written to the scratch
// directory first.
//
// A loaded tokenizer must name every special id uniquely and non-emptily, and
// tokenizer_special_id must map each name back to its id.
#include "common.h"
#include "fuzz_common.h"
#include "fuzz_small_tokenizer.h"
#include "tokenizer.h"

#define N_BASE 300
#define N_VOCAB (N_BASE + 20)

static char tok_path[1024];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    size_t cap = N_BASE * 32, n = 0;
    char *text = malloc(cap), b64[32];
    if (!text) abort();
    for (int r = 0; r < N_BASE; r++) {
        unsigned char s[2] = {(unsigned char)r, (unsigned char)(r >> 8)};
        fuzz_b64(s, r < 256 ? 1 : 2, b64);
        n += (size_t)snprintf(text + n, cap - n, "%s %d\n", b64, r);
    }
    snprintf(tok_path, sizeof tok_path, "%s", fuzz_write_file("vocab.tiktoken", text, n));
    free(text);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *cfg = fuzz_write_file("tokenizer_config.json", data, size);
    k25_tokenizer *t = NULL;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (tokenizer_load(tok_path, cfg, "\\S+|\\s+", N_VOCAB, &t, err)) {
        if (!err[0]) fuzz_fail("rejected without a message");
        if (t) fuzz_fail("failed load returned a tokenizer");
        return 0;
    }
    for (int id = N_BASE; id < N_VOCAB; id++) {
        size_t len;
        const unsigned char *name = tokenizer_token_bytes(t, id, &len);
        if (!name || len == 0) fuzz_fail("special id %d has no name", id);
        if (memchr(name, 0, len)) continue; // a name with a NUL cannot be asked for by C string
        char *s = malloc(len + 1);
        if (!s) abort();
        memcpy(s, name, len);
        s[len] = 0;
        int back = tokenizer_special_id(t, s);
        if (back != id) fuzz_fail("special '%s' (id %d) looks up to %d", s, id, back);
        free(s);
    }
    if (tokenizer_special_id(t, "") != -1 && tokenizer_special_id(t, "") < N_BASE)
        fuzz_fail("empty name found");
    tokenizer_free(t);
    return 0;
}
