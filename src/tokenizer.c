// Kimi tokenizer: loading (tiktoken.model + tokenizer_config.json), special tokens, encoding.
//
// Encoding reproduces Moonshot's TikTokenTokenizer.encode: the text is cut into chunks of at
// most 400,000 code points, each chunk into slices with at most 25,000 consecutive whitespace
// or non-whitespace code points (Python str.isspace), and every slice goes through tiktoken
// (special tokens, pattern, BPE) on its own. The cuts only matter for very long runs.
#include "tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "json_object.h"
#include "tokenizer_internal.h"

#define CHUNK_MAX_CODEPOINTS 400000
#define RUN_MAX_CODEPOINTS 25000
#define KIMI_N_BASE 163584
#define KIMI_N_RESERVED 256

// ----------------------------------------------------------------------------
// Special token names

// Kimi's named specials (offsets from n_base), used when no tokenizer_config.json is given
// and the vocabulary has Kimi's size.
static const struct { int offset; const char *name; } kimi_specials[] = {
    {0, "[BOS]"},
    {1, "[EOS]"},
    {2, "<|im_end|>"},
    {3, "<|im_user|>"},
    {4, "<|im_assistant|>"},
    {6, "<|start_header_id|>"},
    {7, "<|end_header_id|>"},
    {9, "[EOT]"},
    {10, "<|im_system|>"},
    {11, "<|tool_calls_section_begin|>"},
    {12, "<|tool_calls_section_end|>"},
    {13, "<|tool_call_begin|>"},
    {14, "<|tool_call_argument_begin|>"},
    {15, "<|tool_call_end|>"},
    {17, "<|im_middle|>"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {22, "<think>"},
    {23, "</think>"},
    {254, "[UNK]"},
    {255, "[PAD]"},
};

static int set_special(k25_tokenizer *t, int id, const char *name, size_t len) {
    int k = id - t->n_base;
    free(t->special[k]);
    t->special[k] = k25_malloc(len + 1);
    memcpy(t->special[k], name, len);
    t->special[k][len] = 0;
    t->special_len[k] = (uint32_t)len;
    return 0;
}

// Names specials from "added_tokens_decoder": {"163584": {"content": "[BOS]", ...}, ...}.
// Entries outside [n_base, n_vocab) are not specials of this vocabulary and are skipped.
static int load_config_names(k25_tokenizer *t, const char *path, char *err) {
    size_t len;
    char *text = k25_read_file(path, &len, err);
    if (!text) return -1;
    cJSON *root = json_parse_object(text, len, path, err);
    if (!root) {
        free(text);
        return -1;
    }
    int rc = -1;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
    if (!dec) {
        rc = 0;
        goto out;
    }
    if (!cJSON_IsObject(dec)) {
        k25_err(err, "%s: \"added_tokens_decoder\" is not an object", path);
        goto out;
    }
    for (const cJSON *e = dec->child; e; e = e->next) {
        char *end;
        errno = 0;
        long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || errno || id < 0) {
            k25_err(err, "%s: added_tokens_decoder key \"%s\" is not a token id", path, e->string);
            goto out;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0]) {
            k25_err(err, "%s: added_tokens_decoder[\"%s\"].content is missing or not a non-empty string", path,
                    e->string);
            goto out;
        }
        if (id < t->n_base || id >= t->n_vocab) continue;
        set_special(t, (int)id, content->valuestring, strlen(content->valuestring));
    }
    rc = 0;
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

