// EAGLE-3 draft head, MLA variant (Eagle3DeepseekV2ForCausalLM; ../shared/KIMI_K25.md §6.3,
// as sglang python/sglang/srt/models/deepseek_eagle3.py and vLLM deepseek_eagle3.py run it):
//
//   g    = fc(concat(h_a, h_b, h_c))      h_*: the target's hidden states entering the
//                                         layers eagle_aux_hidden_state_layer_ids + 1
//   e    = input_layernorm(embed(token))
//   res  = g;  hn = hidden_norm(g)        (norm_before_residual: res = hn)
//   a    = MLA(concat(e, hn))             q_a_proj / kv_a_proj_with_mqa take the 2D-wide concat
//   res += o_proj(a);  x = post_attention_layernorm(res)
//   res += down(silu(gate x) * up x)      dense MLP
//   logits = lm_head(norm(res)); next step's g = res (the pre-norm hidden)
//
// Row convention (EAGLE): the draft's row at position p takes the token at p + 1 and the
// target's hidden state at p, and predicts the token at p + 2; it caches its MLA latent at p
// like the target. After every target step the rows of each sequence whose next token is now
// known are absorbed (spec_observe): the draft runs over them and keeps the last row's pre-norm
// hidden per sequence. A proposal then samples the first draft token from that hidden and
// chains: draft token j at position L - 2 + j with the previous row's hidden gives token j + 1.
// Rows past the accepted length are overwritten by the next absorption.
//
// Everything runs through the backend operations (matmul, rmsnorm, add, mla_attention,
// silu_mul, allreduce_sum, sample), so CPU and GPU backends run it unchanged. The concat is
// never built: q_a_proj and kv_a_proj_with_mqa are planned as two column slices (embedding half,
// hidden half) whose products are added. The layer is split over the target's tensor-parallel
// group like a target layer (heads, MLP width, vocabulary); fc and the norms are replicated.
// The backend materializes the tensors of its k25_weights' layers, so the decoder layer is
// layers[0] and layers[1] carries the input tensors (fc, hidden_norm, the hidden halves).
#include <math.h>
#include <string.h>

#include "checkpoint.h"
#include "kvcache.h"
#include "sampler.h"
#include "spec_eagle3_config.h"
#include "spec_internal.h"

typedef struct eagle {
    k25_config cfg;            // the draft layer's configuration (its backend computes RoPE and
                               // the softmax scale from it)
    k25_checkpoint *ck;
    k25_backend *be;
    k25_weights w;             // layers[0] decoder layer, layers[1] input tensors (see top)
    k25_tensor *fc;            // [D, n_aux*Dt] replicated
    k25_tensor *hidden_norm;   // [D]
    k25_tensor *q_a_h, *kv_a_h;// hidden halves [q_lora, D], [kv_lora+rope, D]
    k25_layer *L;              // q_a / kv_a: embedding halves
    int32_t *d2t;              // [Vd] target id - draft id; NULL: the same vocabulary
    int norm_before_residual;
    int n_aux, Dt, D, Vd, V, K, R, max_seqs, cap_pos;
    const k25_config *tcfg;
    k25_model *target;
    k25_kvcache kv;

    // activations (backend memory), R rows
    float *aux;                // [R][n_aux*Dt]
    float *x;                  // [R][D] embeddings
    float *en;                 // [R][D] input_layernorm(embeddings)
    float *h, *hn;             // [R][D] incoming hidden / hidden_norm of it (swappable)
    float *cq, *cq2, *cqn;     // [R][q_lora]
    float *q;                  // [R][H_local*(nope+rope)]
    float *kva, *kva2;         // [R][kv_lora+rope]
    float *attn;               // [R][H_local*v]
    float *d;                  // [R][D]
    float *xn;                 // [R][D]
    float *gate, *up, *act;    // [R][I_local]
    float *hf;                 // [R][D]
    float *logits;             // [R][Vd_local]

    // host
    float *aux_host;           // [R][n_aux*Dt]
    float *h_host;             // [R][D]
    float *glog;               // [Vd] gathered draft logits of one row
    float *tlog;               // [V] the same spread over the target vocabulary
    int32_t *tokens, *pos, *seq, *rows, *out, *map;  // [R]
    k25_sampling *params;      // [R]
    float *last_h;             // [max_seqs][D] pre-norm hidden of the last absorbed row
    int *last_pos;             // [max_seqs] its position, -1: none
    int *n_abs;                // [max_seqs] positions absorbed (cache length of real rows)
    uint8_t *open;             // [max_seqs]
} eagle;

