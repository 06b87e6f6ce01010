// Byte-level BPE: tiktoken.model parsing, the byte-string -> rank hash table and the merge loop.
#include "bpe.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

// Pieces up to this many bytes use the quadratic scan (what tiktoken does; fastest for the
// short pieces of normal text); longer ones a heap, so 25,000-byte runs stay linear-ish.
#define BPE_SCAN_MAX 128
#define RANK_NONE INT32_MAX

void bpe_ids_push(bpe_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 256;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) K25_DIE("out of memory growing a token list to %zu ids", cap);
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
}

// ----------------------------------------------------------------------------
// Hash table

static inline uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static inline int bytes_eq(const unsigned char *a, const unsigned char *b, size_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

int32_t bpe_rank(const bpe_vocab *v, const unsigned char *s, size_t len) {
    uint64_t h = hash_bytes(s, len);
    uint64_t tag = h >> 32;
    for (uint32_t i = (uint32_t)h & v->mask;; i = (i + 1) & v->mask) {
        uint64_t slot = v->slots[i];
        if (!slot) return -1;
        if ((slot >> 32) != tag) continue;
        int32_t r = (int32_t)(uint32_t)slot - 1;
        uint32_t o = v->off[r];
        if (v->off[r + 1] - o == len && bytes_eq(v->bytes + o, s, len)) return r;
    }
}

// Inserts rank r; returns the rank already holding the same bytes, or -1.
static int32_t hash_insert(bpe_vocab *v, int32_t r) {
    const unsigned char *s = v->bytes + v->off[r];
    size_t len = v->off[r + 1] - v->off[r];
    uint64_t h = hash_bytes(s, len);
    uint64_t tag = h >> 32;
    for (uint32_t i = (uint32_t)h & v->mask;; i = (i + 1) & v->mask) {
        uint64_t slot = v->slots[i];
        if (!slot) {
            v->slots[i] = (tag << 32) | (uint64_t)(uint32_t)(r + 1);
            return -1;
        }
        if ((slot >> 32) != tag) continue;
        int32_t q = (int32_t)(uint32_t)slot - 1;
        uint32_t o = v->off[q];
        if (v->off[q + 1] - o == len && memcmp(v->bytes + o, s, len) == 0) return q;
    }
}

// ----------------------------------------------------------------------------
// tiktoken.model parsing

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Strict standard base64 (padding required, '=' only at the end). Returns the decoded length
// or -1.
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (n == 0 || n % 4) return -1;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad) return -1; // data after '='
            v[k] = b64_value(c);
            if (v[k] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (pad < 2) out[o++] = (unsigned char)(w >> 8);
        if (pad < 1) out[o++] = (unsigned char)w;
    }
    return o;
}

typedef struct parsed_line {
    int32_t rank;
    int line;
    uint32_t off, len; // into the line-order byte arena
} parsed_line;

