// The tokenizer's representation, shared by tokenizer.c (loading, encoding) and detok.c
// (decoding). Not part of the public API.
#pragma once
#include <stdint.h>

#include "bpe.h"
#include "pretokenize.h"
#include "tokenizer.h"

struct k25_tokenizer {
    int n_vocab;     // ids 0..n_vocab-1
    int n_base;      // mergeable tokens: ids 0..n_base-1 (== vocab.n)
    int bytes_only;  // fallback tokenizer: one id per byte, no pattern, no specials in text
    bpe_vocab vocab;
    pretok pre;
    // Specials: ids n_base..n_vocab-1; special[k] is the name of id n_base + k.
    char **special;
    uint32_t *special_len;
    // Specials grouped by first byte for matching in text, longest first within a group:
    // by_first[first_start[c] .. first_start[c + 1]) are special indices starting with byte c.
    int32_t *by_first;
    int32_t first_start[257];
};