// Fills unnamed specials, rejects duplicate names and builds the first-byte index.
static int finish_specials(k25_tokenizer *t, const char *what, char *err) {
    int ns = t->n_vocab - t->n_base;
    for (int k = 0; k < ns; k++) {
        if (t->special[k]) continue;
        char name[64];
        int n = snprintf(name, sizeof name, t->bytes_only ? "<|token_%d|>" : "<|reserved_token_%d|>", t->n_base + k);
        set_special(t, t->n_base + k, name, (size_t)n);
    }
    // Index by first byte, longest first, so that the first hit at a position is the longest.
    t->by_first = k25_malloc((ns ? ns : 1) * sizeof *t->by_first);
    int count[256] = {0};
    for (int k = 0; k < ns; k++) count[(unsigned char)t->special[k][0]]++;
    t->first_start[0] = 0;
    for (int c = 0; c < 256; c++) t->first_start[c + 1] = t->first_start[c] + count[c];
    int fill[256];
    for (int c = 0; c < 256; c++) fill[c] = t->first_start[c];
    for (int k = 0; k < ns; k++) t->by_first[fill[(unsigned char)t->special[k][0]]++] = k;
    for (int c = 0; c < 256; c++) {
        int32_t *g = t->by_first + t->first_start[c];
        int gn = t->first_start[c + 1] - t->first_start[c];
        for (int a = 1; a < gn; a++) { // insertion sort by length, descending
            int32_t x = g[a];
            int b = a;
            while (b > 0 && t->special_len[g[b - 1]] < t->special_len[x]) g[b] = g[b - 1], b--;
            g[b] = x;
        }
        for (int a = 0; a + 1 < gn; a++)
            for (int b = a + 1; b < gn && t->special_len[g[b]] == t->special_len[g[a]]; b++)
                if (memcmp(t->special[g[a]], t->special[g[b]], t->special_len[g[a]]) == 0)
                    return k25_err(err, "%s: special token name \"%s\" is used by ids %d and %d", what,
                                   t->special[g[a]], t->n_base + g[a], t->n_base + g[b]);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Construction

static k25_tokenizer *tokenizer_alloc(int n_vocab, int n_base) {
    k25_tokenizer *t = k25_calloc(1, sizeof *t);
    t->n_vocab = n_vocab;
    t->n_base = n_base;
    int ns = n_vocab - n_base;
    t->special = k25_calloc(ns ? ns : 1, sizeof *t->special);
    t->special_len = k25_calloc(ns ? ns : 1, sizeof *t->special_len);
    return t;
}

int tokenizer_load(const char *tiktoken_path, const char *config_path, const char *pattern, int n_vocab,
                   k25_tokenizer **out, char *err) {
    *out = NULL;
    bpe_vocab v;
    if (bpe_vocab_load(&v, tiktoken_path, err)) return -1;
    if (n_vocab == 0) n_vocab = v.n + KIMI_N_RESERVED;
    if (n_vocab < v.n) {
        int n_tokens = v.n; // bpe_vocab_free clears v
        bpe_vocab_free(&v);
        return k25_err(err, "%s: %d tokens but the model vocabulary has only %d ids", tiktoken_path,
                       n_tokens, n_vocab);
    }
    k25_tokenizer *t = tokenizer_alloc(n_vocab, v.n);
    t->vocab = v;
    if (pretok_compile(&t->pre, pattern ? pattern : K25_KIMI_PATTERN, err)) goto fail;
    if (config_path) {
        if (load_config_names(t, config_path, err)) goto fail;
    } else if (t->n_base == KIMI_N_BASE) {
        for (size_t i = 0; i < sizeof kimi_specials / sizeof *kimi_specials; i++)
            if (KIMI_N_BASE + kimi_specials[i].offset < n_vocab)
                set_special(t, KIMI_N_BASE + kimi_specials[i].offset, kimi_specials[i].name,
                            strlen(kimi_specials[i].name));
    }
    if (finish_specials(t, config_path ? config_path : tiktoken_path, err)) goto fail;
    *out = t;
    return 0;
fail:
    tokenizer_free(t);
    return -1;
}

int tokenizer_load_with_config(const char *tiktoken_path, const char *pattern, int n_vocab,
                               k25_tokenizer **out, char *err) {
    const char *slash = strrchr(tiktoken_path, '/');
    size_t dn = slash ? (size_t)(slash - tiktoken_path + 1) : 0;
    char *conf = k25_malloc(dn + sizeof "tokenizer_config.json");
    memcpy(conf, tiktoken_path, dn);
    strcpy(conf + dn, "tokenizer_config.json");
    struct stat st;
    int rc = tokenizer_load(tiktoken_path, lstat(conf, &st) == 0 ? conf : NULL, pattern, n_vocab,
                            out, err);
    free(conf);
    return rc;
}

k25_tokenizer *tokenizer_bytes(int n_vocab) {
    int n_base = n_vocab < 256 ? n_vocab : 256;
    if (n_base < 1) K25_DIE("tokenizer_bytes: vocabulary size %d", n_vocab);
    // A rank file of the single bytes, parsed like any other.
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *text = k25_malloc((size_t)n_base * 16);
    size_t n = 0;
    for (int b = 0; b < n_base; b++)
        n += (size_t)sprintf(text + n, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    char err[K25_ERR_LEN];
    bpe_vocab v;
    if (bpe_vocab_parse(&v, "byte vocabulary", text, n, err)) K25_DIE("%s", err);
    free(text);
    k25_tokenizer *t = tokenizer_alloc(n_vocab, n_base);
    t->vocab = v;
    t->bytes_only = 1;
    if (finish_specials(t, "byte vocabulary", err)) K25_DIE("%s", err);
    return t;
}

void tokenizer_free(k25_tokenizer *t) {
    if (!t) return;
    bpe_vocab_free(&t->vocab);
    pretok_free(&t->pre);
    for (int k = 0; k < t->n_vocab - t->n_base; k++) free(t->special[k]);
    free(t->special);
    free(t->special_len);
    free(t->by_first);
    free(t);
}

int tokenizer_n_vocab(const k25_tokenizer *t) { return t->n_vocab; }
int tokenizer_n_base(const k25_tokenizer *t) { return t->n_base; }

int tokenizer_special_id(const k25_tokenizer *t, const char *name) {
    size_t len = strlen(name);
    unsigned char c = (unsigned char)name[0];
    for (int32_t a = t->first_start[c]; a < t->first_start[c + 1]; a++) {
        int32_t k = t->by_first[a];
        if (t->special_len[k] == len && memcmp(t->special[k], name, len) == 0) return t->n_base + k;
    }
    return -1;
}

const unsigned char *tokenizer_token_bytes(const k25_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (id < t->n_base) {
        *len = t->vocab.off[id + 1] - t->vocab.off[id];
        return t->vocab.bytes + t->vocab.off[id];
    }
    *len = t->special_len[id - t->n_base];
    return (const unsigned char *)t->special[id - t->n_base];
}

// ----------------------------------------------------------------------------
// Encoding

// Length of the valid UTF-8 prefix of s (strict: no overlongs, surrogates or > U+10FFFF).
static size_t utf8_valid_prefix(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len) { // ASCII fast path
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 2;
        else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return i;
        if (i + (size_t)n > len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (int k = 2; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += (size_t)n;
    }
    return len;
}

// Decodes the code point at s (valid UTF-8); returns its length in bytes.
static inline int utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) return *cp = c, 1;
    if (c < 0xE0) return *cp = (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F), 2;
    if (c < 0xF0) return *cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F), 3;
    *cp = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return 4;
}

// Python's str.isspace (what the reference's run splitting uses; not the regex's \s).
static inline int py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

typedef struct encode_ctx {
    const k25_tokenizer *t;
    pretok_state st;
    bpe_ids *out;
} encode_ctx;

static int encode_piece(void *ctx, const unsigned char *s, size_t len, char *err) {
    encode_ctx *c = ctx;
    return bpe_encode_piece(&c->t->vocab, s, len, c->out, err);
}

// Finds the leftmost special-token name in s (longest at that position). Returns its index
// (id - n_base) and start, or -1.
static int32_t find_special(const k25_tokenizer *t, const unsigned char *s, size_t len, size_t *at) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        for (int32_t a = t->first_start[c]; a < t->first_start[c + 1]; a++) {
            int32_t k = t->by_first[a];
            size_t n = t->special_len[k];
            if (n <= len - i && memcmp(s + i, t->special[k], n) == 0) {
                *at = i;
                return k;
            }
        }
    }
    return -1;
}

