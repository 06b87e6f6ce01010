// k25-mkckpt: writes a deterministic synthetic checkpoint of any configuration in the
// Kimi-K2.5 Hugging Face layout (sharded safetensors, index, config.json, CRC manifest), whose
// tensors are exactly the synthetic weights of the same seed; or adds a CRC manifest to an
// existing checkpoint directory.
//
//   k25-mkckpt (--config FILE.ini | --set section.key=value ...) --synthetic SEED --out DIR
//              [--shards N] [--bf16-experts] [--no-prefix] [--single]
//   k25-mkckpt --manifest DIR
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "checkpoint.h"
#include "config.h"
#include "progress.h"
#include "safetensors.h"
#include "verify.h"
#include "weights.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: k25-mkckpt (--config FILE.ini | --set section.key=value ...) --synthetic SEED\n"
            "                  --out DIR [--shards N] [--bf16-experts] [--no-prefix] [--single]\n"
            "       k25-mkckpt --manifest DIR\n"
            "Writes a synthetic checkpoint in the Kimi-K2.5 layout whose tensors equal the\n"
            "synthetic weights of SEED (k25dec --synthetic SEED), or (--manifest) writes the CRC-32\n"
            "manifest k25dec --verify checks. --set without --config changes the built-in\n"
            "Kimi-K2.5 configuration (full size: hundreds of GB unless the sizes are set small).\n"
            "  --shards N       number of safetensors shards (default 4)\n"
            "  --bf16-experts   BF16 routed experts, no quantization_config (DeepSeek-V3 style)\n"
            "  --no-prefix      tensor names without \"language_model.\" and a plain (kimi_k2)\n"
            "                   config.json instead of the K2.5 wrapper\n"
            "  --single         one model.safetensors without an index\n");
}

// ------------------------------------------------------------------------------------------
// the tensor list

enum { SRC_TENSOR, SRC_INTS, SRC_ZEROS };

typedef struct {
    char name[200];            // stored name
    st_dtype dtype;
    int ndim;
    int64_t shape[2];
    uint64_t bytes, begin;
    int src;                   // SRC_*
    const k25_tensor *t;       // SRC_TENSOR
    int32_t ints[2];           // SRC_INTS (weight_shape)
    int shard;
} entry;

typedef struct {
    entry *e;
    int n, cap;
    const char *prefix;
} entry_list;

static entry *push(entry_list *l, const char *canonical) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->e = realloc(l->e, sizeof(entry) * (size_t)l->cap);
        if (!l->e) K25_DIE("out of memory");
    }
    entry *e = &l->e[l->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s%s", l->prefix, canonical);
    return e;
}

static st_dtype st_of(k25_dtype d) {
    return d == K25_BF16 ? ST_BF16 : (d == K25_F32 ? ST_F32 : ST_I32);
}

// A planned tensor (tp = 1: the whole global tensor); vec: stored 1-D.
static void add(entry_list *l, const k25_tensor *t, int vec) {
    if (t->kind == K25_SRC_NONE) return;
    entry *e = push(l, t->name);
    e->dtype = st_of(t->dtype);
    e->src = SRC_TENSOR;
    e->t = t;
    e->ndim = vec ? 1 : 2;
    e->shape[0] = vec ? t->g_cols : t->g_rows;
    e->shape[1] = t->g_cols;
    e->bytes = (uint64_t)(t->g_rows * t->g_cols) * k25_dtype_size(t->dtype);
}

static void add_expert(entry_list *l, const k25_expert_w *x) {
    add(l, &x->w, 0);
    if (x->scale.kind == K25_SRC_NONE) return;
    add(l, &x->scale, 0);
    char name[160];
    size_t base = strlen(x->w.name) - strlen("_packed");
    snprintf(name, sizeof name, "%.*s_shape", (int)base, x->w.name);
    entry *e = push(l, name);
    e->dtype = ST_I32;
    e->src = SRC_INTS;
    e->ndim = 1;
    e->shape[0] = 2;
    e->ints[0] = (int32_t)x->out;
    e->ints[1] = (int32_t)x->in;
    e->bytes = 8;
}

