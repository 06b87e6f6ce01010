// Developer tools behind `k25dec --tokenize` / `--detokenize`: text <-> token ids.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// tokfile: tiktoken.model path, or NULL for the byte fallback tokenizer. pattern: Rust-regex
// pre-tokenizer pattern or NULL for Kimi's. Both return a process exit code (0 = ok).
// All of `in` (UTF-8 text) -> ids space-separated on one line. Special-token strings in the
// text are recognized.
int tokenizer_cli_tokenize(const char *tokfile, const char *pattern, FILE *in, FILE *out);
// Whitespace-separated ids on `in` -> text on `out` (no newline added).
int tokenizer_cli_detokenize(const char *tokfile, const char *pattern, FILE *in, FILE *out);

#ifdef __cplusplus
}
#endif
