// Model and run configuration: built-in defaults, .ini files, Hugging Face config.json,
// --set overrides, consistency checks, and the derived quantities (softmax scale, YaRN
// frequencies) every backend must agree on. The list of keys lives in config.def.
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <ini.h>

#include "json_object.h"

// ------------------------------------------------------------------------------------------
// The key table (one row per config.def line)
// ------------------------------------------------------------------------------------------

typedef enum { CT_INT, CT_FLOAT, CT_BOOL, CT_STR, CT_INTS } cfg_type;

typedef struct cfg_key {
    const char *section, *key;
    cfg_type type;
    size_t off;    // offset of the field in k25_config
    size_t off_n;  // INTS: offset of the count field
} cfg_key;

#define CFG_OFFN_INT(f) 0
#define CFG_OFFN_FLOAT(f) 0
#define CFG_OFFN_BOOL(f) 0
#define CFG_OFFN_STR(f) 0
#define CFG_OFFN_INTS(f) offsetof(k25_config, f##_n)

static const cfg_key cfg_keys[] = {
#define K25_CFG(section, key, type, field, def)                                                    \
    {#section, #key, CT_##type, offsetof(k25_config, field), CFG_OFFN_##type(field)},
#include "config.def"
#undef K25_CFG
};
#define N_CFG_KEYS ((int)(sizeof cfg_keys / sizeof cfg_keys[0]))

static const cfg_key *find_key(const char *section, const char *key) {
    for (int i = 0; i < N_CFG_KEYS; i++)
        if (!strcmp(cfg_keys[i].section, section) && !strcmp(cfg_keys[i].key, key))
            return &cfg_keys[i];
    return NULL;
}

static int section_known(const char *section) {
    for (int i = 0; i < N_CFG_KEYS; i++)
        if (!strcmp(cfg_keys[i].section, section)) return 1;
    return 0;
}

static int *field_int(k25_config *c, const cfg_key *k) { return (int *)((char *)c + k->off); }
static float *field_float(k25_config *c, const cfg_key *k) {
    return (float *)((char *)c + k->off);
}
static char *field_str(k25_config *c, const cfg_key *k) { return (char *)c + k->off; }
static int *field_count(k25_config *c, const cfg_key *k) { return (int *)((char *)c + k->off_n); }

// ------------------------------------------------------------------------------------------
// Value parsing (shared by .ini, --set and the built-in defaults)
// ------------------------------------------------------------------------------------------

static int parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (end == s || *end || errno || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    while (isspace((unsigned char)*end)) end++;
    if (end == s || *end || errno == ERANGE || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = 1, 0;
        if (!strcasecmp(s, no[i])) return *out = 0, 0;
    }
    return -1;
}

// "1, 2,3" -> {1,2,3}; the empty string is an empty list.
static int parse_ints(const char *s, int *out, int *n) {
    int cnt = 0;
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    if (!*p) return *n = 0, 0;
    for (;;) {
        char item[64];
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len >= sizeof item || cnt >= K25_CFG_INTS_MAX) return -1;
        memcpy(item, p, len);
        item[len] = 0;
        const char *q = item;
        while (isspace((unsigned char)*q)) q++;
        if (parse_int(q, &out[cnt++])) return -1;
        if (!comma) break;
        p = comma + 1;
    }
    *n = cnt;
    return 0;
}

// Sets one key from its text form. On failure writes the reason (without location) to why.
static int set_value(k25_config *c, const cfg_key *k, const char *value, char *why) {
    switch (k->type) {
    case CT_INT:
        if (parse_int(value, field_int(c, k)))
            return k25_err(why, "cannot parse '%s' as an integer", value);
        return 0;
    case CT_FLOAT:
        if (parse_float(value, field_float(c, k)))
            return k25_err(why, "cannot parse '%s' as a number", value);
        return 0;
    case CT_BOOL:
        if (parse_bool(value, field_int(c, k)))
            return k25_err(why, "cannot parse '%s' as a boolean (true/false/1/0)", value);
        return 0;
    case CT_STR:
        if (strlen(value) >= K25_CFG_STR_LEN)
            return k25_err(why, "value longer than %d characters", K25_CFG_STR_LEN - 1);
        strcpy(field_str(c, k), value);
        return 0;
    case CT_INTS: {
        int tmp[K25_CFG_INTS_MAX], n;
        if (parse_ints(value, tmp, &n))
            return k25_err(why, "cannot parse '%s' as a list of at most %d integers (\"1,2,3\")",
                           value, K25_CFG_INTS_MAX);
        memcpy(field_int(c, k), tmp, sizeof tmp);
        *field_count(c, k) = n;
        return 0;
    }
    }
    return k25_err(why, "internal error: bad key type");
}

// ------------------------------------------------------------------------------------------
// Defaults
// ------------------------------------------------------------------------------------------

void config_init_defaults(k25_config *c) {
    memset(c, 0, sizeof *c);
#define K25_CFG_INT(f, d) c->f = (d);
#define K25_CFG_FLOAT(f, d) c->f = (d);
#define K25_CFG_BOOL(f, d) c->f = (d);
#define K25_CFG_STR(f, d) snprintf(c->f, sizeof c->f, "%s", d);
#define K25_CFG_INTS(f, d) K25_CHECK(!parse_ints(d, c->f, &c->f##_n), "bad default for " #f);
#define K25_CFG(section, key, type, field, def) K25_CFG_##type(field, def)
#include "config.def"
#undef K25_CFG
#undef K25_CFG_INT
#undef K25_CFG_FLOAT
#undef K25_CFG_BOOL
#undef K25_CFG_STR
#undef K25_CFG_INTS
}

// ------------------------------------------------------------------------------------------
// .ini files (inih). The reader feeds inih whole lines from memory and counts them, so the
// handler knows its line number even though the packaged inih does not pass it.
// ------------------------------------------------------------------------------------------

