// Speculative decoding: a draft proposes up to K tokens for a sequence, the target verifies
// them and one more in a single forward pass over K+1 positions (model_step with K+1 rows for
// that sequence, all sampled, batched with the other sequences of the step), and the accepted
// prefix plus one target token is emitted. ../shared/KIMI_K25.md §6, ../shared/PERF.md §7.
//
// Draft sources (--spec-draft), behind one interface (spec_internal.h):
//   ngram            prompt lookup: the last n tokens (n = 3, 2, 1) are looked up earlier in the
//                    sequence's own history and what followed them is proposed; no model
//   ngram:MAX        the same with n from MAX down to 1
//   model:DIR        a draft of the same architecture family loaded like the target from a
//                    checkpoint directory (config.json + safetensors), sharing the vocabulary
//   model:FILE.ini[@SEED]
//                    the same with synthetic weights of a .ini configuration (SEED default 1);
//                    model:DIR@SEED: DIR's config.json with synthetic weights
//   eagle3:DIR       EAGLE-3 draft head, MLA variant (Eagle3DeepseekV2ForCausalLM, e.g.
//                    lightseekorg/kimi-k2.5-eagle3-mla): one MLA decoder layer fed through `fc`
//                    by three hidden states of the target, captured during its steps
// Model and EAGLE-3 drafts run on the same ranks as the target, split over the same
// tensor-parallel group, each with its own paged latent cache of the target's block count.
//
// Acceptance:
//   temperature 0    the longest prefix of drafts equal to the target's greedy tokens is
//                    accepted, then the target's token at the first mismatch (or the bonus
//                    token after K accepted drafts): the output equals plain greedy decoding
//   temperature > 0  speculative sampling: draft x (drawn from q) is accepted with probability
//                    min(1, p(x)/q(x)), otherwise a token is drawn from max(0, p - q)
//                    normalized; p and q are the distributions the sampler (sampler.h) draws
//                    from under the request's temperature / top-k / top-p. The n-gram draft's q
//                    is a point mass. This needs the full-vocabulary logits of the verified
//                    rows (model_step's logits_out: a gather of [rows][vocab] floats per step).
// Random numbers are counter-based (sampler_uniform) keyed by the request's seed and the index
// of the token being decided, so every rank decides the same way.
//
// Rejected positions: the target's cache is truncated to the accepted length (positions past
// it are overwritten later); the drafts' caches follow the same rule. Drafts stop at the
// context end (the verified rows are positions of the target's cache), so a draft needs no
// more positions than the target.
#pragma once
#include "config.h"
#include "dist.h"
#include "kvcache.h"
#include "model.h"
#include "weights.h"

#define K25_SPEC_MAX_K 16

typedef struct k25_spec k25_spec;

typedef struct k25_spec_opts {
    int k;                 // tokens drafted per verification (1 .. K25_SPEC_MAX_K)
    int max_seqs;          // sequence slots of the target (engine max_batch; 1 for k25dec)
    int max_rows;          // rows of one draft step at most (>= max_seqs)
    int ctx_size;          // the target's context; drafts stay inside it, so their caches too
    int kv_block;          // cache block size of the drafts
    int n_blocks;          // cache blocks of a model or EAGLE-3 draft (0: every slot's whole
                           // context); the target's count is enough (k25_spec_seq.max_len)
    const char *backend;   // "cpu" or "cuda" (model and EAGLE-3 drafts)
    int threads;           // CPU threads of draft backends (0: the default)
} k25_spec_opts;

// One sequence as the engine (or generate) hands it to the speculative decoder.
typedef struct k25_spec_seq {
    // in
    int slot;              // the target's sequence slot (drafts keep per-slot state)
    int id;                // request id (for the controlled-acceptance oracle)
    const int32_t *prompt; // [n_prompt]
    int n_prompt;
    const int32_t *gen;    // [n_gen] generated so far; the history is prompt then gen
    int n_gen;
    int max_draft;         // most tokens this sequence may draft now (room left)
    int max_len;           // the most positions the target's cache promised the sequence (0:
                           // the context). Its draft cache is promised as many: a draft never
                           // holds a position the target does not, so a draft cache of the
                           // target's block count never runs short.
    k25_sampling sampling; // the request's settings (counter ignored)
    // out (spec_propose)
    int n_draft;           // tokens drafted (0: a plain decode row)
    int32_t *draft;        // [n_draft] (owned by the spec)
    const float *q;        // [n_draft][vocab] draft probabilities; NULL: point masses
} k25_spec_seq;