static void collect(entry_list *l, const k25_weights *w, int vision) {
    const k25_config *c = w->cfg;
    add(l, &w->embed, 0);
    for (int li = 0; li < c->n_layers; li++) {
        const k25_layer *L = &w->layers[li];
        add(l, &L->attn_norm, 1);
        add(l, &L->q_a, 0);
        add(l, &L->q_a_norm, 1);
        add(l, &L->q_b, 0);
        add(l, &L->kv_a, 0);
        add(l, &L->kv_a_norm, 1);
        add(l, &L->kv_b, 0);
        add(l, &L->o_proj, 0);
        add(l, &L->ffn_norm, 1);
        if (L->is_moe) {
            add(l, &L->router, 0);
            add(l, &L->router_bias, 1);
        }
        add(l, &L->ffn_gate, 0);
        add(l, &L->ffn_up, 0);
        add(l, &L->ffn_down, 0);
        for (int e = 0; L->is_moe && e < c->n_experts; e++) {
            add_expert(l, &L->exp_gate[e]);
            add_expert(l, &L->exp_up[e]);
            add_expert(l, &L->exp_down[e]);
        }
    }
    add(l, &w->final_norm, 1);
    if (!c->tie_embeddings) add(l, &w->lm_head, 0);
    if (vision) {
        // The K2.5 wrapper also carries the vision tower; one tensor of a dtype the text model
        // never reads stands for it, so loaders are seen to skip it.
        entry *e = push(l, "");
        snprintf(e->name, sizeof e->name, "vision_tower.patch_embed.proj.weight");
        e->dtype = ST_F16;
        e->src = SRC_ZEROS;
        e->ndim = 2;
        e->shape[0] = 4;
        e->shape[1] = 8;
        e->bytes = 64;
    }
}

// Contiguous runs of tensors, balanced by bytes, no shard empty.
static void assign_shards(entry_list *l, int n_shards) {
    uint64_t total = 0, cum = 0;
    for (int i = 0; i < l->n; i++) total += l->e[i].bytes;
    int s = 0, in_s = 0;
    for (int i = 0; i < l->n; i++) {
        int want = total ? (int)((double)cum * n_shards / (double)total) : 0;
        if (want > n_shards - 1) want = n_shards - 1;
        int left = l->n - i, shards_after = n_shards - 1 - s;
        if (in_s > 0 && (want > s || left <= shards_after)) s++, in_s = 0;
        l->e[i].shard = s;
        in_s++;
        cum += l->e[i].bytes;
    }
}

// ------------------------------------------------------------------------------------------
// writing

static void shard_name(char *buf, size_t cap, int i, int n, int single) {
    if (single) snprintf(buf, cap, "%s", CKPT_SINGLE_FILE);
    else snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

static int write_shard(const char *path, entry **es, int n, uint8_t *buf, size_t buf_cap,
                       char *err) {
    // 4-byte dtypes first so every tensor starts aligned to its element size.
    uint64_t off = 0;
    st_out_tensor *ts = k25_malloc(sizeof(st_out_tensor) * (size_t)(n > 0 ? n : 1));
    int n_ts = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++)
            if ((st_dtype_bits(es[i]->dtype) >= 32) == (pass == 0)) {
                es[i]->begin = off;
                off += es[i]->bytes;
                ts[n_ts++] = (st_out_tensor){.name = es[i]->name, .dtype = es[i]->dtype,
                                             .ndim = es[i]->ndim, .shape = es[i]->shape,
                                             .begin = es[i]->begin, .end = off};
            }
    FILE *f = st_write_header(path, ts, n_ts, err);
    free(ts);
    if (!f) return -1;
    int rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int i = 0; i < n && !rc; i++) {
            const entry *e = es[i];
            if ((st_dtype_bits(e->dtype) >= 32) != (pass == 0)) continue;
            if (e->src == SRC_INTS) {
                rc = st_write_all(f, e->ints, 8, path, err);
                progress_update(8);
            } else if (e->src == SRC_ZEROS) {
                memset(buf, 0, e->bytes);
                rc = st_write_all(f, buf, e->bytes, path, err);
                progress_update(e->bytes);
            } else {
                const k25_tensor *t = e->t;
                size_t row = (size_t)t->cols * k25_dtype_size(t->dtype);
                int64_t step = (int64_t)(buf_cap / row);
                if (step < 1) step = 1;
                for (int64_t r = 0; r < t->rows && !rc; r += step) {
                    int64_t nr = t->rows - r < step ? t->rows - r : step;
                    tensor_read_rows(t, r, nr, buf);
                    rc = st_write_all(f, buf, (size_t)nr * row, path, err);
                    progress_update((uint64_t)nr * row);
                }
            }
        }
    if (fclose(f) != 0 && !rc) rc = k25_err(err, "%s: write error", path);
    return rc ? -1 : 0;
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(entry *const *)a)->name, (*(entry *const *)b)->name);
}

