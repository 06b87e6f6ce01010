// Vocabulary-parallel sampling: greedy, temperature, top-k and top-p over logits split across
// the ranks of a tensor-parallel group, with the same token on every rank and for every rank
// count.
//
// How a token is chosen (z_i = logit_i / temp, i a global token id):
//   greedy (temp == 0)        argmax logit_i, ties -> lowest id
//   temperature only          Gumbel-max: argmax z_i + g(seed, counter, i), g ~ Gumbel(0, 1)
//                             drawn from a counter-based RNG keyed by the global id, so the
//                             draw is exactly softmax(z) and does not depend on how the
//                             vocabulary is split
//   top-k and/or top-p        the candidates are the global top C by z (C = top_k, or
//                             K25_SAMPLE_CAND_MAX when only top-p is on), found exactly by
//                             gathering every rank's local top C; top-p keeps the shortest
//                             prefix (by z, descending) whose probability reaches top_p, the
//                             probabilities being softmax(z) over the top-k set when top_k is
//                             on, over the whole vocabulary otherwise; then Gumbel-max among
//                             the kept candidates.
// Temperature is applied before top-k/top-p (as Hugging Face's warpers do). The candidate cap:
// top-p alone keeps at most K25_SAMPLE_CAND_MAX (1024) tokens, a nucleus wider than that is cut
// there, and a top_k above the cap acts as the cap.
// Candidate order is (z descending, id ascending) everywhere, so ties break the same way on any
// split.
#pragma once
#include <math.h>
#include <mpi.h>
#include <stdint.h>

#include "backend.h"

#define K25_SAMPLE_CAND_MAX 1024

#if defined(__CUDACC__)
#define K25_SAMPLER_HD __host__ __device__ __forceinline__
#else
#define K25_SAMPLER_HD static inline
#endif

// ------------------------------------------------------------------------------------------
// Counter-based random numbers
// ------------------------------------------------------------------------------------------

K25_SAMPLER_HD uint64_t sampler_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in the open interval (0, 1), a pure function of (seed, counter, id).
K25_SAMPLER_HD double sampler_uniform(uint64_t seed, uint64_t counter, uint64_t id) {
    uint64_t h = sampler_mix(sampler_mix(sampler_mix(seed) ^ counter) ^ sampler_mix(~id));
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard Gumbel noise for token `id`.
K25_SAMPLER_HD double sampler_gumbel(uint64_t seed, uint64_t counter, uint64_t id) {
    return -log(-log(sampler_uniform(seed, counter, id)));
}

// ------------------------------------------------------------------------------------------
// The pieces (each rank runs the local ones on its slice; tests run them on simulated splits)
// ------------------------------------------------------------------------------------------

typedef enum {
    SAMPLER_GREEDY = 0,   // argmax of the logits
    SAMPLER_GUMBEL,       // temperature only: argmax of z + Gumbel over the whole vocabulary
    SAMPLER_CANDIDATES,   // top-k and/or top-p: gather candidates, then Gumbel-max among them
} sampler_mode;

typedef struct k25_cand {
    double score;         // logit (greedy), z (candidates) or z + Gumbel (best of a Gumbel-max)
    int32_t id;           // global token id
} k25_cand;

// Softmax statistics of a slice: sum exp(z - zmax).
typedef struct k25_softmax_stats {
    double zmax, sum;
} k25_softmax_stats;

#ifdef __cplusplus
extern "C" {
#endif

sampler_mode sampler_mode_of(const k25_sampling *p);
// Candidates each rank contributes in SAMPLER_CANDIDATES mode.
int sampler_cand_count(const k25_sampling *p);
// a ranks before b: higher score, then lower id.
static inline int sampler_before(k25_cand a, k25_cand b) {
    return a.score > b.score || (a.score == b.score && a.id < b.id);
}

// GREEDY / GUMBEL: best token of a slice logits[n] (global ids vocab_begin ..). NaN logits
// never win. The global best is the best of the slices' bests (sampler_before).
k25_cand sampler_local_best(const float *logits, int n, int vocab_begin, const k25_sampling *p);
// CANDIDATES: the slice's top c tokens by z (sampler_before order, written sorted); returns
// how many (min(c, n)).
int sampler_local_top(const float *logits, int n, int vocab_begin, float temp, int c,
                      k25_cand *out);
// Softmax statistics of the slice's z; merge slices with sampler_stats_merge.
k25_softmax_stats sampler_local_stats(const float *logits, int n, float temp);
k25_softmax_stats sampler_stats_merge(k25_softmax_stats a, k25_softmax_stats b);
// CANDIDATES: the token among the gathered candidates (any order; n may exceed the count
// kept; sorted in place). stats: softmax statistics of the whole vocabulary (used when top-p
// is on and top-k is off).
int32_t sampler_pick(k25_cand *cands, int n, const k25_sampling *p, k25_softmax_stats stats);

// The whole thing on one rank's slice of n_rows rows of logits [n_rows][V_local], collectives
// over comm (the tensor-parallel group; may have one rank). out[n_rows] on every rank.
void sampler_sample(MPI_Comm comm, const float *logits, int n_rows, int V_local,
                    int vocab_begin, const k25_sampling *params, int32_t *out);

#ifdef __cplusplus
}
#endif