typedef struct ini_ctx {
    k25_config *c;
    const char *name;
    const char *text;
    size_t len, pos;
    size_t line_start;  // offset of the line last handed to inih
    int line;      // line last handed to inih (1-based)
    int err_line;  // first line with an error we diagnosed, 0 if none
    char err[K25_ERR_LEN];
} ini_ctx;

static void ini_fail(ini_ctx *x, const char *fmt, ...) K25_PRINTF(2, 3);
static void ini_fail(ini_ctx *x, const char *fmt, ...) {
    if (x->err_line) return;  // the first error is the useful one
    x->err_line = x->line;
    int n = snprintf(x->err, sizeof x->err, "%s:%d: ", x->name, x->line);
    if (n < 0 || n >= (int)sizeof x->err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err + n, sizeof x->err - (size_t)n, fmt, ap);
    va_end(ap);
}

static char *ini_read_line(char *str, int num, void *stream) {
    ini_ctx *x = stream;
    if (x->pos >= x->len || num < 2) return NULL;
    const char *start = x->text + x->pos;
    const char *nl = memchr(start, '\n', x->len - x->pos);
    size_t linelen = nl ? (size_t)(nl - start) + 1 : x->len - x->pos;
    x->line_start = x->pos;
    x->pos += linelen;
    x->line++;
    size_t copy = linelen;
    if (copy > (size_t)num - 1) {
        copy = (size_t)num - 2;  // keep room for the newline and NUL
        ini_fail(x, "line longer than %d characters", num - 2);
        memcpy(str, start, copy);
        str[copy++] = '\n';
    } else {
        memcpy(str, start, copy);
    }
    str[copy] = 0;
    return str;
}

// inih reads an indented line that follows a key as more of that key's value and hands it
// over as a second value of the same key, which would replace the first one ("eos_token_ids =
// 1,2" then "   3" sets the list to 3). Such a line does not start with the key's name.
static int ini_is_continuation(const ini_ctx *x, const char *name) {
    const char *p = x->text + x->line_start;
    while (*p != '\n' && isspace((unsigned char)*p)) p++;
    size_t n = strlen(name);
    if (strncmp(p, name, n)) return 1;
    for (p += n; *p != '\n' && isspace((unsigned char)*p);) p++;
    return *p != '=' && *p != ':';
}

static int ini_on_key(void *user, const char *section, const char *name, const char *value) {
    ini_ctx *x = user;
    if (!*section) {
        ini_fail(x, "key '%s' is outside of any [section]", name);
        return 0;
    }
    if (ini_is_continuation(x, name)) {
        ini_fail(x, "indented line would continue the value of key '%s.%s': not supported "
                    "(start each 'key = value' at the beginning of a line, the whole value on it)",
                 section, name);
        return 0;
    }
    const cfg_key *k = find_key(section, name);
    if (!k) {
        if (section_known(section))
            ini_fail(x, "unknown key '%s' in section [%s]", name, section);
        else
            ini_fail(x, "unknown section [%s] (key '%s')", section, name);
        return 0;
    }
    char why[K25_ERR_LEN];
    if (set_value(x->c, k, value, why)) {
        ini_fail(x, "key '%s.%s': %s", section, name, why);
        return 0;
    }
    return 1;
}

int config_load_ini_string(k25_config *c, const char *text, const char *name, char *err) {
    k25_config tmp = *c;  // left untouched on error
    ini_ctx x = {.c = &tmp, .name = name ? name : "<string>", .text = text, .len = strlen(text)};
    int rc = ini_parse_stream(ini_read_line, &x, ini_on_key, &x);
    if (rc == -2) return k25_err(err, "%s: out of memory while parsing", x.name);
    if (x.err_line && (rc <= 0 || rc >= x.err_line)) return k25_err(err, "%s", x.err);
    if (rc > 0)
        return k25_err(err, "%s:%d: syntax error (expected '[section]' or 'key = value')",
                       x.name, rc);
    *c = tmp;
    return 0;
}

int config_load_ini(k25_config *c, const char *path, char *err) {
    size_t n;
    char *text = k25_read_file(path, &n, err);
    if (!text) return -1;
    if (strlen(text) != n) {
        free(text);
        return k25_err(err, "%s: not a text file (contains a NUL byte)", path);
    }
    int rc = config_load_ini_string(c, text, path, err);
    free(text);
    return rc;
}

// ------------------------------------------------------------------------------------------
// --set section.key=value
// ------------------------------------------------------------------------------------------

// Returns -1 (dst unset) when the trimmed text does not fit: a cut value could still parse,
// as another number.
static int trim_copy(char *dst, size_t cap, const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n >= cap) return -1;
    memcpy(dst, s, n);
    dst[n] = 0;
    return 0;
}

int config_set(k25_config *c, const char *assignment, char *err) {
    const char *eq = strchr(assignment, '=');
    const char *dot = eq ? memchr(assignment, '.', (size_t)(eq - assignment)) : NULL;
    if (!eq || !dot)
        return k25_err(err, "--set '%s': expected section.key=value (e.g. run.temp=0.7)",
                       assignment);
    char section[64], key[128], value[K25_CFG_STR_LEN + 64];
    if (trim_copy(section, sizeof section, assignment, (size_t)(dot - assignment)) ||
        trim_copy(key, sizeof key, dot + 1, (size_t)(eq - dot - 1)))
        return k25_err(err, "--set '%.*s': no such key", (int)(eq - assignment), assignment);
    if (trim_copy(value, sizeof value, eq + 1, strlen(eq + 1)))
        return k25_err(err, "--set '%.*s=...': value longer than %d characters",
                       (int)(eq - assignment), assignment, (int)sizeof value - 1);
    const cfg_key *k = find_key(section, key);
    if (!k) {
        if (section_known(section))
            return k25_err(err, "--set '%s': unknown key '%s' in section [%s]", assignment, key,
                           section);
        return k25_err(err, "--set '%s': unknown section [%s]", assignment, section);
    }
    char why[K25_ERR_LEN];
    if (set_value(c, k, value, why))
        return k25_err(err, "--set '%s': key '%s.%s': %s", assignment, section, key, why);
    return 0;
}

