// Tokenizer checks that need no Python: malformed rank files, special tokens (config and Kimi
// defaults), chat rendering, invalid UTF-8, streaming decode across split characters, the byte
// fallback, the two BPE merge strategies, pattern translation, the CLI.
//
// With arguments it is the C side of tests/t_tokenizer_tiktoken.sh (records are NUL-separated):
//   test_tokenizer encode-batch TOKDIR PATTERN_FILE   texts on stdin -> one id line per text
//   test_tokenizer decode-batch TOKDIR                id lines on stdin -> texts (streaming decode)
// TOKDIR holds tiktoken.model and optionally tokenizer_config.json.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpe.h"
#include "chat.h"
#include "common.h"
#include "pretokenize.h"
#include "tokenizer.h"
#include "tokenizer_cli.h"
#include "test_util.h"

#define TOKDIR "tests/data/tokenizer"


static char tmpdir[] = "/tmp/k25-tok-XXXXXX";

static char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    K25_CHECK(f, "cannot write %s", path);
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *read_stream(FILE *in, size_t *len) {
    size_t cap = 1 << 16, n = 0, got;
    char *buf = k25_malloc(cap + 1);
    while ((got = fread(buf + n, 1, cap - n, in)) > 0)
        if ((n += got) == cap) buf = realloc(buf, (cap *= 2) + 1);
    buf[n] = 0;
    *len = n;
    return buf;
}

