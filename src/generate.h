// Single-sequence generation on top of model_step: prompt encoding, chunked prefill, the
// token-by-token decode loop with its stop rules (EOS, -n, context end), streaming output,
// the --dump-logits file and the timings.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "dist.h"
#include "model.h"

// Text <-> token ids, plugged in by the caller (a tokenizer) or left empty: encode == NULL is
// the byte fallback of models without a tokenizer file (ids 0..255 are the bytes of the UTF-8
// text); decode == NULL prints ids instead of text.
typedef struct k25_text_codec {
    void *ctx;
    // *ids malloc'ed; returns 0 or -1 with a message in err.
    int (*encode)(void *ctx, const char *text, int32_t **ids, int *n, char *err);
    // Streaming: the complete UTF-8 text of one more token into out[cap]; returns its length.
    size_t (*decode)(void *ctx, int32_t id, char *out, size_t cap);
    // What decode still holds back (an incomplete UTF-8 tail) at the end.
    size_t (*flush)(void *ctx, char *out, size_t cap);
} k25_text_codec;

typedef struct k25_gen_opts {
    int n_predict;            // -1: until EOS or the context end
    int ctx_size;             // positions the cache holds
    int prefill_chunk;        // rows per prefill step (<= the model's max_rows)
    float temp;
    int top_k;
    float top_p;
    uint64_t seed;
    int print_ids;            // ids on stdout instead of text
    const char *output;       // the generated text (or ids) to this file instead of stdout
    const char *dump_logits;  // K25LOGIT file or NULL
    struct k25_spec *spec;    // speculative decoding (spec.h) or NULL
} k25_gen_opts;

typedef struct k25_gen_result {
    int32_t *tokens;          // [n_tokens] generated (malloc'ed)
    int n_tokens;
    int n_prompt;
    int stopped_eos, stopped_ctx, stopped_signal;
    double prompt_ms;         // prefill steps, first token included
    double eval_ms;           // decode steps
    int n_eval;
} k25_gen_result;

#ifdef __cplusplus
extern "C" {
#endif

// Prompt text -> ids (*ids malloc'ed). Returns 0 or -1 with a message.
int gen_encode_prompt(const k25_text_codec *codec, const char *text, int32_t **ids, int *n,
                      char *err);
// Whether the text codec can print text (otherwise ids are printed, common_formats item 2).
int gen_has_text(const k25_text_codec *codec);

// Generates after the prompt on every rank (rank 0 writes stdout or the output file, and the
// dump file). Returns 0, or -1 with a message (an output or dump file cannot be written). The
// prompt must fit the context.
int generate(k25_model *m, const k25_config *cfg, const k25_dist *dist,
             const k25_text_codec *codec, const int32_t *prompt, int n_prompt,
             const k25_gen_opts *o, k25_gen_result *res, char *err);

#ifdef __cplusplus
}
#endif
