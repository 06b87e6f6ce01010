// A synthetic EAGLE-3 MLA draft checkpoint for a target configuration: config.json in the
// layout of the published Kimi-K2.5 heads (Eagle3DeepseekV2ForCausalLM) and one
// model.safetensors with the tensor names SpecForge exports (fc.weight, layers.0.*,
// norm.weight, lm_head.weight, optional embed_tokens.weight, d2t / t2d for a reduced draft
// vocabulary). Values come from the synthetic generator (synth.h) keyed by the seed and the
// tensor name, with the fan-in scaling the target's synthetic weights use.
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "safetensors.h"
#include "spec.h"
#include "synth.h"

typedef struct sentry {
    char name[96];
    st_dtype dtype;
    int ndim;
    int64_t shape[2];
    int kind;              // K25_SYNTH_*, or -1: raw bytes
    int exp;
    const void *raw;
    uint64_t bytes, begin;
} sentry;

static int exp_for(int64_t fan_in) {
    long e = lround(-log2(73.6 * sqrt((double)fan_in)));
    return e < -126 ? -126 : (int)e;
}

static sentry *add(sentry *es, int *n, const char *name, int64_t rows, int64_t cols, int kind,
                   int exp) {
    sentry *e = &es[(*n)++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = ST_BF16;
    e->ndim = rows > 0 ? 2 : 1;
    e->shape[0] = rows > 0 ? rows : cols;
    e->shape[1] = cols;
    e->kind = kind;
    e->exp = exp;
    e->bytes = (uint64_t)(rows > 0 ? rows : 1) * (uint64_t)cols * 2;
    return e;
}

static void add_matrix(sentry *es, int *n, const char *name, int64_t rows, int64_t cols) {
    add(es, n, name, rows, cols, K25_SYNTH_UNIFORM, exp_for(cols));
}
static void add_norm(sentry *es, int *n, const char *name, int64_t dim) {
    add(es, n, name, 0, dim, K25_SYNTH_NORM, 0);
}

static int write_file(const char *path, sentry *es, int n, uint64_t seed, char *err) {
    uint64_t off = 0;
    st_out_tensor ts[32];
    K25_CHECK(n <= 32, "%d tensors", n);
    for (int i = 0; i < n; i++) {
        es[i].begin = off;
        off += es[i].bytes;
        ts[i] = (st_out_tensor){.name = es[i].name, .dtype = es[i].dtype, .ndim = es[i].ndim,
                                .shape = es[i].shape, .begin = es[i].begin, .end = off};
    }
    FILE *f = st_write_header(path, ts, n, err);
    if (!f) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const sentry *e = &es[i];
        if (e->kind < 0) {
            rc = st_write_all(f, e->raw, e->bytes, path, err);
            continue;
        }
        // The generator's values of a whole global tensor, a row at a time.
        k25_tensor t = {0};
        snprintf(t.name, sizeof t.name, "%.95s", e->name);
        t.dtype = K25_BF16;
        t.g_rows = t.rows = e->ndim == 2 ? e->shape[0] : 1;
        t.g_cols = t.cols = e->ndim == 2 ? e->shape[1] : e->shape[0];
        t.kind = K25_SRC_SYNTH;
        t.synth_seed = seed;
        t.synth_id = k25_synth_id(e->name);
        t.synth_kind = e->kind;
        t.synth_exp = e->exp;
        uint16_t *row = k25_malloc(sizeof(uint16_t) * (size_t)t.cols);
        for (int64_t r = 0; r < t.rows && !rc; r++) {
            tensor_read_rows(&t, r, 1, row);
            rc = st_write_all(f, row, sizeof(uint16_t) * (size_t)t.cols, path, err);
        }
        free(row);
    }
    if (fclose(f) != 0 && !rc) rc = k25_err(err, "%s: write error", path);
    return rc ? -1 : 0;
}

static void add_float(cJSON *o, const char *key, float v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    cJSON_AddRawToObject(o, key, buf);
}