static k25_tokenizer *load_dir(const char *dir, const char *pattern) {
    char tok[512], cfg[512], err[K25_ERR_LEN];
    snprintf(tok, sizeof tok, "%s/tiktoken.model", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    k25_tokenizer *t;
    if (tokenizer_load(tok, access(cfg, R_OK) == 0 ? cfg : NULL, pattern, 0, &t, err)) K25_DIE("%s", err);
    return t;
}

// Decodes a whole id list through the streaming decoder.
static char *decode_all(const k25_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, used = 0;
    char *out = k25_malloc(cap);
    k25_detok d;
    detok_init(&d, t);
    for (size_t i = 0; i <= n; i++) {
        size_t tl = 0;
        if (i < n) tokenizer_token_bytes(t, ids[i], &tl);
        size_t need = 4 * (tl + 8);
        if (cap - used < need) out = realloc(out, cap = 2 * (cap + need));
        used += i < n ? detok_push(&d, ids[i], out + used, cap - used) : detok_flush(&d, out + used, cap - used);
    }
    *len = used;
    return out;
}

// ----------------------------------------------------------------------------
// Batch tools for the tiktoken comparison

static int encode_batch(const char *dir, const char *pattern_file) {
    size_t plen, len;
    FILE *pf = fopen(pattern_file, "rb");
    K25_CHECK(pf, "cannot open %s", pattern_file);
    char *pattern = read_stream(pf, &plen);
    fclose(pf);
    k25_tokenizer *t = load_dir(dir, pattern);
    char *in = read_stream(stdin, &len);
    for (size_t p = 0; p < len;) {
        char *z = memchr(in + p, 0, len - p);
        size_t rl = z ? (size_t)(z - (in + p)) : len - p;
        int32_t *ids;
        size_t n;
        char err[K25_ERR_LEN];
        if (tokenizer_encode(t, in + p, rl, 1, &ids, &n, err)) K25_DIE("record at byte %zu: %s", p, err);
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        free(ids);
        p += rl + 1;
    }
    free(in);
    free(pattern);
    tokenizer_free(t);
    return 0;
}

static int decode_batch(const char *dir) {
    k25_tokenizer *t = load_dir(dir, NULL);
    size_t len;
    char *in = read_stream(stdin, &len);
    int32_t *ids = k25_malloc((len / 2 + 1) * sizeof *ids);
    for (char *line = in; line < in + len;) {
        char *nl = memchr(line, '\n', (size_t)(in + len - line));
        if (nl) *nl = 0;
        size_t n = 0;
        for (char *p = line, *end; *p; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            ids[n++] = (int32_t)v;
        }
        size_t ol;
        char *out = decode_all(t, ids, n, &ol);
        fwrite(out, 1, ol, stdout);
        putchar(0);
        free(out);
        line = nl ? nl + 1 : in + len;
    }
    free(ids);
    free(in);
    tokenizer_free(t);
    return 0;
}

// ----------------------------------------------------------------------------
// Checks

static void check_malformed(void) {
    struct {
        const char *name, *text, *expect1, *expect2;
    } cases[] = {
        {"bad_b64", "YQ== 0\nYg== 1\nY$== 2\n", ":3:", "base64"},
        {"bad_pad", "YQ== 0\nYg= 1\n", ":2:", "base64"},
        {"dup_token", "YQ== 0\nYg== 1\nYQ== 2\n", ":3:", "duplicate token"},
        {"dup_rank", "YQ== 0\nYg== 1\nYw== 1\n", ":3:", "duplicate rank"},
        {"gap", "YQ== 0\nYg== 1\nYw== 3\n", ":3:", "rank 2 is missing"},
        {"nonnum", "YQ== 0\nYg== x1\n", ":2:", "not a non-negative integer"},
        {"negative", "YQ== 0\nYg== -1\n", ":2:", "not a non-negative integer"},
        {"one_field", "YQ== 0\n\nYg==\n", ":3:", "expected"},
        {"three_fields", "YQ== 0 7\n", ":1:", "expected"},
        {"empty", "\n\n", "no tokens", "no tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *path = tmp_path(cases[i].name);
        write_file(path, cases[i].text, strlen(cases[i].text));
        k25_tokenizer *t = NULL;
        char err[K25_ERR_LEN] = "";
        int rc = tokenizer_load(path, NULL, NULL, 0, &t, err);
        EXPECT(rc == -1 && !t, "%s: loaded a malformed file", cases[i].name);
        EXPECT(strstr(err, cases[i].expect1) && strstr(err, cases[i].expect2), "%s: message \"%s\"", cases[i].name, err);
        EXPECT(strstr(err, path) != NULL,
              "%s: message lacks the file name: %s", cases[i].name, err);
    }
    // CRLF line ends and blank lines are fine.
    const char *ok = "YQ==\t0\r\n\r\nYg== 1\r\n";
    write_file(tmp_path("crlf"), ok, strlen(ok));
    k25_tokenizer *t;
    char err[K25_ERR_LEN];
    EXPECT(tokenizer_load(tmp_path("crlf"), NULL, NULL, 10, &t, err) == 0, "crlf file: %s", err);
    if (t) tokenizer_free(t);
    EXPECT(tokenizer_load("/nonexistent/tiktoken.model", NULL, NULL, 0, &t, err) == -1 && strstr(err, "/nonexistent"),
          "missing file: %s", err);
    EXPECT(tokenizer_load(tmp_path("crlf"), NULL, NULL, 1, &t, err) == -1, "n_vocab below the rank count accepted");
    EXPECT(tokenizer_load(TOKDIR "/tiktoken.model", NULL, "[a~~b]", 0, &t, err) == -1 && strstr(err, "~~"),
          "unsupported class operator: %s", err);
    const char *badjson = "{\"added_tokens_decoder\": {\"7\": {\"content\": 3}}}";
    write_file(tmp_path("bad.json"), badjson, strlen(badjson));
    EXPECT(tokenizer_load(tmp_path("crlf"), tmp_path("bad.json"), NULL, 10, &t, err) == -1 && strstr(err, "content"),
          "bad config: %s", err);
    write_file(tmp_path("trunc.json"), "{\"added", 7);
    EXPECT(tokenizer_load(tmp_path("crlf"), tmp_path("trunc.json"), NULL, 10, &t, err) == -1 &&
              strstr(err, "trunc.json"),
          "truncated config: %s", err);
    const char *dupjson = "{\"added_tokens_decoder\": {\"2\": {\"content\": \"<x>\"}, \"5\": {\"content\": \"<x>\"}}}";
    write_file(tmp_path("dup.json"), dupjson, strlen(dupjson));
    EXPECT(tokenizer_load(tmp_path("crlf"), tmp_path("dup.json"), NULL, 10, &t, err) == -1 && strstr(err, "<x>"),
          "duplicate special names: %s", err);
    const char *tail = "{\"added_tokens_decoder\": {}}\n trailing";
    write_file(tmp_path("tail.json"), tail, strlen(tail));
    EXPECT(tokenizer_load(tmp_path("crlf"), tmp_path("tail.json"), NULL, 10, &t, err) == -1 &&
              strstr(err, "tail.json: data after the JSON object (byte 30)"),
          "data after the config's object: %s", err);
}

// A vocabulary of Kimi's size (163,584 ranks) without a config gets Kimi's special names.
static void check_kimi_defaults(void) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const int n_base = 163584;
    char *text = k25_malloc((size_t)n_base * 24), *p = text;
    for (int r = 0; r < n_base; r++) {
        if (r < 256) {
            p += sprintf(p, "%c%c== %d\n", b64[r >> 2], b64[(r & 3) << 4], r);
        } else { // distinct 3-byte tokens
            uint32_t w = 0x10000u + (uint32_t)(r - 256);
            p += sprintf(p, "%c%c%c%c %d\n", b64[w >> 18], b64[(w >> 12) & 63], b64[(w >> 6) & 63], b64[w & 63], r);
        }
    }
    write_file(tmp_path("kimi.model"), text, (size_t)(p - text));
    free(text);
    k25_tokenizer *t;
    char err[K25_ERR_LEN];
    if (tokenizer_load(tmp_path("kimi.model"), NULL, NULL, 163840, &t, err)) {
        EXPECT(0, "kimi-size vocabulary: %s", err);
        return;
    }
    EXPECT(tokenizer_n_vocab(t) == 163840, "n_vocab %d", tokenizer_n_vocab(t));
    struct {
        const char *name;
        int id;
    } want[] = {{"[BOS]", 163584},         {"[EOS]", 163585},           {"<|im_end|>", 163586},
                {"<|im_user|>", 163587},   {"<|im_assistant|>", 163588}, {"<|im_system|>", 163594},
                {"<|im_middle|>", 163601}, {"<think>", 163606},          {"</think>", 163607},
                {"[UNK]", 163838},         {"[PAD]", 163839},            {"<|reserved_token_163589|>", 163589},
                {"<|reserved_token_163837|>", 163837}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        EXPECT(tokenizer_special_id(t, want[i].name) == want[i].id, "%s -> %d, want %d", want[i].name,
              tokenizer_special_id(t, want[i].name), want[i].id);
    EXPECT(tokenizer_special_id(t, "<|reserved_token_163840|>") == -1, "id beyond the model vocabulary named");
    int32_t *ids;
    size_t n;
    EXPECT(tokenizer_encode(t, "[BOS]x<|im_end|>", 16, 1, &ids, &n, err) == 0 && n == 3 && ids[0] == 163584 &&
              ids[1] == 'x' && ids[2] == 163586,
          "specials in text");
    free(ids);
    tokenizer_free(t);
}

static void check_specials_and_chat(k25_tokenizer *t) {
    int nb = tokenizer_n_base(t);
    EXPECT(tokenizer_n_vocab(t) == nb + 256, "n_vocab %d n_base %d", tokenizer_n_vocab(t), nb);
    EXPECT(tokenizer_special_id(t, "<|im_end|>") == nb + 2, "<|im_end|> id");
    EXPECT(tokenizer_special_id(t, "<think>") == nb + 22, "<think> id");
    char name[64];
    snprintf(name, sizeof name, "<|reserved_token_%d|>", nb + 5);
    EXPECT(tokenizer_special_id(t, name) == nb + 5, "reserved name %s", name);
    EXPECT(tokenizer_special_id(t, "<|nope|>") == -1, "unknown special");
    size_t len;
    const unsigned char *b = tokenizer_token_bytes(t, nb + 17, &len);
    EXPECT(b && len == 13 && !memcmp(b, "<|im_middle|>", 13), "special decodes to its name");

    const char *txt = "a<|im_end|>b";
    int32_t *with, *without;
    size_t nw, nwo;
    char err[K25_ERR_LEN];
    EXPECT(tokenizer_encode(t, txt, strlen(txt), 1, &with, &nw, err) == 0, "%s", err);
    EXPECT(tokenizer_encode(t, txt, strlen(txt), 0, &without, &nwo, err) == 0, "%s", err);
    int has = 0, has_not = 0;
    for (size_t i = 0; i < nw; i++) has += with[i] == nb + 2;
    for (size_t i = 0; i < nwo; i++) has_not += without[i] >= nb;
    EXPECT(has == 1 && has_not == 0, "allow_special: %d special(s) with, %d without", has, has_not);
    free(with);
    free(without);

    // Chat: the segment-wise rendering equals encoding the rendered text with specials allowed.
    const char *sys = "You are Kimi. Ответь кратко.", *user = "Hi! 你好，今天怎么样？ It's   fine\n\n";
    for (int thinking = 0; thinking < 2; thinking++)
        for (int with_sys = 0; with_sys < 2; with_sys++) {
            char rendered[512];
            snprintf(rendered, sizeof rendered, "%s%s%s%s<|im_user|>user<|im_middle|>%s<|im_end|>"
                     "<|im_assistant|>assistant<|im_middle|><think>%s",
                     with_sys ? "<|im_system|>system<|im_middle|>" : "", with_sys ? sys : "",
                     with_sys ? "<|im_end|>" : "", "", user, thinking ? "" : "</think>");
            int32_t *a, *c;
            size_t na, nc;
            EXPECT(chat_render(t, with_sys ? sys : NULL, user, thinking, &a, &na, err) == 0, "chat: %s", err);
            EXPECT(tokenizer_encode(t, rendered, strlen(rendered), 1, &c, &nc, err) == 0, "%s", err);
            EXPECT(na == nc && !memcmp(a, c, na * sizeof *a), "chat ids differ (thinking=%d system=%d)", thinking,
                  with_sys);
            EXPECT(a[na - 1] == nb + (thinking ? 22 : 23), "chat ends with the think token");
            free(a);
            free(c);
        }
    // A user typing a special-token string does not produce the control token.
    int32_t *a;
    size_t na;
    EXPECT(chat_render(t, NULL, "<|im_end|>", 1, &a, &na, err) == 0, "%s", err);
    int ends = 0;
    for (size_t i = 0; i < na; i++) ends += a[i] == nb + 2;
    EXPECT(ends == 1, "user text became a control token");
    free(a);
    EXPECT(chat_render(t, NULL, "bad \xff", 1, &a, &na, err) == -1 && strstr(err, "byte offset 4"), "chat bad utf8: %s",
          err);
}

static void check_chat_missing_token(void) {
    // A config that names the im_* tokens but not <think>.
    const char *cfg = "{\"added_tokens_decoder\": {\"258\": {\"content\": \"<|im_end|>\"}, \"259\": {\"content\": "
                      "\"<|im_user|>\"}, \"260\": {\"content\": \"<|im_assistant|>\"}, \"261\": {\"content\": "
                      "\"<|im_middle|>\"}}}";
    write_file(tmp_path("nothink.json"), cfg, strlen(cfg));
    char model[256 * 12], *p = model;
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int r = 0; r < 256; r++) p += sprintf(p, "%c%c== %d\n", b64[r >> 2], b64[(r & 3) << 4], r);
    write_file(tmp_path("bytes.model"), model, (size_t)(p - model));
    k25_tokenizer *t;
    char err[K25_ERR_LEN];
    if (tokenizer_load(tmp_path("bytes.model"), tmp_path("nothink.json"), NULL, 300, &t, err)) {
        EXPECT(0, "%s", err);
        return;
    }
    int32_t *ids = NULL;
    size_t n;
    EXPECT(chat_render(t, NULL, "hi", 1, &ids, &n, err) == -1 && strstr(err, "<think>") && !ids,
          "missing <think>: %s", err);
    tokenizer_free(t);
}

static void check_invalid_utf8(k25_tokenizer *t) {
    struct {
        const char *s;
        size_t len, offset;
    } bad[] = {
        {"abc\xff", 4, 3},          {"\xc0\xaf", 2, 0},          {"ok \xed\xa0\x80", 6, 3}, {"x\xe4\xb8", 3, 1},
        {"\xf4\x90\x80\x80", 4, 0}, {"\x80 lone", 6, 0},         {"ab\xe4z\xb8", 5, 2},     {"12345678\xc3", 9, 8},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n;
        char err[K25_ERR_LEN] = "", want[64];
        int rc = tokenizer_encode(t, bad[i].s, bad[i].len, 1, &ids, &n, err);
        snprintf(want, sizeof want, "byte offset %zu", bad[i].offset);
        EXPECT(rc == -1 && !ids && strstr(err, want), "case %zu: rc %d, \"%s\"", i, rc, err);
    }
    // Valid edge cases: NUL, U+10FFFF, U+FFFF, empty text.
    int32_t *ids;
    size_t n;
    char err[K25_ERR_LEN];
    EXPECT(tokenizer_encode(t, "a\0b\xf4\x8f\xbf\xbf\xef\xbf\xbf", 10, 1, &ids, &n, err) == 0, "valid: %s", err);
    free(ids);
    EXPECT(tokenizer_encode(t, "", 0, 1, &ids, &n, err) == 0 && n == 0, "empty text");
    free(ids);
}

static void check_streaming(void) {
    k25_tokenizer *t = tokenizer_bytes(1000);
    EXPECT(tokenizer_n_vocab(t) == 1000, "bytes n_vocab");
    k25_detok d;
    detok_init(&d, t);
    char out[64];
    // "中" = E4 B8 AD arrives one byte per token.
    EXPECT(detok_push(&d, 0xE4, out, sizeof out) == 0, "partial lead byte emitted");
    EXPECT(detok_push(&d, 0xB8, out, sizeof out) == 0, "partial sequence emitted");
    EXPECT(detok_push(&d, 0xAD, out, sizeof out) == 3 && !memcmp(out, "\xe4\xb8\xad", 3), "completed character");
    // 4-byte emoji split 1 + 3.
    EXPECT(detok_push(&d, 0xF0, out, sizeof out) == 0, "emoji lead");
    EXPECT(detok_push(&d, 0x9F, out, sizeof out) == 0 && detok_push(&d, 0x98, out, sizeof out) == 0, "emoji middle");
    EXPECT(detok_push(&d, 0x80, out, sizeof out) == 4 && !memcmp(out, "\xf0\x9f\x98\x80", 4), "emoji complete");
    // A broken sequence: E4 then 'a' -> U+FFFD then 'a'.
    detok_push(&d, 0xE4, out, sizeof out);
    EXPECT(detok_push(&d, 'a', out, sizeof out) == 4 && !memcmp(out, "\xef\xbf\xbd" "a", 4), "broken sequence");
    // A lone continuation byte and an invalid lead.
    EXPECT(detok_push(&d, 0x80, out, sizeof out) == 3 && !memcmp(out, "\xef\xbf\xbd", 3), "lone continuation");
    EXPECT(detok_push(&d, 0xFF, out, sizeof out) == 3, "invalid byte");
    // E0 80 is an overlong start: two replacement characters.
    detok_push(&d, 0xE0, out, sizeof out);
    EXPECT(detok_push(&d, 0x80, out, sizeof out) == 6, "overlong start");
    // An unfinished tail comes out at flush.
    detok_push(&d, 0xF0, out, sizeof out);
    detok_push(&d, 0x9F, out, sizeof out);
    EXPECT(detok_flush(&d, out, sizeof out) == 3 && !memcmp(out, "\xef\xbf\xbd", 3), "flush of a partial tail");
    EXPECT(detok_flush(&d, out, sizeof out) == 0, "second flush");
    // Fallback names and out-of-range ids.
    size_t w = detok_push(&d, 300, out, sizeof out);
    EXPECT(w == 13 && !memcmp(out, "<|token_300|>", 13), "fallback name \"%.*s\"", (int)w, out);
    EXPECT(detok_push(&d, 5000, out, sizeof out) == 3, "out-of-range id");
    // A small buffer truncates without overflow.
    char tiny[4] = {'x', 'x', 'x', 'x'};
    EXPECT(detok_push(&d, 300, tiny, 2) == 2 && tiny[2] == 'x', "cap respected");
    // Encoding: one id per byte, no specials.
    int32_t *ids;
    size_t n;
    char err[K25_ERR_LEN];
    EXPECT(tokenizer_encode(t, "h\xc3\xa9<|token_300|>", 15, 1, &ids, &n, err) == 0 && n == 15 && ids[0] == 'h' &&
              ids[1] == 0xC3 && ids[2] == 0xA9,
          "byte encoding");
    free(ids);
    tokenizer_free(t);
    t = tokenizer_bytes(100);
    EXPECT(tokenizer_encode(t, "z", 1, 1, &ids, &n, err) == -1 && strstr(err, "0x7a"), "byte beyond a tiny vocabulary: %s",
          err);
    tokenizer_free(t);
}

// Streaming decode with splits at every byte equals decoding the whole (checked on the corpus).
static void check_roundtrip(k25_tokenizer *t) {
    FILE *f = fopen(TOKDIR "/corpus.txt", "rb");
    K25_CHECK(f, "cannot open the corpus");
    size_t len;
    char *text = read_stream(f, &len);
    fclose(f);
    int32_t *ids;
    size_t n;
    char err[K25_ERR_LEN];
    EXPECT(tokenizer_encode(t, text, len, 1, &ids, &n, err) == 0, "%s", err);
    size_t ol;
    char *out = decode_all(t, ids, n, &ol);
    EXPECT(ol == len && !memcmp(out, text, len), "decode(encode(corpus)) != corpus");
    // Each push returns complete UTF-8 only.
    k25_detok d;
    detok_init(&d, t);
    char buf[4096];
    int complete = 1;
    for (size_t i = 0; i < n; i++) {
        size_t w = detok_push(&d, ids[i], buf, sizeof buf);
        int32_t *tmp;
        size_t tn;
        if (w && tokenizer_encode(t, buf, w, 0, &tmp, &tn, err)) complete = 0;
        else if (w) free(tmp);
    }
    EXPECT(complete, "a push returned incomplete UTF-8");
    free(out);
    free(ids);
    free(text);
}

// The scan and heap merges agree on long pieces over the trained vocabulary.
static void check_merge_strategies(void) {
    bpe_vocab v;
    char err[K25_ERR_LEN];
    K25_CHECK(bpe_vocab_load(&v, TOKDIR "/tiktoken.model", err) == 0, "%s", err);
    const char *alphabet[] = {"e", "t", " ", "th", "in", "中", "文", "\n", "a", "'s", "ll", "00", "é"};
    uint64_t seed = 12345;
    for (int trial = 0; trial < 300; trial++) {
        char s[128];
        size_t len = 0;
        while (len < 100) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = alphabet[(seed >> 33) % (sizeof alphabet / sizeof *alphabet)];
            memcpy(s + len, a, strlen(a));
            len += strlen(a);
        }
        bpe_ids x = {0}, y = {0};
        bpe_merge_scan(&v, (const unsigned char *)s, len, &x);
        bpe_merge_heap(&v, (const unsigned char *)s, len, &y);
        EXPECT(x.n == y.n && !memcmp(x.v, y.v, x.n * sizeof *x.v), "scan and heap differ on trial %d", trial);
        free(x.v);
        free(y.v);
    }
    bpe_vocab_free(&v);
}

