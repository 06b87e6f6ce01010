// Draft model of the same architecture family: a second model stack (its own weights, backend
// and paged latent cache) on the same ranks and tensor-parallel group as the target, loaded
// from a checkpoint directory or generated from a .ini configuration, sharing the target's
// vocabulary.
//
// Per sequence slot the draft remembers which token it fed at every cached position. At each
// proposal it compares them with the sequence's history: the longest agreeing prefix stays
// (rejected drafts and the target's corrections are simply fed again over the stale
// positions), the rest of the history is fed in one catch-up pass whose last row gives the
// first draft token, then one row per sequence and step for the others. Catch-up passes of all
// proposing sequences share steps (chunked by the row limit); so do the single-row steps.
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "instance.h"
#include "kvcache.h"
#include "sampler.h"
#include "spec_internal.h"

typedef struct model_draft {
    k25_config cfg;           // the draft's configuration (the target's context and run settings)
    k25_instance in;
    k25_kvcache kv;
    int K, V, R, max_seqs;
    int cap_pos;              // positions a slot may hold: the target's context

    int32_t *fed;             // [max_seqs][cap_pos] token cached at each position
    int *n_fed;               // [max_seqs] positions cached
    int *n_ok;                // [max_seqs] positions known to agree with the history
    uint8_t *open;            // [max_seqs] slot opened in the draft's cache

    // one draft step, host: R rows
    int32_t *tokens, *pos, *seq;
    int32_t *rows, *out;      // sampled rows and their tokens
    int32_t *owner, *slot_j;  // per sampled row: the proposing sequence and the draft index
    k25_sampling *params;
    float *logits;            // [R][V] when a sequence samples
    int *start;               // [max_seqs] first catch-up position of proposing sequence i
} model_draft;

// ------------------------------------------------------------------------------------------
// Slots
// ------------------------------------------------------------------------------------------

static void md_release(spec_draft *d, int slot) {
    model_draft *md = d->impl;
    if (slot < 0 || slot >= md->max_seqs || !md->open[slot]) return;
    kvcache_close(&md->kv, slot);
    md->open[slot] = 0;
    md->n_fed[slot] = md->n_ok[slot] = 0;
}

static void md_reset(spec_draft *d) {
    model_draft *md = d->impl;
    for (int s = 0; s < md->max_seqs; s++) md_release(d, s);
}

// ------------------------------------------------------------------------------------------
// Steps
// ------------------------------------------------------------------------------------------

typedef struct step_buf {
    int T, ns, need_logits;
} step_buf;

static void add_row(model_draft *md, step_buf *b, int slot, int p, int32_t tok) {
    md->tokens[b->T] = tok;
    md->pos[b->T] = p;
    md->seq[b->T] = slot;
    md->fed[(size_t)slot * md->cap_pos + p] = tok;
    b->T++;
}

static void add_sample(model_draft *md, step_buf *b, const k25_spec_seq *seqs, int i, int j) {
    md->rows[b->ns] = b->T - 1;
    md->owner[b->ns] = i;
    md->slot_j[b->ns] = j;
    md->params[b->ns] = (k25_sampling){.temp = 0, .top_p = 1}; // greedy; q drawn on the host
    b->need_logits |= seqs[i].q != NULL;
    b->ns++;
}

// Runs the rows gathered so far and hands each sampled row's token to its sequence.
static void flush(model_draft *md, step_buf *b, k25_spec_seq *seqs) {
    if (b->T == 0) return;
    k25_batch batch = {.T = b->T, .tokens = md->tokens, .pos = md->pos, .seq = md->seq,
                       .block_table = md->kv.block_table, .max_seqs = md->kv.max_seqs,
                       .max_blocks_per_seq = md->kv.max_blocks_per_seq};
    model_step(md->in.m, &batch, md->rows, b->ns, md->params, md->out,
               b->need_logits ? md->logits : NULL);
    for (int r = 0; r < b->ns; r++) {
        k25_spec_seq *s = &seqs[md->owner[r]];
        int j = md->slot_j[r];
        if (!s->q) {
            s->draft[j] = md->out[r];
            continue;
        }
        // Under temperature the draft token is drawn from q, which the verifier must know.
        float *q = (float *)s->q + (size_t)j * md->V;
        spec_probs(md->logits + (size_t)r * md->V, md->V, &s->sampling, q);
        s->draft[j] = spec_draw(q, md->V, sampler_uniform(s->sampling.seed,
                                                         (uint64_t)(s->n_gen + j), SPEC_RNG_DRAFT));
    }
    b->T = b->ns = b->need_logits = 0;
}

