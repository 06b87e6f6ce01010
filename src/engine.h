// Continuous batching over the model: requests wait in a queue, join a running batch when a
// sequence slot and cache blocks for their whole length are free, have their prompts
// prefilled in chunks interleaved with the decode rows of the running sequences (one
// model_step per engine step), and leave on EOS or length, freeing their slot and blocks.
//
// Determinism: every decision depends only on the requests, the order they were submitted in
// and the sampled tokens (the same on every rank), never on clocks. So every rank running the
// same engine with the same submissions calls model_step with identical batches, and a
// request's tokens do not depend on what else runs with it: sampling uses counter = the index
// of the generated token.
//
// Times: every generated token gets the host clock (k25_now_ms) read after the model_step
// that produced it returns; the token is then known on every rank.
#pragma once
#include "config.h"
#include "kvcache.h"
#include "model.h"

typedef struct k25_engine k25_engine;

typedef enum {
    K25_FINISH_NONE = 0,   // still waiting or running
    K25_FINISH_LENGTH,     // max_new tokens generated
    K25_FINISH_EOS,        // an end-of-sequence token (kept as the last token)
} k25_finish;

typedef struct k25_request {
    const int32_t *prompt;   // [n_prompt] token ids (copied by engine_submit)
    int n_prompt;            // >= 1
    int max_new;             // tokens to generate at most, >= 1
    k25_sampling sampling;   // counter is ignored: the engine uses the generated-token index
    int ignore_eos;          // non-zero: run to max_new whatever is sampled
} k25_request;

// What the engine keeps of one request (valid until engine_free).
typedef struct k25_seq_record {
    int id;                  // engine_submit's return value
    int n_prompt, max_new;
    int32_t *tokens;         // [n_tokens] generated so far
    double *t_token;         // [n_tokens] host ms after the step that produced each token
    int n_tokens;
    double t_submit;         // engine_submit
    double t_admit;          // start of the step that admitted it (slot and blocks given)
    double t_done;           // time of the last token (0 while unfinished)
    long admit_step, done_step;
    k25_finish finish;
} k25_seq_record;

// Optional per-token callback (bench streaming, k25dec output), called on every rank.
typedef void (*k25_token_fn)(void *ctx, const k25_seq_record *r, int32_t token);

typedef struct k25_engine_opts {
    int max_batch;           // sequences in flight, 1 .. model max_seqs (<= 256)
    int max_seqs;            // block-table rows: the model's max_seqs (0: max_batch). Engines
                             // that share a model should all pass it, so every batch has the
                             // same table geometry whatever their max_batch
    int prefill_chunk;       // prompt tokens per step at most, all prefilling sequences together
    int max_rows;            // rows per step at most (the model's max_rows), >= max_batch
    int kv_block;            // tokens per cache block (as the model was built with)
    int ctx_size;            // most cache positions of a sequence: prompt + generated - 1
    int n_blocks;            // cache blocks; 0: model_n_blocks()
    int prefill_first;       // no decode rows while an admitted sequence is still prefilling:
                             // benches use it to reach a full batch of decode rows
    int pp_async;            // with pipeline stages: one sequence group per stage, the stages
                             // working on different groups at once (run.pp_async)
} k25_engine_opts;

// What one step did (for benches and tests).
typedef struct k25_step_info {
    int n_decode;            // decode rows (one per running sequence past its prompt)
    int n_prefill;           // prompt rows
    int n_prefill_seqs;      // sequences with prompt rows in the step
    int n_sampled;           // rows sampled
    int n_running;           // sequences holding a slot during the step
    int n_waiting;           // requests left waiting after admission
    double ms;               // host time of model_step
} k25_step_info;

#ifdef __cplusplus
extern "C" {
#endif

// Engine options from the [run] section (max_batch, prefill_chunk, kv_block_size, ctx_size,
// pp_async);
// max_rows = max_batch + prefill_chunk.
void engine_opts_from_config(const k25_config *cfg, k25_engine_opts *o);
// The model options an engine with these options needs (max_seqs = max(max_seqs, max_batch),
// max_rows, kv_block, n_blocks).
void engine_model_opts(const k25_engine_opts *o, k25_model_opts *mo);

// The model must have been created with max_seqs >= max_batch, max_rows >= o->max_rows and the
// same kv_block. cfg supplies the EOS ids and the vocabulary (kept by pointer). Returns NULL
// with a message in err on inconsistent options.
k25_engine *engine_create(k25_model *m, const k25_config *cfg, const k25_engine_opts *o,
                          char *err);
void engine_free(k25_engine *e);
void engine_set_token_fn(k25_engine *e, k25_token_fn fn, void *ctx);

// Queues a request (FIFO). Returns its id (0, 1, 2, ... in submission order), or -1 with a
// message in err when it can never run (empty prompt, ids out of the vocabulary, longer than
// ctx_size or than the whole cache).
int engine_submit(k25_engine *e, const k25_request *r, char *err);
// One step: admit waiting requests, form the batch, model_step, hand out tokens, retire
// finished sequences. Returns 1 when a step ran or tokens were handed out (with pipelined
// steps, a group's last ones), 0 when there was nothing to do.
int engine_step(k25_engine *e);
// Steps until every submitted request has finished.
void engine_run(k25_engine *e);
int engine_busy(const k25_engine *e);     // requests waiting or running
int engine_n_requests(const k25_engine *e);
const k25_seq_record *engine_record(const k25_engine *e, int id);
const k25_step_info *engine_last_step(const k25_engine *e);
long engine_steps(const k25_engine *e);
// Sequence groups whose steps overlap across pipeline stages (1: none; see pp_async).
int engine_groups(const k25_engine *e);
const k25_kvcache *engine_cache(const k25_engine *e);

// Speculative decoding (spec.h) from the next step on, NULL: off. Every decoding sequence gets
// drafts (within max_rows: each running sequence keeps one row) verified in the step; a step
// may then hand a sequence several tokens. The spec must have been built for at least
// max_batch sequences and max_rows rows.
struct k25_spec;
void engine_set_spec(k25_engine *e, struct k25_spec *sp);

#ifdef __cplusplus
}
#endif