typedef struct pieces {
    char buf[256];
    size_t n;
} pieces;

static int collect(void *ctx, const unsigned char *s, size_t len, char *err) {
    pieces *p = ctx;
    p->n += (size_t)snprintf(p->buf + p->n, sizeof p->buf - p->n, "[%.*s]", (int)len, (const char *)s);
    return 0;
}

static void check_pattern(const char *rust, const char *text, const char *want) {
    pretok p;
    char err[K25_ERR_LEN];
    if (pretok_compile(&p, rust, err)) {
        EXPECT(0, "%s: %s", rust, err);
        return;
    }
    pieces got = {.n = 0};
    got.buf[0] = 0;
    pretok_state st;
    pretok_begin(&p, &st);
    pretok_split(&p, &st, (const unsigned char *)text, strlen(text), collect, &got, err);
    pretok_end(&st);
    EXPECT(!strcmp(got.buf, want), "pattern %s on \"%s\": %s, want %s (translated %s)", rust, text, got.buf, want,
          p.pattern);
    pretok_free(&p);
}

static void check_translation(void) {
    check_pattern("[\\p{L}&&[^\\p{Han}]]+|.", "ab中文cd", "[ab][中][文][cd]");
    check_pattern("[a-z--[aeiou]]+|.", "hello", "[h][e][ll][o]");
    check_pattern("[a-z&&[d-f]]+|.", "abcdefg", "[a][b][c][def][g]");
    check_pattern("[^a-z&&[^x]]+|.", "abxyXY", "[a][b][x][y][XY]"); // not (a-z and not x)
    check_pattern("[[a-c][x-z]]+|.", "abqxz", "[ab][q][xz]");
    check_pattern("\\p{Han}+|.", "、中文", "[、][中文]"); // Script, not Script_Extensions
    check_pattern("\\s+|.", "\xe1\xa0\x8e \t", "[\xe1\xa0\x8e][ \t]"); // U+180E is not White_Space
    check_pattern("\\u{41}\\u0042|.", "ABC", "[AB][C]");
    check_pattern("\\d+|.", "12٣x", "[12٣][x]");
    check_pattern("a*", "baab", "[aa]"); // empty matches produce nothing
    check_pattern("[]a]+|.", "]a]b", "[]a]][b]");
    check_pattern("[^]]+|.", "ab]c", "[ab][]][c]");
    // Rust's \w takes marks and not No (PCRE2 10.42's is L, N and '_'); \b and \B follow it;
    // POSIX classes are ASCII in Rust
    check_pattern("\\w+|.", "e\xcc\x81x\xc2\xb2", "[e\xcc\x81x][\xc2\xb2]");
    check_pattern("\\W+|.", "\xc2\xb2!e\xcc\x81", "[\xc2\xb2!][e][\xcc\x81]");
    check_pattern("\\p{L}\\b\\p{M}|.", "e\xcc\x81", "[e][\xcc\x81]");
    check_pattern("\\p{L}\\B\\p{M}|.", "e\xcc\x81", "[e\xcc\x81]");
    check_pattern("[[:alpha:]]+|.", "ab\xc3\xa9", "[ab][\xc3\xa9]");
    check_pattern("[[:punct:][:digit:]]+|.", "a!9\xc2\xb2", "[a][!9][\xc2\xb2]");
    char err[K25_ERR_LEN];
    char *s = tokenizer_translate_pattern("[\\p{Lu}&&[^\\p{Han}]]", err);
    EXPECT(s && !strcmp(s, "(?:(?![\\p{sc:Han}])[\\p{Lu}])"), "translation: %s", s ? s : err);
    free(s);
    EXPECT(!tokenizer_translate_pattern("[abc", err) && strstr(err, "unterminated"), "unterminated class: %s", err);
    EXPECT(!tokenizer_translate_pattern("[[:^alpha:]]", err) && strstr(err, "negated POSIX class [:^alpha:]"),
           "negated POSIX class: %s", err);
}