static void md_propose(spec_draft *d, k25_spec_seq *seqs, int n) {
    model_draft *md = d->impl;
    int max_k = 0;
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        if (s->n_draft == 0) continue;
        int slot = s->slot, L = s->n_prompt + s->n_gen;
        K25_CHECK(slot >= 0 && slot < md->max_seqs, "draft model: slot %d of %d", slot,
                  md->max_seqs);
        if (L + s->n_draft - 1 > md->cap_pos) {
            s->n_draft = 0; // beyond the context the draft was built for
            continue;
        }
        if (!md->open[slot]) {
            spec_cache_open(&md->kv, slot, s->max_len, md->cap_pos, "draft model");
            md->open[slot] = 1;
            md->n_fed[slot] = md->n_ok[slot] = 0;
        }
        const int32_t *fed = md->fed + (size_t)slot * md->cap_pos;
        int v = md->n_ok[slot], lim = md->n_fed[slot] < L ? md->n_fed[slot] : L;
        while (v < lim && fed[v] == spec_hist(s->prompt, s->n_prompt, s->gen, v)) v++;
        // The last history token always goes through: its row gives the first draft.
        md->start[i] = v < L - 1 ? v : L - 1;
        K25_CHECK(kvcache_grow(&md->kv, slot, L + s->n_draft - 1) == 0,
                  "draft model: slot %d cannot grow to %d positions", slot, L + s->n_draft - 1);
        if (s->n_draft > max_k) max_k = s->n_draft;
    }

    // Catch-up: every history token the draft has not cached, chunked by the row limit.
    step_buf b = {0};
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        if (s->n_draft == 0) continue;
        int L = s->n_prompt + s->n_gen;
        for (int p = md->start[i]; p < L; p++) {
            add_row(md, &b, s->slot, p, spec_hist(s->prompt, s->n_prompt, s->gen, p));
            if (p == L - 1) add_sample(md, &b, seqs, i, 0);
            if (b.T == md->R) flush(md, &b, seqs);
        }
    }
    flush(md, &b, seqs);
    // Then draft j is fed to get draft j + 1.
    for (int j = 1; j < max_k; j++) {
        for (int i = 0; i < n; i++) {
            k25_spec_seq *s = &seqs[i];
            if (s->n_draft <= j) continue;
            add_row(md, &b, s->slot, s->n_prompt + s->n_gen - 1 + j, s->draft[j - 1]);
            add_sample(md, &b, seqs, i, j);
        }
        flush(md, &b, seqs);
    }
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        if (s->n_draft == 0) continue;
        int L = s->n_prompt + s->n_gen;
        md->n_fed[s->slot] = L + s->n_draft - 1;
        md->n_ok[s->slot] = L;
    }
}

// ------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------

