// Byte-level BPE vocabulary (tiktoken.model) and the tiktoken merge algorithm.
//
// A vocabulary maps byte strings to ranks 0..n-1; the rank is both the token id and the merge
// priority. Encoding a piece repeatedly merges the adjacent pair of parts whose concatenation
// has the lowest rank (leftmost on ties) until no concatenation is in the vocabulary, exactly
// as tiktoken's byte_pair_merge does. Internal to the tokenizer.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct bpe_vocab {
    int n;                 // number of tokens; ranks are 0..n-1
    unsigned char *bytes;  // every token's bytes, concatenated in rank order
    uint32_t *off;         // [n + 1] rank -> offset into bytes (token r is bytes[off[r]..off[r+1]))
    uint64_t *slots;       // [mask + 1] hash table: (hash high 32 bits << 32) | (rank + 1); 0 = empty
    uint32_t mask;
    int32_t byte_rank[256]; // rank of each single byte, -1 when the vocabulary lacks it
    int32_t *pair_rank;     // [65536] rank of each two-byte string (b0 << 8 | b1), -1 if absent
} bpe_vocab;

// A growable id list.
typedef struct bpe_ids {
    int32_t *v;
    size_t n, cap;
} bpe_ids;

void bpe_ids_push(bpe_ids *ids, int32_t id);

// Parses a tiktoken.model file ("base64(bytes) rank" per line, empty lines skipped). Errors
// (bad base64, non-numeric or duplicate rank, duplicate token, missing rank) name the file
// and line. Returns 0 or -1 with a message in err.
int bpe_vocab_load(bpe_vocab *v, const char *path, char *err);
// Same for a file already in memory (name is used in messages).
int bpe_vocab_parse(bpe_vocab *v, const char *name, const char *text, size_t len, char *err);
void bpe_vocab_free(bpe_vocab *v);

// Rank of a byte string, -1 if absent.
int32_t bpe_rank(const bpe_vocab *v, const unsigned char *s, size_t len);

// Appends the ids of one pre-tokenized piece. Returns 0, or -1 when a byte of the piece has
// no token of its own (the vocabulary is not byte-complete) with a message in err.
int bpe_encode_piece(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out, char *err);

// The two merge strategies (bpe_encode_piece picks one by length); exposed so that tests can
// check they agree. Both require len >= 2 and every byte present in the vocabulary.
void bpe_merge_scan(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out);
void bpe_merge_heap(const bpe_vocab *v, const unsigned char *s, size_t len, bpe_ids *out);
