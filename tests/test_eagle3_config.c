// An EAGLE-3 head's config.json (src/spec_eagle3_config.c) against the tiny target and the
// real one: the fields of accepted files (aux layers as sglang captures them: the explicit ids
// + 1, else [2, L/2, L-3], ascending), and for every key of the wrong type or out of range a
// message that names the file and the key. The base file is what k25-mkeagle writes for
// config/tiny.ini; each case replaces one key.
#include <string.h>

#include <cjson/cJSON.h>

#include "spec_eagle3_config.h"
#include "test_util.h"

static const char *PATH = "draft/config.json";

static const char *BASE =
    "{\"architectures\": [\"Eagle3DeepseekV2ForCausalLM\"], \"model_type\": \"kimi_k2\","
    " \"hidden_size\": 128, \"target_hidden_size\": 128, \"intermediate_size\": 256,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 8, \"num_key_value_heads\": 8,"
    " \"q_lora_rank\": 64, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16,"
    " \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"rms_norm_eps\": 1e-05,"
    " \"hidden_act\": \"silu\", \"vocab_size\": 512, \"max_position_embeddings\": 4096,"
    " \"tie_word_embeddings\": false, \"rope_theta\": 50000,"
    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4,"
    " \"original_max_position_embeddings\": 256, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"mscale\": 1, \"mscale_all_dim\": 1},"
    " \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [2, 0, 1]}}";

