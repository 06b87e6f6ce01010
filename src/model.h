// The forward pass of the Kimi-K2.5 text model over one batch of token rows, written once
// against the backend interface: embed, for each layer MLA attention then dense MLP or MoE
// (each followed by a tensor-parallel sum), final norm, lm_head, sampling.
#pragma once
#include "backend.h"
#include "config.h"
#include "dist.h"
#include "weights.h"

typedef struct k25_model k25_model;

typedef struct k25_model_opts {
    int max_seqs;        // sequence slots (continuous batching)
    int max_rows;        // most token rows in one step (prefill chunk or batch x (spec_k+1))
    int kv_block;        // tokens per cache block
    int n_blocks;        // cache blocks (0: sized from max_seqs * ctx_size)
    int max_blocks;      // at most this many cache blocks (0: no cap; run.kv_cache_mb, instance.h)
    int check_finite;    // NaN/Inf check of the hidden state after every layer (slow path)
} k25_model_opts;

#ifdef __cplusplus
extern "C" {
#endif

// Loads the weights into the backend and allocates activations and the paged latent cache.
k25_model *model_create(const k25_config *cfg, k25_weights *w, k25_backend *be,
                        const k25_dist *dist, const k25_model_opts *opts);
void model_free(k25_model *m);
// Entries of a block table that maps every sequence slot's whole context (slots x blocks a
// slot, with model_create's defaults); also the cache blocks model_create allocates when
// opts->n_blocks is 0, before run.kv_cache_mb's cap. The block tables are indexed in int:
// instance_open refuses more than INT_MAX before the weights load.
int64_t model_table_entries(const k25_config *cfg, const k25_model_opts *opts);
int model_n_blocks(const k25_model *m);
// The options the model was made with, defaults filled in.
const k25_model_opts *model_opts_of(const k25_model *m);

// One step over batch b (positions must already have cache blocks in b->block_table).
// Rows listed in sample_rows[n_sample] go through the final norm and lm_head and are sampled
// with params[i] (one per listed row); the tokens land in out[n_sample] on every rank. When
// logits_out is not NULL it receives the full float32 logits of the sampled rows
// ([n_sample][vocab], every rank).
void model_step(k25_model *m, const k25_batch *b, const int32_t *sample_rows, int n_sample,
                const k25_sampling *params, int32_t *out, float *logits_out);

// The same step for stages that overlap consecutive steps: this rank's stage runs the whole
// batch (no micro-batches) and returns; the sampled tokens reach out[n_sample] on every rank
// when *tokens completes (MPI_Wait), so a stage can start the next step (another group of
// sequences) while the later stages still work on this one. out must stay untouched until
// then. Not with hidden-state captures.
void model_step_issue(k25_model *m, const k25_batch *b, const int32_t *sample_rows,
                      int n_sample, const k25_sampling *params, int32_t *out,
                      MPI_Request *tokens);
// Pipeline stages of the model's world (1: none).
int model_n_stages(const k25_model *m);

// Hidden state (input of layer `layer`, i.e. after layer-1) of the last step's rows, captured
// for EAGLE-3 drafts: model_capture_layers() selects up to 3 layers before a step.
void model_capture_layers(k25_model *m, const int *layers, int n);
const float *model_captured(const k25_model *m, int i); // [T][D] host, after model_step

#ifdef __cplusplus
}
#endif
