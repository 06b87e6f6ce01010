// The speculative decoder (see spec.h): the draft source behind spec_internal.h's interface,
// the per-step propose / verify / observe calls the engine and generate() make, the
// controlled-acceptance oracle of the benchmark and the counters.
#include "spec.h"

#include <string.h>

#include "sampler.h"
#include "spec_eagle3_config.h"
#include "spec_internal.h"

struct k25_spec {
    spec_draft d;
    spec_env env;
    int K, V;

    int32_t *drafts;          // [max_seqs][K] what spec_propose hands out
    float *q;                 // [n][K][V] draft probabilities, grown on demand
    size_t q_cap;             // floats
    float *logits;            // [rows][V] for model_step's logits_out, grown on demand
    size_t logits_cap;        // floats
    float *p;                 // [V] scratch: the target's distribution at one row

    // controlled acceptance
    int oracle;
    double alpha;
    int32_t (*ref)(void *ctx, int id, int index);
    void *ref_ctx;

    // spec_round_single scratch
    int32_t tokens[K25_SPEC_MAX_K + 1], pos[K25_SPEC_MAX_K + 1], seq[K25_SPEC_MAX_K + 1];
    int32_t rows[K25_SPEC_MAX_K + 1], out[K25_SPEC_MAX_K + 1];
    k25_sampling params[K25_SPEC_MAX_K + 1];
    int32_t *hist;            // generated tokens with the new ones appended
    int hist_cap;

    int attached;
    k25_spec_stats st;
};

// ------------------------------------------------------------------------------------------
// Life cycle
// ------------------------------------------------------------------------------------------

enum draft_kind { DRAFT_NGRAM, DRAFT_MODEL, DRAFT_EAGLE3 };

// The kind named before the colon of source, its argument in *arg; -1 with a message.
static int draft_kind(const char *source, const char **arg, char *err) {
    if (!source || !*source)
        return k25_err(err, "--spec-draft: empty source (ngram, model:PATH or eagle3:DIR)");
    const char *colon = strchr(source, ':');
    size_t n = colon ? (size_t)(colon - source) : strlen(source);
    *arg = colon ? colon + 1 : "";
    if (n == 5 && !strncmp(source, "ngram", 5))
        return !colon || **arg ? DRAFT_NGRAM
                               : k25_err(err, "--spec-draft ngram:N needs the n-gram length N "
                                              "(or ngram alone)");
    if (n == 5 && !strncmp(source, "model", 5))
        return **arg ? DRAFT_MODEL
                     : k25_err(err, "--spec-draft model:PATH needs a checkpoint directory or "
                                    "FILE.ini[@SEED]");
    if (n == 6 && !strncmp(source, "eagle3", 6))
        return **arg ? DRAFT_EAGLE3
                     : k25_err(err, "--spec-draft eagle3:DIR needs a draft checkpoint directory");
    return k25_err(err, "--spec-draft '%s': unknown draft (ngram, ngram:N, model:DIR, "
                        "model:FILE.ini[@SEED], eagle3:DIR)", source);
}

