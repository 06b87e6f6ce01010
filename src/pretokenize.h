// Pre-tokenization: cuts text into the pieces that BPE encodes, with a tiktoken pattern
// (Rust-regex syntax) translated to PCRE2 and matched with the PCRE2 JIT. Internal to the
// tokenizer.
#pragma once
#include <stddef.h>

typedef struct pretok {
    void *re;      // pcre2_code_8 *
    char *pattern; // the translated PCRE2 pattern
    int jit;       // 1 when JIT compilation succeeded
} pretok;

// Compiles a Rust-regex pattern (see tokenizer_translate_pattern for what is translated).
int pretok_compile(pretok *p, const char *rust_pattern, char *err);
void pretok_free(pretok *p);

// Per-call match resources (match data, match context, JIT stack): one per encode call, so a
// compiled pattern can be shared by threads.
typedef struct pretok_state {
    void *md, *mc, *js;
} pretok_state;
void pretok_begin(const pretok *p, pretok_state *st);
void pretok_end(pretok_state *st);

// Calls fn on each match, left to right, like tiktoken's find_iter: text between matches is
// dropped and empty matches produce nothing. s must be valid UTF-8 (not checked again).
// fn returns 0 to go on or -1 to stop with its message in err.
typedef int (*pretok_piece_fn)(void *ctx, const unsigned char *s, size_t len, char *err);
int pretok_split(const pretok *p, pretok_state *st, const unsigned char *s, size_t len, pretok_piece_fn fn, void *ctx,
                 char *err);
