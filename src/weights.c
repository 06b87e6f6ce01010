// A rank's weight plan: every tensor of its layers with global shape and tensor-parallel slice
// (split table in weights.h), resolved through a tensor source (checkpoint files or the
// synthetic generator), plus element access for materializing slices.
//
// The planner also decides each tensor's synthetic distribution (synth_kind / synth_exp): it is
// the one place that knows a tensor's role and fan-in. The synthetic source only adds the seed
// and the tensor id; a file source ignores the hint.
#include "weights.h"

#include <math.h>
#include <string.h>

#include "int4.h"
#include "synth.h"

// ------------------------------------------------------------------------------------------
// dtypes

size_t k25_dtype_size(k25_dtype t) {
    switch (t) {
    case K25_BF16: return 2;
    case K25_F32: return 4;
    case K25_I32: return 4;
    }
    return 0;
}

const char *k25_dtype_name(k25_dtype t) {
    switch (t) {
    case K25_BF16: return "BF16";
    case K25_F32: return "F32";
    case K25_I32: return "I32";
    }
    return "?";
}

// ------------------------------------------------------------------------------------------
// synthetic distributions by role
//
// Activations must stay finite through 61 layers at full size, so each weight matrix W [N][K]
// gets element std ~ 1/sqrt(K): UNIFORM values r * 2^exp with r uniform in [-127, 127]
// (std ~ 73.6 * 2^exp); INT4 experts q * s with q in [-8, 7] (std ~ 4.6) and scales
// (64 + [0, 63]) * 2^exp (mean ~ 95 * 2^exp).

static int clamp_exp(long e) { return e < -126 ? -126 : (e > 127 ? 127 : (int)e); }

static int exp_weight(int64_t k) { return clamp_exp(lround(-log2(73.6 * sqrt((double)k)))); }
static int exp_int4_scale(int64_t k) {
    return clamp_exp(lround(-log2(4.6 * 95.0 * sqrt((double)k))));
}
#define EXP_EMBED (-6)   // std ~ 1.15: the embedding feeds RMSNorm, its scale is free
#define EXP_BIAS (-10)   // routing bias |b| < 0.125: shifts choices without dominating them

// ------------------------------------------------------------------------------------------
// planning

typedef struct {
    const k25_tensor_source *src;
    char *err;
} planner;

// One tensor: global [g_rows, g_cols], local rows [row0, row0+rows) x cols [col0, col0+cols).
static int plan(planner *p, k25_tensor *t, const char *name, k25_dtype dt, int64_t g_rows,
                int64_t g_cols, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                int synth_kind, int synth_exp) {
    memset(t, 0, sizeof *t);
    size_t n = strlen(name);
    if (n >= sizeof t->name)
        return k25_err(p->err, "tensor name too long (%zu chars): %s", n, name);
    memcpy(t->name, name, n + 1);
    K25_CHECK(row0 >= 0 && rows > 0 && row0 + rows <= g_rows && col0 >= 0 && cols > 0 &&
                  col0 + cols <= g_cols,
              "%s: slice rows [%lld,+%lld) cols [%lld,+%lld) outside [%lld, %lld]", name,
              (long long)row0, (long long)rows, (long long)col0, (long long)cols,
              (long long)g_rows, (long long)g_cols);
    t->dtype = dt;
    t->g_rows = g_rows, t->g_cols = g_cols;
    t->row0 = row0, t->rows = rows;
    t->col0 = col0, t->cols = cols;
    t->synth_kind = synth_kind;
    t->synth_exp = synth_exp;
    if (p->src->lookup(p->src->ctx, t, p->err)) return -1;
    K25_CHECK(t->kind == K25_SRC_FILE || t->kind == K25_SRC_SYNTH,
              "%s: tensor source returned no data", name);
    return 0;
}

