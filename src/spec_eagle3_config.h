// The configuration of an EAGLE-3 MLA draft head (the config.json beside its weights), read and
// checked against the target it drafts for (../shared/KIMI_K25.md §6.3).
#pragma once
#include <stddef.h>

#include "config.h"

#define EAGLE3_MAX_AUX 3

typedef struct eagle3_config {
    k25_config cfg;              // the draft's two dense layers: [0] the decoder layer, [1] the
                                 // carrier of the input tensors; tokens and run settings are
                                 // the target's
    int n_aux;                   // target hidden states concatenated into fc's input
    int aux_ids[EAGLE3_MAX_AUX]; // the target layers whose input they are, ascending
    int Dt;                      // their width (the target's hidden size)
    int Vd;                      // draft vocabulary (below the target's: a d2t map translates)
    int norm_before_residual;
} eagle3_config;

// What the draft must fit: the target and the run's shape.
typedef struct eagle3_fit {
    const k25_config *target;
    int ctx_size;                // the target's context (drafts never go past it)
    int kv_block;
    int tp;                      // tensor-parallel ranks the head is split over
} eagle3_fit;

// len bytes of config.json text (no NUL needed), named `path` in messages. Returns 0, or -1
// with a message naming path and the key.
int eagle3_config_parse(eagle3_config *out, const char *json, size_t len, const char *path,
                        const eagle3_fit *fit, char *err);
// DIR/config.json.
int eagle3_config_read(eagle3_config *out, const char *dir, const eagle3_fit *fit, char *err);