// Rows of the last target step that belong to one sequence (spec_observe): rows
// [row0, row0 + n_rows) at positions pos0 .. pos0 + n_rows - 1. Row p is part of the sequence
// once the token after it is known, i.e. p + 1 < n_prompt + n_gen.
typedef struct k25_spec_obs {
    int slot;
    int row0, pos0, n_rows;
    int max_len;           // as in k25_spec_seq
    const int32_t *prompt;
    int n_prompt;
    const int32_t *gen;
    int n_gen;
} k25_spec_obs;

typedef struct k25_spec_stats {
    long rounds;           // verifications with at least one drafted token
    long drafted;          // tokens drafted
    long accepted;         // drafted tokens accepted
    long emitted;          // tokens emitted by verifications (accepted + 1 each)
    long plain_rows;       // decode rows without a draft
    double draft_ms;       // host time inside the draft (propose + observe)
} k25_spec_stats;

#ifdef __cplusplus
extern "C" {
#endif

// ------------------------------------------------------------------------------------------
// Life cycle
// ------------------------------------------------------------------------------------------

// What spec_create checks before it needs weights: the --spec-draft text, the options and the
// draft's configuration against the target's (cfg) and the ranks. 0, or -1 with a message; for
// a run to call before a load that takes minutes. Every rank calls it alike. cache_values (may
// be NULL) receives the values one position takes in the draft's latent cache on a rank (its
// layers x latent width; 0 for the n-gram draft): a cache budget covers them with the target's.
int spec_check(const char *source, const k25_config *cfg, const k25_dist *dist,
               const k25_spec_opts *o, int64_t *cache_values, char *err);
// The draft's cache allocator (NULL for the n-gram draft): its blocks and promises.
const k25_kvcache *spec_draft_cache(const k25_spec *sp);
// Parses the --spec-draft text and builds the draft against the target (tw: the target's
// weights, whose embedding / lm_head / final norm an EAGLE-3 head without its own reuses).
// Every rank calls it alike. NULL with a message in err on a bad source.
k25_spec *spec_create(const char *source, k25_model *target, const k25_weights *tw,
                      const k25_config *cfg, const k25_dist *dist, const k25_spec_opts *o,
                      char *err);
void spec_free(k25_spec *sp);
int spec_k(const k25_spec *sp);
const char *spec_draft_kind(const k25_spec *sp);   // "ngram", "model", "eagle3"
// Before a run over the target (an engine or a generation): forgets every sequence, turns on
// the target's hidden-state capture when the draft needs it. spec_detach turns it off again.
void spec_attach(k25_spec *sp);
void spec_detach(k25_spec *sp);
// The sequence in `slot` ended: its draft state and cache go.
void spec_release(k25_spec *sp, int slot);

// Controlled acceptance (benchmarks, greedy only): the draft still runs for real, but each
// proposed token is then replaced by the reference token ref(ctx, id, index) (the target's
// greedy token of request `id` at generated index `index`, from a plain run; -1 where the
// reference ends) with probability alpha, and by a token that differs from it otherwise. The
// draft proposes as many tokens as it may (max_draft), whatever the real draft found.
void spec_set_oracle(k25_spec *sp, double alpha,
                     int32_t (*ref)(void *ctx, int id, int index), void *ctx);

// ------------------------------------------------------------------------------------------
// One step
// ------------------------------------------------------------------------------------------

// Drafts for seqs[0..n) (batched through the draft): sets n_draft, draft and q of each.
void spec_propose(k25_spec *sp, k25_spec_seq *seqs, int n);
// Whether any of seqs[0..n) needs the verified rows' full logits (a draft under temperature).
int spec_needs_logits(const k25_spec *sp, const k25_spec_seq *seqs, int n);
// A buffer for model_step's logits_out of n_rows rows (owned by the spec).
float *spec_logits_buffer(k25_spec *sp, int n_rows);
// Verification of one sequence after the target step: sampled[0..n_draft] are the target's
// tokens of the rows fed [last token, draft...] (sampled with counter = n_gen + row), logits
// their full logits (NULL under temperature 0). Writes the tokens to emit (the accepted drafts,
// then one token of the target) to emit[] and returns how many (1 .. n_draft + 1).
int spec_verify(k25_spec *sp, const k25_spec_seq *s, const int32_t *sampled,
                const float *logits, int32_t *emit);
// After the target step and spec_verify: the rows of each sequence still running, so drafts
// that read the target's hidden states (EAGLE-3) take them in. No-op for other drafts.
void spec_observe(k25_spec *sp, const k25_spec_obs *obs, int n);

// A single-sequence verification round on the target for generate(): sequence slot 0 of the
// batch template b (block table etc.), history prompt + gen with gen[n_gen-1] to be fed at
// position n_prompt + n_gen - 1, at most max_draft drafted tokens. Runs the draft, the target
// step over the draft+1 rows and the acceptance; emit[] gets the tokens (returns how many).
// logits_out: NULL, or [k+1][vocab] that receives the rows' logits (row j: position
// n_prompt + n_gen - 1 + j).
int spec_round_single(k25_spec *sp, k25_model *m, const k25_batch *b, const int32_t *prompt,
                      int n_prompt, const int32_t *gen, int n_gen, int max_draft,
                      const k25_sampling *sampling, int32_t *emit, float *logits_out);

const k25_spec_stats *spec_stats(const k25_spec *sp);
void spec_reset_stats(k25_spec *sp);

// ------------------------------------------------------------------------------------------
// The sampling rules (spec_sample.c; pure functions, tested directly)
// ------------------------------------------------------------------------------------------

// The distribution sampler.h draws a row's token from under settings p, as probabilities over
// the whole vocabulary (0 outside the kept set). temp == 0: a point mass on the greedy token.
void spec_probs(const float *logits, int V, const k25_sampling *p, float *probs);
// A token drawn from probs[V] (sum 1) by inversion with uniform u in (0, 1).
int32_t spec_draw(const float *probs, int V, double u);
// Speculative sampling at one position: draft token x was drawn from q (NULL: x was proposed
// without randomness, a point mass). Accepted with probability min(1, p[x] / q[x]) (uniform
// u_acc); otherwise the result is drawn from max(0, p - q) normalized (uniform u_res) and
// *accepted is 0. The result is distributed exactly as p.
int32_t spec_accept_or_resample(const float *p, const float *q, int V, int32_t x, double u_acc,
                                double u_res, int *accepted);

#ifdef __cplusplus
}
#endif

