// Configuration: built-in defaults against config/kimi_k25.ini and the model card values, the
// tiny test configs, dump round-trips, error messages for bad .ini / --set / config.json
// input, Hugging Face config.json mapping, tensor-parallel checks, and the derived softmax
// scale and YaRN frequencies against an independent double-precision computation.
#include "config.h"
#include "test_util.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

// Every listed substring must occur in msg.
static int has_all(const char *msg, const char *a, const char *b, const char *c) {
    return strstr(msg, a) && (!b || strstr(msg, b)) && (!c || strstr(msg, c));
}

// ------------------------------------------------------------------------------------------
// Field-by-field comparison generated from config.def (independent of config_dump)
// ------------------------------------------------------------------------------------------

// Returns the name of the first differing key in a section matching `only` (NULL = all
// sections, "!x" = all but section x), or NULL when equal.
static const char *first_diff(const k25_config *a, const k25_config *b, const char *only) {
#define SEL(section)                                                                               \
    (!only || (only[0] == '!' ? strcmp(only + 1, #section) : !strcmp(only, #section)))
#define K25_CFG_INT(f) a->f != b->f
#define K25_CFG_FLOAT(f) memcmp(&a->f, &b->f, sizeof(float))
#define K25_CFG_BOOL(f) a->f != b->f
#define K25_CFG_STR(f) strcmp(a->f, b->f)
#define K25_CFG_INTS(f) (a->f##_n != b->f##_n || memcmp(a->f, b->f, sizeof(int) * (size_t)a->f##_n))
#define K25_CFG(section, key, type, field, def)                                                    \
    if (SEL(section) && (K25_CFG_##type(field))) return #section "." #key;
#include "config.def"
#undef K25_CFG
#undef K25_CFG_INT
#undef K25_CFG_FLOAT
#undef K25_CFG_BOOL
#undef K25_CFG_STR
#undef K25_CFG_INTS
#undef SEL
    return NULL;
}

static int n_keys(void) {
    int n = 0;
#define K25_CFG(section, key, type, field, def) n++;
#include "config.def"
#undef K25_CFG
    return n;
}

static char *dump_to_string(const k25_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_dump(c, f);
    fclose(f);
    return buf;
}

static void load_or_die(k25_config *c, const char *path) {
    char err[K25_ERR_LEN];
    if (config_load_ini(c, path, err)) K25_DIE("%s", err);
}

// Writes text to a fresh temporary file; returns its path (static buffer per call slot).
static const char *temp_file(const char *text, int slot) {
    static char paths[8][64];
    char *p = paths[slot];
    snprintf(p, 64, "/tmp/k25_test_config_XXXXXX");
    int fd = mkstemp(p);
    K25_CHECK(fd >= 0, "mkstemp failed");
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

// ------------------------------------------------------------------------------------------
// Defaults and the shipped .ini files
// ------------------------------------------------------------------------------------------

static void test_defaults(void) {
    k25_config d, f;
    char err[K25_ERR_LEN];
    config_init_defaults(&d);
    // Model card values (KIMI_K25.md §1, §2.1).
    CHECK(d.hidden == 7168 && d.n_layers == 61 && d.first_dense == 1, "dims");
    CHECK(d.dense_inter == 18432 && d.moe_inter == 2048, "widths");
    CHECK(d.n_experts == 384 && d.n_shared == 1 && d.top_k == 8, "experts");
    CHECK(d.n_group == 1 && d.topk_group == 1 && d.routed_scale == 2.827f, "routing");
    CHECK(d.n_heads == 64 && d.q_lora_rank == 1536 && d.kv_lora_rank == 512, "mla");
    CHECK(d.qk_nope_dim == 128 && d.qk_rope_dim == 64 && d.v_head_dim == 128, "heads");
    CHECK(d.vocab == 163840 && d.max_pos == 262144 && d.norm_eps == 1e-5f, "vocab");
    CHECK(d.rope_theta == 50000.0f && !strcmp(d.rope_type, "yarn") && d.yarn_factor == 64.0f &&
              d.yarn_orig_max_pos == 4096 && d.yarn_beta_fast == 32.0f &&
              d.yarn_beta_slow == 1.0f && d.yarn_mscale == 1.0f && d.yarn_mscale_all_dim == 1.0f,
          "yarn");
    CHECK(d.experts_int4 == 1 && d.quant_group == 32, "quant");
    CHECK(d.bos_id == 163584 && d.pad_id == 163839 && d.eos_ids_n == 2 &&
              d.eos_ids[0] == 163585 && d.eos_ids[1] == 163586,
          "tokens");
    CHECK(config_validate(&d, err) == 0, "defaults invalid: %s", err);

    // kimi_k25.ini equals the defaults and sets every key itself: load it over tiny.ini, whose
    // model values all differ, and over a config with every run value changed.
    config_init_defaults(&f);
    load_or_die(&f, "config/tiny.ini");
    const char *run_poison[] = {"run.backend=cuda", "run.ctx_size=7",   "run.n_predict=9",
                                "run.temp=0.3",     "run.top_k=5",      "run.top_p=0.5",
                                "run.seed=11",      "run.threads=3",    "run.max_batch=3",
                                "run.kv_block_size=3", "run.prefill_chunk=3", "run.kv_cache_mb=3",
                                "run.tp=3",         "run.pp=3"};
    for (size_t i = 0; i < sizeof run_poison / sizeof run_poison[0]; i++)
        CHECK(config_set(&f, run_poison[i], err) == 0, "%s", err);
    CHECK(first_diff(&f, &d, "model") && first_diff(&f, &d, "run"), "poison did not change");
    load_or_die(&f, "config/kimi_k25.ini");
    const char *k = first_diff(&f, &d, NULL);
    CHECK(k == NULL, "config/kimi_k25.ini differs from the built-in defaults at %s", k);

    // Every key appears exactly once in kimi_k25.ini.
    FILE *fp = fopen("config/kimi_k25.ini", "r");
    CHECK(fp != NULL, "open kimi_k25.ini");
    if (fp) {
        char line[512];
        int n = 0;
        while (fgets(line, sizeof line, fp))
            if (line[0] != ';' && line[0] != '[' && strchr(line, '=')) n++;
        fclose(fp);
        CHECK(n == n_keys(), "kimi_k25.ini has %d keys, config.def %d", n, n_keys());
    }
}

static void test_tiny(void) {
    k25_config t, g;
    char err[K25_ERR_LEN];
    config_init_defaults(&t);
    load_or_die(&t, "config/tiny.ini");
    // Values from the agreed tiny format.
    CHECK(t.hidden == 128 && t.n_layers == 4 && t.first_dense == 1 && t.dense_inter == 256 &&
              t.moe_inter == 128 && t.n_experts == 16 && t.n_shared == 1 && t.top_k == 4 &&
              t.n_group == 1 && t.topk_group == 1 && t.routed_scale == 2.827f,
          "tiny model");
    CHECK(t.n_heads == 8 && t.q_lora_rank == 64 && t.kv_lora_rank == 32 && t.qk_nope_dim == 16 &&
              t.qk_rope_dim == 8 && t.v_head_dim == 16 && t.vocab == 512 && t.max_pos == 4096 &&
              t.norm_eps == 1e-5f && t.latent_norm_eps == 1e-6f,
          "tiny attention");
    CHECK(t.rope_theta == 50000.0f && t.yarn_factor == 4.0f && t.yarn_orig_max_pos == 256 &&
              t.yarn_beta_fast == 32.0f && t.yarn_beta_slow == 1.0f,
          "tiny rope");
    CHECK(t.experts_int4 == 1 && t.quant_group == 32, "tiny quant");
    CHECK(t.bos_id == 256 && t.eos_ids_n == 1 && t.eos_ids[0] == 257 && t.pad_id == 511,
          "tiny tokens");
    CHECK(t.ctx_size == 512, "tiny ctx");
    CHECK(config_validate(&t, err) == 0, "tiny invalid: %s", err);
    for (int tp = 1; tp <= 4; tp *= 2) CHECK(config_check_tp(&t, tp, err) == 0, "tiny tp=%d: %s", tp, err);

    config_init_defaults(&g);
    load_or_die(&g, "config/tiny_group.ini");
    CHECK(g.n_experts == 32 && g.n_group == 4 && g.topk_group == 2, "tiny_group routing");
    CHECK(config_validate(&g, err) == 0, "tiny_group invalid: %s", err);
    for (int tp = 1; tp <= 4; tp *= 2)
        CHECK(config_check_tp(&g, tp, err) == 0, "tiny_group tp=%d: %s", tp, err);
    // Apart from the routing keys the two tiny configs are the same.
    g.n_experts = t.n_experts, g.n_group = t.n_group, g.topk_group = t.topk_group;
    const char *k = first_diff(&g, &t, NULL);
    CHECK(k == NULL, "tiny_group differs from tiny at %s", k);

    CHECK(!config_is_moe_layer(&t, 0) && config_is_moe_layer(&t, 1) && config_is_moe_layer(&t, 3),
          "moe layers");
    CHECK(config_is_eos(&t, 257) && !config_is_eos(&t, 256), "tiny eos");
}

// ------------------------------------------------------------------------------------------
// Dump round trip
// ------------------------------------------------------------------------------------------

static void round_trip(const k25_config *c, const char *what) {
    char err[K25_ERR_LEN];
    char *text = dump_to_string(c);
    k25_config back;
    config_init_defaults(&back);
    load_or_die(&back, "config/tiny_group.ini");  // start from something else
    CHECK(config_load_ini_string(&back, text, what, err) == 0, "%s: %s", what, err);
    const char *k = first_diff(&back, c, NULL);
    CHECK(k == NULL, "%s: round trip differs at %s", what, k);
    char *again = dump_to_string(&back);
    CHECK(!strcmp(text, again), "%s: second dump differs", what);
    free(text);
    free(again);
}

static void test_dump(void) {
    k25_config c;
    char err[K25_ERR_LEN];
    config_init_defaults(&c);
    round_trip(&c, "defaults");
    load_or_die(&c, "config/tiny.ini");
    round_trip(&c, "tiny");
    // Awkward values: floats that need 9 digits, an empty list, a long list, negatives.
    const char *sets[] = {"run.temp=0.1",          "model.routed_scaling_factor=0.333333343",
                          "model.rms_norm_eps=1.17549435e-38", "rope.factor=3.14159274",
                          "tokens.eos_token_ids=",  "run.seed=-5",
                          "run.top_p=0.95",         "model.norm_topk_prob=false"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        CHECK(config_set(&c, sets[i], err) == 0, "%s", err);
    CHECK(c.eos_ids_n == 0, "empty list");
    round_trip(&c, "odd values");
    CHECK(config_set(&c, "tokens.eos_token_ids=1, 2,3,4,5,6,7,8", err) == 0, "%s", err);
    CHECK(c.eos_ids_n == 8 && c.eos_ids[7] == 8, "8 ids");
    round_trip(&c, "8 ids");
    CHECK(config_set(&c, "tokens.eos_token_ids=1,2,3,4,5,6,7,8,9", err) != 0, "9 ids accepted");
}

// ------------------------------------------------------------------------------------------
// Bad .ini and --set input
// ------------------------------------------------------------------------------------------

static void expect_ini_error(const char *text, const char *a, const char *b, const char *c) {
    k25_config cfg, before;
    char err[K25_ERR_LEN] = "";
    config_init_defaults(&cfg);
    before = cfg;
    const char *path = temp_file(text, 0);
    int rc = config_load_ini(&cfg, path, err);
    CHECK(rc != 0, "accepted: %s", text);
    CHECK(has_all(err, path, a, b) && (!c || strstr(err, c)), "message '%s' lacks %s/%s/%s", err,
          a, b ? b : "", c ? c : "");
    CHECK(first_diff(&cfg, &before, NULL) == NULL, "config changed by a failed load");
    unlink(path);
}

static void test_bad_ini(void) {
    expect_ini_error("[model]\nhidden_size = 128\nbogus_key = 3\n", ":3:", "bogus_key", "[model]");
    expect_ini_error("[model]\n\n[nosuch]\nx = 1\n", ":4:", "nosuch", "'x'");
    expect_ini_error("[model]\nhidden_size = 12x\n", ":2:", "model.hidden_size", "12x");
    expect_ini_error("[model]\nhidden_size = 99999999999\n", ":2:", "hidden_size", NULL);
    expect_ini_error("; c\n[rope]\nfactor = abc\n", ":3:", "rope.factor", "abc");
    expect_ini_error("[rope]\nfactor = nan\n", ":2:", "rope.factor", NULL);
    expect_ini_error("[quant]\nexperts_int4 = maybe\n", ":2:", "quant.experts_int4", "maybe");
    expect_ini_error("[tokens]\neos_token_ids = 1,x\n", ":2:", "tokens.eos_token_ids", NULL);
    expect_ini_error("hidden_size = 128\n", ":1:", "hidden_size", "section");
    expect_ini_error("[model]\nhidden_size 128\n", ":2:", "syntax", NULL);
    // The first error wins, whichever kind it is.
    expect_ini_error("[model]\nhidden_size 128\n\nbogus = 1\n", ":2:", "syntax", NULL);
    expect_ini_error("[model]\nbogus = 1\n\nhidden_size 128\n", ":2:", "bogus", NULL);
    expect_ini_error("[model]\nvocab_size = 1\nhidden_size = 1\nq_lora_rank = z\nbogus = 1\n",
                     ":4:", "q_lora_rank", NULL);
    // A line longer than inih's buffer is an error on that line, not a silent split.
    char longl[400];
    snprintf(longl, sizeof longl, "[run]\nbackend = %0300d\nseed = 1\n", 0);
    expect_ini_error(longl, ":2:", "longer", NULL);
    // inih reads an indented line after a key as another value of that key: the list became
    // [300], and an indented key was parsed as the previous key's value.
    expect_ini_error("[tokens]\neos_token_ids = 257\n   300\n", ":3:", "tokens.eos_token_ids",
                     "indented");
    expect_ini_error("[run]\n  seed = 5\n  n_predict = 7\n", ":3:", "run.seed", "indented");

    k25_config c;
    char err[K25_ERR_LEN];
    config_init_defaults(&c);
    CHECK(config_load_ini(&c, "/nonexistent/k25.ini", err) != 0, "missing file");
    CHECK(strstr(err, "/nonexistent/k25.ini") != NULL, "missing-file message: %s", err);
    // Embedded text names itself.
    CHECK(config_load_ini_string(&c, "[run]\n\nseed = x\n", "builtin.ini", err) != 0, "string");
    CHECK(has_all(err, "builtin.ini:3:", "run.seed", NULL), "string message: %s", err);
    // Comments, blank lines, inline comments and spacing are accepted.
    CHECK(config_load_ini_string(&c, "# top\n[run]\n  seed=17 ; inline\n\n;x\n", "ok.ini", err) ==
              0,
          "%s", err);
    CHECK(c.seed == 17, "seed");
    // Indented keys are keys where inih reads them so: first in a section, even after a
    // blank line or a comment; so is 'key: value'.
    CHECK(config_load_ini_string(&c, "[run]\n\t seed = 18\n[run]\n\n ; x\n  n_predict: 9\n",
                                 "indent.ini", err) == 0,
          "%s", err);
    CHECK(c.seed == 18 && c.n_predict == 9, "indented keys: seed %d n_predict %d", c.seed,
          c.n_predict);

    // --set
    CHECK(config_set(&c, "run.temp = 0.7", err) == 0 && c.temp == 0.7f, "--set temp: %s", err);
    CHECK(config_set(&c, "rope.type=none", err) == 0 && !strcmp(c.rope_type, "none"), "%s", err);
    CHECK(config_set(&c, "model.hidden_size=abc", err) != 0 &&
              has_all(err, "model.hidden_size", "abc", NULL),
          "--set bad int: %s", err);
    CHECK(config_set(&c, "nosuch.x=1", err) != 0 && strstr(err, "nosuch"), "%s", err);
    CHECK(config_set(&c, "model.nokey=1", err) != 0 && strstr(err, "nokey"), "%s", err);
    CHECK(config_set(&c, "hidden_size=1", err) != 0 && strstr(err, "section.key=value"), "%s",
          err);
    CHECK(config_set(&c, "run.seed", err) != 0, "no value");
    // A value longer than the buffer was cut, and the cut text could parse as another number.
    char longv[400];
    snprintf(longv, sizeof longv, "run.n_predict=%0330d5", 0);
    CHECK(config_set(&c, longv, err) != 0 && has_all(err, "run.n_predict", "longer", NULL),
          "--set long value: %s", err);
}

// ------------------------------------------------------------------------------------------
// Hugging Face config.json
// ------------------------------------------------------------------------------------------

// The Kimi-K2.5 text model as config.json writes it (KIMI_K25.md §1), without braces so
// tests can splice keys in.
#define K25_TEXT_KEYS                                                                              \
    "\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\","                 \
    "\"hidden_size\": 7168, \"num_hidden_layers\": 61, \"first_k_dense_replace\": 1,"              \
    "\"moe_layer_freq\": 1, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048,"        \
    "\"n_routed_experts\": 384, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8,"              \
    "\"n_group\": 1, \"topk_group\": 1, \"topk_method\": \"noaux_tc\","                            \
    "\"scoring_func\": \"sigmoid\", \"routed_scaling_factor\": 2.827, \"norm_topk_prob\": true,"   \
    "\"seq_aux\": true, \"aux_loss_alpha\": 0.001, \"num_attention_heads\": 64,"                   \
    "\"num_key_value_heads\": 64, \"q_lora_rank\": 1536, \"kv_lora_rank\": 512,"                   \
    "\"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"                    \
    "\"attention_bias\": false, \"hidden_act\": \"silu\", \"vocab_size\": 163840,"                 \
    "\"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-05,"                                \
    "\"tie_word_embeddings\": false, \"num_nextn_predict_layers\": 0, \"dtype\": \"bfloat16\","    \
    "\"bos_token_id\": 163584, \"eos_token_id\": 163585, \"pad_token_id\": 163839"

#define K25_ROPE_SCALING                                                                           \
    "\"rope_theta\": 50000.0, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 64.0,"            \
    "\"original_max_position_embeddings\": 4096, \"beta_fast\": 32.0, \"beta_slow\": 1.0,"         \
    "\"mscale\": 1.0, \"mscale_all_dim\": 1.0}"

#define K25_QUANT                                                                                  \
    "\"quantization_config\": {\"quant_method\": \"compressed-tensors\","                          \
    "\"format\": \"pack-quantized\", \"quantization_status\": \"compressed\","                     \
    "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"input_activations\": null,"    \
    "\"output_activations\": null, \"weights\": {\"num_bits\": 4, \"type\": \"int\","              \
    "\"symmetric\": true, \"strategy\": \"group\", \"group_size\": 32, \"dynamic\": false,"        \
    "\"actorder\": null, \"block_structure\": null, \"observer\": \"minmax\"}}},"                  \
    "\"ignore\": [\"lm_head\", \"re:.*self_attn.*\"], \"kv_cache_scheme\": null}"

static int load_json(k25_config *c, const char *json, char *err) {
    config_init_defaults(c);
    load_or_die(c, "config/tiny.ini");  // every model value differs from K2.5
    return config_load_hf_json_string(c, json, strlen(json), "config.json", err);
}

// s with its first `from` replaced by `to` (a static buffer: one result at a time).
static const char *with(const char *s, const char *from, const char *to) {
    static char out[8192];
    const char *at = strstr(s, from);
    if (!at) K25_DIE("test: '%s' not in the test's JSON", from);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return out;
}

// load_json of the object base with the keys of "{" over "}" in place of its own (the reader
// refuses a key that appears twice).
static int load_over(k25_config *c, const char *base, const char *over, char *err) {
    char text[1024];
    snprintf(text, sizeof text, "{%s}", over);
    cJSON *b = cJSON_Parse(base), *o = cJSON_Parse(text);
    if (!b || !o) K25_DIE("test: bad JSON %s", b ? text : base);
    for (cJSON *v; (v = o->child);) {
        char key[128];
        snprintf(key, sizeof key, "%s", v->string);
        cJSON_DetachItemViaPointer(o, v);
        if (cJSON_GetObjectItemCaseSensitive(b, key))
            cJSON_ReplaceItemInObjectCaseSensitive(b, key, v);
        else
            cJSON_AddItemToObject(b, key, v);
    }
    char *json = cJSON_PrintUnformatted(b);
    int rc = load_json(c, json, err);
    cJSON_free(json);
    cJSON_Delete(b);
    cJSON_Delete(o);
    return rc;
}

static void test_hf_json(void) {
    k25_config d, c;
    char err[K25_ERR_LEN] = "";
    config_init_defaults(&d);

    // K2.5 wrapper: LM under text_config, quantization at the top level.
    const char *wrapper =
        "{\"architectures\": [\"KimiK25ForConditionalGeneration\"], \"model_type\": \"kimi_k25\","
        "\"media_placeholder_token_id\": 163605, \"vision_config\": {\"depth\": 27},"
        "\"text_config\": {" K25_TEXT_KEYS "," K25_ROPE_SCALING "}," K25_QUANT "}";
    CHECK(load_json(&c, wrapper, err) == 0, "wrapper: %s", err);
    const char *k;
    CHECK((k = first_diff(&c, &d, "model")) == NULL, "wrapper model differs at %s", k);
    CHECK((k = first_diff(&c, &d, "rope")) == NULL, "wrapper rope differs at %s", k);
    CHECK((k = first_diff(&c, &d, "quant")) == NULL, "wrapper quant differs at %s", k);
    CHECK(c.bos_id == 163584 && c.pad_id == 163839 && c.eos_ids_n == 1 && c.eos_ids[0] == 163585,
          "wrapper tokens");
    CHECK(c.ctx_size == 512, "run section untouched");
    CHECK(config_validate(&c, err) == 0, "%s", err);

    // transformers 5: rope_parameters instead of rope_theta + rope_scaling.
    const char *tf5 =
        "{\"model_type\": \"kimi_k25\", \"text_config\": {" K25_TEXT_KEYS ","
        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 50000.0, \"factor\": 64.0,"
        "\"original_max_position_embeddings\": 4096, \"beta_fast\": 32.0, \"beta_slow\": 1.0,"
        "\"mscale\": 1.0, \"mscale_all_dim\": 1.0}, " K25_QUANT "}}";
    CHECK(load_json(&c, tf5, err) == 0, "rope_parameters: %s", err);
    CHECK((k = first_diff(&c, &d, "rope")) == NULL, "rope_parameters differs at %s", k);
    CHECK((k = first_diff(&c, &d, "quant")) == NULL, "quant inside text_config differs at %s", k);

    // Plain DeepseekV3 (BF16, rope_scaling, eos list, no quantization_config).
    const char *ds3 =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
        "\"hidden_size\": 7168, \"num_hidden_layers\": 61, \"first_k_dense_replace\": 3,"
        "\"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"n_routed_experts\": 256,"
        "\"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"n_group\": 8, \"topk_group\": 4,"
        "\"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
        "\"topk_method\": \"noaux_tc\", \"num_attention_heads\": 128, \"q_lora_rank\": 1536,"
        "\"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
        "\"v_head_dim\": 128, \"vocab_size\": 129280, \"max_position_embeddings\": 163840,"
        "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000,"
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
        "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096},"
        "\"bos_token_id\": 0, \"eos_token_id\": [1, 2], \"tie_word_embeddings\": false,"
        "\"unknown_future_key\": {\"a\": [1, 2, 3]}}";
    CHECK(load_json(&c, ds3, err) == 0, "deepseek_v3: %s", err);
    CHECK(c.n_experts == 256 && c.n_group == 8 && c.topk_group == 4 && c.first_dense == 3 &&
              c.n_heads == 128 && c.vocab == 129280 && c.routed_scale == 2.5f &&
              c.norm_eps == 1e-6f,
          "deepseek_v3 model");
    CHECK(c.rope_theta == 10000.0f && c.yarn_factor == 40.0f && !strcmp(c.rope_type, "yarn"),
          "deepseek_v3 rope");
    CHECK(c.experts_int4 == 0, "no quantization_config -> BF16 experts");
    CHECK(c.bos_id == 0 && c.eos_ids_n == 2 && c.eos_ids[0] == 1 && c.eos_ids[1] == 2,
          "eos list");
    CHECK(c.pad_id == 511, "absent pad keeps the previous value");
    CHECK(config_validate(&c, err) == 0, "deepseek_v3 invalid: %s", err);

    // No rope scaling at all, and rope_type "default".
    const char *plain = "{" K25_TEXT_KEYS ", \"rope_theta\": 50000.0, \"rope_scaling\": null}";
    CHECK(load_json(&c, plain, err) == 0 && !strcmp(c.rope_type, "none"), "no scaling: %s", err);
    const char *dflt = "{" K25_TEXT_KEYS ", \"rope_parameters\": {\"rope_type\": \"default\","
                       "\"rope_theta\": 1234.0}}";
    CHECK(load_json(&c, dflt, err) == 0 && !strcmp(c.rope_type, "none") &&
              c.rope_theta == 1234.0f,
          "default rope: %s", err);

    // Errors name the key. (cJSON finds the first of duplicate keys, so overrides go first.)
    const char *fp8 = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING ", \"quantization_config\": "
                      "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                      "\"weight_block_size\": [128, 128]}}";
    CHECK(load_json(&c, fp8, err) != 0 && has_all(err, "fp8", "not supported", "quant_method"),
          "fp8: %s", err);
    const char *int8 =
        "{" K25_TEXT_KEYS "," K25_ROPE_SCALING ", \"quantization_config\": {\"quant_method\": "
        "\"compressed-tensors\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, "
        "\"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 32}}}}}";
    CHECK(load_json(&c, int8, err) != 0 && strstr(err, "config_groups.g"), "int8: %s", err);
    const char *missing = "{\"model_type\": \"kimi_k25\", \"text_config\": {\"vocab_size\": 5}}";
    CHECK(load_json(&c, missing, err) != 0 && strstr(err, "text_config.hidden_size"),
          "missing key: %s", err);
    const char *no_theta = "{" K25_TEXT_KEYS "}";
    CHECK(load_json(&c, no_theta, err) != 0 && strstr(err, "rope_theta"), "no theta: %s", err);
    // transformers 5 derives a missing factor from max_position_embeddings / original.
    const char *no_factor = "{" K25_TEXT_KEYS ", \"rope_theta\": 1.0, \"rope_scaling\": "
                            "{\"type\": \"yarn\", \"original_max_position_embeddings\": 4096,"
                            "\"mscale_all_dim\": 1.0}}";
    CHECK(load_json(&c, no_factor, err) == 0 && c.yarn_factor == 64.0f, "no factor: %s", err);
    // Absent mscale_all_dim is 0: HF then scales cos/sin by mscale(factor), not supported.
    const char *no_msad = "{" K25_TEXT_KEYS ", \"rope_theta\": 1.0, \"rope_scaling\": "
                          "{\"type\": \"yarn\", \"factor\": 64, "
                          "\"original_max_position_embeddings\": 4096}}";
    CHECK(load_json(&c, no_msad, err) == 0 && c.yarn_mscale_all_dim == 0.0f, "%s", err);
    CHECK(config_validate(&c, err) != 0 && strstr(err, "mscale_all_dim"), "%s", err);
    // A rope_theta inside rope_parameters wins over the top-level one (as in transformers 5).
    const char *theta2 = "{" K25_TEXT_KEYS ", \"rope_theta\": 50000.0, \"rope_parameters\": "
                         "{\"rope_type\": \"default\", \"rope_theta\": 777.0}}";
    CHECK(load_json(&c, theta2, err) == 0 && c.rope_theta == 777.0f, "theta order: %s", err);
    const char *unsup[][2] = {
        {"\"rope_interleave\": false", "rope_interleave"},
        {"\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 64, \"truncate\": false, "
         "\"original_max_position_embeddings\": 4096}", "truncate"},
        {"\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 64, \"attention_factor\": 0.5, "
         "\"original_max_position_embeddings\": 4096}", "attention_factor"},
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"moe_layer_freq\": 2", "moe_layer_freq"},
    };
    for (int i = 0; i < 5; i++)
        CHECK(load_over(&c, "{" K25_TEXT_KEYS ", \"rope_theta\": 1.0}", unsup[i][0], err) != 0 &&
                  strstr(err, unsup[i][1]),
              "%s: %s", unsup[i][1], err);
    const char *bad_rope = "{" K25_TEXT_KEYS ", \"rope_theta\": 1.0, \"rope_scaling\": "
                           "{\"rope_type\": \"linear\", \"factor\": 2}}";
    CHECK(load_json(&c, bad_rope, err) != 0 && has_all(err, "linear", "rope_type", NULL), "%s",
          err);
    const char *full = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING "}";
    // An absent norm_topk_prob is true, as transformers' DeepseekV3Config has it (false would
    // route with unnormalized weights and decode other tokens without a word).
    CHECK(load_json(&c, with(full, " \"norm_topk_prob\": true,", ""), err) == 0 &&
              c.norm_topk_prob == 1,
          "absent norm_topk_prob: %s, value %d", err, c.norm_topk_prob);
    // Quantization schemes whose tensors mean something else than plain groups of columns.
    const char *quant = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING "," K25_QUANT "}";
    CHECK(load_json(&c, quant, err) == 0 && c.experts_int4 && c.quant_group == 32, "%s", err);
    const char *schemes[][3] = {
        {"\"actorder\": null", "\"actorder\": \"group\"", "weights.actorder' is set"},
        {"\"block_structure\": null", "\"block_structure\": [128, 128]",
         "weights.block_structure' is set"},
        {"\"dynamic\": false", "\"dynamic\": true", "weights.dynamic': only static"},
        {"\"output_activations\": null", "\"output_activations\": {\"num_bits\": 8}",
         "output_activations': quantized outputs"},
    };
    for (int i = 0; i < 4; i++)
        CHECK(load_json(&c, with(quant, schemes[i][0], schemes[i][1]), err) != 0 &&
                  has_all(err, "config_groups.group_0.", schemes[i][2], NULL),
              "%s: %s", schemes[i][1], err);
    CHECK(load_json(&c, with(quant, "\"actorder\": null", "\"actorder\": false"), err) == 0,
          "actorder false (no order, as null): %s", err);
    CHECK(load_over(&c, full, "\"hidden_size\": \"7168\"", err) != 0 &&
              has_all(err, "'hidden_size'", "an integer", NULL),
          "wrong type: %s", err);
    CHECK(load_over(&c, full, "\"n_group\": 1.5", err) != 0 &&
              has_all(err, "'n_group'", "an integer", NULL),
          "fraction: %s", err);
    CHECK(load_over(&c, full, "\"norm_topk_prob\": 1", err) != 0 &&
              has_all(err, "'norm_topk_prob'", "true or false", NULL),
          "%s", err);
    CHECK(load_over(&c, full, "\"eos_token_id\": [1, \"x\"]", err) != 0 &&
              strstr(err, "eos_token_id"),
          "%s", err);
    CHECK(load_over(&c, full, "\"q_lora_rank\": null", err) != 0 && strstr(err, "q_lora_rank"),
          "%s", err);
    // A repeated key: cJSON would read the first, transformers the last.
    const char *twice = "{\"hidden_size\": 7168, " K25_TEXT_KEYS "," K25_ROPE_SCALING "}";
    CHECK(load_json(&c, twice, err) != 0 &&
              strstr(err, "config.json: key 'hidden_size' appears more than once"),
          "repeated key: %s", err);
    const char *twice_nested = "{" K25_TEXT_KEYS ", \"rope_theta\": 1.0, \"rope_scaling\": "
                               "{\"type\": \"yarn\", \"factor\": 64, \"factor\": 32, "
                               "\"original_max_position_embeddings\": 4096}}";
    CHECK(load_json(&c, twice_nested, err) != 0 &&
              strstr(err, "key 'rope_scaling.factor' appears more than once"),
          "repeated nested key: %s", err);
    const char *twice_in_list = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING ", \"x\": "
                                "[{\"a\": 1}, {\"b\": 1, \"b\": 2}]}";
    CHECK(load_json(&c, twice_in_list, err) != 0 &&
              strstr(err, "key 'x[1].b' appears more than once"),
          "repeated key in a list: %s", err);
    const char *other = "{\"model_type\": \"llama\", \"hidden_size\": 4096}";
    CHECK(load_json(&c, other, err) != 0 && strstr(err, "llama"), "%s", err);
    CHECK(load_json(&c, "{\"hidden_size\": ", err) != 0 && strstr(err, "JSON"), "%s", err);
    CHECK(load_json(&c, "[1, 2]", err) != 0 && strstr(err, "object"), "%s", err);
    // cJSON stops after the first value, Python's json refuses what follows; white space may.
    const char *tail = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING "}\n}\"x";
    CHECK(load_json(&c, tail, err) != 0 && strstr(err, "config.json: data after the JSON object"),
          "data after the object: %s", err);
    const char *spaces = "{" K25_TEXT_KEYS "," K25_ROPE_SCALING "}\n \t\r\n";
    CHECK(load_json(&c, spaces, err) == 0, "white space after the object: %s", err);

    // A failed load leaves the config as it was; a file load names the file.
    k25_config before;
    config_init_defaults(&before);
    c = before;
    CHECK(config_load_hf_json_string(&c, fp8, strlen(fp8), "config.json", err) != 0, "fp8");
    CHECK(first_diff(&c, &before, NULL) == NULL, "failed json load changed the config");
    const char *path = temp_file(missing, 1);
    CHECK(config_load_hf_json(&c, path, err) != 0 && has_all(err, path, "hidden_size", NULL),
          "file message: %s", err);
    unlink(path);
    path = temp_file(wrapper, 1);
    CHECK(config_load_hf_json(&c, path, err) == 0, "wrapper file: %s", err);
    unlink(path);
    CHECK(config_load_hf_json(&c, "/nonexistent/config.json", err) != 0 &&
              strstr(err, "/nonexistent/config.json"),
          "%s", err);
}

// ------------------------------------------------------------------------------------------
// Validation and tensor-parallel checks
// ------------------------------------------------------------------------------------------

static void expect_invalid(const char *base, const char *set1, const char *set2, const char *key) {
    k25_config c;
    char err[K25_ERR_LEN] = "";
    config_init_defaults(&c);
    load_or_die(&c, base);
    CHECK(config_set(&c, set1, err) == 0, "%s", err);
    if (set2) CHECK(config_set(&c, set2, err) == 0, "%s", err);
    int rc = config_validate(&c, err);
    CHECK(rc != 0, "%s %s accepted", set1, set2 ? set2 : "");
    CHECK(strstr(err, key) != NULL, "%s: message '%s' lacks '%s'", set1, err, key);
}

static void test_validate(void) {
    expect_invalid("config/tiny.ini", "model.hidden_size=0", NULL, "hidden_size");
    expect_invalid("config/tiny.ini", "model.num_experts_per_tok=17", NULL, "num_experts_per_tok");
    expect_invalid("config/tiny.ini", "model.n_group=3", NULL, "n_group");
    expect_invalid("config/tiny_group.ini", "model.topk_group=5", NULL, "topk_group");
    // 4 groups of 8 experts, 1 group kept: at most 8 experts can be chosen.
    expect_invalid("config/tiny_group.ini", "model.topk_group=1", "model.num_experts_per_tok=9",
                   "num_experts_per_tok");
    expect_invalid("config/tiny.ini", "model.qk_rope_head_dim=7", NULL, "qk_rope_head_dim");
    expect_invalid("config/tiny.ini", "model.scoring_func=softmax", NULL, "scoring_func");
    expect_invalid("config/tiny.ini", "model.topk_method=greedy", NULL, "topk_method");
    expect_invalid("config/tiny.ini", "model.first_k_dense_replace=5", NULL,
                   "first_k_dense_replace");
    expect_invalid("config/tiny.ini", "rope.type=linear", NULL, "rope.type");
    expect_invalid("config/tiny.ini", "model.hidden_size=144", NULL, "group_size");
    expect_invalid("config/tiny.ini", "model.moe_intermediate_size=48", NULL,
                   "moe_intermediate_size");
    expect_invalid("config/tiny.ini", "tokens.eos_token_ids=257,512", NULL, "eos_token_ids");
    expect_invalid("config/tiny.ini", "run.ctx_size=5000", NULL, "ctx_size");
    expect_invalid("config/tiny.ini", "run.top_p=0", NULL, "top_p");
    expect_invalid("config/tiny.ini", "run.backend=tpu", NULL, "backend");
    expect_invalid("config/tiny.ini", "rope.mscale=0.707", NULL, "mscale");
    expect_invalid("config/tiny.ini", "run.seed=-1", NULL, "run.seed must not be negative");
    expect_invalid("config/tiny.ini", "run.pp_async=7", NULL, "run.pp_async is 0 or 1");
    // More threads than --threads takes crashed inside the OpenMP runtime.
    expect_invalid("config/tiny.ini", "run.threads=4097", NULL, "run.threads");
    // YaRN divides by log(rope_theta): theta 1 made every frequency, and so every logit, NaN.
    expect_invalid("config/tiny.ini", "rope.rope_theta=1", NULL, "rope.rope_theta");
    // Every head's query row side by side past int overflowed the last head's offset.
    expect_invalid("config/tiny.ini", "model.num_attention_heads=129",
                   "model.qk_rope_head_dim=16777216",
                   "model.num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim) = "
                   "2164262928 is too large");
    expect_invalid("config/tiny.ini", "model.num_attention_heads=2",
                   "model.kv_lora_rank=16777216",
                   "model.num_attention_heads x kv_lora_rank = 33554432 is too large");

    // BF16 experts lift the group constraints; no rope scaling is fine.
    k25_config c;
    char err[K25_ERR_LEN];
    config_init_defaults(&c);
    load_or_die(&c, "config/tiny.ini");
    CHECK(config_set(&c, "quant.experts_int4=false", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.hidden_size=144", err) == 0, "%s", err);
    CHECK(config_set(&c, "rope.type=none", err) == 0, "%s", err);
    CHECK(config_set(&c, "rope.rope_theta=1", err) == 0, "%s", err);
    CHECK(config_set(&c, "run.threads=4096", err) == 0, "%s", err);
    CHECK(config_validate(&c, err) == 0, "bf16 tiny: %s", err);
    // 8 heads x (16 + 2097136) is exactly the bound.
    config_init_defaults(&c);
    load_or_die(&c, "config/tiny.ini");
    CHECK(config_set(&c, "model.qk_rope_head_dim=2097136", err) == 0, "%s", err);
    CHECK(config_validate(&c, err) == 0, "a query row of 2^24: %s", err);
}

static void test_check_tp(void) {
    k25_config c;
    char err[K25_ERR_LEN] = "";
    config_init_defaults(&c);
    for (int tp = 1; tp <= 32; tp *= 2) CHECK(config_check_tp(&c, tp, err) == 0, "K2.5 tp=%d: %s", tp, err);
    CHECK(config_check_tp(&c, 128, err) != 0 && strstr(err, "num_attention_heads=64"), "%s", err);
    CHECK(config_check_tp(&c, 0, err) != 0, "tp=0");

    config_init_defaults(&c);
    load_or_die(&c, "config/tiny.ini");
    CHECK(config_set(&c, "model.num_attention_heads=6", err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 4, err) != 0, "6 heads on 4 ranks");
    CHECK(!strcmp(err, "4 ranks cannot split 6 attention heads evenly (num_attention_heads=6)"),
          "message: %s", err);

    load_or_die(&c, "config/tiny.ini");
    // 128 expert columns / 8 ranks = 16: not a whole INT4 group of 32.
    CHECK(config_check_tp(&c, 8, err) != 0 && has_all(err, "moe_intermediate_size=128", "8 ranks", NULL),
          "int4 width: %s", err);
    CHECK(config_set(&c, "quant.experts_int4=false", err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 8, err) == 0, "bf16 tp=8: %s", err);
    CHECK(config_check_tp(&c, 3, err) != 0 && strstr(err, "num_attention_heads"), "%s", err);
    CHECK(config_set(&c, "model.num_attention_heads=6", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.moe_intermediate_size=96", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.intermediate_size=192", err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 3, err) != 0 && strstr(err, "vocab_size=512"), "vocab: %s", err);
    CHECK(config_set(&c, "model.intermediate_size=200", err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 2, err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 3, err) != 0 && strstr(err, "intermediate_size=200"), "%s", err);
    CHECK(config_set(&c, "model.intermediate_size=192", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.moe_intermediate_size=100", err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 3, err) != 0 && strstr(err, "moe_intermediate_size=100"), "%s", err);

    // tp x group_size past INT_MAX (2^16 x 2^16 wrapped to 0: a division by zero).
    const char *big[] = {"model.num_attention_heads=65536", "quant.group_size=65536",
                         "model.hidden_size=65536", "model.moe_intermediate_size=65536",
                         "model.intermediate_size=65536", "model.vocab_size=65536"};
    load_or_die(&c, "config/tiny.ini");
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        CHECK(config_set(&c, big[i], err) == 0, "%s", err);
    CHECK(config_validate(&c, err) == 0, "%s", err);
    CHECK(config_check_tp(&c, 65536, err) != 0 && strstr(err, "tp*group_size=4294967296"),
          "tp x group overflow: %s", err);
}

// ------------------------------------------------------------------------------------------
// Derived quantities against an independent computation
// ------------------------------------------------------------------------------------------

// YaRN as written in the DeepSeek-V3 reference (KIMI_K25.md §4.3), in double.
static void ref_inv_freq(double theta, int dim, int yarn, double factor, int orig, double bfast,
                         double bslow, double *out, int *lo, int *hi) {
    double l = floor(dim * log(orig / (bfast * 2 * M_PI)) / (2 * log(theta)));
    double h = ceil(dim * log(orig / (bslow * 2 * M_PI)) / (2 * log(theta)));
    l = fmax(l, 0);
    h = fmin(h, dim - 1);
    if (l == h) h += 0.001;
    *lo = (int)l, *hi = (int)h;
    for (int i = 0; i < dim / 2; i++) {
        double base = pow(theta, -2.0 * i / dim);
        double r = fmin(fmax((i - l) / (h - l), 0.0), 1.0);
        out[i] = yarn ? base / factor * r + base * (1 - r) : base;
    }
}

static void check_inv_freq(const k25_config *c, const char *what, int want_lo, int want_hi) {
    float got[64];
    double ref[64];
    int lo, hi, dim = c->qk_rope_dim;
    config_rope_inv_freq(c, got);
    ref_inv_freq(c->rope_theta, dim, !strcmp(c->rope_type, "yarn"), c->yarn_factor,
                 c->yarn_orig_max_pos, c->yarn_beta_fast, c->yarn_beta_slow, ref, &lo, &hi);
    if (want_lo >= 0) CHECK(lo == want_lo && hi == want_hi, "%s: low %d high %d", what, lo, hi);
    for (int i = 0; i < dim / 2; i++)
        CHECK(fabs(got[i] - ref[i]) <= 2e-7 * ref[i], "%s: inv_freq[%d] = %.9g, want %.9g", what,
              i, got[i], ref[i]);
}

static void test_derived(void) {
    k25_config c;
    char err[K25_ERR_LEN];
    config_init_defaults(&c);

    // K2.5 softmax scale: the model card number and the formula.
    float s = config_softmax_scale(&c);
    CHECK(fabs(s - 0.14467963) < 2e-8, "K2.5 softmax scale %.9g", s);
    double m = 0.1 * log(64.0) + 1;
    CHECK(fabs(s - m * m / sqrt(192.0)) < 1e-8, "softmax scale %.9g vs formula", s);
    load_or_die(&c, "config/tiny.ini");
    m = 0.1 * log(4.0) + 1;
    CHECK(fabs(config_softmax_scale(&c) / (m * m / sqrt(24.0)) - 1) < 1e-7, "tiny softmax scale");
    CHECK(config_set(&c, "rope.type=none", err) == 0, "%s", err);
    CHECK(fabs(config_softmax_scale(&c) * sqrt(24.0) - 1) < 1e-7, "no-yarn softmax scale");

    // K2.5 YaRN: low = 8, high = 20 (KIMI_K25.md §4.3), and the spot values it implies.
    config_init_defaults(&c);
    check_inv_freq(&c, "K2.5", 8, 20);
    float f[32];
    config_rope_inv_freq(&c, f);
    CHECK(f[0] == 1.0f, "inv_freq[0] %g", f[0]);
    CHECK(fabs(f[8] - pow(50000.0, -16.0 / 64)) < 1e-7 * f[8], "dim 8 keeps its frequency");
    CHECK(fabs(f[20] - pow(50000.0, -40.0 / 64) / 64) < 1e-7 * f[20], "dim 20 divided by 64");
    double b14 = pow(50000.0, -28.0 / 64);  // ramp (14-8)/12 = 1/2
    CHECK(fabs(f[14] - (b14 / 2 + b14 / 128)) < 1e-7 * f[14], "dim 14 half-way blend");
    CHECK(fabs(f[31] - pow(50000.0, -62.0 / 64) / 64) < 1e-7 * f[31], "last dim");

    // K2-Instruct (beta_fast = beta_slow = 1): low 19, high 20 — a hard switch.
    CHECK(config_set(&c, "rope.beta_fast=1", err) == 0, "%s", err);
    check_inv_freq(&c, "K2-Instruct", 19, 20);
    config_rope_inv_freq(&c, f);
    CHECK(fabs(f[19] - pow(50000.0, -38.0 / 64)) < 1e-7 * f[19], "dim 19 unscaled");

    // Tiny (dim 8, factor 4, original context 256) and no scaling at all.
    load_or_die(&c, "config/tiny.ini");
    check_inv_freq(&c, "tiny", -1, -1);
    CHECK(config_set(&c, "rope.type=none", err) == 0, "%s", err);
    check_inv_freq(&c, "tiny none", -1, -1);
    config_rope_inv_freq(&c, f);
    CHECK(fabs(f[3] - pow(50000.0, -6.0 / 8)) < 1e-7 * f[3], "unscaled");

    // EOS lookups.
    config_init_defaults(&c);
    CHECK(config_is_eos(&c, 163585) && config_is_eos(&c, 163586) && !config_is_eos(&c, 163584),
          "eos");
}

int main(void) {
    test_defaults();
    test_tiny();
    test_dump();
    test_bad_ini();
    test_hf_json();
    test_validate();
    test_check_tp();
    test_derived();
    if (test_failures) {
        fprintf(stderr, "test_config: %d check(s) failed\n", test_failures);
        return 1;
    }
    printf("test_config: ok\n");
    return 0;
}
