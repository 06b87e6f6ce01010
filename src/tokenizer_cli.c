// `k25dec --tokenize` / `--detokenize`: text <-> ids on stdin/stdout, for checking the
// tokenizer against other implementations.
//
// The tokenizer_config.json next to the tiktoken.model (as in a Hugging Face model directory)
// names the special tokens when present; the vocabulary gets the Kimi convention of 256
// special ids after the mergeable tokens.
#include "tokenizer_cli.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer.h"

// The whole input, or NULL after a message naming the option (a read error on the stream).
static char *read_input(FILE *in, const char *option, size_t *len) {
    char err[K25_ERR_LEN];
    char *text = k25_read_stream(in, "standard input", len, err);
    if (!text) fprintf(stderr, "k25dec: %s: %s\n", option, err);
    return text;
}

static k25_tokenizer *open_tokenizer(const char *tokfile, const char *pattern) {
    if (!tokfile) return tokenizer_bytes(256);
    k25_tokenizer *t;
    char err[K25_ERR_LEN];
    if (tokenizer_load_with_config(tokfile, pattern, 0, &t, err)) {
        fprintf(stderr, "k25dec: %s\n", err);
        return NULL;
    }
    return t;
}

// The exit status: 1 when the work failed (rc) or its output did not reach `out`.
static int output_done(FILE *out, const char *what, int rc) {
    char err[K25_ERR_LEN];
    if (k25_flush_check(out, "the output", err) == 0) return rc ? 1 : 0;
    fprintf(stderr, "k25dec: %s: %s\n", what, err);
    return 1;
}

int tokenizer_cli_tokenize(const char *tokfile, const char *pattern, FILE *in, FILE *out) {
    k25_tokenizer *t = open_tokenizer(tokfile, pattern);
    if (!t) return 1;
    size_t len, n;
    char *text = read_input(in, "--tokenize", &len);
    if (!text) {
        tokenizer_free(t);
        return 1;
    }
    int32_t *ids;
    char err[K25_ERR_LEN];
    int rc = tokenizer_encode(t, text, len, 1, &ids, &n, err);
    free(text);
    if (rc) {
        fprintf(stderr, "k25dec: --tokenize: %s\n", err);
        tokenizer_free(t);
        return 1;
    }
    for (size_t i = 0; i < n; i++) fprintf(out, i ? " %d" : "%d", ids[i]);
    fputc('\n', out);
    free(ids);
    tokenizer_free(t);
    return output_done(out, "--tokenize", 0);
}

int tokenizer_cli_detokenize(const char *tokfile, const char *pattern, FILE *in, FILE *out) {
    k25_tokenizer *t = open_tokenizer(tokfile, pattern);
    if (!t) return 1;
    size_t len;
    char *text = read_input(in, "--detokenize", &len);
    if (!text) {
        tokenizer_free(t);
        return 1;
    }
    // The ids are parsed as one C string: past a NUL byte the rest would go unread, unreported.
    const char *nul = memchr(text, 0, len);
    if (nul) {
        fprintf(stderr,
                "k25dec: --detokenize: standard input has a NUL byte at offset %zu (expected token "
                "ids)\n",
                (size_t)(nul - text));
        free(text);
        tokenizer_free(t);
        return 1;
    }
    k25_detok d;
    detok_init(&d, t);
    char buf[4096];
    int rc = 0;
    size_t count = 0;
    for (char *p = text; *p;) {
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || (*end && !isspace((unsigned char)*end)) || id < 0 || id >= tokenizer_n_vocab(t)) {
            int span = 0;
            while (p[span] && !isspace((unsigned char)p[span]) && span < 32) span++;
            fprintf(stderr, "k25dec: --detokenize: item %zu \"%.*s\" is not a token id in 0..%d\n", count + 1, span, p,
                    tokenizer_n_vocab(t) - 1);
            rc = 1;
            break;
        }
        count++;
        // A token is at most a few hundred bytes; longer ones are written in pieces through
        // the same buffer size rule (4 bytes out per byte in, at worst).
        size_t tl;
        tokenizer_token_bytes(t, (int32_t)id, &tl);
        if (4 * (tl + 8) <= sizeof buf) {
            size_t w = detok_push(&d, (int32_t)id, buf, sizeof buf);
            fwrite(buf, 1, w, out);
        } else {
            char *big = k25_malloc(4 * (tl + 8));
            size_t w = detok_push(&d, (int32_t)id, big, 4 * (tl + 8));
            fwrite(big, 1, w, out);
            free(big);
        }
        p = end;
    }
    size_t w = detok_flush(&d, buf, sizeof buf);
    fwrite(buf, 1, w, out);
    free(text);
    tokenizer_free(t);
    return output_done(out, "--detokenize", rc);
}