// ------------------------------------------------------------------------------------------
// Hugging Face config.json
// ------------------------------------------------------------------------------------------

typedef struct hf_ctx {
    const char *name;    // file name for messages
    const char *prefix;  // "text_config." or ""
    char *err;
} hf_ctx;

// Looks up obj[key]; JSON null counts as absent.
static const cJSON *jget(const cJSON *obj, const char *key) {
    if (!obj) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int hf_type_err(hf_ctx *h, const char *pfx, const char *key, const char *want) {
    return k25_err(h->err, "%s: key '%s%s': expected %s", h->name, pfx, key, want);
}

static int json_int(hf_ctx *h, const char *pfx, const char *key, const cJSON *v, int *out) {
    double d = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || d != floor(d) || d < INT_MIN || d > INT_MAX)
        return hf_type_err(h, pfx, key, "an integer");
    *out = (int)d;
    return 0;
}

static int json_float(hf_ctx *h, const char *pfx, const char *key, const cJSON *v, float *out) {
    if (!cJSON_IsNumber(v)) return hf_type_err(h, pfx, key, "a number");
    // A value that is not a normal float (overflow to inf, or subnormal) would not survive
    // --dump-config and is never a meaningful model parameter.
    double d = cJSON_GetNumberValue(v);
    float f = (float)d;
    if (!isfinite(f) || (f != 0 && fabsf(f) < FLT_MIN))
        return hf_type_err(h, pfx, key, "a number in float range");
    *out = f;
    return 0;
}

static int json_bool(hf_ctx *h, const char *pfx, const char *key, const cJSON *v, int *out) {
    if (!cJSON_IsBool(v)) return hf_type_err(h, pfx, key, "true or false");
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int json_str(hf_ctx *h, const char *pfx, const char *key, const cJSON *v, char *out) {
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= K25_CFG_STR_LEN)
        return hf_type_err(h, pfx, key, "a string");
    strcpy(out, v->valuestring);
    return 0;
}

// One [model] key from the text config. Optional keys that are absent take the value the
// Hugging Face DeepseekV3 code assumes when the key is missing.
typedef struct hf_model_key {
    const char *key;
    int required;
    const char *absent;  // text form of the value used when absent and optional
} hf_model_key;

static const hf_model_key hf_model_keys[] = {
    {"hidden_size", 1, NULL},
    {"num_hidden_layers", 1, NULL},
    {"first_k_dense_replace", 1, NULL},
    {"intermediate_size", 1, NULL},
    {"moe_intermediate_size", 1, NULL},
    {"n_routed_experts", 1, NULL},
    {"n_shared_experts", 1, NULL},
    {"num_experts_per_tok", 1, NULL},
    {"n_group", 1, NULL},
    {"topk_group", 1, NULL},
    {"routed_scaling_factor", 1, NULL},
    {"norm_topk_prob", 0, "true"},
    {"scoring_func", 0, "sigmoid"},
    {"topk_method", 0, "noaux_tc"},
    {"num_attention_heads", 1, NULL},
    {"q_lora_rank", 1, NULL},
    {"kv_lora_rank", 1, NULL},
    {"qk_nope_head_dim", 1, NULL},
    {"qk_rope_head_dim", 1, NULL},
    {"v_head_dim", 1, NULL},
    {"vocab_size", 1, NULL},
    {"max_position_embeddings", 1, NULL},
    {"rms_norm_eps", 1, NULL},
    {"tie_word_embeddings", 0, "false"},
};

static int hf_set_typed(hf_ctx *h, k25_config *c, const cfg_key *k, const char *pfx,
                        const char *key, const cJSON *v) {
    switch (k->type) {
    case CT_INT: return json_int(h, pfx, key, v, field_int(c, k));
    case CT_FLOAT: return json_float(h, pfx, key, v, field_float(c, k));
    case CT_BOOL: return json_bool(h, pfx, key, v, field_int(c, k));
    case CT_STR: return json_str(h, pfx, key, v, field_str(c, k));
    case CT_INTS: break;
    }
    return k25_err(h->err, "internal error: key %s", key);
}

