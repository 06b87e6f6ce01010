// Model and run configuration: one struct generated from config.def, filled from (in order of
// precedence, lowest first) built-in defaults (the real Kimi-K2.5), a .ini file or a
// checkpoint's config.json, then --set section.key=value overrides.
#pragma once
#include "common.h"

#define K25_CFG_STR_LEN 256
#define K25_CFG_INTS_MAX 8
// run.threads and --threads: far above any node's cores; a larger count fails inside the OpenMP
// runtime (a crash or an abort naming no setting) rather than here.
#define K25_CFG_THREADS_MAX 4096

typedef struct k25_config {
#define K25_CFG_INT(f) int f;
#define K25_CFG_FLOAT(f) float f;
#define K25_CFG_BOOL(f) int f;
#define K25_CFG_STR(f) char f[K25_CFG_STR_LEN];
#define K25_CFG_INTS(f) int f[K25_CFG_INTS_MAX]; int f##_n;
#define K25_CFG(section, key, type, field, def) K25_CFG_##type(field)
#include "config.def"
#undef K25_CFG
#undef K25_CFG_INT
#undef K25_CFG_FLOAT
#undef K25_CFG_BOOL
#undef K25_CFG_STR
#undef K25_CFG_INTS
} k25_config;

#ifdef __cplusplus
extern "C" {
#endif

// Built-in defaults (Kimi-K2.5).
void config_init_defaults(k25_config *c);
// Each returns 0, or -1 with a message naming the file / line / key in err.
int config_load_ini(k25_config *c, const char *path, char *err);
int config_load_ini_string(k25_config *c, const char *text, const char *name, char *err);
// A Hugging Face config.json: the K2.5 wrapper (text_config) or a plain DeepseekV3 / kimi_k2
// config. Also reads quantization_config (INT4 routed experts or not).
int config_load_hf_json(k25_config *c, const char *path, char *err);
// The same for text in memory (len bytes, no NUL needed); messages name it `name`.
int config_load_hf_json_string(k25_config *c, const char *json, size_t len, const char *name,
                               char *err);
// "section.key=value"
int config_set(k25_config *c, const char *assignment, char *err);
// Consistency of the values (positive dims, divisibility by the quant group, top_k <= experts,
// n_group divides experts, ...).
int config_validate(const k25_config *c, char *err);
// Rank-count checks for tensor parallelism: heads, expert width / group, dense width, vocab.
int config_check_tp(const k25_config *c, int tp, char *err);
// Writes the resolved configuration as a loadable .ini.
void config_dump(const k25_config *c, FILE *f);

// Derived quantities.
int config_is_moe_layer(const k25_config *c, int layer);   // layer >= first_dense
float config_softmax_scale(const k25_config *c);            // (qk_nope+qk_rope)^-0.5 * mscale^2
// YaRN inverse frequencies for the rope dims: inv_freq[qk_rope_dim/2].
void config_rope_inv_freq(const k25_config *c, float *inv_freq);
int config_is_eos(const k25_config *c, int token);
// Which settings make a step of `rows` rows, for messages: "run.prefill_chunk 512",
// "run.max_batch 16 + run.prefill_chunk 512", ... (buf of n bytes; returns buf).
const char *config_step_rows_source(const k25_config *c, int64_t rows, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