// ------------------------------------------------------------------------------------------
// Configuration (config.json of the draft)
// ------------------------------------------------------------------------------------------

// The head's config.json, checked against the target and this run (spec_eagle3_config.c).
static int read_config(eagle *e, const char *dir, const spec_env *env, int *aux_ids, char *err) {
    eagle3_fit fit = {env->cfg, env->o.ctx_size, env->o.kv_block, env->dist->tp_size};
    eagle3_config ec;
    if (eagle3_config_read(&ec, dir, &fit, err)) return -1;
    e->cfg = ec.cfg;
    e->n_aux = ec.n_aux;
    memcpy(aux_ids, ec.aux_ids, sizeof ec.aux_ids);
    e->Dt = ec.Dt;
    e->Vd = ec.Vd;
    e->V = env->cfg->vocab;
    e->D = ec.cfg.hidden;
    e->norm_before_residual = ec.norm_before_residual;
    return 0;
}

// ------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------

typedef struct eplanner {
    k25_checkpoint *ck;
    k25_tensor_source src;
    char *err;
} eplanner;

// The name a tensor is stored under: as written, with "model.", or (decoder layer) with the
// "midlayer." of older SpecForge exports. NULL when absent.
static const char *stored_name(eplanner *p, const char *name, char *buf, size_t cap) {
    const char *forms[4] = {"%s", "model.%s", NULL, NULL};
    char mid[192] = "";
    if (!strncmp(name, "layers.0.", 9)) {
        snprintf(mid, sizeof mid, "midlayer.%s", name + 9);
        forms[2] = "midlayer";
        forms[3] = "model.midlayer";
    }
    int shard;
    for (int i = 0; i < 4 && forms[i]; i++) {
        if (i < 2) snprintf(buf, cap, forms[i], name);
        else snprintf(buf, cap, "%s.%s", forms[i], name + 9);
        if (checkpoint_find(p->ck, buf, &shard, NULL)) return buf;
    }
    return NULL;
}

// Plans a slice (rows [r0, +nr), cols [c0, +nc)) of a stored bf16 tensor [gr, gc]; 1-D when
// gr == 1. Returns 0, 1 when the checkpoint lacks it, -1 on a mismatch (message in err).
static int eplan(eplanner *p, k25_tensor *t, const char *name, int64_t gr, int64_t gc,
                 int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    memset(t, 0, sizeof *t);
    char buf[192];
    const char *s = stored_name(p, name, buf, sizeof buf);
    if (!s) return 1;
    snprintf(t->name, sizeof t->name, "%.127s", s);
    t->dtype = K25_BF16;
    t->g_rows = gr, t->g_cols = gc;
    t->row0 = r0, t->rows = nr;
    t->col0 = c0, t->cols = nc;
    return p->src.lookup(p->src.ctx, t, p->err) ? -1 : 0;
}

static int need(eplanner *p, k25_tensor *t, const char *name, int64_t gr, int64_t gc, int64_t r0,
                int64_t nr, int64_t c0, int64_t nc) {
    int rc = eplan(p, t, name, gr, gc, r0, nr, c0, nc);
    if (rc == 1)
        return k25_err(p->err, "EAGLE-3 checkpoint %s: tensor '%s' not found", p->ck->dir, name);
    return rc;
}

// A tensor of the target reused by the draft: its slice description, not its memory.
static void reuse(k25_tensor *dst, const k25_tensor *src) {
    *dst = *src;
    dst->dev = NULL;
    dst->dev_bytes = 0;
}

// A tensor the head does not ship is the target's, which must then have the head's shape.
static int target_unfit(const eagle *e, const char *name, int64_t D, int64_t rows, char *err) {
    if (D != e->Dt)
        return k25_err(err, "EAGLE-3 checkpoint %s: no %s, and the target's does not fit a hidden "
                       "size of %lld (the target's is %d)", e->ck->dir, name, (long long)D, e->Dt);
    if (rows != e->V)
        return k25_err(err, "EAGLE-3 checkpoint %s: no %s, and the target's does not fit a draft "
                       "vocabulary of %lld (the target's is %d)", e->ck->dir, name,
                       (long long)rows, e->V);
    return 0;
}