int bpe_vocab_parse(bpe_vocab *v, const char *name, const char *text, size_t len, char *err) {
    memset(v, 0, sizeof *v);
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += text[i] == '\n';
    parsed_line *pl = k25_malloc(n_lines * sizeof *pl);
    unsigned char *arena = k25_malloc(len / 4 * 3 + 4); // decoded bytes never exceed 3/4 of the text
    size_t n = 0, arena_n = 0;
    int line = 0, rc = -1;
    int32_t *line_of_rank = NULL;
    for (size_t p = 0; p < len;) {
        const char *ls = text + p;
        const char *nl = memchr(ls, '\n', len - p);
        size_t ll = nl ? (size_t)(nl - ls) : len - p;
        p += ll + (nl != NULL);
        line++;
        if (ll && ls[ll - 1] == '\r') ll--;
        if (ll == 0) continue;
        // Two fields separated by blanks.
        size_t a = 0;
        while (a < ll && (ls[a] == ' ' || ls[a] == '\t')) a++;
        size_t a_end = a;
        while (a_end < ll && ls[a_end] != ' ' && ls[a_end] != '\t') a_end++;
        size_t b = a_end;
        while (b < ll && (ls[b] == ' ' || ls[b] == '\t')) b++;
        size_t b_end = b;
        while (b_end < ll && ls[b_end] != ' ' && ls[b_end] != '\t') b_end++;
        size_t rest = b_end;
        while (rest < ll && (ls[rest] == ' ' || ls[rest] == '\t')) rest++;
        if (a == a_end || b == b_end || rest != ll) {
            k25_err(err, "%s:%d: expected \"base64(token) rank\"", name, line);
            goto out;
        }
        long bl = b64_decode(ls + a, a_end - a, arena + arena_n);
        if (bl <= 0) {
            k25_err(err, "%s:%d: invalid base64 token \"%.*s\"", name, line, (int)(a_end - a > 64 ? 64 : a_end - a),
                    ls + a);
            goto out;
        }
        long long r = 0;
        for (size_t k = b; k < b_end; k++) {
            if (ls[k] < '0' || ls[k] > '9' || (r = r * 10 + (ls[k] - '0')) > (1 << 30)) {
                k25_err(err, "%s:%d: rank \"%.*s\" is not a non-negative integer below 2^30", name, line,
                        (int)(b_end - b > 32 ? 32 : b_end - b), ls + b);
                goto out;
            }
        }
        pl[n++] = (parsed_line){.rank = (int32_t)r, .line = line, .off = (uint32_t)arena_n, .len = (uint32_t)bl};
        arena_n += (size_t)bl;
    }
    if (n == 0) {
        k25_err(err, "%s: no tokens", name);
        goto out;
    }
    // Ranks must be exactly 0..n-1: no duplicates, none out of range (which means a gap).
    line_of_rank = k25_malloc(n * sizeof *line_of_rank);
    for (size_t i = 0; i < n; i++) line_of_rank[i] = 0;
    int gap_line = 0;
    int32_t gap_rank = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t r = pl[i].rank;
        if ((size_t)r >= n) {
            if (!gap_line) gap_line = pl[i].line, gap_rank = r;
            continue;
        }
        if (line_of_rank[r]) {
            k25_err(err, "%s:%d: duplicate rank %d (also on line %d)", name, pl[i].line, r, line_of_rank[r]);
            goto out;
        }
        line_of_rank[r] = pl[i].line;
    }
    if (gap_line) {
        size_t missing = 0;
        while (line_of_rank[missing]) missing++;
        k25_err(err, "%s:%d: rank %d but rank %zu is missing (%zu tokens need ranks 0..%zu without gaps)", name,
                gap_line, gap_rank, missing, n, n - 1);
        goto out;
    }
    // Lay the bytes out in rank order.
    v->n = (int)n;
    v->bytes = k25_malloc(arena_n ? arena_n : 1);
    v->off = k25_malloc((n + 1) * sizeof *v->off);
    uint32_t *len_of_rank = k25_malloc(n * sizeof *len_of_rank), *src_of_rank = k25_malloc(n * sizeof *src_of_rank);
    for (size_t i = 0; i < n; i++) len_of_rank[pl[i].rank] = pl[i].len, src_of_rank[pl[i].rank] = pl[i].off;
    uint32_t o = 0;
    for (size_t r = 0; r < n; r++) {
        v->off[r] = o;
        memcpy(v->bytes + o, arena + src_of_rank[r], len_of_rank[r]);
        o += len_of_rank[r];
    }
    v->off[n] = o;
    free(len_of_rank);
    free(src_of_rank);
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    v->mask = cap - 1;
    v->slots = k25_calloc(cap, sizeof *v->slots);
    for (int r = 0; r < 256; r++) v->byte_rank[r] = -1;
    v->pair_rank = k25_malloc(65536 * sizeof *v->pair_rank);
    for (int p = 0; p < 65536; p++) v->pair_rank[p] = -1;
    for (size_t r = 0; r < n; r++) {
        int32_t q = hash_insert(v, (int32_t)r);
        if (q >= 0) {
            k25_err(err, "%s:%d: duplicate token (same bytes as rank %d on line %d)", name, line_of_rank[r], q,
                    line_of_rank[q]);
            bpe_vocab_free(v);
            goto out;
        }
        const unsigned char *b = v->bytes + v->off[r];
        if (v->off[r + 1] - v->off[r] == 1) v->byte_rank[b[0]] = (int32_t)r;
        if (v->off[r + 1] - v->off[r] == 2) v->pair_rank[b[0] << 8 | b[1]] = (int32_t)r;
    }
    rc = 0;
out:
    free(line_of_rank);
    free(pl);
    free(arena);
    return rc;
}

int bpe_vocab_load(bpe_vocab *v, const char *path, char *err) {
    size_t n;
    char *buf = k25_read_file(path, &n, err);
    if (!buf) return -1;
    int rc = bpe_vocab_parse(v, path, buf, n, err);
    free(buf);
    return rc;
}

void bpe_vocab_free(bpe_vocab *v) {
    free(v->bytes);
    free(v->off);
    free(v->slots);
    free(v->pair_rank);
    memset(v, 0, sizeof *v);
}

// ----------------------------------------------------------------------------
// Merging

static inline int32_t rank_or_none(const bpe_vocab *v, const unsigned char *s, size_t len) {
    int32_t r = bpe_rank(v, s, len);
    return r < 0 ? RANK_NONE : r;
}

static inline int32_t pair_or_none(const bpe_vocab *v, const unsigned char *s) {
    int32_t r = v->pair_rank[s[0] << 8 | s[1]];
    return r < 0 ? RANK_NONE : r;
}

