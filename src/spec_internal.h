// The interface every draft source implements (spec_ngram.c, spec_model.c, spec_eagle3.c) and
// what spec.c hands their constructors. Not for use outside the spec_*.c files.
#pragma once
#include "spec.h"

// Everything a draft may need from the target and the run.
typedef struct spec_env {
    k25_model *target;
    const k25_weights *tw;     // the target's weights (this rank's slices)
    const k25_config *cfg;     // the target's configuration
    const k25_dist *dist;
    k25_spec_opts o;
} spec_env;

typedef struct spec_draft spec_draft;
struct spec_draft {
    const char *kind;          // "ngram", "model", "eagle3"
    void *impl;
    // Target layers whose input hidden states the draft reads (model_capture_layers), or 0.
    int n_capture;
    int capture[3];
    const k25_kvcache *cache;  // the draft's own latent cache allocator, or NULL
    // Forget every sequence (a new engine or generation starts).
    void (*reset)(spec_draft *d);
    // The sequence in slot ended.
    void (*release)(spec_draft *d, int slot);
    // For each seqs[i] with n_draft > 0 (the number wanted): writes up to that many tokens to
    // seqs[i].draft and lowers n_draft to what it found. When seqs[i].q is not NULL (a request
    // under temperature), the draft must draw each token from a distribution over the whole
    // vocabulary and write it to the q row ((float *)q + j * vocab); a draft that proposes
    // deterministically sets q to NULL instead (point masses).
    void (*propose)(spec_draft *d, k25_spec_seq *seqs, int n);
    // The rows of the last target step (spec_observe); NULL when not needed.
    void (*observe)(spec_draft *d, const k25_spec_obs *obs, int n);
    void (*destroy)(spec_draft *d);
};

// Constructors: 0, or -1 with a message in err. arg is the text after "kind:" (may be empty).
int spec_ngram_create(const spec_env *env, const char *arg, spec_draft *d, char *err);
int spec_model_create(const spec_env *env, const char *arg, spec_draft *d, char *err);
int spec_eagle3_create(const spec_env *env, const char *arg, spec_draft *d, char *err);
// A model draft's configuration ("DIR", "DIR@SEED", "FILE.ini[@SEED]" in arg), checked against
// the target and the run; needs no weights (env->target may be NULL). path receives the
// draft's file or directory; synthetic and seed what the text asks for.
int spec_model_config(const spec_env *env, const char *arg, k25_config *c, char *path,
                      size_t cap_path, int *synthetic, uint64_t *seed, char *err);

// Opens `slot` of a draft's cache for a sequence of the target's, promised what the target
// promised it (max_len; 0: the whole context, cap): a draft never holds a position the target
// does not, so a cache of the target's block count (k25_spec_opts.n_blocks) has room for every
// sequence the target admits. Dies naming `who` and the counts otherwise.
void spec_cache_open(k25_kvcache *kv, int slot, int max_len, int cap, const char *who);

// Token at index i of a sequence's history (prompt then generated).
static inline int32_t spec_hist(const int32_t *prompt, int n_prompt, const int32_t *gen, int i) {
    return i < n_prompt ? prompt[i] : gen[i - n_prompt];
}

// Counter-based random streams of the speculative decoder (sampler_uniform ids; above every
// token id, so they never coincide with the sampler's Gumbel noise of a token).
#define SPEC_RNG_DRAFT 0x5350454300000001ull   // a draft's own sampling
#define SPEC_RNG_ACCEPT 0x5350454300000002ull  // accept test
#define SPEC_RNG_RESAMPLE 0x5350454300000003ull // draw from the residual
#define SPEC_RNG_ORACLE 0x5350454300000004ull  // controlled acceptance