int spec_check(const char *source, const k25_config *cfg, const k25_dist *dist,
               const k25_spec_opts *o, int64_t *cache_values, char *err) {
    const char *arg;
    int kind = draft_kind(source, &arg, err);
    if (kind < 0) return -1;
    if (o->k < 1 || o->k > K25_SPEC_MAX_K)
        return k25_err(err, "--spec-k %d is outside 1..%d", o->k, K25_SPEC_MAX_K);
    if (o->max_seqs < 1 || o->max_rows < o->max_seqs)
        return k25_err(err, "speculative decoding: %d sequence slots with %d rows per step",
                       o->max_seqs, o->max_rows);
    if (dist->pp_size > 1)
        return k25_err(err, "speculative decoding with pipeline stages (run.pp = %d) is not "
                            "implemented", dist->pp_size);
    spec_env env = {NULL, NULL, cfg, dist, *o};
    int64_t values = 0;
    if (kind == DRAFT_NGRAM) {
        spec_draft d = {0};
        if (spec_ngram_create(&env, arg, &d, err)) return -1;
        d.destroy(&d);
    } else if (kind == DRAFT_MODEL) {
        k25_config c;
        char path[4096];
        int synthetic;
        uint64_t seed;
        if (spec_model_config(&env, arg, &c, path, sizeof path, &synthetic, &seed, err))
            return -1;
        values = (int64_t)c.n_layers * (c.kv_lora_rank + c.qk_rope_dim);
    } else {
        eagle3_fit fit = {cfg, o->ctx_size, o->kv_block, dist->tp_size};
        eagle3_config ec;
        char why[K25_ERR_LEN];
        if (eagle3_config_read(&ec, arg, &fit, why))
            return k25_err(err, "--spec-draft eagle3:%s: %s", arg, why);
        values = ec.cfg.kv_lora_rank + ec.cfg.qk_rope_dim; // one decoder layer
    }
    if (cache_values) *cache_values = values;
    return 0;
}

k25_spec *spec_create(const char *source, k25_model *target, const k25_weights *tw,
                      const k25_config *cfg, const k25_dist *dist, const k25_spec_opts *o,
                      char *err) {
    if (spec_check(source, cfg, dist, o, NULL, err)) return NULL;
    const char *arg;
    int kind = draft_kind(source, &arg, err);
    k25_spec *sp = k25_calloc(1, sizeof *sp);
    sp->env = (spec_env){target, tw, cfg, dist, *o};
    if (sp->env.o.n_blocks <= 0) // every slot's whole context
        sp->env.o.n_blocks = o->max_seqs * ((o->ctx_size + o->kv_block - 1) / o->kv_block);
    sp->K = o->k;
    sp->V = cfg->vocab;
    int rc = kind == DRAFT_NGRAM   ? spec_ngram_create(&sp->env, arg, &sp->d, err)
             : kind == DRAFT_MODEL ? spec_model_create(&sp->env, arg, &sp->d, err)
                                   : spec_eagle3_create(&sp->env, arg, &sp->d, err);
    if (rc != 0) {
        free(sp);
        return NULL;
    }
    sp->drafts = k25_calloc((size_t)o->max_seqs * sp->K, sizeof(int32_t));
    sp->p = k25_malloc(sizeof(float) * (size_t)sp->V);
    return sp;
}

void spec_free(k25_spec *sp) {
    if (!sp) return;
    spec_detach(sp);
    if (sp->d.destroy) sp->d.destroy(&sp->d);
    free(sp->drafts);
    free(sp->q);
    free(sp->logits);
    free(sp->p);
    free(sp->hist);
    free(sp);
}

void spec_cache_open(k25_kvcache *kv, int slot, int max_len, int cap, const char *who) {
    int promise = max_len > 0 && max_len < cap ? max_len : cap;
    K25_CHECK(kvcache_open(kv, slot, promise) == 0,
              "%s: no cache for slot %d (%d positions; %d blocks free of %d)", who, slot, promise,
              kv->n_free, kv->n_blocks);
}

int spec_k(const k25_spec *sp) { return sp->K; }
const char *spec_draft_kind(const k25_spec *sp) { return sp->d.kind; }
const k25_kvcache *spec_draft_cache(const k25_spec *sp) { return sp->d.cache; }
const k25_spec_stats *spec_stats(const k25_spec *sp) { return &sp->st; }
void spec_reset_stats(k25_spec *sp) { memset(&sp->st, 0, sizeof sp->st); }

void spec_attach(k25_spec *sp) {
    if (sp->d.reset) sp->d.reset(&sp->d);
    if (sp->d.n_capture) model_capture_layers(sp->env.target, sp->d.capture, sp->d.n_capture);
    sp->attached = 1;
}

void spec_detach(k25_spec *sp) {
    if (!sp->attached) return;
    // Capture costs host copies and CUDA graphs: off while nothing reads it.
    if (sp->d.n_capture) model_capture_layers(sp->env.target, NULL, 0);
    sp->attached = 0;
}