void bpe_merge_scan(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out) {
    // parts[i] starts at start[i] and is token tok[i]; rank[i] is the rank of parts i and i+1
    // merged. The last two entries are sentinels (start[np-1] == len).
    uint32_t start[BPE_SCAN_MAX + 1];
    int32_t rank[BPE_SCAN_MAX + 1], tok[BPE_SCAN_MAX + 1];
    size_t np = len + 1;
    for (size_t i = 0; i < np; i++) start[i] = (uint32_t)i;
    for (size_t i = 0; i < len; i++) tok[i] = v->byte_rank[s[i]];
    for (size_t i = 0; i + 1 < len; i++) rank[i] = pair_or_none(v, s + i);
    rank[len - 1] = rank[len] = RANK_NONE;
    for (;;) {
        int32_t best = RANK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < np; i++)
            if (rank[i] < best) best = rank[i], bi = i;
        if (best == RANK_NONE) break;
        tok[bi] = best;
        if (bi > 0)
            rank[bi - 1] = bi + 2 < np ? rank_or_none(v, s + start[bi - 1], start[bi + 2] - start[bi - 1]) : RANK_NONE;
        rank[bi] = bi + 3 < np ? rank_or_none(v, s + start[bi], start[bi + 3] - start[bi]) : RANK_NONE;
        memmove(start + bi + 1, start + bi + 2, (np - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (np - bi - 2) * sizeof *rank);
        memmove(tok + bi + 1, tok + bi + 2, (np - bi - 2) * sizeof *tok);
        np--;
    }
    for (size_t i = 0; i + 1 < np; i++) bpe_ids_push(out, tok[i]);
}

// Min-heap of (rank << 32 | start): lowest rank first, leftmost on ties, like the scan.
static void heap_push(uint64_t *h, size_t *n, uint64_t key) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = key;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

void bpe_merge_heap(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out) {
    // A part is named by its start byte; next[i] is the start of the following part (len for
    // the last), prev[i] the start of the preceding one. pair[i]: rank of part i merged with
    // its successor (RANK_NONE if absent or i is dead). Stale heap entries are skipped by
    // checking pair[i] (a rank names one byte string, and i fixes where it starts).
    uint32_t *next = k25_malloc((len + 1) * sizeof *next);
    uint32_t *prev = k25_malloc((len + 1) * sizeof *prev);
    int32_t *pair = k25_malloc((len + 1) * sizeof *pair);
    int32_t *tok = k25_malloc((len + 1) * sizeof *tok); // token of the part starting at i
    uint64_t *heap = k25_malloc(3 * (len + 1) * sizeof *heap);
    size_t hn = 0;
    for (size_t i = 0; i <= len; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i ? i - 1 : 0);
        tok[i] = i < len ? v->byte_rank[s[i]] : RANK_NONE;
        pair[i] = i + 1 < len ? pair_or_none(v, s + i) : RANK_NONE;
        if (pair[i] != RANK_NONE) heap_push(heap, &hn, (uint64_t)pair[i] << 32 | i);
    }
    while (hn) {
        uint64_t key = heap_pop(heap, &hn);
        uint32_t i = (uint32_t)key;
        int32_t r = (int32_t)(key >> 32);
        if (pair[i] != r) continue;
        uint32_t j = next[i], k = next[j]; // merge part j into part i
        tok[i] = r;
        pair[j] = RANK_NONE;
        next[i] = k;
        prev[k] = i;
        pair[i] = k < len ? rank_or_none(v, s + i, next[k] - i) : RANK_NONE;
        if (pair[i] != RANK_NONE) heap_push(heap, &hn, (uint64_t)pair[i] << 32 | i);
        if (i > 0) {
            uint32_t p = prev[i];
            pair[p] = rank_or_none(v, s + p, k - p);
            if (pair[p] != RANK_NONE) heap_push(heap, &hn, (uint64_t)pair[p] << 32 | p);
        }
    }
    for (uint32_t i = 0; i < len; i = next[i]) bpe_ids_push(out, tok[i]);
    free(tok);
    free(next);
    free(prev);
    free(pair);
    free(heap);
}

int bpe_encode_piece(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out, char *err) {
    if (len == 0) return 0;
    int32_t whole = bpe_rank(v, s, len);
    if (whole >= 0) {
        bpe_ids_push(out, whole);
        return 0;
    }
    for (size_t i = 0; i < len; i++)
        if (v->byte_rank[s[i]] < 0) return k25_err(err, "vocabulary has no token for byte 0x%02x", s[i]);
    if (len <= BPE_SCAN_MAX)
        bpe_merge_scan(v, s, len, out);
    else
        bpe_merge_heap(v, s, len, out);
    return 0;
}