static int plan_full(planner *p, k25_tensor *t, const char *name, k25_dtype dt, int64_t r,
                     int64_t c, int kind, int exp) {
    return plan(p, t, name, dt, r, c, 0, r, 0, c, kind, exp);
}
static int plan_vec(planner *p, k25_tensor *t, const char *name, int64_t n) {
    return plan(p, t, name, K25_BF16, 1, n, 0, 1, 0, n, K25_SYNTH_NORM, 0);
}
// W [R, C] bf16, rows [r0, r0+nr) on this rank.
static int plan_rows(planner *p, k25_tensor *t, const char *name, int64_t r, int64_t c,
                     int64_t r0, int64_t nr) {
    return plan(p, t, name, K25_BF16, r, c, r0, nr, 0, c, K25_SYNTH_UNIFORM, exp_weight(c));
}
// W [R, C] bf16, columns [c0, c0+nc) on this rank.
static int plan_cols(planner *p, k25_tensor *t, const char *name, int64_t r, int64_t c,
                     int64_t c0, int64_t nc) {
    return plan(p, t, name, K25_BF16, r, c, 0, r, c0, nc, K25_SYNTH_UNIFORM, exp_weight(c));
}

// One routed-expert projection, logical W [out, in]; by_rows: this rank holds rows
// [lo, lo+n) (gate, up), else columns [lo, lo+n) (down).
static int plan_expert(planner *p, k25_expert_w *e, const k25_config *c, const char *prefix,
                       int64_t out, int64_t in, int by_rows, int64_t lo, int64_t n) {
    char name[160];
    memset(e, 0, sizeof *e);
    e->out = by_rows ? n : out;
    e->in = by_rows ? in : n;
    if (!c->experts_int4) {
        snprintf(name, sizeof name, "%s.weight", prefix);
        return by_rows ? plan_rows(p, &e->w, name, out, in, lo, n)
                       : plan_cols(p, &e->w, name, out, in, lo, n);
    }
    int64_t g = c->quant_group;
    K25_CHECK(in % g == 0 && g % 8 == 0 && (by_rows || (lo % g == 0 && n % g == 0)),
              "%s: INT4 layout needs widths divisible by the group %lld", prefix, (long long)g);
    int sexp = exp_int4_scale(in);
    snprintf(name, sizeof name, "%s.weight_packed", prefix);
    int rc = by_rows
        ? plan(p, &e->w, name, K25_I32, out, in / 8, lo, n, 0, in / 8, K25_SYNTH_INT4, 0)
        : plan(p, &e->w, name, K25_I32, out, in / 8, 0, out, lo / 8, n / 8, K25_SYNTH_INT4, 0);
    if (rc) return rc;
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    return by_rows
        ? plan(p, &e->scale, name, K25_BF16, out, in / g, lo, n, 0, in / g, K25_SYNTH_SCALE,
               sexp)
        : plan(p, &e->scale, name, K25_BF16, out, in / g, 0, out, lo / g, n / g,
               K25_SYNTH_SCALE, sexp);
}

