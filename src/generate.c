// Single-sequence generation: the prompt goes through the model in chunks (sequence slot 0,
// cache blocks 0..n-1 in order), then one token per step until EOS, -n tokens or the context
// end. Every rank runs the same loop (the model's collectives need all of them); rank 0 writes
// stdout (or the --output file) and the --dump-logits file (common_formats items 1 and 2).
//
// RNG counter of a sampled row = the index of the token it generates (0 for the first), as the
// engine (engine.h) does, so a request samples the same tokens through either path and the
// draw does not depend on how the prompt was chunked or on which other rows were sampled.
#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "out_file.h"
#include "spec.h"
#include "stop_signal.h"

// ------------------------------------------------------------------------------------------
// Text
// ------------------------------------------------------------------------------------------

int gen_encode_prompt(const k25_text_codec *codec, const char *text, int32_t **ids, int *n,
                      char *err) {
    if (codec->encode) return codec->encode(codec->ctx, text, ids, n, err);
    size_t len = strlen(text);
    *ids = k25_malloc(sizeof(int32_t) * (len + 1));
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = (int)len;
    return 0;
}

int gen_has_text(const k25_text_codec *codec) { return codec->decode != NULL; }

// What rank 0 prints: ids separated by spaces, or text streamed through the detokenizer, to
// stdout or the --output file (streamed into its PATH.tmp, renamed when generation ends). A
// failed write (a full disk) stops the printing and, one step later, the run. A reader that
// closes the pipe ends the process by SIGPIPE, as it would any filter (`| head`).
typedef struct out_stream {
    int active, ids, n;
    int failed;
    char why[K25_ERR_LEN]; // the first failed write's message
    const k25_text_codec *codec;
    FILE *f;               // stdout or file.f
    k25_out_file file;     // --output, or closed
    char what[K25_ERR_LEN];
} out_stream;

// Rank 0 opens its output before any collective; the others write nothing.
static int out_open(out_stream *s, const char *path, char *err) {
    s->f = stdout;
    snprintf(s->what, sizeof s->what, "standard output");
    if (!path || !s->active) return 0;
    if (out_file_open(&s->file, path, "--output", 0, err)) return -1;
    s->f = s->file.f;
    snprintf(s->what, sizeof s->what, "the --output file %s",
             s->file.tmp ? s->file.tmp : s->file.path);
    return 0;
}

static void out_flush(out_stream *s) {
    if (k25_flush_check(s->f, s->what, s->why) == 0) return;
    s->failed = 1;
    s->active = 0;
}

static void out_token(out_stream *s, int32_t id) {
    if (!s->active) return;
    if (s->ids) {
        fprintf(s->f, s->n++ ? " %d" : "%d", id);
    } else {
        char buf[1 << 16];
        fwrite(buf, 1, s->codec->decode(s->codec->ctx, id, buf, sizeof buf), s->f);
    }
    out_flush(s);
}

// The last bytes and the newline; the --output file goes into place, or away after a failure.
static void out_end(out_stream *s) {
    if (s->active) {
        if (!s->ids && s->codec->flush) {
            char buf[64];
            fwrite(buf, 1, s->codec->flush(s->codec->ctx, buf, sizeof buf), s->f);
        }
        fputc('\n', s->f);
        out_flush(s);
    }
    if (!s->file.f) return;
    if (s->failed) {
        out_file_abandon(&s->file);
    } else if (out_file_commit(&s->file, s->why)) {
        s->failed = 1;
    }
}

// ------------------------------------------------------------------------------------------
// --dump-logits (K25LOGIT v1)
// ------------------------------------------------------------------------------------------

typedef struct dump_file {
    k25_out_file out;
    uint32_t n_rows;
} dump_file;

static void put_u32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

static int dump_open(dump_file *d, const char *path, int vocab, char *err) {
    memset(d, 0, sizeof *d);
    if (out_file_open(&d->out, path, "--dump-logits", 1, err)) return -1;
    FILE *f = d->out.f;
    fwrite("K25LOGIT", 1, 8, f);
    put_u32(f, 1);
    put_u32(f, (uint32_t)vocab);
    put_u32(f, 0); // n_rows, rewritten at the end
    put_u32(f, 0);
    return 0;
}

