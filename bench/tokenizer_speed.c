// Tokenizer throughput on one core: encode MB/s (Kimi pattern, specials allowed) and streaming
// decode MB/s.
//
//   tokenizer_speed [TIKTOKEN_MODEL|- [TEXT_FILE]]
//
// Without a vocabulary (or with "-") the vocabulary is tests/data/tokenizer/tiktoken.model padded with random
// never-matching tokens to Kimi's 163,584 ranks (so the hash table has the real size and cache
// behaviour, while merges use the trained 6k-token table: more merge work per piece than a
// real 160k vocabulary, so a conservative number). Texts: the multilingual test corpus, and the
// same corpus with letters scrambled inside words (pieces that are not whole tokens: the merge
// loop runs on nearly every piece). Each text is repeated to about 16 MB and encoded in one call.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "tokenizer.h"
#include "tokenizer_internal.h"

#define TARGET_BYTES (16u << 20)
#define KIMI_N_BASE 163584

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    K25_CHECK(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = k25_malloc((size_t)n + 1);
    K25_CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "short read on %s", path);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// Writes the trained vocabulary plus distinct 6..12-byte filler tokens up to Kimi's size.
static void write_padded_vocab(const char *src, const char *dst) {
    size_t len;
    char *text = read_all(src, &len);
    int n = 0;
    for (size_t i = 0; i < len; i++) n += text[i] == '\n';
    FILE *f = fopen(dst, "wb");
    K25_CHECK(f, "cannot write %s", dst);
    fwrite(text, 1, len, f);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int r = n; r < KIMI_N_BASE; r++) {
        // 0xFF never occurs in UTF-8, so these tokens can never match text; 3-byte groups
        // keep the base64 free of padding.
        unsigned char b[12];
        int nb = 3 * (2 + (int)(rng() % 3)); // 6..12 bytes: 0xFF, the rank (unique), random
        b[0] = 0xFF;
        b[1] = (unsigned char)(r >> 16), b[2] = (unsigned char)(r >> 8), b[3] = (unsigned char)r;
        for (int k = 4; k < nb; k++) b[k] = (unsigned char)rng();
        for (int k = 0; k < nb; k += 3) {
            uint32_t w = (uint32_t)b[k] << 16 | (uint32_t)b[k + 1] << 8 | b[k + 2];
            fputc(b64[w >> 18], f), fputc(b64[(w >> 12) & 63], f), fputc(b64[(w >> 6) & 63], f), fputc(b64[w & 63], f);
        }
        fprintf(f, " %d\n", r);
    }
    fclose(f);
    free(text);
}

// Shuffles the ASCII letters inside each run of ASCII letters.
static void scramble(char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && ((s[j] | 32) >= 'a' && (s[j] | 32) <= 'z')) j++;
        for (size_t k = j; k > i + 1; k--) {
            size_t r = i + rng() % (k - i);
            char c = s[k - 1];
            s[k - 1] = s[r];
            s[r] = c;
        }
        i = j > i ? j : i + 1;
    }
}

static char *repeat(const char *s, size_t len, size_t *out_len) {
    size_t reps = TARGET_BYTES / len + 1;
    char *buf = k25_malloc(reps * len + 1);
    for (size_t r = 0; r < reps; r++) memcpy(buf + r * len, s, len);
    *out_len = reps * len;
    return buf;
}

static void bench(const k25_tokenizer *t, const char *name, const char *text, size_t len) {
    double best_enc = 1e30, best_dec = 1e30;
    size_t n = 0;
    char err[K25_ERR_LEN];
    for (int rep = 0; rep < 3; rep++) {
        int32_t *ids;
        double t0 = k25_now_ms();
        if (tokenizer_encode(t, text, len, 1, &ids, &n, err)) K25_DIE("%s", err);
        double t1 = k25_now_ms();
        k25_detok d;
        detok_init(&d, t);
        char buf[4096];
        size_t out = 0;
        for (size_t i = 0; i < n; i++) out += detok_push(&d, ids[i], buf, sizeof buf);
        out += detok_flush(&d, buf, sizeof buf);
        double t2 = k25_now_ms();
        K25_CHECK(out == len, "decode returned %zu bytes, want %zu", out, len);
        free(ids);
        if (t1 - t0 < best_enc) best_enc = t1 - t0;
        if (t2 - t1 < best_dec) best_dec = t2 - t1;
    }
    double mb = (double)len / 1e6;
    printf("| %-28s | %6.1f | %9zu | %5.2f | %8.1f | %8.1f |\n", name, mb, n, (double)len / (double)n,
           mb / (best_enc / 1e3), mb / (best_dec / 1e3));
}

int main(int argc, char **argv) {
    k25_prog = "tokenizer_speed";
    const char *vocab = argc > 1 && strcmp(argv[1], "-") ? argv[1] : NULL;
    const char *text_path = argc > 2 ? argv[2] : "tests/data/tokenizer/corpus.txt";
    char padded[64] = "/tmp/k25-tokbench-XXXXXX";
    if (!vocab) {
        int fd = mkstemp(padded);
        K25_CHECK(fd >= 0, "mkstemp failed");
        close(fd);
        write_padded_vocab("tests/data/tokenizer/tiktoken.model", padded);
        vocab = padded;
    }
    k25_tokenizer *t;
    char err[K25_ERR_LEN];
    double t0 = k25_now_ms();
    if (tokenizer_load(vocab, NULL, NULL, 0, &t, err)) K25_DIE("%s", err);
    double load_ms = k25_now_ms() - t0;
    if (vocab == padded) unlink(padded);
    printf("vocabulary: %s, %d ranks, loaded in %.0f ms; PCRE2 JIT: %s\n\n", vocab == padded ? "padded test vocabulary" : vocab,
           tokenizer_n_base(t), load_ms, t->pre.jit ? "on" : "off");
    printf("| text                         |     MB |       ids | B/id  | encode MB/s | decode MB/s |\n");
    printf("|------------------------------|--------|-----------|-------|-------------|-------------|\n");
    size_t len, rlen;
    char *text = read_all(text_path, &len);
    char *big = repeat(text, len, &rlen);
    bench(t, text_path, big, rlen);
    free(big);
    scramble(text, len);
    big = repeat(text, len, &rlen);
    bench(t, "same, letters scrambled", big, rlen);
    free(big);
    free(text);
    tokenizer_free(t);
    return 0;
}