static int plan_weights(eagle *e, const spec_env *env, char *err) {
    const k25_config *c = &e->cfg;
    const k25_weights *tw = env->tw;
    int r = env->dist->tp_rank, tp = env->dist->tp_size;
    int64_t D = e->D, H = c->n_heads, Hl = H / tp, I = c->dense_inter, Il = I / tp;
    int64_t dq = c->qk_nope_dim + c->qk_rope_dim, nv = c->qk_nope_dim + c->v_head_dim;
    int64_t ql = c->q_lora_rank, kvw = c->kv_lora_rank + c->qk_rope_dim;
    int64_t Vl = e->Vd / tp;
    k25_weights *w = &e->w;
    memset(w, 0, sizeof *w);
    w->cfg = c;
    w->tp_rank = r, w->tp_size = tp;
    w->layer_begin = 0, w->layer_end = 2;
    w->n_heads_local = (int)Hl;
    w->dense_inter_local = (int)Il;
    w->moe_inter_local = c->moe_inter / tp;
    w->vocab_local = (int)Vl;
    w->vocab_begin = (int)(r * Vl);
    w->layers = k25_calloc(2, sizeof(k25_layer));
    w->layers[0].index = 0;
    w->layers[1].index = 1;
    k25_layer *L = &w->layers[0], *C = &w->layers[1];
    e->L = L;
    e->fc = &C->q_b;
    e->hidden_norm = &C->attn_norm;
    e->q_a_h = &C->q_a;
    e->kv_a_h = &C->kv_a;

    eplanner p = {e->ck, checkpoint_source(e->ck), err};
#define LN(s) "layers.0." s
    if (need(&p, e->fc, "fc.weight", D, e->n_aux * e->Dt, 0, D, 0, e->n_aux * e->Dt) ||
        need(&p, e->hidden_norm, LN("hidden_norm.weight"), 1, D, 0, 1, 0, D) ||
        need(&p, &L->attn_norm, LN("input_layernorm.weight"), 1, D, 0, 1, 0, D) ||
        need(&p, &L->ffn_norm, LN("post_attention_layernorm.weight"), 1, D, 0, 1, 0, D) ||
        need(&p, &L->q_a, LN("self_attn.q_a_proj.weight"), ql, 2 * D, 0, ql, 0, D) ||
        need(&p, e->q_a_h, LN("self_attn.q_a_proj.weight"), ql, 2 * D, 0, ql, D, D) ||
        need(&p, &L->q_a_norm, LN("self_attn.q_a_layernorm.weight"), 1, ql, 0, 1, 0, ql) ||
        need(&p, &L->q_b, LN("self_attn.q_b_proj.weight"), H * dq, ql, r * Hl * dq, Hl * dq, 0,
             ql) ||
        need(&p, &L->kv_a, LN("self_attn.kv_a_proj_with_mqa.weight"), kvw, 2 * D, 0, kvw, 0, D) ||
        need(&p, e->kv_a_h, LN("self_attn.kv_a_proj_with_mqa.weight"), kvw, 2 * D, 0, kvw, D,
             D) ||
        need(&p, &L->kv_a_norm, LN("self_attn.kv_a_layernorm.weight"), 1, c->kv_lora_rank, 0, 1,
             0, c->kv_lora_rank) ||
        need(&p, &L->kv_b, LN("self_attn.kv_b_proj.weight"), H * nv, c->kv_lora_rank,
             r * Hl * nv, Hl * nv, 0, c->kv_lora_rank) ||
        need(&p, &L->o_proj, LN("self_attn.o_proj.weight"), D, H * c->v_head_dim, 0, D,
             r * Hl * c->v_head_dim, Hl * c->v_head_dim) ||
        need(&p, &L->ffn_gate, LN("mlp.gate_proj.weight"), I, D, r * Il, Il, 0, D) ||
        need(&p, &L->ffn_up, LN("mlp.up_proj.weight"), I, D, r * Il, Il, 0, D) ||
        need(&p, &L->ffn_down, LN("mlp.down_proj.weight"), D, I, 0, D, r * Il, Il))
        return -1;
#undef LN

    // Embedding, final norm and lm_head: the draft's own, else the target's (drafts trained
    // with the target's frozen ones often ship without them).
    int rc = eplan(&p, &w->embed, "embed_tokens.weight", e->V, D, 0, e->V, 0, D);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (target_unfit(e, "embed_tokens.weight", D, e->V, err)) return -1;
        reuse(&w->embed, &tw->embed);
    }
    rc = eplan(&p, &w->final_norm, "norm.weight", 1, D, 0, 1, 0, D);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (target_unfit(e, "norm.weight", D, e->V, err)) return -1;
        reuse(&w->final_norm, &tw->final_norm);
    }
    if (c->tie_embeddings) {
        if (e->Vd != e->V)
            return k25_err(err, "EAGLE-3 checkpoint %s: tied embeddings with a draft vocabulary",
                           e->ck->dir);
        reuse(&w->lm_head, &w->embed);
        w->lm_head.row0 = r * Vl;
        w->lm_head.rows = Vl;
    } else {
        rc = eplan(&p, &w->lm_head, "lm_head.weight", e->Vd, D, r * Vl, Vl, 0, D);
        if (rc < 0) return -1;
        if (rc == 1) {
            if (target_unfit(e, "lm_head.weight", D, e->Vd, err)) return -1;
            reuse(&w->lm_head, &tw->lm_head);
        }
    }

    // d2t: target id = draft id + d2t[draft id] (int64 in the published checkpoints).
    if (e->Vd != e->V) {
        char buf[64];
        const char *name = NULL;
        const char *forms[] = {"d2t", "model.d2t"};
        int shard;
        const st_tensor *st = NULL;
        for (int i = 0; i < 2 && !st; i++)
            if ((st = checkpoint_find(e->ck, forms[i], &shard, NULL))) name = forms[i];
        if (!st)
            return k25_err(err, "EAGLE-3 checkpoint %s: draft_vocab_size %d needs a d2t map",
                           e->ck->dir, e->Vd);
        if ((st->dtype != ST_I64 && st->dtype != ST_I32) || st->numel != e->Vd)
            return k25_err(err, "EAGLE-3 checkpoint %s: %s must hold %d integers", e->ck->dir,
                           name, e->Vd);
        snprintf(buf, sizeof buf, "%s", name);
        e->d2t = k25_malloc(sizeof(int32_t) * (size_t)e->Vd);
        for (int i = 0; i < e->Vd; i++) {
            int64_t v;
            if (st->dtype == ST_I64) {
                memcpy(&v, st->data + 8 * (size_t)i, 8);
            } else {
                int32_t v32;
                memcpy(&v32, st->data + 4 * (size_t)i, 4);
                v = v32;
            }
            if (i + v < 0 || i + v >= e->V)
                return k25_err(err, "EAGLE-3 checkpoint %s: %s[%d] = %lld maps outside the "
                                    "vocabulary", e->ck->dir, buf, i, (long long)v);
            e->d2t[i] = (int32_t)v;
        }
    }
    return 0;
}

