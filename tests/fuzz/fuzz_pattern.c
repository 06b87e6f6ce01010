// Fuzz target: the pre-tokenizer pattern translation (tokenizer_translate_pattern: Rust-regex
// class set operations, \s, \d, \p{Script}, \u escapes -> PCRE2) and its compilation
// (pretok_compile). Patterns are not matched here (an arbitrary pattern can backtrack for
// minutes); fuzz_tokenize matches the real pattern.
//
// The input (up to 1024 bytes, cut at a NUL) is the pattern. A failure must say why;
// pretok_compile must succeed only if the translation does, and give the same translation.
#include "common.h"
#include "fuzz_common.h"
#include "pretokenize.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1024) return 0;
    char *pat = fuzz_cstr(data, size);
    char err[K25_ERR_LEN];
    err[0] = 0;
    char *tr = tokenizer_translate_pattern(pat, err);
    if (!tr && !err[0]) fuzz_fail("translation failed without a message");
    pretok p;
    err[0] = 0;
    if (pretok_compile(&p, pat, err)) {
        if (!err[0]) fuzz_fail("compile failed without a message");
    } else {
        if (!tr) fuzz_fail("pretok_compile accepted a pattern the translation rejects");
        if (strcmp(tr, p.pattern)) fuzz_fail("two translations of one pattern differ");
        pretok_free(&p);
    }
    free(tr);
    free(pat);
    return 0;
}