static void md_destroy(spec_draft *d) {
    model_draft *md = d->impl;
    instance_close(&md->in);
    kvcache_destroy(&md->kv);
    free(md->fed);
    free(md->n_fed);
    free(md->n_ok);
    free(md->open);
    free(md->tokens);
    free(md->pos);
    free(md->seq);
    free(md->rows);
    free(md->out);
    free(md->owner);
    free(md->slot_j);
    free(md->params);
    free(md->logits);
    free(md->start);
    free(md);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// "DIR", "DIR@SEED" (its config.json, synthetic weights), "FILE.ini" or "FILE.ini@SEED".
static int parse_path(const char *arg, char *path, size_t cap, int *synthetic, uint64_t *seed,
                      char *err) {
    const char *at = strrchr(arg, '@');
    size_t n = at ? (size_t)(at - arg) : strlen(arg);
    if (n == 0 || n >= cap) return k25_err(err, "--spec-draft model:%s: bad path", arg);
    memcpy(path, arg, n);
    path[n] = 0;
    *seed = 1;
    *synthetic = 0;
    if (at) {
        char *end;
        errno = 0; // strtoull would take " -1" or "+1" and wrap or round past the range
        unsigned long long v = strtoull(at + 1, &end, 10);
        if (at[1] < '0' || at[1] > '9' || *end || errno)
            return k25_err(err, "--spec-draft model:%s: '%s' is not a seed", arg, at + 1);
        *seed = v;
        *synthetic = 1;
    }
    if (ends_with(path, ".ini")) *synthetic = 1;
    return 0;
}

int spec_model_config(const spec_env *env, const char *arg, k25_config *c, char *path,
                      size_t cap_path, int *synthetic, uint64_t *seed, char *err) {
    if (parse_path(arg, path, cap_path, synthetic, seed, err)) return -1;
    const k25_spec_opts *o = &env->o;
    config_init_defaults(c);
    int rc;
    if (ends_with(path, ".ini")) {
        rc = config_load_ini(c, path, err);
    } else {
        struct stat st;
        char json[4200];
        snprintf(json, sizeof json, "%s/config.json", path);
        rc = stat(path, &st) != 0 || !S_ISDIR(st.st_mode)
                 ? k25_err(err, "--spec-draft model:%s: not a checkpoint directory or .ini file",
                           path)
                 : config_load_hf_json(c, json, err);
    }
    if (rc) return -1;
    // Run settings follow the target's (checked as its own); drafts never go past its context.
    // The draft's step shapes are the run's (o->max_seqs, o->max_rows, given to the model as
    // they are), so its config keeps the target's batch and chunk settings: a derived row count
    // past a setting's bound would be refused under the name of a setting the user never gave.
    int cap = o->ctx_size;
    c->ctx_size = cap;
    c->kv_block = o->kv_block;
    c->max_batch = env->cfg->max_batch;
    c->prefill_chunk = env->cfg->prefill_chunk;
    c->tp = env->dist->tp_size;
    c->pp = 1;
    snprintf(c->backend, sizeof c->backend, "%s", o->backend ? o->backend : env->cfg->backend);
    if (c->vocab != env->cfg->vocab)
        return k25_err(err, "draft model %s: vocabulary of %d tokens, the target has %d", path,
                       c->vocab, env->cfg->vocab);
    if (cap > c->max_pos)
        return k25_err(err, "draft model %s: the context %d exceeds its max_position_embeddings %d",
                       path, cap, c->max_pos);
    char why[K25_ERR_LEN];
    if (config_validate(c, why) || config_check_tp(c, env->dist->tp_size, why))
        return k25_err(err, "draft model %s: %s", path, why);
    return 0;
}

int spec_model_create(const spec_env *env, const char *arg, spec_draft *d, char *err) {
    char path[4096];
    int synthetic;
    uint64_t seed;
    const k25_spec_opts *o = &env->o;
    model_draft *md = k25_calloc(1, sizeof *md);
    k25_config *c = &md->cfg;
    if (spec_model_config(env, arg, c, path, sizeof path, &synthetic, &seed, err)) {
        free(md);
        return -1;
    }
    int cap = c->ctx_size;

    md->K = o->k;
    md->V = c->vocab;
    md->R = o->max_rows;
    md->max_seqs = o->max_seqs;
    md->cap_pos = cap;
    int mbps = (cap + o->kv_block - 1) / o->kv_block;
    k25_instance_opts io = {
        .model_dir = synthetic ? NULL : path,
        .synth_seed = seed,
        .backend = c->backend,
        .threads = o->threads,
        .model = {.max_seqs = o->max_seqs, .max_rows = md->R, .kv_block = o->kv_block,
                  .n_blocks = o->n_blocks},
    };
    if (instance_open(&md->in, c, env->dist, &io, err) ||
        kvcache_init(&md->kv, o->n_blocks, o->kv_block, o->max_seqs, mbps, err)) {
        instance_close(&md->in);
        free(md);
        return -1;
    }
    md->fed = k25_calloc((size_t)o->max_seqs * cap, sizeof(int32_t));
    md->n_fed = k25_calloc(o->max_seqs, sizeof(int));
    md->n_ok = k25_calloc(o->max_seqs, sizeof(int));
    md->open = k25_calloc(o->max_seqs, 1);
    size_t R = (size_t)md->R;
    md->tokens = k25_malloc(R * sizeof(int32_t));
    md->pos = k25_malloc(R * sizeof(int32_t));
    md->seq = k25_malloc(R * sizeof(int32_t));
    md->rows = k25_malloc(R * sizeof(int32_t));
    md->out = k25_malloc(R * sizeof(int32_t));
    md->owner = k25_malloc(R * sizeof(int32_t));
    md->slot_j = k25_malloc(R * sizeof(int32_t));
    md->params = k25_malloc(R * sizeof(k25_sampling));
    // Full logits of the sampled rows (a sampled row per sequence and step: at most max_seqs).
    md->logits = k25_malloc(sizeof(float) * (size_t)o->max_seqs * md->V);
    md->start = k25_malloc(sizeof(int) * (size_t)o->max_seqs);

    d->kind = "model";
    d->impl = md;
    d->cache = &md->kv;
    d->reset = md_reset;
    d->release = md_release;
    d->propose = md_propose;
    d->destroy = md_destroy;
    k25_log("spec: draft model %s (%s), %d layers, hidden %d, %.2f MiB of weights per rank, %d "
            "cache blocks of %d tokens\n", path, synthetic ? "synthetic" : "checkpoint",
            c->n_layers, c->hidden, weights_bytes(&md->in.w) / (1024.0 * 1024.0), o->n_blocks,
            o->kv_block);
    return 0;
}
