// Kimi tokenizer: tiktoken-format byte-level BPE with special tokens and a streaming decoder.
//
// Vocabulary layout (what the model's embedding rows mean):
//   ids 0 .. n_base-1        mergeable tokens from tiktoken.model ("base64(bytes) rank" lines;
//                            the rank is the id and the merge priority, lower merges first)
//   ids n_base .. n_vocab-1  special tokens, named from tokenizer_config.json
//                            "added_tokens_decoder" when given, otherwise the Kimi defaults for
//                            the known ids (n_base == 163584) and "<|reserved_token_{id}|>" for
//                            the others (same numbering as Moonshot's TikTokenTokenizer).
// Encoding follows tiktoken: special-token strings are split off first (allow_special), the
// rest is cut into pieces by the pre-tokenizer regex (PCRE2, JIT; Rust-regex class
// intersections [A&&[^B]] are rewritten, see tokenizer_translate_pattern), pieces longer than
// the reference's chunk limits are split like the reference does, each piece is BPE-merged by
// rank.
//
// Invalid UTF-8 in the text to encode is an error naming the byte offset; the tokenizer never
// replaces bytes silently. Decoding never fails: bytes that do not form valid UTF-8 come out as
// U+FFFD when flushed.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k25_tokenizer k25_tokenizer;

// The Kimi pre-tokenizer pattern in Rust-regex syntax (as in tokenization_kimi.py).
extern const char *const K25_KIMI_PATTERN;

// Loads a tiktoken.model file. tokenizer_config_json: path or NULL. pattern: Rust-regex
// syntax or NULL for the Kimi pattern. n_vocab: model vocabulary size (>= number of ranks);
// 0 means "number of ranks + 256 reserved specials" (the Kimi convention). On error returns -1
// with a message naming the file and line in err (K25_ERR_LEN bytes).
int tokenizer_load(const char *tiktoken_path, const char *tokenizer_config_json, const char *pattern,
                   int n_vocab, k25_tokenizer **out, char *err);
// tokenizer_load with the tokenizer_config.json beside tiktoken_path, when its directory has
// one (a dangling link counts, and fails to open: a download that stopped half-way).
int tokenizer_load_with_config(const char *tiktoken_path, const char *pattern, int n_vocab,
                               k25_tokenizer **out, char *err);
// For models without a tokenizer file: ids 0..255 are the bytes; every other id decodes as
// "<|token_N|>". Encoding maps each byte to its id (no merges, no specials).
k25_tokenizer *tokenizer_bytes(int n_vocab);
void tokenizer_free(k25_tokenizer *t);
int tokenizer_n_vocab(const k25_tokenizer *t);
int tokenizer_n_base(const k25_tokenizer *t); // number of mergeable tokens (ranks)

// Encodes UTF-8 text. allow_special: special-token strings in the text become their ids
// (otherwise they are encoded as ordinary text). *ids is malloc'ed (free() it); on error
// returns -1 with a message (e.g. "invalid UTF-8 at byte offset 17") and *ids = NULL.
int tokenizer_encode(const k25_tokenizer *t, const char *text, size_t len, int allow_special,
                     int32_t **ids, size_t *n, char *err);
// Id of a special token by its full name (e.g. "<|im_end|>"); -1 if unknown.
int tokenizer_special_id(const k25_tokenizer *t, const char *name);
// Raw bytes of a token (not NUL-terminated); NULL for an id out of range.
const unsigned char *tokenizer_token_bytes(const k25_tokenizer *t, int32_t id, size_t *len);

// Streaming decode: holds a partial multi-byte UTF-8 sequence until it is complete.
typedef struct k25_detok {
    const k25_tokenizer *t;
    unsigned char pending[8];
    int n_pending;
} k25_detok;
void detok_init(k25_detok *d, const k25_tokenizer *t);
// Appends the text of one token to out (at most cap bytes, NUL-terminated when room is left);
// returns the number of bytes written, complete UTF-8 only. Invalid bytes come out as U+FFFD.
// cap >= 4 * (token length + 8) always suffices.
size_t detok_push(k25_detok *d, int32_t id, char *out, size_t cap);
// Writes what is still pending (an incomplete tail comes out as U+FFFD) and resets.
size_t detok_flush(k25_detok *d, char *out, size_t cap);

// Translates a tiktoken pattern (Rust regex syntax) into PCRE2 syntax. Class set operations
// become lookaheads: [A&&[^B]] -> (?:(?![B])[A]), [A&&B] -> (?:(?=[B])[A]), [A--B] ->
// (?:(?![B])[A]), with any number of operands (left to right), nested classes (unions) and an
// outer negation; symmetric difference (~~) and negated POSIX classes are rejected. \s, \w, \d,
// \S and \W (these two outside classes), \b, \B, POSIX classes (ASCII) and bare script names
// (\p{Han} -> \p{sc:Han}) are rewritten to keep Rust's meaning; see pretokenize.c for the full
// list and the limits. Returns a malloc'ed string, or NULL with a message in err.
char *tokenizer_translate_pattern(const char *rust_pattern, char *err);

#ifdef __cplusplus
}
#endif