// ------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------

static void set_batch(eagle *e, int T) {
    k25_batch b = {.T = T, .tokens = e->tokens, .pos = e->pos, .seq = e->seq,
                   .block_table = e->kv.block_table, .max_seqs = e->kv.max_seqs,
                   .max_blocks_per_seq = e->kv.max_blocks_per_seq};
    e->be->set_batch(e->be, &b);
}

// The decoder layer over rows [0, T) (tokens / pos / seq set, the incoming hidden in e->h).
// Leaves the pre-norm output hidden in e->h.
static void layer_forward(eagle *e, int T) {
    k25_backend *be = e->be;
    const k25_config *c = &e->cfg;
    const k25_layer *L = e->L;
    int D = e->D, ql = c->q_lora_rank, kvw = c->kv_lora_rank + c->qk_rope_dim;
    size_t TD = (size_t)T * D;
    set_batch(e, T);
    be->embed(be, &e->w.embed, e->x);
    be->rmsnorm(be, e->x, D, &L->attn_norm, c->norm_eps, T, D, e->en);
    be->rmsnorm(be, e->h, D, e->hidden_norm, c->norm_eps, T, D, e->hn);
    const float *hin = e->hn;
    if (e->norm_before_residual) {
        // The residual is the normalized hidden too: the buffers trade places.
        float *t = e->h;
        e->h = e->hn;
        e->hn = t;
        hin = e->h;
    }

    // ---- MLA over concat(e, hn): each projection as the sum of its two column halves ----
    be->matmul(be, e->en, &L->q_a, T, e->cq);
    be->matmul(be, hin, e->q_a_h, T, e->cq2);
    be->add(be, e->cq, e->cq2, (size_t)T * ql);
    be->rmsnorm(be, e->cq, ql, &L->q_a_norm, c->latent_norm_eps, T, ql, e->cqn);
    be->matmul(be, e->cqn, &L->q_b, T, e->q);
    be->matmul(be, e->en, &L->kv_a, T, e->kva);
    be->matmul(be, hin, e->kv_a_h, T, e->kva2);
    be->add(be, e->kva, e->kva2, (size_t)T * kvw);
    be->mla_attention(be, 0, L, e->q, e->kva, e->attn);
    be->matmul(be, e->attn, &L->o_proj, T, e->d);
    be->allreduce_sum(be, e->d, TD);
    be->add_rmsnorm(be, e->h, e->d, &L->ffn_norm, c->norm_eps, T, D, e->xn);

    // ---- dense MLP ----
    be->matmul(be, e->xn, &L->ffn_gate, T, e->gate);
    be->matmul(be, e->xn, &L->ffn_up, T, e->up);
    be->silu_mul(be, e->gate, e->up, T, (int)L->ffn_gate.rows, e->act);
    be->matmul(be, e->act, &L->ffn_down, T, e->d);
    be->allreduce_sum(be, e->d, TD);
    be->add(be, e->h, e->d, TD);
}