static void check_cli(void) {
    char in_text[] = "Hello<|im_end|> 世界";
    FILE *in = fmemopen(in_text, strlen(in_text), "r");
    char *outbuf = NULL;
    size_t outlen = 0;
    FILE *out = open_memstream(&outbuf, &outlen);
    EXPECT(tokenizer_cli_tokenize(TOKDIR "/tiktoken.model", NULL, in, out) == 0, "cli tokenize");
    fclose(in);
    fclose(out);
    k25_tokenizer *t = load_dir(TOKDIR, NULL);
    int32_t *ids;
    size_t n;
    char err[K25_ERR_LEN], want[512] = "";
    tokenizer_encode(t, in_text, strlen(in_text), 1, &ids, &n, err);
    for (size_t i = 0, w = 0; i < n; i++) w += (size_t)snprintf(want + w, sizeof want - w, i ? " %d" : "%d", ids[i]);
    strcat(want, "\n");
    EXPECT(!strcmp(outbuf, want), "cli ids \"%s\" want \"%s\"", outbuf, want);
    // ... and back.
    in = fmemopen(outbuf, outlen, "r");
    char *text = NULL;
    size_t tl = 0;
    out = open_memstream(&text, &tl);
    EXPECT(tokenizer_cli_detokenize(TOKDIR "/tiktoken.model", NULL, in, out) == 0, "cli detokenize");
    fclose(in);
    fclose(out);
    EXPECT(tl == strlen(in_text) && !memcmp(text, in_text, tl), "cli round trip \"%.*s\"", (int)tl, text);
    free(text);
    free(outbuf);
    free(ids);
    char bad_ids[] = "1 2 banana";
    in = fmemopen(bad_ids, strlen(bad_ids), "r");
    out = open_memstream(&text, &tl);
    EXPECT(tokenizer_cli_detokenize(TOKDIR "/tiktoken.model", NULL, in, out) == 1, "cli accepted a bad id");
    fclose(in);
    fclose(out);
    free(text);
    // Ids after a NUL byte were dropped without a word, exit 0
    char nul_ids[] = "1 2\0 3";
    in = fmemopen(nul_ids, sizeof nul_ids - 1, "r");
    out = open_memstream(&text, &tl);
    EXPECT(tokenizer_cli_detokenize(TOKDIR "/tiktoken.model", NULL, in, out) == 1, "cli accepted a NUL byte");
    fclose(in);
    fclose(out);
    free(text);
    tokenizer_free(t);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "encode-batch")) return encode_batch(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "decode-batch")) return decode_batch(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [encode-batch TOKDIR PATTERN_FILE | decode-batch TOKDIR]\n", argv[0]);
        return 2;
    }
    K25_CHECK(mkdtemp(tmpdir), "mkdtemp failed");
    check_malformed();
    check_kimi_defaults();
    k25_tokenizer *t = load_dir(TOKDIR, NULL);
    check_specials_and_chat(t);
    check_invalid_utf8(t);
    check_roundtrip(t);
    tokenizer_free(t);
    check_chat_missing_token();
    check_streaming();
    check_merge_strategies();
    check_translation();
    check_cli();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    if (test_failures) {
        fprintf(stderr, "%d check(s) failed\n", test_failures);
        return 1;
    }
    printf("tokenizer: all checks passed\n");
    return 0;
}