static int hf_model(hf_ctx *h, k25_config *c, const cJSON *tc) {
    for (size_t i = 0; i < sizeof hf_model_keys / sizeof hf_model_keys[0]; i++) {
        const hf_model_key *m = &hf_model_keys[i];
        const cfg_key *k = find_key("model", m->key);
        K25_CHECK(k, "config.def lacks model.%s", m->key);
        const cJSON *v = jget(tc, m->key);
        if (!v) {
            if (!strcmp(m->key, "q_lora_rank") && cJSON_IsNull(cJSON_GetObjectItem(tc, m->key)))
                return k25_err(h->err,
                               "%s: key '%sq_lora_rank' is null (uncompressed queries): "
                               "not supported, k25dec needs q_lora_rank > 0",
                               h->name, h->prefix);
            if (m->required)
                return k25_err(h->err, "%s: missing key '%s%s'", h->name, h->prefix, m->key);
            char why[K25_ERR_LEN];
            K25_CHECK(!set_value(c, k, m->absent, why), "%s", why);
            continue;
        }
        if (hf_set_typed(h, c, k, h->prefix, m->key, v)) return -1;
    }
    // Features this decoder does not implement: refuse rather than decode wrongly.
    const cJSON *v;
    if ((v = jget(tc, "hidden_act")) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "silu")))
        return k25_err(h->err, "%s: key '%shidden_act': only \"silu\" is supported", h->name,
                       h->prefix);
    if ((v = jget(tc, "moe_layer_freq")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return k25_err(h->err, "%s: key '%smoe_layer_freq': only 1 is supported", h->name,
                       h->prefix);
    if ((v = jget(tc, "attention_bias")) && cJSON_IsTrue(v))
        return k25_err(h->err, "%s: key '%sattention_bias': true is not supported", h->name,
                       h->prefix);
    return 0;
}

// rope_theta + rope_scaling (transformers 4) or rope_parameters (transformers 5). As in
// transformers, rope_scaling wins over rope_parameters, and a rope_theta inside the chosen
// dictionary wins over the top-level one.
static int hf_rope(hf_ctx *h, k25_config *c, const cJSON *tc) {
    const cJSON *rs = jget(tc, "rope_scaling");
    const char *rs_name = "rope_scaling";
    const cJSON *rp = jget(tc, "rope_parameters");
    if (rs && !cJSON_IsObject(rs)) return hf_type_err(h, h->prefix, "rope_scaling", "an object");
    if (rp && !cJSON_IsObject(rp))
        return hf_type_err(h, h->prefix, "rope_parameters", "an object");
    if (!rs && rp) rs = rp, rs_name = "rope_parameters";
    char pfx[96];
    snprintf(pfx, sizeof pfx, "%s%s.", h->prefix, rs_name);

    const cJSON *v = jget(tc, "rope_interleave");
    if (v && !cJSON_IsTrue(v))
        return k25_err(h->err, "%s: key '%srope_interleave': only true (interleaved rope pairs) "
                       "is supported", h->name, h->prefix);

    if (rs && (v = jget(rs, "rope_theta"))) {
        if (json_float(h, pfx, "rope_theta", v, &c->rope_theta)) return -1;
    } else if ((v = jget(tc, "rope_theta"))) {
        if (json_float(h, h->prefix, "rope_theta", v, &c->rope_theta)) return -1;
    } else if (rp && (v = jget(rp, "rope_theta"))) {
        char ppfx[96];
        snprintf(ppfx, sizeof ppfx, "%srope_parameters.", h->prefix);
        if (json_float(h, ppfx, "rope_theta", v, &c->rope_theta)) return -1;
    } else {
        return k25_err(h->err, "%s: missing key '%srope_theta' (or rope_parameters.rope_theta)",
                       h->name, h->prefix);
    }

    const char *tkey = "type";
    const cJSON *type = rs ? jget(rs, "type") : NULL;
    if (rs && !type) type = jget(rs, "rope_type"), tkey = "rope_type";
    if (type && !cJSON_IsString(type)) return hf_type_err(h, pfx, tkey, "a string");
    const char *t = type ? type->valuestring : "default";
    if (!strcmp(t, "default")) {
        strcpy(c->rope_type, "none");
        return 0;
    }
    if (strcmp(t, "yarn"))
        return k25_err(h->err,
                       "%s: key '%s%s': rope type \"%s\" is not supported (yarn or default)",
                       h->name, pfx, tkey, t);
    strcpy(c->rope_type, "yarn");
    if (!(v = jget(rs, "original_max_position_embeddings")))
        return k25_err(h->err, "%s: missing key '%soriginal_max_position_embeddings'", h->name,
                       pfx);
    if (json_int(h, pfx, "original_max_position_embeddings", v, &c->yarn_orig_max_pos))
        return -1;
    if ((v = jget(rs, "factor"))) {
        if (json_float(h, pfx, "factor", v, &c->yarn_factor)) return -1;
    } else {
        // transformers 5 derives a missing factor from the context lengths.
        if (c->yarn_orig_max_pos <= 0)
            return k25_err(h->err, "%s: missing key '%sfactor'", h->name, pfx);
        c->yarn_factor = (float)((double)c->max_pos / c->yarn_orig_max_pos);
    }
    // Absent values: the defaults of the Hugging Face DeepseekV3 YaRN code.
    struct { const char *key; float *dst; float absent; } opt[] = {
        {"beta_fast", &c->yarn_beta_fast, 32.0f},
        {"beta_slow", &c->yarn_beta_slow, 1.0f},
        {"mscale", &c->yarn_mscale, 1.0f},
        {"mscale_all_dim", &c->yarn_mscale_all_dim, 0.0f},
    };
    for (int i = 0; i < 4; i++) {
        if (!(v = jget(rs, opt[i].key))) *opt[i].dst = opt[i].absent;
        else if (json_float(h, pfx, opt[i].key, v, opt[i].dst)) return -1;
    }
    // Variants of YaRN this decoder does not implement.
    if ((v = jget(rs, "truncate")) && !cJSON_IsTrue(v))
        return k25_err(h->err, "%s: key '%struncate': only true (floor/ceil of the correction "
                       "range) is supported", h->name, pfx);
    if ((v = jget(rs, "attention_factor")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return k25_err(h->err, "%s: key '%sattention_factor': only 1 is supported", h->name, pfx);
    if ((v = jget(rs, "partial_rotary_factor")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return k25_err(h->err, "%s: key '%spartial_rotary_factor': only 1 is supported", h->name,
                       pfx);
    return 0;
}

// Special tokens: text config first, then the wrapper's top level; absent keeps the value.
static int hf_tokens(hf_ctx *h, k25_config *c, const cJSON *tc, const cJSON *root) {
    const cJSON *v;
    const char *pfx;
#define HF_FIND(key) ((v = jget(tc, key)) ? (pfx = h->prefix, v) : (pfx = "", v = jget(root, key)))
    if (HF_FIND("bos_token_id") && json_int(h, pfx, "bos_token_id", v, &c->bos_id)) return -1;
    if (HF_FIND("pad_token_id") && json_int(h, pfx, "pad_token_id", v, &c->pad_id)) return -1;
    if (HF_FIND("eos_token_id")) {
        if (cJSON_IsArray(v)) {
            int n = cJSON_GetArraySize(v);
            if (n > K25_CFG_INTS_MAX)
                return hf_type_err(h, pfx, "eos_token_id", "at most 8 token ids");
            int ids[K25_CFG_INTS_MAX], i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                if (json_int(h, pfx, "eos_token_id", e, &ids[i++])) return -1;
            }
            memcpy(c->eos_ids, ids, sizeof(int) * (size_t)n);
            c->eos_ids_n = n;
        } else {
            if (json_int(h, pfx, "eos_token_id", v, &c->eos_ids[0])) return -1;
            c->eos_ids_n = 1;
        }
    }
#undef HF_FIND
    return 0;
}

// quantization_config: absent = BF16 experts; compressed-tensors pack-quantized symmetric
// INT4 group = INT4 routed experts; anything else is refused.
static int hf_quant(hf_ctx *h, k25_config *c, const cJSON *tc, const cJSON *root) {
    const char *pfx = h->prefix;
    const cJSON *q = jget(tc, "quantization_config");
    if (!q) q = jget(root, "quantization_config"), pfx = "";
    if (!q) {
        c->experts_int4 = 0;
        return 0;
    }
    char qp[128];
    snprintf(qp, sizeof qp, "%squantization_config.", pfx);
    if (!cJSON_IsObject(q)) return hf_type_err(h, pfx, "quantization_config", "an object");
    const cJSON *m = jget(q, "quant_method");
    if (!m) return k25_err(h->err, "%s: missing key '%squant_method'", h->name, qp);
    if (!cJSON_IsString(m)) return hf_type_err(h, qp, "quant_method", "a string");
    if (strcmp(m->valuestring, "compressed-tensors"))
        return k25_err(h->err,
                       "%s: key '%squant_method': quantization \"%s\" is not supported "
                       "(k25dec reads BF16 or compressed-tensors pack-quantized INT4 experts)",
                       h->name, qp, m->valuestring);
    const cJSON *fmt = jget(q, "format");
    if (fmt && !(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "pack-quantized")))
        return k25_err(h->err, "%s: key '%sformat': only \"pack-quantized\" is supported",
                       h->name, qp);
    const cJSON *groups = jget(q, "config_groups");
    if (!groups || !cJSON_IsObject(groups) || !groups->child)
        return k25_err(h->err, "%s: missing key '%sconfig_groups'", h->name, qp);
    int group_size = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) {
        char gp[256];
        snprintf(gp, sizeof gp, "%sconfig_groups.%s.", qp, g->string);
        const cJSON *w = jget(g, "weights");
        if (!w || !cJSON_IsObject(w))
            return k25_err(h->err, "%s: missing key '%sweights'", h->name, gp);
        const cJSON *bits = jget(w, "num_bits"), *ty = jget(w, "type"),
                    *sym = jget(w, "symmetric"), *st = jget(w, "strategy"),
                    *gs = jget(w, "group_size"), *act = jget(g, "input_activations");
        int ok = bits && cJSON_IsNumber(bits) && bits->valuedouble == 4 &&
                 (!ty || (cJSON_IsString(ty) && !strcmp(ty->valuestring, "int"))) && sym &&
                 cJSON_IsTrue(sym) && st && cJSON_IsString(st) &&
                 !strcmp(st->valuestring, "group") && !act;
        if (!ok)
            return k25_err(h->err,
                           "%s: key '%sweights': unsupported scheme (k25dec reads 4-bit "
                           "symmetric int weights with group strategy and 16-bit activations)",
                           h->name, gp);
        // Activation order (each column's group from weight_g_idx), blocks, dynamic scales and
        // quantized outputs change what the tensors mean: refused, not read as plain groups.
        const char *plain[] = {"actorder", "block_structure"};
        for (int i = 0; i < 2; i++)
            if (jget(w, plain[i]) && !cJSON_IsFalse(jget(w, plain[i]))) // false: none, as null
                return k25_err(h->err, "%s: key '%sweights.%s' is set: k25dec reads groups of "
                               "consecutive columns only (it must be null or false)", h->name,
                               gp, plain[i]);
        const cJSON *dyn = jget(w, "dynamic");
        if (dyn && !cJSON_IsFalse(dyn))
            return k25_err(h->err, "%s: key '%sweights.dynamic': only static scales (false) are "
                           "supported", h->name, gp);
        if (jget(g, "output_activations"))
            return k25_err(h->err, "%s: key '%soutput_activations': quantized outputs are not "
                           "supported (it must be null)", h->name, gp);
        int size;
        if (!gs) return k25_err(h->err, "%s: missing key '%sweights.group_size'", h->name, gp);
        char wp[300];
        snprintf(wp, sizeof wp, "%sweights.", gp);
        if (json_int(h, wp, "group_size", gs, &size)) return -1;
        if (group_size && size != group_size)
            return k25_err(h->err, "%s: key '%sgroup_size': groups disagree (%d vs %d)", h->name,
                           wp, size, group_size);
        group_size = size;
    }
    c->experts_int4 = 1;
    c->quant_group = group_size;
    return 0;
}

static int hf_load(k25_config *c, const char *json, size_t len, const char *name, char *err) {
    hf_ctx h = {.name = name, .prefix = "", .err = err};
    cJSON *root = json_parse_object(json, len, name, err);
    if (!root) return -1;
    int rc = -1;
    k25_config tmp = *c;  // left untouched on error
    const cJSON *tc = root;
    const cJSON *mt = jget(root, "model_type");
    const cJSON *text = jget(root, "text_config");
    int wrapper = (mt && cJSON_IsString(mt) && !strcmp(mt->valuestring, "kimi_k25")) || text;
    if (wrapper) {
        if (!text) {
            k25_err(err, "%s: missing key 'text_config'", name);
            goto done;
        }
        if (!cJSON_IsObject(text)) {
            hf_type_err(&h, "", "text_config", "an object");
            goto done;
        }
        tc = text;
        h.prefix = "text_config.";
    }
    // A draft head's config.json lacks the model's keys; say what it is rather than which key.
    const cJSON *arch = jget(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? arch->child : NULL;
    if (cJSON_IsString(a0) && !strncmp(a0->valuestring, "Eagle", 5)) {
        k25_err(err, "%s: %s is an EAGLE draft head, not a model: give its directory as "
                "--spec-draft eagle3:DIR", name, a0->valuestring);
        goto done;
    }
    const cJSON *tmt = jget(tc, "model_type");
    if (tmt && !(cJSON_IsString(tmt) && (!strcmp(tmt->valuestring, "deepseek_v3") ||
                                         !strcmp(tmt->valuestring, "kimi_k2")))) {
        k25_err(err, "%s: key '%smodel_type': \"%s\" is not supported (deepseek_v3 or kimi_k2)",
                name, h.prefix, cJSON_IsString(tmt) ? tmt->valuestring : "?");
        goto done;
    }
    if (hf_model(&h, &tmp, tc) || hf_rope(&h, &tmp, tc) || hf_tokens(&h, &tmp, tc, root) ||
        hf_quant(&h, &tmp, tc, root))
        goto done;
    *c = tmp;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int config_load_hf_json_string(k25_config *c, const char *json, size_t len, const char *name,
                               char *err) {
    return hf_load(c, json, len, name, err);
}

int config_load_hf_json(k25_config *c, const char *path, char *err) {
    size_t n;
    char *text = k25_read_file(path, &n, err);
    if (!text) return -1;
    int rc = hf_load(c, text, n, path, err);
    free(text);
    return rc;
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

static double yarn_get_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static int uses_yarn(const k25_config *c) { return !strcmp(c->rope_type, "yarn"); }

int config_validate(const k25_config *c, char *err) {
    struct { const char *key; int v; } pos[] = {
        {"model.hidden_size", c->hidden},
        {"model.num_hidden_layers", c->n_layers},
        {"model.intermediate_size", c->dense_inter},
        {"model.moe_intermediate_size", c->moe_inter},
        {"model.n_routed_experts", c->n_experts},
        {"model.num_experts_per_tok", c->top_k},
        {"model.n_group", c->n_group},
        {"model.topk_group", c->topk_group},
        {"model.num_attention_heads", c->n_heads},
        {"model.q_lora_rank", c->q_lora_rank},
        {"model.kv_lora_rank", c->kv_lora_rank},
        {"model.qk_nope_head_dim", c->qk_nope_dim},
        {"model.qk_rope_head_dim", c->qk_rope_dim},
        {"model.v_head_dim", c->v_head_dim},
        {"model.vocab_size", c->vocab},
        {"model.max_position_embeddings", c->max_pos},
        {"run.ctx_size", c->ctx_size},
        {"run.max_batch", c->max_batch},
        {"run.kv_block_size", c->kv_block},
        {"run.prefill_chunk", c->prefill_chunk},
        {"run.pp", c->pp},
    };
    // Bounded far above any real model so that products of dimensions stay inside int64 and
    // per-rank shapes inside int.
    const int dim_max = 1 << 24;
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        if (pos[i].v <= 0) return k25_err(err, "%s must be positive (is %d)", pos[i].key, pos[i].v);
        if (pos[i].v > dim_max)
            return k25_err(err, "%s = %d is too large (at most %d)", pos[i].key, pos[i].v, dim_max);
    }
    if ((int64_t)c->n_shared * c->moe_inter > dim_max)
        return k25_err(err, "model.n_shared_experts x model.moe_intermediate_size = %lld is too "
                            "large (at most %d)", (long long)c->n_shared * c->moe_inter, dim_max);
    // Every head's rows side by side (a query row's q_nope and q_pe, the attention's output,
    // the queries absorbed into the latent) are indexed in int: 129 heads x 2^24 rope dims
    // overflowed the last head's offset (a crash in a debug build)
    struct { const char *what; int64_t v; } per_heads[] = {
        {"(qk_nope_head_dim + qk_rope_head_dim)",
         (int64_t)c->n_heads * (c->qk_nope_dim + c->qk_rope_dim)},
        {"v_head_dim", (int64_t)c->n_heads * c->v_head_dim},
        {"kv_lora_rank", (int64_t)c->n_heads * c->kv_lora_rank},
    };
    for (size_t i = 0; i < sizeof per_heads / sizeof per_heads[0]; i++)
        if (per_heads[i].v > dim_max)
            return k25_err(err, "model.num_attention_heads x %s = %lld is too large (at most %d)",
                           per_heads[i].what, (long long)per_heads[i].v, dim_max);
    struct { const char *key; int v; } nonneg[] = {
        {"model.n_shared_experts", c->n_shared}, {"run.n_predict", c->n_predict},
        {"run.top_k", c->sample_top_k},          {"run.threads", c->threads},
        {"run.kv_cache_mb", c->kv_cache_mb},     {"run.tp", c->tp},
        {"run.sim_tp", c->sim_tp},               {"run.pp_async", c->pp_async},
        {"run.seed", c->seed},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++)
        if (nonneg[i].v < 0)
            return k25_err(err, "%s must not be negative (is %d)", nonneg[i].key, nonneg[i].v);
    if (c->pp_async > 1) return k25_err(err, "run.pp_async is 0 or 1 (is %d)", c->pp_async);
    if (c->threads > K25_CFG_THREADS_MAX)
        return k25_err(err, "run.threads = %d is too large (at most %d)", c->threads,
                       K25_CFG_THREADS_MAX);
    struct { const char *key; float v; } fpos[] = {
        {"model.routed_scaling_factor", c->routed_scale},
        {"model.rms_norm_eps", c->norm_eps},
        {"model.latent_norm_eps", c->latent_norm_eps},
        {"rope.rope_theta", c->rope_theta},
    };
    for (size_t i = 0; i < sizeof fpos / sizeof fpos[0]; i++)
        if (!(fpos[i].v > 0)) return k25_err(err, "%s must be positive (is %g)", fpos[i].key, fpos[i].v);

    if (c->first_dense < 0 || c->first_dense > c->n_layers)
        return k25_err(err,
                       "model.first_k_dense_replace (%d) must be between 0 and "
                       "num_hidden_layers (%d)",
                       c->first_dense, c->n_layers);
    if (c->top_k > c->n_experts)
        return k25_err(err, "model.num_experts_per_tok (%d) exceeds n_routed_experts (%d)",
                       c->top_k, c->n_experts);
    if (c->n_experts % c->n_group)
        return k25_err(err, "model.n_group (%d) does not divide n_routed_experts (%d)",
                       c->n_group, c->n_experts);
    if (c->topk_group > c->n_group)
        return k25_err(err, "model.topk_group (%d) exceeds n_group (%d)", c->topk_group,
                       c->n_group);
    if (c->top_k > c->n_experts / c->n_group * c->topk_group)
        return k25_err(err,
                       "model.num_experts_per_tok (%d) exceeds the %d experts of the topk_group "
                       "(%d) selected groups of %d",
                       c->top_k, c->n_experts / c->n_group * c->topk_group, c->topk_group,
                       c->n_experts / c->n_group);
    if (c->qk_rope_dim % 2)
        return k25_err(err, "model.qk_rope_head_dim (%d) must be even (rotated in pairs)",
                       c->qk_rope_dim);
    if (strcmp(c->scoring_func, "sigmoid"))
        return k25_err(err, "model.scoring_func \"%s\" is not supported (only \"sigmoid\")",
                       c->scoring_func);
    if (strcmp(c->topk_method, "noaux_tc"))
        return k25_err(err, "model.topk_method \"%s\" is not supported (only \"noaux_tc\")",
                       c->topk_method);

    if (uses_yarn(c)) {
        if (!(c->yarn_factor > 0))
            return k25_err(err, "rope.factor must be positive (is %g)", c->yarn_factor);
        if (c->yarn_orig_max_pos <= 0)
            return k25_err(err, "rope.original_max_position_embeddings must be positive (is %d)",
                           c->yarn_orig_max_pos);
        if (!(c->yarn_beta_fast > 0) || !(c->yarn_beta_slow > 0))
            return k25_err(err, "rope.beta_fast (%g) and rope.beta_slow (%g) must be positive",
                           c->yarn_beta_fast, c->yarn_beta_slow);
        // The HF code scales cos/sin by mscale(mscale) / mscale(mscale_all_dim); that factor
        // is 1 for every Kimi/DeepSeek checkpoint and is not implemented.
        double s = yarn_get_mscale(c->yarn_factor, c->yarn_mscale) /
                   yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
        if (fabs(s - 1.0) > 1e-6)
            return k25_err(err,
                           "rope.mscale (%g) and rope.mscale_all_dim (%g) give a cos/sin scale "
                           "of %g: not supported (they must give 1)",
                           c->yarn_mscale, c->yarn_mscale_all_dim, s);
        // The correction range divides by log(rope_theta): 1 makes every frequency NaN.
        if (c->rope_theta == 1)
            return k25_err(err, "rope.rope_theta must not be 1 with rope.type = yarn");
    } else if (strcmp(c->rope_type, "none")) {
        return k25_err(err, "rope.type \"%s\" is not supported (yarn or none)", c->rope_type);
    }

    if (c->experts_int4) {
        int g = c->quant_group;
        if (g <= 0) return k25_err(err, "quant.group_size must be positive (is %d)", g);
        struct { const char *key; int v; } div[] = {
            {"model.hidden_size", c->hidden},
            {"model.moe_intermediate_size", c->moe_inter},
            {"model.intermediate_size", c->dense_inter},
        };
        for (int i = 0; i < 3; i++)
            if (div[i].v % g)
                return k25_err(err, "%s (%d) is not a multiple of quant.group_size (%d)",
                               div[i].key, div[i].v, g);
        if (g % 8)
            return k25_err(err,
                           "quant.group_size (%d) must be a multiple of 8 (eight 4-bit values "
                           "per packed int32)",
                           g);
    }

    if (c->bos_id < -1 || c->bos_id >= c->vocab)
        return k25_err(err, "tokens.bos_token_id (%d) is outside the vocabulary (0..%d, or -1)",
                       c->bos_id, c->vocab - 1);
    if (c->pad_id < -1 || c->pad_id >= c->vocab)
        return k25_err(err, "tokens.pad_token_id (%d) is outside the vocabulary (0..%d, or -1)",
                       c->pad_id, c->vocab - 1);
    for (int i = 0; i < c->eos_ids_n; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab)
            return k25_err(err, "tokens.eos_token_ids: %d is outside the vocabulary (0..%d)",
                           c->eos_ids[i], c->vocab - 1);

    if (strcmp(c->backend, "cpu") && strcmp(c->backend, "cuda"))
        return k25_err(err, "run.backend \"%s\" is unknown (cpu or cuda)", c->backend);
    if (strcmp(c->kv_cache_dtype, "bf16") && strcmp(c->kv_cache_dtype, "f32"))
        return k25_err(err, "run.kv_cache_dtype \"%s\" is unknown (bf16 or f32)",
                       c->kv_cache_dtype);
    if (c->ctx_size > c->max_pos)
        return k25_err(err, "run.ctx_size (%d) exceeds model.max_position_embeddings (%d)",
                       c->ctx_size, c->max_pos);
    if (!(c->temp >= 0)) return k25_err(err, "run.temp must not be negative (is %g)", c->temp);
    if (!(c->sample_top_p > 0 && c->sample_top_p <= 1))
        return k25_err(err, "run.top_p must be in (0, 1] (is %g)", c->sample_top_p);
    if (c->pp > c->n_layers)
        return k25_err(err, "run.pp (%d) exceeds the %d layers", c->pp, c->n_layers);
    return 0;
}

int config_check_tp(const k25_config *c, int tp, char *err) {
    if (tp <= 0) return k25_err(err, "tensor-parallel size must be positive (is %d)", tp);
    if (c->n_heads % tp)
        return k25_err(err, "%d ranks cannot split %d attention heads evenly "
                       "(num_attention_heads=%d)", tp, c->n_heads, c->n_heads);
    if (c->experts_int4) {
        int64_t span = (int64_t)tp * c->quant_group;  // overflows int for large tp and groups
        if (c->moe_inter % span)
            return k25_err(err,
                           "%d ranks cannot split the expert width %d into whole INT4 groups of "
                           "%d (moe_intermediate_size=%d must be a multiple of tp*group_size=%lld)",
                           tp, c->moe_inter, c->quant_group, c->moe_inter, (long long)span);
    } else if (c->moe_inter % tp) {
        return k25_err(err, "%d ranks cannot split the expert width evenly "
                       "(moe_intermediate_size=%d)", tp, c->moe_inter);
    }
    if (c->dense_inter % tp)
        return k25_err(err, "%d ranks cannot split the dense MLP width evenly "
                       "(intermediate_size=%d)", tp, c->dense_inter);
    if ((c->n_shared * c->moe_inter) % tp)
        return k25_err(err, "%d ranks cannot split the shared-expert width evenly "
                       "(n_shared_experts*moe_intermediate_size=%d)", tp,
                       c->n_shared * c->moe_inter);
    if (c->vocab % tp)
        return k25_err(err, "%d ranks cannot split the vocabulary evenly (vocab_size=%d)", tp,
                       c->vocab);
    return 0;
}

// ------------------------------------------------------------------------------------------
// Dump
// ------------------------------------------------------------------------------------------

// Shortest decimal that reads back as the same float.
static void format_float(char *buf, size_t cap, float v) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

void config_dump(const k25_config *c, FILE *f) {
    k25_config *cc = (k25_config *)c;  // field accessors take non-const; nothing is written
    const char *section = "";
    fprintf(f, "; k25dec resolved configuration\n");
    for (int i = 0; i < N_CFG_KEYS; i++) {
        const cfg_key *k = &cfg_keys[i];
        if (strcmp(section, k->section)) {
            section = k->section;
            fprintf(f, "\n[%s]\n", section);
        }
        fprintf(f, "%s = ", k->key);
        char buf[64];
        switch (k->type) {
        case CT_INT: fprintf(f, "%d", *field_int(cc, k)); break;
        case CT_BOOL: fprintf(f, "%s", *field_int(cc, k) ? "true" : "false"); break;
        case CT_FLOAT:
            format_float(buf, sizeof buf, *field_float(cc, k));
            fputs(buf, f);
            break;
        case CT_STR: fputs(field_str(cc, k), f); break;
        case CT_INTS:
            for (int j = 0; j < *field_count(cc, k); j++)
                fprintf(f, "%s%d", j ? "," : "", field_int(cc, k)[j]);
            break;
        }
        fputc('\n', f);
    }
}

// ------------------------------------------------------------------------------------------
// Derived quantities
// ------------------------------------------------------------------------------------------

int config_is_moe_layer(const k25_config *c, int layer) { return layer >= c->first_dense; }

float config_softmax_scale(const k25_config *c) {
    double s = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    if (uses_yarn(c)) {
        double m = yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
        s *= m * m;
    }
    return (float)s;
}

// Rope dim index where `rotations` full turns fit in the original context.
static double yarn_corr_dim(double rotations, int dim, double base, int orig_max_pos) {
    return dim * log(orig_max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

void config_rope_inv_freq(const k25_config *c, float *inv_freq) {
    int dim = c->qk_rope_dim, half = dim / 2;
    double low = 0, high = 0;
    if (uses_yarn(c)) {
        low = floor(yarn_corr_dim(c->yarn_beta_fast, dim, c->rope_theta, c->yarn_orig_max_pos));
        high = ceil(yarn_corr_dim(c->yarn_beta_slow, dim, c->rope_theta, c->yarn_orig_max_pos));
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        double base = 1.0 / pow(c->rope_theta, (2.0 * i) / dim);
        if (!uses_yarn(c)) {
            inv_freq[i] = (float)base;
            continue;
        }
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        inv_freq[i] = (float)(base * (1 - ramp) + base / c->yarn_factor * ramp);
    }
}

const char *config_step_rows_source(const k25_config *c, int64_t rows, char *buf, size_t n) {
    if (rows == (int64_t)c->max_batch + c->prefill_chunk)
        snprintf(buf, n, "run.max_batch %d + run.prefill_chunk %d", c->max_batch,
                 c->prefill_chunk);
    else if (rows == c->prefill_chunk)
        snprintf(buf, n, "run.prefill_chunk %d", c->prefill_chunk);
    else if (rows == c->ctx_size)
        snprintf(buf, n, "run.ctx_size %d, below run.prefill_chunk", c->ctx_size);
    else
        snprintf(buf, n, "run.prefill_chunk %d and run.max_batch %d bound a step's rows",
                 c->prefill_chunk, c->max_batch);
    return buf;
}

int config_is_eos(const k25_config *c, int token) {
    for (int i = 0; i < c->eos_ids_n; i++)
        if (c->eos_ids[i] == token) return 1;
    return 0;
}