static cJSON *config_json(const k25_config *t, const k25_eagle3_synth *o, int D, int inter) {
    cJSON *c = cJSON_CreateObject();
    const char *arch[] = {"Eagle3DeepseekV2ForCausalLM"};
    cJSON_AddItemToObject(c, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(c, "model_type", "kimi_k2");
    cJSON_AddNumberToObject(c, "hidden_size", D);
    cJSON_AddNumberToObject(c, "target_hidden_size", t->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", 1);
    cJSON_AddNumberToObject(c, "num_attention_heads", t->n_heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", t->n_heads);
    cJSON_AddNumberToObject(c, "q_lora_rank", t->q_lora_rank);
    cJSON_AddNumberToObject(c, "kv_lora_rank", t->kv_lora_rank);
    cJSON_AddNumberToObject(c, "qk_nope_head_dim", t->qk_nope_dim);
    cJSON_AddNumberToObject(c, "qk_rope_head_dim", t->qk_rope_dim);
    cJSON_AddNumberToObject(c, "v_head_dim", t->v_head_dim);
    add_float(c, "rms_norm_eps", t->norm_eps);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "vocab_size", t->vocab);
    if (o->draft_vocab > 0) cJSON_AddNumberToObject(c, "draft_vocab_size", o->draft_vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", t->max_pos);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", 0);
    if (o->norm_before_residual) cJSON_AddBoolToObject(c, "norm_before_residual", 1);
    add_float(c, "rope_theta", t->rope_theta);
    if (!strcmp(t->rope_type, "yarn")) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "type", "yarn");
        add_float(rs, "factor", t->yarn_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", t->yarn_orig_max_pos);
        add_float(rs, "beta_fast", t->yarn_beta_fast);
        add_float(rs, "beta_slow", t->yarn_beta_slow);
        add_float(rs, "mscale", t->yarn_mscale);
        add_float(rs, "mscale_all_dim", t->yarn_mscale_all_dim);
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    if (o->n_aux > 0) {
        cJSON *ec = cJSON_AddObjectToObject(c, "eagle_config");
        cJSON_AddItemToObject(ec, "eagle_aux_hidden_state_layer_ids",
                              cJSON_CreateIntArray(o->aux_ids, o->n_aux));
    }
    return c;
}

int spec_eagle3_write_synthetic(const char *dir, const k25_config *t, const k25_eagle3_synth *o,
                                char *err) {
    if (o->draft_vocab < 0 || o->draft_vocab > t->vocab)
        return k25_err(err, "draft vocabulary %d outside 0..%d", o->draft_vocab, t->vocab);
    if (o->no_lm_head && o->draft_vocab > 0)
        return k25_err(err, "a reduced draft vocabulary needs the draft's own lm_head");
    if (o->n_aux < 0 || o->n_aux > 3) return k25_err(err, "%d aux layers (0..3)", o->n_aux);
    for (int i = 0; i < o->n_aux; i++)
        if (o->aux_ids[i] < -1 || o->aux_ids[i] >= t->n_layers)
            return k25_err(err, "aux layer id %d outside the target's %d layers", o->aux_ids[i],
                           t->n_layers);
    if (checkpoint_dir_fresh(dir, err)) return -1;

    int64_t D = o->hidden > 0 ? o->hidden : t->hidden, Dt = t->hidden;
    int64_t H = t->n_heads, ql = t->q_lora_rank;
    int64_t dq = t->qk_nope_dim + t->qk_rope_dim, nv = t->qk_nope_dim + t->v_head_dim;
    int64_t kvw = t->kv_lora_rank + t->qk_rope_dim;
    int inter = o->intermediate > 0 ? o->intermediate : t->dense_inter;
    int n_aux = o->n_aux > 0 ? o->n_aux : 3;
    int Vd = o->draft_vocab > 0 ? o->draft_vocab : t->vocab;

    // Reduced vocabulary: draft id i stands for target id floor(i * V / Vd) (spread over the
    // vocabulary); d2t holds the offsets, t2d marks the target ids that have a draft id.
    int64_t *d2t = NULL;
    uint8_t *t2d = NULL;
    sentry es[32];
    int n = 0;
    if (o->draft_vocab > 0) {
        d2t = k25_malloc(sizeof(int64_t) * (size_t)Vd);
        t2d = k25_calloc((size_t)t->vocab, 1);
        for (int i = 0; i < Vd; i++) {
            int64_t tid = (int64_t)i * t->vocab / Vd;
            d2t[i] = tid - i;
            t2d[tid] = 1;
        }
        sentry *e = add(es, &n, "d2t", 0, Vd, -1, 0); // first: 8-byte aligned
        e->dtype = ST_I64;
        e->bytes = sizeof(int64_t) * (uint64_t)Vd;
        e->raw = d2t;
    }
    add_matrix(es, &n, "fc.weight", D, n_aux * Dt);
    add_norm(es, &n, "layers.0.hidden_norm.weight", D);
    add_norm(es, &n, "layers.0.input_layernorm.weight", D);
    add_norm(es, &n, "layers.0.post_attention_layernorm.weight", D);
    add_matrix(es, &n, "layers.0.self_attn.q_a_proj.weight", ql, 2 * D);
    add_norm(es, &n, "layers.0.self_attn.q_a_layernorm.weight", ql);
    add_matrix(es, &n, "layers.0.self_attn.q_b_proj.weight", H * dq, ql);
    add_matrix(es, &n, "layers.0.self_attn.kv_a_proj_with_mqa.weight", kvw, 2 * D);
    add_norm(es, &n, "layers.0.self_attn.kv_a_layernorm.weight", t->kv_lora_rank);
    add_matrix(es, &n, "layers.0.self_attn.kv_b_proj.weight", H * nv, t->kv_lora_rank);
    add_matrix(es, &n, "layers.0.self_attn.o_proj.weight", D, H * t->v_head_dim);
    add_matrix(es, &n, "layers.0.mlp.gate_proj.weight", inter, D);
    add_matrix(es, &n, "layers.0.mlp.up_proj.weight", inter, D);
    add_matrix(es, &n, "layers.0.mlp.down_proj.weight", D, inter);
    if (!o->no_norm) add_norm(es, &n, "norm.weight", D);
    if (!o->no_lm_head) add_matrix(es, &n, "lm_head.weight", Vd, D);
    if (o->own_embed) add(es, &n, "embed_tokens.weight", t->vocab, D, K25_SYNTH_UNIFORM, -6);
    if (t2d) {
        sentry *e = add(es, &n, "t2d", 0, t->vocab, -1, 0);
        e->dtype = ST_BOOL;
        e->bytes = (uint64_t)t->vocab;
        e->raw = t2d;
    }

    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = write_file(path, es, n, o->seed, err);
    free(d2t);
    free(t2d);
    if (rc) return -1;

    cJSON *c = config_json(t, o, (int)D, inter);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        cJSON_free(text);
        return k25_err(err, "%s: cannot create: %s", path, strerror(errno));
    }
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    cJSON_free(text);
    return bad ? k25_err(err, "%s: write error", path) : 0;
}