static int plan_layer(planner *p, const k25_weights *w, k25_layer *L) {
    const k25_config *c = w->cfg;
    const int64_t D = c->hidden, H = c->n_heads, r = w->tp_rank;
    const int64_t Hl = w->n_heads_local;
    const int64_t qk = c->qk_nope_dim + c->qk_rope_dim, nv = c->qk_nope_dim + c->v_head_dim;
    char name[160];
#define NAME(...) (snprintf(name, sizeof name, "model.layers.%d." __VA_ARGS__), name)
    const int li = L->index;
    if (plan_vec(p, &L->attn_norm, NAME("input_layernorm.weight", li), D) ||
        plan_vec(p, &L->ffn_norm, NAME("post_attention_layernorm.weight", li), D) ||
        plan_full(p, &L->q_a, NAME("self_attn.q_a_proj.weight", li), K25_BF16, c->q_lora_rank,
                  D, K25_SYNTH_UNIFORM, exp_weight(D)) ||
        plan_vec(p, &L->q_a_norm, NAME("self_attn.q_a_layernorm.weight", li), c->q_lora_rank) ||
        plan_rows(p, &L->q_b, NAME("self_attn.q_b_proj.weight", li), H * qk, c->q_lora_rank,
                  r * Hl * qk, Hl * qk) ||
        plan_full(p, &L->kv_a, NAME("self_attn.kv_a_proj_with_mqa.weight", li), K25_BF16,
                  c->kv_lora_rank + c->qk_rope_dim, D, K25_SYNTH_UNIFORM, exp_weight(D)) ||
        plan_vec(p, &L->kv_a_norm, NAME("self_attn.kv_a_layernorm.weight", li),
                 c->kv_lora_rank) ||
        plan_rows(p, &L->kv_b, NAME("self_attn.kv_b_proj.weight", li), H * nv, c->kv_lora_rank,
                  r * Hl * nv, Hl * nv) ||
        plan_cols(p, &L->o_proj, NAME("self_attn.o_proj.weight", li), D, H * c->v_head_dim,
                  r * Hl * c->v_head_dim, Hl * c->v_head_dim))
        return -1;

    if (!L->is_moe) {
        const int64_t I = c->dense_inter, Il = w->dense_inter_local;
        return (plan_rows(p, &L->ffn_gate, NAME("mlp.gate_proj.weight", li), I, D, r * Il, Il) ||
                plan_rows(p, &L->ffn_up, NAME("mlp.up_proj.weight", li), I, D, r * Il, Il) ||
                plan_cols(p, &L->ffn_down, NAME("mlp.down_proj.weight", li), D, I, r * Il, Il))
                   ? -1 : 0;
    }

    const int64_t E = c->n_experts, S = (int64_t)c->n_shared * c->moe_inter, Sl = S / w->tp_size;
    // Router std ~ 2/sqrt(D): sigmoid scores spread enough that top-k is not a tie-break.
    if (plan_full(p, &L->router, NAME("mlp.gate.weight", li), K25_BF16, E, D, K25_SYNTH_UNIFORM,
                  exp_weight(D) + 1) ||
        plan(p, &L->router_bias, NAME("mlp.gate.e_score_correction_bias", li), K25_F32, 1, E, 0,
             1, 0, E, K25_SYNTH_F32, EXP_BIAS))
        return -1;
    if (S > 0 &&
        (plan_rows(p, &L->ffn_gate, NAME("mlp.shared_experts.gate_proj.weight", li), S, D,
                   r * Sl, Sl) ||
         plan_rows(p, &L->ffn_up, NAME("mlp.shared_experts.up_proj.weight", li), S, D, r * Sl,
                   Sl) ||
         plan_cols(p, &L->ffn_down, NAME("mlp.shared_experts.down_proj.weight", li), D, S,
                   r * Sl, Sl)))
        return -1;
    const int64_t Ie = c->moe_inter, Iel = w->moe_inter_local;
    L->exp_gate = k25_calloc((size_t)E, sizeof(k25_expert_w));
    L->exp_up = k25_calloc((size_t)E, sizeof(k25_expert_w));
    L->exp_down = k25_calloc((size_t)E, sizeof(k25_expert_w));
    for (int e = 0; e < E; e++) {
        if (plan_expert(p, &L->exp_gate[e], c, NAME("mlp.experts.%d.gate_proj", li, e), Ie, D, 1,
                        r * Iel, Iel) ||
            plan_expert(p, &L->exp_up[e], c, NAME("mlp.experts.%d.up_proj", li, e), Ie, D, 1,
                        r * Iel, Iel) ||
            plan_expert(p, &L->exp_down[e], c, NAME("mlp.experts.%d.down_proj", li, e), D, Ie, 0,
                        r * Iel, Iel))
            return -1;
    }
#undef NAME
    return 0;
}