// BASE with key ("a" or "a.b"; NULL: none) set to the JSON value text (NULL: removed).
static char *with(const char *key, const char *value) {
    cJSON *root = cJSON_Parse(BASE);
    if (key) {
        cJSON *o = root;
        char k[128];
        snprintf(k, sizeof k, "%s", key);
        char *dot = strchr(k, '.');
        if (dot) {
            *dot = 0;
            o = cJSON_GetObjectItemCaseSensitive(root, k);
            memmove(k, dot + 1, strlen(dot + 1) + 1);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(o, k);
        if (value) {
            cJSON *v = cJSON_Parse(value);
            if (!v) K25_DIE("test: bad JSON value %s", value);
            cJSON_AddItemToObject(o, k, v);
        }
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static k25_config tiny, kimi;

static int parse(eagle3_config *ec, const char *json, const k25_config *t, int tp, char *err) {
    eagle3_fit fit = {t, t->ctx_size, t->kv_block, tp};
    err[0] = 0;
    return eagle3_config_parse(ec, json, strlen(json), PATH, &fit, err);
}

// key = value (tp ranks) must be rejected with a message naming the file and holding want.
static void reject(const char *key, const char *value, int tp, const char *want) {
    char *json = with(key, value), err[K25_ERR_LEN];
    eagle3_config ec;
    if (!parse(&ec, json, &tiny, tp, err))
        EXPECT(0, "%s = %s was accepted", key, value ? value : "(removed)");
    else
        EXPECT(!strncmp(err, PATH, strlen(PATH)) && strstr(err, want),
               "%s = %s: message '%s', expected the file and '%s'", key, value, err, want);
    cJSON_free(json);
}

static void reject_text(const char *json, const char *want) {
    char err[K25_ERR_LEN];
    eagle3_config ec;
    int rc = parse(&ec, json, &tiny, 1, err);
    EXPECT(rc && !strncmp(err, PATH, strlen(PATH)) && strstr(err, want),
           "'%s': rc %d, message '%s', expected the file and '%s'", json, rc, err, want);
}

static eagle3_config accept(const char *key, const char *value, const k25_config *t) {
    char *json = with(key, value), err[K25_ERR_LEN];
    eagle3_config ec;
    if (parse(&ec, json, t, 1, err)) EXPECT(0, "%s = %s rejected: %s", key, value, err);
    cJSON_free(json);
    return ec;
}

static void expect_aux(const eagle3_config *ec, int n, int a0, int a1, int a2, const char *what) {
    int want[3] = {a0, a1, a2}, same = ec->n_aux == n;
    for (int i = 0; i < n && same; i++) same = ec->aux_ids[i] == want[i];
    EXPECT(same, "%s: %d aux layers %d,%d,%d; expected %d: %d,%d,%d", what, ec->n_aux,
           ec->aux_ids[0], ec->aux_ids[1], ec->aux_ids[2], n, a0, a1, a2);
}

static void test_accepted(void) {
    eagle3_config ec = accept(NULL, NULL, &tiny);
    expect_aux(&ec, 3, 1, 2, 3, "ids [2, 0, 1]");
    CHECK(ec.Dt == 128 && ec.Vd == 512 && !ec.norm_before_residual, "Dt %d Vd %d nbr %d", ec.Dt,
          ec.Vd, ec.norm_before_residual);
    const k25_config *c = &ec.cfg;
    CHECK(c->n_layers == 2 && c->first_dense == 2 && !c->experts_int4, "layers %d/%d int4 %d",
          c->n_layers, c->first_dense, c->experts_int4);
    CHECK(c->hidden == 128 && c->n_heads == 8 && c->dense_inter == 256 && c->q_lora_rank == 64,
          "dims %d %d %d %d", c->hidden, c->n_heads, c->dense_inter, c->q_lora_rank);
    CHECK(c->ctx_size == tiny.ctx_size, "ctx %d", c->ctx_size);
    CHECK(c->latent_norm_eps == c->norm_eps, "latent eps %g", (double)c->latent_norm_eps);

    ec = accept("eagle_config", NULL, &tiny);
    expect_aux(&ec, 3, 1, 2, 2, "default ids, 4 layers");
    ec = accept("eagle_config", "{}", &tiny);
    expect_aux(&ec, 3, 1, 2, 2, "empty eagle_config");
    ec = accept("eagle_config.eagle_aux_hidden_state_layer_ids", "[-1]", &tiny);
    expect_aux(&ec, 1, 0, 0, 0, "ids [-1] (the embeddings)");
    ec = accept("eagle_config.eagle_aux_hidden_state_layer_ids", "[3, 3.0]", &tiny);
    expect_aux(&ec, 2, 4, 4, 0, "ids [3, 3.0] (the last layer's output)");
    ec = accept("draft_vocab_size", "256", &tiny);
    CHECK(ec.Vd == 256, "Vd %d", ec.Vd);
    ec = accept("norm_before_residual", "true", &tiny);
    CHECK(ec.norm_before_residual == 1, "norm_before_residual %d", ec.norm_before_residual);
    accept("architectures", NULL, &tiny);
    accept("architectures", "[\"Eagle3DeepseekV3ForCausalLM\"]", &tiny);
    accept("fc_norm", "null", &tiny);
    accept("fc_norm", "false", &tiny);
    accept("target_hidden_size", NULL, &tiny);
    accept("max_position_embeddings", "512", &tiny); // the target's context: drafts stay inside

    // The real target's 61 layers: sglang's default [2, 30, 58].
    char *json = with("eagle_config", NULL), err[K25_ERR_LEN];
    cJSON *root = cJSON_Parse(json);
    cJSON_free(json);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "target_hidden_size", cJSON_CreateNumber(7168));
    cJSON_ReplaceItemInObjectCaseSensitive(root, "vocab_size", cJSON_CreateNumber(163840));
    cJSON_DeleteItemFromObjectCaseSensitive(root, "max_position_embeddings"); // the target's
    json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (parse(&ec, json, &kimi, 8, err)) EXPECT(0, "head for the real target rejected: %s", err);
    else expect_aux(&ec, 3, 2, 30, 58, "default ids, 61 layers");
    CHECK(ec.Dt == 7168 && ec.cfg.hidden == 128, "Dt %d hidden %d", ec.Dt, ec.cfg.hidden);
    cJSON_free(json);
}

static void test_rejected(void) {
    reject_text("{\"hidden_size\": ", "invalid JSON");
    reject_text("[1]", "expected a JSON object");
    reject("architectures", "[\"LlamaForCausalLMEagle3\"]", 1, "Llama EAGLE-3 head");
    reject("architectures", "[\"DeepseekV3ForCausalLM\"]", 1, "is not an EAGLE-3 MLA head");
    reject("architectures", "\"Eagle3DeepseekV2ForCausalLM\"", 1, "key 'architectures'");
    reject("architectures", "[]", 1, "key 'architectures'");
    reject("num_hidden_layers", "2", 1, "num_hidden_layers 2: only one-layer");
    reject("num_hidden_layers", "1.5", 1, "key 'num_hidden_layers': expected an integer");
    reject("num_hidden_layers", "1e10", 1, "key 'num_hidden_layers': expected an integer");
    reject("fc_norm", "true", 1, "fc_norm = true (EAGLE 3.1 variant)");
    reject("norm_output", "true", 1, "norm_output = true (EAGLE 3.1 variant)");
    reject("fc_norm", "\"true\"", 1, "key 'fc_norm': expected true or false");
    reject("norm_before_residual", "1", 1, "key 'norm_before_residual': expected true or false");
    reject("target_hidden_size", "64", 1, "target_hidden_size 64, the target's hidden size is 128");
    reject("target_hidden_size", "\"128\"", 1, "key 'target_hidden_size': expected an integer");
    reject("target_hidden_size", "1e300", 1, "key 'target_hidden_size': expected an integer");
    reject("vocab_size", "511", 1, "vocab_size 511, the target has 512");
    reject("vocab_size", "[512]", 1, "key 'vocab_size': expected an integer");
    const char *ids = "eagle_config.eagle_aux_hidden_state_layer_ids";
    reject("eagle_config", "[2, 0, 1]", 1, "key 'eagle_config': expected an object");
    reject(ids, "[]", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "[0, 1, 2, 3]", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "2", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "[0, \"1\"]", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "[0.5]", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "[1e300]", 1, "key 'eagle_config.eagle_aux_hidden_state_layer_ids'");
    reject(ids, "[4]", 1, "aux hidden state layer id 4 outside the target's 4 layers");
    reject(ids, "[-2]", 1, "aux hidden state layer id -2 outside the target's 4 layers");
    reject(ids, "[2147483647]", 1, "aux hidden state layer id 2147483647 outside");
    reject("draft_vocab_size", "0", 1, "draft_vocab_size 0 outside 1..512");
    reject("draft_vocab_size", "513", 1, "draft_vocab_size 513 outside 1..512");
    reject("draft_vocab_size", "-1e300", 1, "key 'draft_vocab_size': expected an integer");
    reject("draft_vocab_size", "255", 2, "must divide over 2 tensor-parallel ranks");
    reject("num_attention_heads", "6", 4, "must divide over 4 tensor-parallel ranks");
    reject("hidden_size", "1.5", 1, "key 'hidden_size': expected an integer");
    reject("kv_lora_rank", "-32", 1, "kv_lora_rank");
    reject("max_position_embeddings", "511", 1, "the context 512 exceeds max_position_embeddings 511");
}

int main(void) {
    char err[K25_ERR_LEN];
    config_init_defaults(&tiny);
    config_init_defaults(&kimi);
    if (config_load_ini(&tiny, "config/tiny.ini", err) ||
        config_load_ini(&kimi, "config/kimi_k25.ini", err))
        K25_DIE("%s", err);
    test_accepted();
    test_rejected();
    if (test_failures) {
        fprintf(stderr, "test_eagle3_config: %d check(s) failed\n", test_failures);
        return 1;
    }
    printf("test_eagle3_config: ok\n");
    return 0;
}