// One slice after the chunk/run cuts: tiktoken's encode with allowed_special = all / none.
static int encode_slice(encode_ctx *c, const unsigned char *s, size_t len, int allow_special, char *err) {
    const k25_tokenizer *t = c->t;
    while (allow_special && len) {
        size_t at;
        int32_t k = find_special(t, s, len, &at);
        if (k < 0) break;
        if (pretok_split(&t->pre, &c->st, s, at, encode_piece, c, err)) return -1;
        bpe_ids_push(c->out, t->n_base + k);
        s += at + t->special_len[k];
        len -= at + t->special_len[k];
    }
    return pretok_split(&t->pre, &c->st, s, len, encode_piece, c, err);
}

int tokenizer_encode(const k25_tokenizer *t, const char *text, size_t len, int allow_special, int32_t **ids,
                     size_t *n, char *err) {
    *ids = NULL;
    *n = 0;
    const unsigned char *s = (const unsigned char *)text;
    if (len && !s) return k25_err(err, "tokenizer_encode: NULL text");
    size_t valid = utf8_valid_prefix(s, len);
    if (valid < len) return k25_err(err, "invalid UTF-8 at byte offset %zu (byte 0x%02x)", valid, s[valid]);
    bpe_ids out = {0};
    if (t->bytes_only) {
        for (size_t i = 0; i < len; i++) {
            if (s[i] >= t->n_base) {
                free(out.v);
                return k25_err(err, "byte 0x%02x at offset %zu has no id in a %d-token byte vocabulary", s[i], i,
                               t->n_vocab);
            }
            bpe_ids_push(&out, s[i]);
        }
    } else {
        // Chunk at 400,000 code points; within a chunk cut before a code point that would make
        // a whitespace or non-whitespace run longer than 25,000.
        encode_ctx ctx = {.t = t, .out = &out};
        pretok_begin(&t->pre, &ctx.st);
        size_t slice = 0, cps = 0, run = 0;
        int run_space = 0, rc = 0;
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            int l = utf8_next(s + i, &cp);
            int sp = py_isspace(cp);
            int cut = 0;
            if (cps == CHUNK_MAX_CODEPOINTS) {
                cut = 1;
                cps = 0;
            }
            if (cps == 0) {
                run_space = sp;
                run = 0;
            }
            if (sp != run_space) {
                run_space = sp;
                run = 1;
            } else if (++run > RUN_MAX_CODEPOINTS) {
                cut = 1;
                run = 1;
            }
            if (cut && i > slice) {
                if ((rc = encode_slice(&ctx, s + slice, i - slice, allow_special, err))) break;
                slice = i;
            }
            cps++;
            i += (size_t)l;
        }
        if (!rc && len > slice) rc = encode_slice(&ctx, s + slice, len - slice, allow_special, err);
        pretok_end(&ctx.st);
        if (rc) goto fail;
    }
    *ids = out.v ? out.v : k25_malloc(sizeof(int32_t));
    *n = out.n;
    return 0;
fail:
    free(out.v);
    return -1;
}