static int write_json(const char *path, cJSON *root, char *err) {
    char *text = cJSON_Print(root);
    if (!text) K25_DIE("out of memory printing %s", path);
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f) rc = k25_err(err, "%s: cannot create: %s", path, strerror(errno));
    else {
        rc = st_write_all(f, text, strlen(text), path, err) ||
             st_write_all(f, "\n", 1, path, err);
        if (fclose(f) != 0 && !rc) rc = k25_err(err, "%s: write error", path);
    }
    free(text);
    return rc ? -1 : 0;
}

static int write_index(const char *dir, entry_list *l, int n_shards, char *err) {
    entry **sorted = k25_malloc(sizeof(entry *) * (size_t)l->n);
    uint64_t total = 0;
    for (int i = 0; i < l->n; i++) sorted[i] = &l->e[i], total += l->e[i].bytes;
    qsort(sorted, (size_t)l->n, sizeof(entry *), cmp_entry_name);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    char name[64];
    for (int i = 0; i < l->n; i++) {
        shard_name(name, sizeof name, sorted[i]->shard, n_shards, 0);
        cJSON_AddStringToObject(wm, sorted[i]->name, name);
    }
    free(sorted);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX_FILE);
    int rc = write_json(path, root, err);
    cJSON_Delete(root);
    return rc;
}

// ------------------------------------------------------------------------------------------
// config.json

// Shortest decimal that reads back as the same float, as a raw JSON number.
static void add_float(cJSON *o, const char *key, float v) {
    char buf[48];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    cJSON_AddRawToObject(o, key, buf);
}

static cJSON *quant_config(const k25_config *c) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "format", "pack-quantized");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON *g = cJSON_AddObjectToObject(cJSON_AddObjectToObject(q, "config_groups"), "group_0");
    const char *targets[] = {"Linear"};
    cJSON_AddItemToObject(g, "targets", cJSON_CreateStringArray(targets, 1));
    cJSON_AddNullToObject(g, "input_activations");
    cJSON_AddNullToObject(g, "output_activations");
    cJSON *w = cJSON_AddObjectToObject(g, "weights");
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "int");
    cJSON_AddTrueToObject(w, "symmetric");
    cJSON_AddStringToObject(w, "strategy", "group");
    cJSON_AddNumberToObject(w, "group_size", c->quant_group);
    cJSON_AddFalseToObject(w, "dynamic");
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddNullToObject(w, "block_structure");
    cJSON_AddStringToObject(w, "observer", "minmax");
    const char *ignore[] = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
    cJSON_AddItemToObject(q, "ignore", cJSON_CreateStringArray(ignore, 4));
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    return q;
}