// Final norm, lm_head and a token for each of rows [0, n) of e->h, row i for seqs[idx[i]] as
// its draft number j. Greedy rows take the vocabulary-parallel argmax; rows under temperature
// draw from q (the draft's distribution over the target vocabulary, written to the q row).
static void head(eagle *e, int n, k25_spec_seq *seqs, const int *idx, int j) {
    k25_backend *be = e->be;
    const k25_config *c = &e->cfg;
    int D = e->D;
    be->rmsnorm(be, e->h, D, &e->w.final_norm, c->norm_eps, n, D, e->hf);
    be->matmul(be, e->hf, &e->w.lm_head, n, e->logits);
    for (int i = 0; i < n; i++) {
        e->params[i] = (k25_sampling){.temp = 0, .top_p = 1};
        e->rows[i] = i;
    }
    set_batch(e, n); // the sampled rows are rows 0..n-1 with their tokens/positions
    be->sample(be, e->logits, e->w.vocab_begin, e->w.vocab_local, e->params, e->out);
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[idx[i]];
        int32_t id = e->out[i];
        if (s->q) {
            float *q = (float *)s->q + (size_t)j * e->V;
            be->gather_logits(be, e->logits, e->w.vocab_local, i, e->glog);
            const float *lg = e->glog;
            if (e->d2t) {
                for (int v = 0; v < e->V; v++) e->tlog[v] = -INFINITY;
                for (int v = 0; v < e->Vd; v++) e->tlog[v + e->d2t[v]] = e->glog[v];
                lg = e->tlog;
            }
            spec_probs(lg, e->V, &s->sampling, q);
            s->draft[j] = spec_draw(q, e->V, sampler_uniform(s->sampling.seed,
                                                            (uint64_t)(s->n_gen + j),
                                                            SPEC_RNG_DRAFT));
        } else {
            s->draft[j] = e->d2t ? id + e->d2t[id] : id;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Slots
// ------------------------------------------------------------------------------------------

static void eg_release(spec_draft *d, int slot) {
    eagle *e = d->impl;
    if (slot < 0 || slot >= e->max_seqs || !e->open[slot]) return;
    kvcache_close(&e->kv, slot);
    e->open[slot] = 0;
    e->last_pos[slot] = -1;
    e->n_abs[slot] = 0;
}

static void eg_reset(spec_draft *d) {
    eagle *e = d->impl;
    for (int s = 0; s < e->max_seqs; s++) eg_release(d, s);
}

static void ensure_slot(eagle *e, int slot, int n_positions, int max_len) {
    K25_CHECK(slot >= 0 && slot < e->max_seqs, "EAGLE-3: slot %d of %d", slot, e->max_seqs);
    if (!e->open[slot]) {
        spec_cache_open(&e->kv, slot, max_len, e->cap_pos, "EAGLE-3");
        e->open[slot] = 1;
        e->last_pos[slot] = -1;
        e->n_abs[slot] = 0;
    }
    K25_CHECK(kvcache_grow(&e->kv, slot, n_positions) == 0,
              "EAGLE-3: slot %d cannot grow to %d positions", slot, n_positions);
}

// ------------------------------------------------------------------------------------------
// Observe: absorb the target's rows
// ------------------------------------------------------------------------------------------

// Runs rows [0, T) gathered in tokens/pos/seq/map (map: the target's batch row) through fc
// and the layer, then keeps the pre-norm hidden of the rows listed in keep_row for their slots.
static void absorb(eagle *e, int T, const int *keep_row, int n_keep) {
    if (T == 0) return;
    size_t W = (size_t)e->n_aux * e->Dt;
    for (int a = 0; a < e->n_aux; a++) {
        const float *cap = model_captured(e->target, a);
        K25_CHECK(cap, "EAGLE-3: the target captured no hidden states");
        for (int t = 0; t < T; t++)
            memcpy(e->aux_host + (size_t)t * W + (size_t)a * e->Dt,
                   cap + (size_t)e->map[t] * e->Dt, sizeof(float) * (size_t)e->Dt);
    }
    e->be->to_device(e->be, e->aux, e->aux_host, sizeof(float) * (size_t)T * W);
    e->be->matmul(e->be, e->aux, e->fc, T, e->h);
    layer_forward(e, T);
    e->be->to_host(e->be, e->h_host, e->h, sizeof(float) * (size_t)T * e->D);
    for (int i = 0; i < n_keep; i++) {
        int t = keep_row[i], slot = e->seq[t];
        memcpy(e->last_h + (size_t)slot * e->D, e->h_host + (size_t)t * e->D,
               sizeof(float) * (size_t)e->D);
        e->last_pos[slot] = e->pos[t];
    }
}

static void eg_observe(spec_draft *d, const k25_spec_obs *obs, int n) {
    eagle *e = d->impl;
    int T = 0, n_keep = 0;
    int *keep = k25_malloc(sizeof(int) * (size_t)(e->R > n ? e->R : n));
    for (int i = 0; i < n; i++) {
        const k25_spec_obs *o = &obs[i];
        int L = o->n_prompt + o->n_gen, last = -1;
        for (int r = 0; r < o->n_rows; r++) {
            int p = o->pos0 + r;
            if (p + 1 >= L) break; // the token after it is not known (yet, or was rejected)
            if (T == e->R) {
                absorb(e, T, keep, n_keep);
                T = n_keep = 0;
                last = -1;
            }
            ensure_slot(e, o->slot, p + 1, o->max_len);
            e->tokens[T] = spec_hist(o->prompt, o->n_prompt, o->gen, p + 1);
            e->pos[T] = p;
            e->seq[T] = o->slot;
            e->map[T] = o->row0 + r;
            last = T++;
        }
        if (last >= 0) {
            keep[n_keep++] = last;
            e->n_abs[o->slot] = e->pos[last] + 1;
        }
    }
    absorb(e, T, keep, n_keep);
    free(keep);
}

// ------------------------------------------------------------------------------------------
// Propose: the first draft from the kept hidden, then the chain
// ------------------------------------------------------------------------------------------

static void eg_propose(spec_draft *d, k25_spec_seq *seqs, int n) {
    eagle *e = d->impl;
    int *idx = k25_malloc(sizeof(int) * (size_t)(n + 1));   // row -> sequence
    int *keep = k25_malloc(sizeof(int) * (size_t)(n + 1));
    int na = 0, max_k = 0;
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        int L = s->n_prompt + s->n_gen;
        // The hidden of position L - 2 (whose next token, the one to feed, is known).
        int ok = s->n_draft > 0 && s->slot >= 0 && s->slot < e->max_seqs && e->open[s->slot] &&
                 e->last_pos[s->slot] == L - 2 && L - 2 + s->n_draft <= e->cap_pos;
        if (!ok) {
            s->n_draft = 0;
            continue;
        }
        memcpy(e->h_host + (size_t)na * e->D, e->last_h + (size_t)s->slot * e->D,
               sizeof(float) * (size_t)e->D);
        e->pos[na] = L - 2;
        e->seq[na] = s->slot;
        e->tokens[na] = spec_hist(s->prompt, s->n_prompt, s->gen, L - 1);
        idx[na++] = i;
        if (s->n_draft > max_k) max_k = s->n_draft;
    }
    if (na) {
        e->be->to_device(e->be, e->h, e->h_host, sizeof(float) * (size_t)na * e->D);
        head(e, na, seqs, idx, 0);
    }
    for (int j = 1; j < max_k; j++) {
        // Sequences that want fewer drafts drop out; the rows that stay are compacted.
        int m = 0;
        for (int a = 0; a < na; a++)
            if (seqs[idx[a]].n_draft > j) keep[m++] = a;
        if (m < na && m > 0) {
            e->be->to_host(e->be, e->h_host, e->h, sizeof(float) * (size_t)na * e->D);
            for (int b = 0; b < m; b++) {
                memmove(e->h_host + (size_t)b * e->D, e->h_host + (size_t)keep[b] * e->D,
                        sizeof(float) * (size_t)e->D);
                idx[b] = idx[keep[b]];
            }
            e->be->to_device(e->be, e->h, e->h_host, sizeof(float) * (size_t)m * e->D);
        }
        na = m;
        if (!na) break;
        for (int a = 0; a < na; a++) {
            k25_spec_seq *s = &seqs[idx[a]];
            int p = s->n_prompt + s->n_gen - 2 + j;
            ensure_slot(e, s->slot, p + 1, s->max_len);
            e->tokens[a] = s->draft[j - 1];
            e->pos[a] = p;
            e->seq[a] = s->slot;
        }
        layer_forward(e, na);
        head(e, na, seqs, idx, j);
    }
    free(keep);
    free(idx);
}

// ------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------

static void eg_destroy(spec_draft *d) {
    eagle *e = d->impl;
    k25_backend *be = e->be;
    if (be) {
        float *bufs[] = {e->aux, e->x, e->en, e->h, e->hn, e->cq, e->cq2, e->cqn, e->q, e->kva,
                         e->kva2, e->attn, e->d, e->xn, e->gate, e->up, e->act, e->hf, e->logits};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        be->destroy(be);
    }
    weights_free(&e->w);
    if (e->ck) checkpoint_close(e->ck);
    kvcache_destroy(&e->kv);
    free(e->d2t);
    free(e->aux_host);
    free(e->h_host);
    free(e->glog);
    free(e->tlog);
    free(e->tokens);
    free(e->pos);
    free(e->seq);
    free(e->rows);
    free(e->out);
    free(e->map);
    free(e->params);
    free(e->last_h);
    free(e->last_pos);
    free(e->n_abs);
    free(e->open);
    free(e);
}

int spec_eagle3_create(const spec_env *env, const char *dir, spec_draft *d, char *err) {
    const k25_spec_opts *o = &env->o;
    eagle *e = k25_calloc(1, sizeof *e);
    int aux_ids[EAGLE3_MAX_AUX];
    e->tcfg = env->cfg;
    e->target = env->target;
    e->K = o->k;
    e->R = o->max_rows;
    e->max_seqs = o->max_seqs;
    e->cap_pos = o->ctx_size;
    if (read_config(e, dir, env, aux_ids, err) || !(e->ck = checkpoint_open(dir, err)) ||
        plan_weights(e, env, err)) {
        d->impl = e;
        eg_destroy(d);
        d->impl = NULL;
        return -1;
    }
    const char *backend = o->backend ? o->backend : env->cfg->backend;
    if (!strcmp(backend, "cuda")) {
        e->be = backend_cuda_create(&e->cfg, env->dist);
        if (!e->be) {
            d->impl = e;
            eg_destroy(d);
            d->impl = NULL;
            return k25_err(err, "EAGLE-3 draft: this binary was built without CUDA");
        }
    } else {
        int threads = o->threads > 0 ? o->threads : env->cfg->threads;
        e->be = backend_cpu_create(&e->cfg, env->dist, threads);
    }
    k25_backend *be = e->be;
    be->load_weights(be, &e->w);
    int mbps = (e->cap_pos + o->kv_block - 1) / o->kv_block;
    be->kv_init(be, 1, o->n_blocks, o->kv_block);
    if (kvcache_init(&e->kv, o->n_blocks, o->kv_block, o->max_seqs, mbps, err)) {
        d->impl = e;
        eg_destroy(d);
        d->impl = NULL;
        return -1;
    }

    const k25_config *c = &e->cfg;
    size_t R = (size_t)e->R, D = (size_t)e->D, f = sizeof(float);
    size_t Hl = (size_t)e->w.n_heads_local, Il = (size_t)e->w.dense_inter_local;
    size_t W = (size_t)e->n_aux * e->Dt, kvw = (size_t)(c->kv_lora_rank + c->qk_rope_dim);
    e->aux = be->alloc(be, R * W * f);
    e->x = be->alloc(be, R * D * f);
    e->en = be->alloc(be, R * D * f);
    e->h = be->alloc(be, R * D * f);
    e->hn = be->alloc(be, R * D * f);
    e->cq = be->alloc(be, R * c->q_lora_rank * f);
    e->cq2 = be->alloc(be, R * c->q_lora_rank * f);
    e->cqn = be->alloc(be, R * c->q_lora_rank * f);
    e->q = be->alloc(be, R * Hl * (c->qk_nope_dim + c->qk_rope_dim) * f);
    e->kva = be->alloc(be, R * kvw * f);
    e->kva2 = be->alloc(be, R * kvw * f);
    e->attn = be->alloc(be, R * Hl * c->v_head_dim * f);
    e->d = be->alloc(be, R * D * f);
    e->xn = be->alloc(be, R * D * f);
    e->gate = be->alloc(be, R * Il * f);
    e->up = be->alloc(be, R * Il * f);
    e->act = be->alloc(be, R * Il * f);
    e->hf = be->alloc(be, R * D * f);
    e->logits = be->alloc(be, R * (size_t)e->w.vocab_local * f);
    e->aux_host = k25_malloc(R * W * f);
    e->h_host = k25_malloc(R * D * f);
    e->glog = k25_malloc((size_t)e->Vd * f);
    e->tlog = k25_malloc((size_t)e->V * f);
    e->tokens = k25_malloc(R * sizeof(int32_t));
    e->pos = k25_malloc(R * sizeof(int32_t));
    e->seq = k25_malloc(R * sizeof(int32_t));
    e->rows = k25_malloc(R * sizeof(int32_t));
    e->out = k25_malloc(R * sizeof(int32_t));
    e->map = k25_malloc(R * sizeof(int32_t));
    e->params = k25_malloc(R * sizeof(k25_sampling));
    e->last_h = k25_malloc((size_t)o->max_seqs * D * f);
    e->last_pos = k25_malloc(sizeof(int) * (size_t)o->max_seqs);
    e->n_abs = k25_calloc(o->max_seqs, sizeof(int));
    e->open = k25_calloc(o->max_seqs, 1);
    for (int s = 0; s < o->max_seqs; s++) e->last_pos[s] = -1;

    d->kind = "eagle3";
    d->impl = e;
    d->cache = &e->kv;
    d->n_capture = e->n_aux;
    memcpy(d->capture, aux_ids, sizeof(int) * (size_t)e->n_aux);
    d->reset = eg_reset;
    d->release = eg_release;
    d->propose = eg_propose;
    d->observe = eg_observe;
    d->destroy = eg_destroy;
    k25_log("spec: EAGLE-3 head %s: hidden %d, %d heads, q_lora %d, kv_lora %d, MLP %d, draft "
            "vocabulary %d%s, target layers %d,%d,%d feed fc, %.2f MiB of weights per rank, %d "
            "cache blocks of %d tokens\n", dir, e->D, c->n_heads, c->q_lora_rank,
            c->kv_lora_rank, c->dense_inter, e->Vd, e->d2t ? " (d2t map)" : "", aux_ids[0],
            e->n_aux > 1 ? aux_ids[1] : -1, e->n_aux > 2 ? aux_ids[2] : -1,
            weights_bytes(&e->w) / (1024.0 * 1024.0), e->kv.n_blocks, o->kv_block);
    return 0;
}