void spec_release(k25_spec *sp, int slot) {
    if (sp->d.release) sp->d.release(&sp->d, slot);
}

void spec_set_oracle(k25_spec *sp, double alpha, int32_t (*ref)(void *ctx, int id, int index),
                     void *ctx) {
    sp->oracle = ref != NULL;
    sp->alpha = alpha;
    sp->ref = ref;
    sp->ref_ctx = ctx;
}

// ------------------------------------------------------------------------------------------
// Propose
// ------------------------------------------------------------------------------------------

static int sampled(const k25_sampling *p) { return p->temp > 0; }

void spec_propose(k25_spec *sp, k25_spec_seq *seqs, int n) {
    double t0 = k25_now_ms();
    K25_CHECK(n <= sp->env.o.max_seqs, "spec: %d sequences, built for %d", n, sp->env.o.max_seqs);
    size_t KV = (size_t)sp->K * sp->V;
    int any_q = 0;
    for (int i = 0; i < n; i++) any_q |= sampled(&seqs[i].sampling) && !sp->oracle;
    if (any_q && sp->q_cap < (size_t)n * KV) {
        free(sp->q);
        sp->q_cap = (size_t)n * KV;
        sp->q = k25_malloc(sizeof(float) * sp->q_cap);
    }
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        int k = s->max_draft < sp->K ? s->max_draft : sp->K;
        s->n_draft = k > 0 ? k : 0;
        s->draft = sp->drafts + (size_t)i * sp->K;
        s->q = any_q && sampled(&s->sampling) ? sp->q + (size_t)i * KV : NULL;
    }
    sp->d.propose(&sp->d, seqs, n);

    if (sp->oracle) {
        // The reference token with probability alpha, another one otherwise.
        for (int i = 0; i < n; i++) {
            k25_spec_seq *s = &seqs[i];
            int k = s->max_draft < sp->K ? s->max_draft : sp->K;
            s->n_draft = k > 0 ? k : 0;
            s->q = NULL;
            for (int j = 0; j < s->n_draft; j++) {
                int32_t r = sp->ref(sp->ref_ctx, s->id, s->n_gen + j);
                if (r < 0 || r >= sp->V) { // the reference ends here (EOS)
                    s->n_draft = j;
                    break;
                }
                double u = sampler_uniform(s->sampling.seed, (uint64_t)(s->n_gen + j),
                                           SPEC_RNG_ORACLE);
                s->draft[j] = u < sp->alpha ? r : (r + 1) % sp->V;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (seqs[i].n_draft == 0) seqs[i].q = NULL;
        sp->st.drafted += seqs[i].n_draft;
    }
    sp->st.draft_ms += k25_now_ms() - t0;
}

int spec_needs_logits(const k25_spec *sp, const k25_spec_seq *seqs, int n) {
    (void)sp;
    for (int i = 0; i < n; i++)
        if (seqs[i].n_draft > 0 && sampled(&seqs[i].sampling)) return 1;
    return 0;
}

float *spec_logits_buffer(k25_spec *sp, int n_rows) {
    size_t need = (size_t)n_rows * sp->V;
    if (need > sp->logits_cap) {
        free(sp->logits);
        sp->logits_cap = need;
        sp->logits = k25_malloc(sizeof(float) * need);
    }
    return sp->logits;
}

// ------------------------------------------------------------------------------------------
// Verify
// ------------------------------------------------------------------------------------------

int spec_verify(k25_spec *sp, const k25_spec_seq *s, const int32_t *sampled_tok,
                const float *logits, int32_t *emit) {
    int k = s->n_draft, n;
    if (k == 0) {
        sp->st.plain_rows++;
        emit[0] = sampled_tok[0];
        return 1;
    }
    if (!sampled(&s->sampling)) {
        // Greedy: the target's own tokens up to and including the first disagreement.
        int a = 0;
        while (a < k && s->draft[a] == sampled_tok[a]) emit[a] = s->draft[a], a++;
        emit[a] = sampled_tok[a];
        n = a + 1;
    } else {
        K25_CHECK(logits, "spec: verification under temperature without the rows' logits");
        n = -1;
        for (int j = 0; j < k && n < 0; j++) {
            spec_probs(logits + (size_t)j * sp->V, sp->V, &s->sampling, sp->p);
            uint64_t counter = (uint64_t)(s->n_gen + j);
            double u_acc = sampler_uniform(s->sampling.seed, counter, SPEC_RNG_ACCEPT);
            double u_res = sampler_uniform(s->sampling.seed, counter, SPEC_RNG_RESAMPLE);
            int acc;
            emit[j] = spec_accept_or_resample(sp->p, s->q ? s->q + (size_t)j * sp->V : NULL,
                                              sp->V, s->draft[j], u_acc, u_res, &acc);
            if (!acc) n = j + 1;
        }
        // Every draft accepted: the bonus token is the target's own sample of the last row,
        // drawn from p with this token's counter.
        if (n < 0) emit[k] = sampled_tok[k], n = k + 1;
    }
    sp->st.rounds++;
    sp->st.accepted += n - 1;
    sp->st.emitted += n;
    return n;
}

void spec_observe(k25_spec *sp, const k25_spec_obs *obs, int n) {
    if (!sp->d.observe || n == 0) return;
    double t0 = k25_now_ms();
    sp->d.observe(&sp->d, obs, n);
    sp->st.draft_ms += k25_now_ms() - t0;
}

// ------------------------------------------------------------------------------------------
// A single-sequence round (generate.c)
// ------------------------------------------------------------------------------------------

int spec_round_single(k25_spec *sp, k25_model *m, const k25_batch *b, const int32_t *prompt,
                      int n_prompt, const int32_t *gen, int n_gen, int max_draft,
                      const k25_sampling *sampling, int32_t *emit, float *logits_out) {
    K25_CHECK(n_gen >= 1, "spec: a round needs the token to feed");
    k25_spec_seq s = {.slot = 0, .id = 0, .prompt = prompt, .n_prompt = n_prompt, .gen = gen,
                      .n_gen = n_gen, .max_draft = max_draft, .sampling = *sampling};
    spec_propose(sp, &s, 1);
    int k = s.n_draft, P = n_prompt + n_gen - 1;
    sp->tokens[0] = gen[n_gen - 1];
    for (int j = 0; j <= k; j++) {
        if (j) sp->tokens[j] = s.draft[j - 1];
        sp->pos[j] = P + j;
        sp->seq[j] = 0;
        sp->rows[j] = j;
        sp->params[j] = *sampling;
        sp->params[j].counter = (uint64_t)(n_gen + j);
    }
    k25_batch vb = *b;
    vb.T = k + 1;
    vb.tokens = sp->tokens;
    vb.pos = sp->pos;
    vb.seq = sp->seq;
    float *lg = logits_out ? logits_out
                           : (spec_needs_logits(sp, &s, 1) ? spec_logits_buffer(sp, k + 1) : NULL);
    model_step(m, &vb, sp->rows, k + 1, sp->params, sp->out, lg);
    int n = spec_verify(sp, &s, sp->out, sampled(sampling) ? lg : NULL, emit);

    if (sp->d.observe) {
        if (sp->hist_cap < n_gen + n) {
            free(sp->hist);
            sp->hist_cap = 2 * (n_gen + n) + 64;
            sp->hist = k25_malloc(sizeof(int32_t) * (size_t)sp->hist_cap);
        }
        memcpy(sp->hist, gen, sizeof(int32_t) * (size_t)n_gen);
        memcpy(sp->hist + n_gen, emit, sizeof(int32_t) * (size_t)n);
        k25_spec_obs ob = {.slot = 0, .row0 = 0, .pos0 = P, .n_rows = k + 1, .prompt = prompt,
                           .n_prompt = n_prompt, .gen = sp->hist, .n_gen = n_gen + n};
        spec_observe(sp, &ob, 1);
    }
    return n;
}