int weights_plan(k25_weights *w, const k25_config *c, int tp_rank, int tp_size,
                 int layer_begin, int layer_end, const k25_tensor_source *src, char *err) {
    memset(w, 0, sizeof *w);
    if (c->q_lora_rank <= 0)
        return k25_err(err, "q_lora_rank = %d: models without a q_a_proj (q_lora_rank 0) are "
                       "not supported", c->q_lora_rank);
    if (c->n_shared < 0 || c->n_experts <= 0)
        return k25_err(err, "n_routed_experts = %d, n_shared_experts = %d: not supported",
                       c->n_experts, c->n_shared);
    // config_check_tp has vetted these; a failure here is a programming error.
    K25_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "bad tp rank %d / %d", tp_rank,
              tp_size);
    K25_CHECK(c->n_heads % tp_size == 0 && c->dense_inter % tp_size == 0 &&
                  c->moe_inter % tp_size == 0 && c->vocab % tp_size == 0 &&
                  (c->n_shared * c->moe_inter) % tp_size == 0,
              "config not divisible for tp = %d (config_check_tp not run?)", tp_size);
    K25_CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= c->n_layers,
              "bad layer range [%d, %d) of %d", layer_begin, layer_end, c->n_layers);
    w->cfg = c;
    w->tp_rank = tp_rank, w->tp_size = tp_size;
    w->layer_begin = layer_begin, w->layer_end = layer_end;
    w->n_heads_local = c->n_heads / tp_size;
    w->dense_inter_local = c->dense_inter / tp_size;
    w->moe_inter_local = c->moe_inter / tp_size;
    w->vocab_local = c->vocab / tp_size;
    w->vocab_begin = tp_rank * w->vocab_local;

    planner p = {src, err};
    const int64_t D = c->hidden, V = c->vocab;
    const char *embed_name = "model.embed_tokens.weight";
    int rc = plan_full(&p, &w->embed, embed_name, K25_BF16, V, D, K25_SYNTH_UNIFORM, EXP_EMBED) ||
             plan_vec(&p, &w->final_norm, "model.norm.weight", D);
    if (!rc) {
        // Tied embeddings: the vocabulary slice of the embedding, with its distribution.
        if (c->tie_embeddings)
            rc = plan(&p, &w->lm_head, embed_name, K25_BF16, V, D, w->vocab_begin,
                      w->vocab_local, 0, D, K25_SYNTH_UNIFORM, EXP_EMBED);
        else
            rc = plan_rows(&p, &w->lm_head, "lm_head.weight", V, D, w->vocab_begin,
                           w->vocab_local);
    }
    w->layers = k25_calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof(k25_layer));
    for (int l = 0; l < c->n_layers; l++) w->layers[l].index = l;
    for (int l = layer_begin; l < layer_end && !rc; l++) {
        w->layers[l].is_moe = config_is_moe_layer(c, l);
        rc = plan_layer(&p, w, &w->layers[l]);
    }
    if (rc) {
        weights_free(w);
        return -1;
    }
    return 0;
}

void weights_free(k25_weights *w) {
    if (w->layers)
        for (int l = 0; w->cfg && l < w->cfg->n_layers; l++) {
            free(w->layers[l].exp_gate);
            free(w->layers[l].exp_up);
            free(w->layers[l].exp_down);
        }
    free(w->layers);
    memset(w, 0, sizeof *w);
}

// ------------------------------------------------------------------------------------------
// the synthetic source

static int synth_lookup(void *ctx, k25_tensor *t, char *err) {
    (void)err;
    t->kind = K25_SRC_SYNTH;
    t->file_data = NULL;
    t->synth_seed = (uint64_t)(uintptr_t)ctx;
    t->synth_id = k25_synth_id(t->name);
    return 0;
}

k25_tensor_source synth_source(uint64_t seed) {
    _Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "the seed travels in the ctx pointer");
    k25_tensor_source s = {(void *)(uintptr_t)seed, synth_lookup};
    return s;
}

// ------------------------------------------------------------------------------------------
// element access