// ------------------------------------------------------------------------------------------
// Synthetic EAGLE-3 checkpoints (spec_eagle3_synth.c; tools/k25-mkeagle, tests)
// ------------------------------------------------------------------------------------------

typedef struct k25_eagle3_synth {
    uint64_t seed;
    int draft_vocab;           // 0: lm_head over the whole vocabulary; else this many rows and
                               // a d2t map (draft_vocab_size)
    int own_embed;             // write embed_tokens (otherwise the target's is used)
    int no_lm_head;            // no lm_head (the target's is used; whole vocabulary only)
    int n_aux;                 // eagle_aux_hidden_state_layer_ids written (0: none, the
    int aux_ids[3];            // default layers apply)
    int intermediate;          // MLP width (0: the target's intermediate_size)
    int norm_before_residual;
    int hidden;                // the head's hidden size (0: the target's)
    int no_norm;               // no norm.weight (the target's final norm is used)
} k25_eagle3_synth;

#ifdef __cplusplus
extern "C" {
#endif
// Writes config.json and model.safetensors of an EAGLE-3 MLA head for target t into dir
// (created when absent). Returns 0 or -1 with a message.
int spec_eagle3_write_synthetic(const char *dir, const k25_config *t, const k25_eagle3_synth *o,
                                char *err);
#ifdef __cplusplus
}
#endif