// One record: position, the token fed there, logits[vocab] (little-endian float32).
static void dump_row(dump_file *d, int pos, int token, const float *logits, int vocab) {
    FILE *f = d->out.f;
    if (!f) return;
    put_u32(f, (uint32_t)pos);
    put_u32(f, (uint32_t)token);
    for (int i = 0; i < vocab; i++) {
        uint32_t u;
        memcpy(&u, &logits[i], 4);
        put_u32(f, u);
    }
    d->n_rows++;
}

static int dump_close(dump_file *d, char *err) {
    FILE *f = d->out.f;
    if (!f) return 0;
    if (fseek(f, 16, SEEK_SET) != 0) {
        out_file_abandon(&d->out);
        return k25_err(err, "--dump-logits: cannot rewind to write the row count");
    }
    put_u32(f, d->n_rows);
    return out_file_commit(&d->out, err);
}

// ------------------------------------------------------------------------------------------
// Generation
// ------------------------------------------------------------------------------------------

int generate(k25_model *m, const k25_config *cfg, const k25_dist *dist,
             const k25_text_codec *codec, const int32_t *prompt, int n_prompt,
             const k25_gen_opts *o, k25_gen_result *res, char *err) {
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    int rank0 = dist->world_rank == 0, V = cfg->vocab;
    if (n_prompt <= 0) return k25_err(err, "the prompt is empty");
    if (n_prompt > o->ctx_size)
        return k25_err(err, "the prompt has %d tokens, more than the context (%d; see -c)",
                       n_prompt, o->ctx_size);

    // The rank that writes the output and the dump must be able to before anyone starts the
    // collectives.
    out_stream out = {.active = rank0, .ids = o->print_ids || !gen_has_text(codec), .codec = codec};
    dump_file dump = {0};
    char derr[K25_ERR_LEN] = "";
    int ok = out_open(&out, o->output, derr) == 0;
    if (ok && o->dump_logits && rank0) ok = dump_open(&dump, o->dump_logits, V, derr) == 0;
    if (!dist_all_ok(dist, ok)) {
        out_file_abandon(&out.file);
        out_file_abandon(&dump.out);
        if (rank0) snprintf(err, K25_ERR_LEN, "%s", derr);
        else k25_err(err, "opening an output file failed on rank 0");
        return -1;
    }

    // Sequence slot 0 owns cache blocks 0..n-1, in order.
    int kv_block = cfg->kv_block;
    int max_blocks = (o->ctx_size + kv_block - 1) / kv_block;
    if (max_blocks > model_n_blocks(m))
        K25_DIE("the context (%d) needs %d cache blocks, the model has %d", o->ctx_size,
                max_blocks, model_n_blocks(m));
    int32_t *table = k25_malloc(sizeof(int32_t) * (size_t)max_blocks);
    for (int i = 0; i < max_blocks; i++) table[i] = i;

    int chunk = o->prefill_chunk;
    int32_t *pos = k25_malloc(sizeof(int32_t) * (size_t)chunk);
    int32_t *seq = k25_calloc((size_t)chunk, sizeof(int32_t));
    int32_t *rows = k25_malloc(sizeof(int32_t) * (size_t)chunk);
    int32_t *sampled = k25_malloc(sizeof(int32_t) * (size_t)chunk);
    k25_sampling *params = k25_malloc(sizeof(k25_sampling) * (size_t)chunk);
    float *logits = o->dump_logits ? k25_malloc(sizeof(float) * (size_t)chunk * V) : NULL;
    int room = o->ctx_size - n_prompt + 1; // the last token needs no cache position
    int cap = o->n_predict >= 0 && o->n_predict < room ? o->n_predict : room;
    res->tokens = k25_malloc(sizeof(int32_t) * (size_t)(cap + 1));

    k25_sampling sp = {o->temp, o->top_k, o->top_p, o->seed, 0};
    k25_batch b = {.max_seqs = 1, .max_blocks_per_seq = max_blocks, .block_table = table,
                   .pos = pos, .seq = seq};

    if (o->spec) spec_attach(o->spec);

    // ---- prefill: every row when dumping, otherwise only the last prompt row is sampled ----
    double t0 = k25_now_ms();
    int32_t next = -1;
    int want_token = o->n_predict != 0;
    for (int p0 = 0; p0 < n_prompt; p0 += chunk) {
        int n = n_prompt - p0 < chunk ? n_prompt - p0 : chunk;
        int last = p0 + n == n_prompt;
        b.T = n;
        b.tokens = prompt + p0;
        for (int i = 0; i < n; i++) pos[i] = p0 + i;
        int n_sample = 0;
        if (logits) {
            for (int i = 0; i < n; i++) rows[n_sample++] = i;
        } else if (last && want_token) {
            rows[n_sample++] = n - 1;
        }
        for (int i = 0; i < n_sample; i++) params[i] = sp; // counter 0: the first token
        model_step(m, &b, rows, n_sample, params, sampled, logits);
        if (logits && rank0)
            for (int i = 0; i < n; i++) dump_row(&dump, pos[i], prompt[p0 + i], logits + (size_t)i * V, V);
        if (last && n_sample) next = sampled[n_sample - 1];
        if (o->spec) {
            // An EAGLE-3 draft takes in the prompt's hidden states as they go by.
            k25_spec_obs ob = {.slot = 0, .row0 = 0, .pos0 = p0, .n_rows = n, .prompt = prompt,
                               .n_prompt = n_prompt, .gen = &next, .n_gen = last && n_sample};
            spec_observe(o->spec, &ob, 1);
        }
    }
    res->prompt_ms = k25_now_ms() - t0;

    // ---- decode: emit, stop, or feed the token back ----
    // Speculative rounds emit several tokens at once: all but the last were fed to the target
    // as drafts (their logits rows are kept for the dump), so they wait in `queue` and are
    // emitted without a step.
    int32_t queue[K25_SPEC_MAX_K + 1];
    int n_queue = 0, i_queue = 0;
    float *spec_logits =
        o->spec && logits ? k25_malloc(sizeof(float) * (K25_SPEC_MAX_K + 1) * V) : NULL;
    t0 = k25_now_ms();
    while (want_token) {
        res->tokens[res->n_tokens++] = next;
        out_token(&out, next);
        if (config_is_eos(cfg, next)) {
            res->stopped_eos = 1;
            break;
        }
        if (o->n_predict >= 0 && res->n_tokens >= o->n_predict) break;
        int stop = stop_reasons_any(dist, out.failed ? K25_STOP_OUTPUT : 0);
        if (stop) {
            res->stopped_signal = (stop & K25_STOP_SIGNAL) != 0;
            break;
        }
        int p = n_prompt + res->n_tokens - 1;
        if (p >= o->ctx_size) {
            res->stopped_ctx = 1;
            break;
        }
        if (i_queue < n_queue) { // a draft the target accepted: already fed at p
            if (spec_logits && rank0)
                dump_row(&dump, p, next, spec_logits + (size_t)i_queue * V, V);
            next = queue[i_queue++];
            continue;
        }
        if (o->spec) {
            // Drafts fit the context, -n and the rows of one step.
            int room = o->ctx_size - 1 - p;
            int left = o->n_predict >= 0 ? o->n_predict - res->n_tokens - 1 : room;
            int max_draft = room < left ? room : left;
            if (max_draft > chunk - 1) max_draft = chunk - 1;
            n_queue = spec_round_single(o->spec, m, &b, prompt, n_prompt, res->tokens,
                                        res->n_tokens, max_draft, &sp, queue, spec_logits);
            if (spec_logits && rank0) dump_row(&dump, p, next, spec_logits, V);
            next = queue[0];
            i_queue = 1;
            res->n_eval++;
            continue;
        }
        b.T = 1;
        b.tokens = &next;
        pos[0] = p;
        rows[0] = 0;
        params[0] = sp;
        params[0].counter = (uint64_t)res->n_tokens;
        int32_t fed = next;
        model_step(m, &b, rows, 1, params, sampled, logits);
        if (logits && rank0) dump_row(&dump, p, fed, logits, V);
        next = sampled[0];
        res->n_eval++;
    }
    res->eval_ms = k25_now_ms() - t0;
    if (o->spec) spec_detach(o->spec);
    out_end(&out);

    // Output that was lost must not end in success.
    int rc = 0;
    if (rank0 && o->dump_logits) rc = dump_close(&dump, err);
    if (rank0 && out.failed)
        rc = k25_err(err, "%s after %d token%s", out.why, res->n_tokens,
                      res->n_tokens == 1 ? "" : "s");
    if (!dist_all_ok(dist, rc == 0)) {
        if (!rank0) k25_err(err, "writing the output failed on rank 0");
        rc = -1;
    }
    free(spec_logits);
    free(logits);
    free(params);
    free(sampled);
    free(rows);
    free(seq);
    free(pos);
    free(table);
    return rc;
}