// Stored bits of local element (r, c): bf16 in the low 16 bits, or a 32-bit word.
static uint32_t tensor_bits(const k25_tensor *t, int64_t r, int64_t c) {
    int64_t idx = (t->row0 + r) * t->g_cols + t->col0 + c;
    if (t->kind == K25_SRC_SYNTH)
        return k25_synth_bits(t->synth_kind, t->synth_exp, t->synth_seed, t->synth_id,
                              (uint64_t)idx);
    K25_CHECK(t->kind == K25_SRC_FILE && t->file_data, "%s: tensor has no source", t->name);
    if (t->dtype == K25_BF16) {
        uint16_t h;
        memcpy(&h, t->file_data + 2 * idx, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, t->file_data + 4 * idx, 4);
    return u;
}

void tensor_read_rows(const k25_tensor *t, int64_t r0, int64_t nr, void *dst) {
    K25_CHECK(r0 >= 0 && nr >= 0 && r0 + nr <= t->rows, "%s: rows [%lld, +%lld) of %lld",
              t->name, (long long)r0, (long long)nr, (long long)t->rows);
    const size_t es = k25_dtype_size(t->dtype);
    const size_t row_bytes = (size_t)t->cols * es;
    uint8_t *out = dst;
    if (t->kind == K25_SRC_FILE) {
        K25_CHECK(t->file_data, "%s: FILE tensor without data", t->name);
        for (int64_t r = 0; r < nr; r++) {
            size_t src = ((size_t)(t->row0 + r0 + r) * (size_t)t->g_cols + (size_t)t->col0) * es;
            memcpy(out + (size_t)r * row_bytes, t->file_data + src, row_bytes);
        }
        return;
    }
    K25_CHECK(t->kind == K25_SRC_SYNTH, "%s: tensor has no source", t->name);
    const int big = nr * t->cols > (1 << 16);
#pragma omp parallel for schedule(static) if (big)
    for (int64_t r = 0; r < nr; r++) {
        uint64_t base = (uint64_t)(t->row0 + r0 + r) * (uint64_t)t->g_cols + (uint64_t)t->col0;
        uint8_t *row = out + (size_t)r * row_bytes;
        if (es == 2) {
            uint16_t *d = (uint16_t *)row;
            for (int64_t c = 0; c < t->cols; c++)
                d[c] = (uint16_t)k25_synth_bits(t->synth_kind, t->synth_exp, t->synth_seed,
                                                t->synth_id, base + (uint64_t)c);
        } else {
            uint32_t *d = (uint32_t *)row;
            for (int64_t c = 0; c < t->cols; c++)
                d[c] = k25_synth_bits(t->synth_kind, t->synth_exp, t->synth_seed, t->synth_id,
                                      base + (uint64_t)c);
        }
    }
}

float tensor_get_f32(const k25_tensor *t, int64_t r, int64_t c) {
    uint32_t u = tensor_bits(t, r, c);
    switch (t->dtype) {
    case K25_BF16: return k25_bf16_to_f32((uint16_t)u);
    case K25_I32: return (float)(int32_t)u;
    default: {
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

float expert_w_get(const k25_expert_w *e, int64_t o, int64_t i) {
    if (e->scale.kind == K25_SRC_NONE) return tensor_get_f32(&e->w, o, i);
    const int64_t group = e->in / e->scale.cols;
    uint32_t word = tensor_bits(&e->w, o, i / 8);
    float s = k25_bf16_to_f32((uint16_t)tensor_bits(&e->scale, o, i / group));
    return (float)int4_unpack(word, (int)(i & 7)) * s;
}

size_t weights_bytes(const k25_weights *w) {
    size_t b = 0;
#define ADD(t) b += ((t).kind != K25_SRC_NONE ? tensor_bytes(&(t)) : 0)
    ADD(w->embed);
    ADD(w->final_norm);
    ADD(w->lm_head);
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        const k25_layer *L = &w->layers[l];
        ADD(L->attn_norm); ADD(L->q_a); ADD(L->q_a_norm); ADD(L->q_b); ADD(L->kv_a);
        ADD(L->kv_a_norm); ADD(L->kv_b); ADD(L->o_proj); ADD(L->ffn_norm);
        ADD(L->ffn_gate); ADD(L->ffn_up); ADD(L->ffn_down); ADD(L->router); ADD(L->router_bias);
        if (L->is_moe && L->exp_gate)
            for (int e = 0; e < w->cfg->n_experts; e++) {
                ADD(L->exp_gate[e].w); ADD(L->exp_gate[e].scale);
                ADD(L->exp_up[e].w); ADD(L->exp_up[e].scale);
                ADD(L->exp_down[e].w); ADD(L->exp_down[e].scale);
            }
    }
#undef ADD
    return b;
}
