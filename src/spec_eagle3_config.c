// An EAGLE-3 head's config.json. The layer's dimensions go through the DeepSeek-V3 config.json
// reader, so its types, RoPE and checks are the target's; what only EAGLE-3 has (the target
// layers feeding fc, the draft vocabulary, the variant) is read here, as strictly: a key of
// the wrong type or out of range is an error naming it, never a silent default.
#include "spec_eagle3_config.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "json_object.h"

static int type_err(const char *path, const char *key, const char *want, char *err) {
    return k25_err(err, "%s: key '%s': expected %s", path, key, want);
}

// o's key when present and not null.
static const cJSON *present(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int is_int(const cJSON *v) {
    double d = cJSON_GetNumberValue(v);
    return cJSON_IsNumber(v) && d == floor(d) && d >= INT_MIN && d <= INT_MAX;
}

// An optional integer: *out keeps its value when the key is absent.
static int opt_int(const cJSON *o, const char *key, int *out, const char *path, char *err) {
    const cJSON *v = present(o, key);
    if (!v) return 0;
    if (!is_int(v)) return type_err(path, key, "an integer", err);
    *out = (int)cJSON_GetNumberValue(v);
    return 0;
}

static int opt_bool(const cJSON *o, const char *key, int *out, const char *path, char *err) {
    const cJSON *v = present(o, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return type_err(path, key, "true or false", err);
    *out = cJSON_IsTrue(v);
    return 0;
}

static void set_num(cJSON *o, const char *key, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddNumberToObject(o, key, v);
}

// Only one-layer MLA heads: a Llama head's multi-head attention has no backend operation, and
// EAGLE 3.1's extra norms are not implemented.
static int check_variant(const cJSON *root, const char *path, char *err) {
    const cJSON *arch = present(root, "architectures");
    const char *an = "";
    if (arch) {
        const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
        if (!cJSON_IsString(a0))
            return type_err(path, "architectures", "a list of architecture names", err);
        an = a0->valuestring;
    }
    if (strstr(an, "Llama"))
        return k25_err(err, "%s: architecture %s (Llama EAGLE-3 head): not supported, its "
                            "standard multi-head attention has no backend operation; use an MLA "
                            "head (Eagle3DeepseekV2ForCausalLM)", path, an);
    if (*an && strcmp(an, "Eagle3DeepseekV2ForCausalLM") &&
        strcmp(an, "Eagle3DeepseekV3ForCausalLM"))
        return k25_err(err, "%s: architecture %s is not an EAGLE-3 MLA head "
                            "(Eagle3DeepseekV2ForCausalLM)", path, an);
    int layers = 1;
    if (opt_int(root, "num_hidden_layers", &layers, path, err)) return -1;
    if (layers != 1)
        return k25_err(err, "%s: num_hidden_layers %d: only one-layer EAGLE-3 heads are "
                            "supported", path, layers);
    const char *v31[] = {"fc_norm", "norm_output"};
    for (int i = 0; i < 2; i++) {
        int on = 0;
        if (opt_bool(root, v31[i], &on, path, err)) return -1;
        if (on)
            return k25_err(err, "%s: %s = true (EAGLE 3.1 variant) is not supported", path,
                           v31[i]);
    }
    return 0;
}

// The target layers whose input hidden states feed fc: the explicit ids + 1 (the state
// entering the next layer), else sglang's default [2, L/2, L-3]; ascending, the order the
// target produces them.
static int read_aux(const cJSON *root, const k25_config *t, eagle3_config *out, const char *path,
                    char *err) {
    const char *key = "eagle_config.eagle_aux_hidden_state_layer_ids";
    const cJSON *ec = present(root, "eagle_config");
    if (ec && !cJSON_IsObject(ec)) return type_err(path, "eagle_config", "an object", err);
    const cJSON *ids = ec ? present(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
    int *a = out->aux_ids, L = t->n_layers;
    if (!ids) {
        out->n_aux = 3;
        a[0] = 2 < L ? 2 : L;
        a[1] = L / 2;
        a[2] = L - 3 > 0 ? L - 3 : 0;
    } else {
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        if (n < 1 || n > EAGLE3_MAX_AUX)
            return type_err(path, key, "a list of 1..3 layer ids", err);
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(ids, i);
            if (!is_int(v)) return type_err(path, key, "a list of 1..3 layer ids", err);
            int id = (int)cJSON_GetNumberValue(v);
            if (id < -1 || id >= L)
                return k25_err(err, "%s: aux hidden state layer id %d outside the target's %d "
                                    "layers", path, id, L);
            a[i] = id + 1;
        }
        out->n_aux = n;
    }
    for (int i = 1; i < out->n_aux; i++)
        for (int j = i; j > 0 && a[j] < a[j - 1]; j--) {
            int x = a[j];
            a[j] = a[j - 1];
            a[j - 1] = x;
        }
    return 0;
}

// The layer's dimensions through the DeepSeek-V3 reader, which wants the MoE keys a dense
// one-layer head does not have: the target's stand in.
static int read_layer(const cJSON *root, const k25_config *t, k25_config *c, const char *path,
                      char *err) {
    cJSON *j = cJSON_Duplicate(root, 1);
    const char *drop[] = {"architectures", "model_type", "quantization_config", "text_config",
                          "auto_map"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(j, drop[i]);
    set_num(j, "first_k_dense_replace", 1);
    set_num(j, "moe_intermediate_size", t->moe_inter);
    set_num(j, "n_routed_experts", t->n_experts);
    set_num(j, "n_shared_experts", t->n_shared);
    set_num(j, "num_experts_per_tok", t->top_k);
    set_num(j, "n_group", t->n_group);
    set_num(j, "topk_group", t->topk_group);
    set_num(j, "routed_scaling_factor", t->routed_scale);
    set_num(j, "vocab_size", t->vocab);
    if (!present(j, "max_position_embeddings")) set_num(j, "max_position_embeddings", t->max_pos);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    *c = *t;
    int rc = config_load_hf_json_string(c, txt, strlen(txt), path, err);
    cJSON_free(txt);
    return rc;
}

static int parse_root(eagle3_config *out, const cJSON *root, const char *path,
                      const eagle3_fit *fit, char *err) {
    const k25_config *t = fit->target;
    if (check_variant(root, path, err)) return -1;
    out->Dt = t->hidden;
    out->norm_before_residual = 0;
    if (opt_int(root, "target_hidden_size", &out->Dt, path, err) ||
        opt_bool(root, "norm_before_residual", &out->norm_before_residual, path, err))
        return -1;
    if (out->Dt != t->hidden)
        return k25_err(err, "%s: target_hidden_size %d, the target's hidden size is %d", path,
                       out->Dt, t->hidden);
    int vocab = t->vocab;
    if (opt_int(root, "vocab_size", &vocab, path, err)) return -1;
    if (vocab != t->vocab)
        return k25_err(err, "%s: vocab_size %d, the target has %d", path, vocab, t->vocab);
    if (read_aux(root, t, out, path, err)) return -1;
    out->Vd = t->vocab;
    if (opt_int(root, "draft_vocab_size", &out->Vd, path, err)) return -1;
    if (out->Vd < 1 || out->Vd > t->vocab)
        return k25_err(err, "%s: draft_vocab_size %d outside 1..%d", path, out->Vd, t->vocab);
    return read_layer(root, t, &out->cfg, path, err);
}

int eagle3_config_parse(eagle3_config *out, const char *json, size_t len, const char *path,
                        const eagle3_fit *fit, char *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = json_parse_object(json, len, path, err);
    if (!root) return -1;
    int rc = parse_root(out, root, path, fit, err);
    cJSON_Delete(root);
    if (rc) return -1;

    k25_config *c = &out->cfg;
    c->n_layers = 2;
    c->first_dense = 2;
    c->experts_int4 = 0;
    // sglang and vLLM build the draft's q_a / kv_a norms with rms_norm_eps.
    c->latent_norm_eps = c->norm_eps;
    c->ctx_size = fit->ctx_size;
    c->kv_block = fit->kv_block;
    c->tp = fit->tp;
    c->pp = 1;
    if (c->ctx_size > c->max_pos)
        return k25_err(err, "%s: the context %d exceeds max_position_embeddings %d", path,
                       c->ctx_size, c->max_pos);
    char why[K25_ERR_LEN];
    if (config_validate(c, why)) return k25_err(err, "%s: %s", path, why);
    if (c->n_heads % fit->tp || c->dense_inter % fit->tp || out->Vd % fit->tp)
        return k25_err(err, "%s: %d heads, intermediate size %d and draft vocabulary %d must "
                            "divide over %d tensor-parallel ranks", path, c->n_heads,
                       c->dense_inter, out->Vd, fit->tp);
    return 0;
}

int eagle3_config_read(eagle3_config *out, const char *dir, const eagle3_fit *fit, char *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t n;
    char *text = k25_read_file(path, &n, err);
    if (!text) return -1;
    int rc = eagle3_config_parse(out, text, n, path, fit, err);
    free(text);
    return rc;
}