static cJSON *text_config(const k25_config *c) {
    cJSON *t = cJSON_CreateObject();
    const char *arch[] = {"DeepseekV3ForCausalLM"};
    cJSON_AddItemToObject(t, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(t, "model_type", "kimi_k2");
    struct { const char *k; int v; } ints[] = {
        {"hidden_size", c->hidden}, {"num_hidden_layers", c->n_layers},
        {"first_k_dense_replace", c->first_dense}, {"moe_layer_freq", 1},
        {"intermediate_size", c->dense_inter}, {"moe_intermediate_size", c->moe_inter},
        {"n_routed_experts", c->n_experts}, {"n_shared_experts", c->n_shared},
        {"num_experts_per_tok", c->top_k}, {"n_group", c->n_group},
        {"topk_group", c->topk_group}, {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_heads}, {"q_lora_rank", c->q_lora_rank},
        {"kv_lora_rank", c->kv_lora_rank}, {"qk_nope_head_dim", c->qk_nope_dim},
        {"qk_rope_head_dim", c->qk_rope_dim}, {"v_head_dim", c->v_head_dim},
        {"vocab_size", c->vocab}, {"max_position_embeddings", c->max_pos},
        {"num_nextn_predict_layers", 0}, {"bos_token_id", c->bos_id},
        {"pad_token_id", c->pad_id},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        cJSON_AddNumberToObject(t, ints[i].k, ints[i].v);
    if (c->eos_ids_n == 1) cJSON_AddNumberToObject(t, "eos_token_id", c->eos_ids[0]);
    else cJSON_AddItemToObject(t, "eos_token_id", cJSON_CreateIntArray(c->eos_ids, c->eos_ids_n));
    add_float(t, "routed_scaling_factor", c->routed_scale);
    cJSON_AddBoolToObject(t, "norm_topk_prob", c->norm_topk_prob);
    cJSON_AddStringToObject(t, "scoring_func", c->scoring_func);
    cJSON_AddStringToObject(t, "topk_method", c->topk_method);
    cJSON_AddStringToObject(t, "hidden_act", "silu");
    cJSON_AddFalseToObject(t, "attention_bias");
    add_float(t, "rms_norm_eps", c->norm_eps);
    cJSON_AddBoolToObject(t, "tie_word_embeddings", c->tie_embeddings);
    add_float(t, "rope_theta", c->rope_theta);
    if (!strcmp(c->rope_type, "yarn")) {
        cJSON *r = cJSON_AddObjectToObject(t, "rope_scaling");
        cJSON_AddStringToObject(r, "type", "yarn");
        add_float(r, "factor", c->yarn_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", c->yarn_orig_max_pos);
        add_float(r, "beta_fast", c->yarn_beta_fast);
        add_float(r, "beta_slow", c->yarn_beta_slow);
        add_float(r, "mscale", c->yarn_mscale);
        add_float(r, "mscale_all_dim", c->yarn_mscale_all_dim);
    } else {
        cJSON_AddNullToObject(t, "rope_scaling");
    }
    cJSON_AddStringToObject(t, "torch_dtype", "bfloat16");
    if (c->experts_int4) cJSON_AddItemToObject(t, "quantization_config", quant_config(c));
    return t;
}

static int write_config(const char *dir, const k25_config *c, int wrapper, char *err) {
    cJSON *root;
    if (wrapper) {
        root = cJSON_CreateObject();
        const char *arch[] = {"KimiK25ForConditionalGeneration"};
        cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(arch, 1));
        cJSON_AddStringToObject(root, "model_type", "kimi_k25");
        cJSON_AddItemToObject(root, "text_config", text_config(c));
    } else {
        root = text_config(c);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = write_json(path, root, err);
    cJSON_Delete(root);
    return rc;
}

// ------------------------------------------------------------------------------------------
// main

int main(int argc, char **argv) {
    k25_prog = "k25-mkckpt";
    char err[K25_ERR_LEN];
    const char *ini = NULL, *out = NULL, *manifest = NULL, *seed_s = NULL;
    const char *shards_s = NULL;
    int bf16 = 0, no_prefix = 0, single = 0, n_sets = 0;
    k25_config c;
    config_init_defaults(&c);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--config") && more) ini = argv[++i];
        else if (!strcmp(a, "--set") && more) ++i, n_sets++; // applied after --config
        else if (!strcmp(a, "--synthetic") && more) seed_s = argv[++i];
        else if (!strcmp(a, "--out") && more) out = argv[++i];
        else if (!strcmp(a, "--shards") && more) shards_s = argv[++i];
        else if (!strcmp(a, "--manifest") && more) manifest = argv[++i];
        else if (!strcmp(a, "--bf16-experts")) bf16 = 1;
        else if (!strcmp(a, "--no-prefix")) no_prefix = 1;
        else if (!strcmp(a, "--single")) single = 1;
        else {
            fprintf(stderr, "k25-mkckpt: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    const char *wrong = NULL;
    if (manifest && argc != 3) wrong = "--manifest DIR takes no other option";
    else if (manifest && !*manifest) wrong = "--manifest: the path is empty";
    else if (manifest) {
        if (verify_write_manifest(manifest, err)) K25_DIE("%s", err);
        fprintf(stderr, "k25-mkckpt: wrote %s/%s\n", manifest, VERIFY_MANIFEST);
        return 0;
    } else if (!ini && !n_sets) {
        wrong = "no model: give --config FILE.ini and/or --set section.key=value";
    } else if (!seed_s) {
        wrong = "missing --synthetic SEED";
    } else if (!out) {
        wrong = "missing --out DIR";
    } else if (single && shards_s) {
        wrong = "--single writes one file: it takes no --shards";
    } else if ((ini && !*ini) || !*out) {
        wrong = ini && !*ini ? "--config: the path is empty" : "--out: the path is empty";
    }
    if (wrong) {
        fprintf(stderr, "k25-mkckpt: error: %s\n", wrong);
        usage(stderr);
        return 2;
    }
    if (!shards_s) shards_s = "4";
    uint64_t seed;
    if (k25_parse_seed(seed_s, &seed))
        K25_DIE("--synthetic: '%s' is not a non-negative integer seed", seed_s);
    long n_shards;
    if (k25_parse_long(shards_s, 1, INT_MAX, &n_shards))
        K25_DIE("--shards: '%s' is not a positive integer", shards_s);
    int shards = single ? 1 : (int)n_shards;
    if (ini && config_load_ini(&c, ini, err)) K25_DIE("%s", err);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && i + 1 < argc && config_set(&c, argv[++i], err))
            K25_DIE("--set: %s", err);
    if (bf16) c.experts_int4 = 0;
    if (config_validate(&c, err)) K25_DIE("%s", err);
    if (config_check_tp(&c, 1, err)) K25_DIE("%s", err);

    k25_weights w;
    k25_tensor_source src = synth_source(seed);
    if (weights_plan(&w, &c, 0, 1, 0, c.n_layers, &src, err)) K25_DIE("%s", err);
    entry_list l = {.prefix = no_prefix ? "" : CKPT_PREFIX};
    collect(&l, &w, !no_prefix);
    if (shards > l.n) K25_DIE("--shards %d: more shards than the %d tensors", shards, l.n);
    assign_shards(&l, shards);
    if (checkpoint_dir_fresh(out, err)) K25_DIE("%s", err);

    uint64_t total = 0;
    for (int i = 0; i < l.n; i++) total += l.e[i].bytes;
    // A full-size model is hundreds of GB: better refused now than found out hours in.
    struct statvfs fs;
    if (statvfs(out, &fs) == 0 && (double)fs.f_bavail * (double)fs.f_frsize < (double)total)
        K25_DIE("%s: the checkpoint needs %.2f GB, the file system has %.2f GB free", out,
                (double)total / 1e9, (double)fs.f_bavail * (double)fs.f_frsize / 1e9);
    const size_t buf_cap = 16u << 20;
    uint8_t *buf = k25_malloc(buf_cap + 4096);
    entry **es = k25_malloc(sizeof(entry *) * (size_t)l.n);
    progress_begin("writing checkpoint", total);
    for (int s = 0; s < shards; s++) {
        int n = 0;
        for (int i = 0; i < l.n; i++)
            if (l.e[i].shard == s) es[n++] = &l.e[i];
        char name[64], path[4200];
        shard_name(name, sizeof name, s, shards, single);
        snprintf(path, sizeof path, "%s/%s", out, name);
        // A row wider than the buffer still fits: tensor_read_rows writes whole rows.
        size_t widest = 0;
        for (int i = 0; i < n; i++)
            if (es[i]->src == SRC_TENSOR) {
                size_t row = (size_t)es[i]->t->cols * k25_dtype_size(es[i]->t->dtype);
                if (row > widest) widest = row;
            }
        if (widest > buf_cap) {
            free(buf);
            buf = k25_malloc(widest);
        }
        if (write_shard(path, es, n, buf, widest > buf_cap ? widest : buf_cap, err))
            K25_DIE("%s", err);
    }
    progress_end();
    free(es);
    free(buf);
    if (!single && write_index(out, &l, shards, err)) K25_DIE("%s", err);
    if (write_config(out, &c, !no_prefix, err)) K25_DIE("%s", err);
    if (verify_write_manifest(out, err)) K25_DIE("%s", err);
    fprintf(stderr, "k25-mkckpt: wrote %s: %d tensors, %.3f GB in %d shard%s (seed %llu)\n", out,
            l.n, (double)total / 1e9, shards, shards == 1 ? "" : "s", (unsigned long long)seed);
    free(l.e);
    weights_free(&w);
    return 0;
}
