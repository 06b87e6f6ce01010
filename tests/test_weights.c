// Weight planning and sources:
// - INT4 helpers against the compressed-tensors bit layout;
// - tensor-parallel slices (tp 1, 2, 4) of every tensor kind reassemble the tp = 1 global
//   tensor exactly once (split tensors) or repeat it (replicated ones), at the offsets of the
//   split table; dequantized expert slices match a dequantization computed here from the raw
//   words and scales;
// - synthetic values equal the generator formula and stay in range for the full-size model;
// - k25-mkckpt round trip: checkpoints written with seed S (K2.5 layout, plain layout with BF16
//   experts, single file) load through checkpoint_open to tensors bit-identical to the
//   synthetic source S, at tp 1 and 2, and their config.json reads back to the same model.
//
// Helper modes for the shell tests:
//   test_weights --check DIR SEED   open DIR, plan tp 1 and 2, compare with synthetic SEED
//   test_weights --load DIR         open DIR and plan tp 1 (prints the first error)
//   test_weights --verify DIR       check DIR against its CRC manifest
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "int4.h"
#include "synth.h"
#include "verify.h"
#include "weights.h"
#include "test_util.h"


#define MAX_RANKS 4

// ------------------------------------------------------------------------------------------
// helpers

// Every tensor of a plan in a fixed order (NONE ones included, so lists line up across tp).
static int list_tensors(const k25_weights *w, const k25_tensor **out, int cap) {
    int n = 0;
#define PUT(t) do { K25_CHECK(n < cap, "tensor list full"); out[n++] = &(t); } while (0)
    PUT(w->embed);
    PUT(w->final_norm);
    PUT(w->lm_head);
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        const k25_layer *L = &w->layers[l];
        PUT(L->attn_norm); PUT(L->q_a); PUT(L->q_a_norm); PUT(L->q_b); PUT(L->kv_a);
        PUT(L->kv_a_norm); PUT(L->kv_b); PUT(L->o_proj); PUT(L->ffn_norm); PUT(L->ffn_gate);
        PUT(L->ffn_up); PUT(L->ffn_down); PUT(L->router); PUT(L->router_bias);
        for (int e = 0; L->is_moe && e < w->cfg->n_experts; e++) {
            PUT(L->exp_gate[e].w); PUT(L->exp_gate[e].scale);
            PUT(L->exp_up[e].w); PUT(L->exp_up[e].scale);
            PUT(L->exp_down[e].w); PUT(L->exp_down[e].scale);
        }
    }
#undef PUT
    return n;
}

static uint8_t *read_all(const k25_tensor *t) {
    uint8_t *b = k25_malloc(tensor_bytes(t));
    tensor_read_rows(t, 0, t->rows, b);
    return b;
}

// Split table of weights.h: which tensors are sliced across tensor-parallel ranks.
static int is_split(const char *name) {
    static const char *split[] = {"q_b_proj", "kv_b_proj", "o_proj", "mlp.gate_proj",
                                  "mlp.up_proj", "mlp.down_proj", "shared_experts.",
                                  "mlp.experts.", "lm_head"};
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
        if (strstr(name, split[i])) return 1;
    return 0;
}

static int load_config(k25_config *c, const char *ini, char *err) {
    config_init_defaults(c);
    return config_load_ini(c, ini, err);
}

// ------------------------------------------------------------------------------------------
// INT4 helpers

static void test_int4(void) {
    // Every value in every nibble position round-trips; the layout is offset binary LSB-first.
    for (int pos = 0; pos < 8; pos++)
        for (int v = -8; v <= 7; v++) {
            int q[8] = {0};
            q[pos] = v;
            uint32_t w = int4_pack8(q);
            EXPECT(((w >> (4 * pos)) & 0xF) == (uint32_t)(v + 8), "nibble %d of %d", pos, v);
            for (int i = 0; i < 8; i++)
                EXPECT(int4_unpack(w, i) == (i == pos ? v : 0), "unpack %d/%d", pos, i);
        }
    int q[8] = {-8, 7, 0, 1, -1, 3, -5, 6};
    // u = q + 8 = {0,15,8,9,7,11,3,14}, nibble 0 lowest
    EXPECT(int4_pack8(q) == 0xe3b798f0u, "pack8 word %08x", int4_pack8(q));
    // Dequantization of a 64-wide row against W[k] = q[k] * scale[k/32].
    uint32_t packed[8];
    uint16_t scale[2] = {k25_f32_to_bf16(0.5f), k25_f32_to_bf16(-0.125f)};
    int ref[64];
    for (int k = 0; k < 64; k++) ref[k] = (k * 5 + 3) % 16 - 8;
    for (int j = 0; j < 8; j++) packed[j] = int4_pack8(&ref[8 * j]);
    float out[64];
    int4_dequant(packed, scale, 64, out);
    for (int k = 0; k < 64; k++) {
        float want = (float)ref[k] * (k < 32 ? 0.5f : -0.125f);
        EXPECT(out[k] == want, "dequant[%d] %g != %g", k, out[k], want);
        EXPECT(int4_dequant_at(packed, scale, k) == want, "dequant_at[%d]", k);
    }
}

// ------------------------------------------------------------------------------------------
// tensor-parallel slices

// Raw dequantization of global element (o, i) from the tp = 1 packed words and scales.
static float ref_dequant(const uint8_t *packed, const uint8_t *scale, int64_t in, int64_t group,
                         int64_t o, int64_t i) {
    uint32_t w;
    uint16_t s;
    memcpy(&w, packed + 4 * (o * (in / 8) + i / 8), 4);
    memcpy(&s, scale + 2 * (o * (in / group) + i / group), 2);
    int q = (int)((w >> (4 * (i % 8))) & 0xF) - 8;
    return (float)q * k25_bf16_to_f32(s);
}

static void check_experts(const k25_weights *g, const k25_weights *ranks, int tp) {
    const k25_config *c = g->cfg;
    for (int l = g->layer_begin; l < g->layer_end; l++) {
        if (!g->layers[l].is_moe) continue;
        for (int e = 0; e < c->n_experts; e += 5)
            for (int p = 0; p < 3; p++) {
                const k25_expert_w *G = p == 0 ? &g->layers[l].exp_gate[e]
                                        : p == 1 ? &g->layers[l].exp_up[e]
                                                 : &g->layers[l].exp_down[e];
                uint8_t *pw = read_all(&G->w), *ps = G->scale.kind ? read_all(&G->scale) : NULL;
                for (int r = 0; r < tp; r++) {
                    const k25_layer *L = &ranks[r].layers[l];
                    const k25_expert_w *X = p == 0 ? &L->exp_gate[e]
                                            : p == 1 ? &L->exp_up[e] : &L->exp_down[e];
                    int64_t Il = c->moe_inter / tp;
                    EXPECT(X->out == (p < 2 ? Il : c->hidden) && X->in == (p < 2 ? c->hidden : Il),
                          "%s: local shape %lldx%lld", X->w.name, (long long)X->out,
                          (long long)X->in);
                    int bad = 0;
                    for (int64_t o = 0; o < X->out && !bad; o++)
                        for (int64_t i = 0; i < X->in && !bad; i++) {
                            int64_t go = p < 2 ? r * Il + o : o, gi = p < 2 ? i : r * Il + i;
                            float want = ps ? ref_dequant(pw, ps, G->in, c->quant_group, go, gi)
                                            : expert_w_get(G, go, gi);
                            float got = expert_w_get(X, o, i);
                            if (got != want) {
                                bad = 1;
                                EXPECT(0, "%s tp %d rank %d (%lld, %lld): %g != %g", X->w.name, tp,
                                      r, (long long)o, (long long)i, got, want);
                            }
                        }
                }
                free(pw);
                free(ps);
            }
    }
}

// Slices of every tensor at tp reassemble the tp = 1 tensors.
static void check_tp(const k25_config *c, const k25_tensor_source *src, int tp) {
    char err[K25_ERR_LEN];
    k25_weights g, ranks[MAX_RANKS];
    if (weights_plan(&g, c, 0, 1, 0, c->n_layers, src, err)) {
        EXPECT(0, "tp 1 plan: %s", err);
        return;
    }
    for (int r = 0; r < tp; r++)
        if (weights_plan(&ranks[r], c, r, tp, 0, c->n_layers, src, err)) {
            EXPECT(0, "tp %d rank %d plan: %s", tp, r, err);
            return;
        }
    enum { CAP = 1 << 14 };
    static const k25_tensor *gl[CAP], *rl[MAX_RANKS][CAP];
    int n = list_tensors(&g, gl, CAP);
    for (int r = 0; r < tp; r++) EXPECT(list_tensors(&ranks[r], rl[r], CAP) == n, "list length");
    int checked = 0;
    for (int k = 0; k < n; k++) {
        const k25_tensor *G = gl[k];
        if (G->kind == K25_SRC_NONE) {
            for (int r = 0; r < tp; r++) EXPECT(rl[r][k]->kind == K25_SRC_NONE, "NONE differs");
            continue;
        }
        EXPECT(G->rows == G->g_rows && G->cols == G->g_cols && !G->row0 && !G->col0,
              "%s: tp 1 slice is not the whole tensor", G->name);
        const size_t es = k25_dtype_size(G->dtype);
        uint8_t *gb = read_all(G);
        uint8_t *cover = k25_calloc((size_t)(G->g_rows * G->g_cols), 1);
        // lm_head (k == 2) is split even when tied to the embedding's name.
        const int split = tp > 1 && (is_split(G->name) || k == 2);
        for (int r = 0; r < tp; r++) {
            const k25_tensor *T = rl[r][k];
            EXPECT(!strcmp(T->name, G->name) && T->dtype == G->dtype && T->g_rows == G->g_rows &&
                      T->g_cols == G->g_cols && T->kind == G->kind,
                  "%s: descriptor differs at tp %d rank %d", G->name, tp, r);
            EXPECT(split == (T->rows < T->g_rows || T->cols < T->g_cols),
                  "%s: %s at tp %d but the split table says %s", G->name,
                  split ? "replicated" : "split", tp, split ? "split" : "replicated");
            uint8_t *lb = read_all(T);
            int bad = 0;
            for (int64_t i = 0; i < T->rows; i++)
                for (int64_t j = 0; j < T->cols; j++) {
                    int64_t gi = (T->row0 + i) * G->g_cols + T->col0 + j;
                    cover[gi]++;
                    if (!bad && memcmp(lb + (size_t)(i * T->cols + j) * es, gb + (size_t)gi * es,
                                       es)) {
                        bad = 1;
                        EXPECT(0, "%s: tp %d rank %d element (%lld, %lld) differs", G->name, tp, r,
                              (long long)i, (long long)j);
                    }
                    if (!bad && ((i * 7 + j) % 97 == 0) &&
                        tensor_get_f32(T, i, j) != tensor_get_f32(G, T->row0 + i, T->col0 + j)) {
                        bad = 1;
                        EXPECT(0, "%s: tensor_get_f32 differs", G->name);
                    }
                }
            free(lb);
        }
        int want = split ? 1 : tp;
        for (int64_t i = 0; i < G->g_rows * G->g_cols; i++)
            if (cover[i] != want) {
                EXPECT(0, "%s: element %lld held %d times at tp %d (want %d)", G->name,
                      (long long)i, cover[i], tp, want);
                break;
            }
        free(cover);
        free(gb);
        checked++;
    }
    EXPECT(checked > 10, "only %d tensors checked", checked);
    check_experts(&g, ranks, tp);

    // Offsets of the split table at the last rank.
    const k25_weights *w = &ranks[tp - 1];
    const int r = tp - 1, Hl = c->n_heads / tp;
    const k25_layer *L0 = &w->layers[0], *L1 = &w->layers[c->first_dense];
    EXPECT(w->n_heads_local == Hl && w->vocab_local == c->vocab / tp &&
              w->vocab_begin == r * c->vocab / tp,
          "local sizes");
    EXPECT(L0->q_b.row0 == (int64_t)r * Hl * (c->qk_nope_dim + c->qk_rope_dim), "q_b row0");
    EXPECT(L0->kv_b.row0 == (int64_t)r * Hl * (c->qk_nope_dim + c->v_head_dim), "kv_b row0");
    EXPECT(L0->o_proj.col0 == (int64_t)r * Hl * c->v_head_dim, "o_proj col0");
    EXPECT(L0->ffn_down.col0 == (int64_t)r * c->dense_inter / tp, "dense down col0");
    EXPECT(w->lm_head.row0 == w->vocab_begin && w->lm_head.rows == w->vocab_local, "lm_head");
    if (c->first_dense < c->n_layers) {
        int64_t Il = c->moe_inter / tp;
        EXPECT(L1->exp_gate[1].w.row0 == r * Il && L1->exp_gate[1].w.rows == Il, "gate rows");
        if (c->experts_int4) {
            EXPECT(L1->exp_down[1].w.col0 == r * Il / 8 && L1->exp_down[1].w.cols == Il / 8,
                  "down packed cols");
            EXPECT(L1->exp_down[1].scale.col0 == r * Il / c->quant_group &&
                      L1->exp_down[1].scale.cols == Il / c->quant_group,
                  "down scale cols");
        } else {
            EXPECT(L1->exp_down[1].w.col0 == r * Il && L1->exp_down[1].scale.kind == K25_SRC_NONE,
                  "bf16 down cols");
        }
        EXPECT(L1->ffn_gate.rows == (int64_t)c->n_shared * c->moe_inter / tp, "shared rows");
    }
    weights_free(&g);
    for (int i = 0; i < tp; i++) weights_free(&ranks[i]);
}

// ------------------------------------------------------------------------------------------
// synthetic values

static void test_synth_values(void) {
    char err[K25_ERR_LEN];
    k25_config c;
    EXPECT(!load_config(&c, "config/tiny.ini", err), "%s", err);
    k25_tensor_source s7 = synth_source(7), s8 = synth_source(8);
    k25_weights a, b;
    EXPECT(!weights_plan(&a, &c, 0, 1, 0, c.n_layers, &s7, err), "%s", err);
    EXPECT(!weights_plan(&b, &c, 0, 1, 0, c.n_layers, &s8, err), "%s", err);
    // The generator formula, element by element, for a few tensors.
    const k25_tensor *ts[] = {&a.embed, &a.layers[1].q_b, &a.layers[1].router_bias,
                              &a.layers[2].exp_down[3].w, &a.layers[2].exp_down[3].scale,
                              &a.layers[0].kv_a_norm};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        const k25_tensor *t = ts[k];
        EXPECT(t->kind == K25_SRC_SYNTH && t->synth_seed == 7 &&
                  t->synth_id == k25_synth_id(t->name),
              "%s: synthetic descriptor", t->name);
        uint8_t *buf = read_all(t);
        for (int64_t i = 0; i < t->rows * t->cols; i += 13) {
            uint32_t want = k25_synth_bits(t->synth_kind, t->synth_exp, 7, k25_synth_id(t->name),
                                           (uint64_t)i), got = 0;
            memcpy(&got, buf + (size_t)i * k25_dtype_size(t->dtype), k25_dtype_size(t->dtype));
            EXPECT(got == want, "%s[%lld]: %08x != %08x", t->name, (long long)i, got, want);
        }
        free(buf);
    }
    EXPECT(a.layers[1].router_bias.dtype == K25_F32 && a.layers[1].router_bias.synth_kind ==
          K25_SYNTH_F32, "bias is F32");
    EXPECT(a.layers[0].attn_norm.synth_kind == K25_SYNTH_NORM, "norms use NORM");
    EXPECT(a.layers[1].exp_up[0].w.synth_kind == K25_SYNTH_INT4 &&
              a.layers[1].exp_up[0].scale.synth_kind == K25_SYNTH_SCALE, "INT4 kinds");
    // Another seed gives other values; the same seed the same ones.
    EXPECT(tensor_get_f32(&a.layers[1].q_a, 3, 5) != tensor_get_f32(&b.layers[1].q_a, 3, 5) ||
              tensor_get_f32(&a.layers[1].q_a, 4, 6) != tensor_get_f32(&b.layers[1].q_a, 4, 6),
          "seed ignored");
    weights_free(&a);
    weights_free(&b);

    // Full-size model: planning only fills descriptors (fast, small), magnitudes keep
    // activations finite: element std ~ 1/sqrt(fan-in), positive scales, exponents in range.
    config_init_defaults(&c);
    EXPECT(!config_check_tp(&c, 8, err), "%s", err);
    k25_weights f;
    double t0 = k25_now_ms();
    EXPECT(!weights_plan(&f, &c, 3, 8, 0, 3, &s7, err), "%s", err);
    EXPECT(k25_now_ms() - t0 < 5000, "planning took %.0f ms", k25_now_ms() - t0);
    const k25_layer *L = &f.layers[1];
    struct { const k25_tensor *t; double fan_in; } ws[] = {
        {&L->q_a, 7168}, {&L->q_b, 1536}, {&L->kv_b, 512}, {&L->o_proj, 8192},
        {&f.layers[0].ffn_down, 18432}, {&L->ffn_gate, 7168}, {&f.lm_head, 7168}};
    for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) {
        double s2 = 0;
        int n = 0;
        for (int64_t i = 0; i < 64; i++)
            for (int64_t j = 0; j < ws[k].t->cols; j += 7, n++) {
                double v = tensor_get_f32(ws[k].t, i, j);
                s2 += v * v;
            }
        double std = sqrt(s2 / n), want = 1 / sqrt(ws[k].fan_in);
        EXPECT(std > want / 1.6 && std < want * 1.6, "%s: std %g, want ~%g", ws[k].t->name, std,
              want);
    }
    double s2 = 0, smin = 1e9;
    int n = 0;
    for (int e = 0; e < 384; e += 37)
        for (int64_t o = 0; o < 8; o++)
            for (int64_t i = 0; i < 7168; i += 3, n++) {
                double v = expert_w_get(&L->exp_gate[e], o, i);
                s2 += v * v;
                double s = tensor_get_f32(&L->exp_gate[e].scale, o, i / 32);
                if (s < smin) smin = s;
            }
    EXPECT(sqrt(s2 / n) > 1 / sqrt(7168.0) / 1.6 && sqrt(s2 / n) < 1.6 / sqrt(7168.0),
          "expert std %g", sqrt(s2 / n));
    EXPECT(smin > 0, "scales must be positive (%g)", smin);
    s2 = 0;
    n = 0;
    for (int64_t j = 0; j < 7168; j++, n++) {
        double v = tensor_get_f32(&f.embed, 12345, j);
        s2 += v * v;
    }
    EXPECT(sqrt(s2 / n) > 0.5 && sqrt(s2 / n) < 2, "embedding std %g", sqrt(s2 / n));
    EXPECT(weights_bytes(&f) > ((size_t)1 << 30), "full-size slice bytes %zu", weights_bytes(&f));
    weights_free(&f);
}

// ------------------------------------------------------------------------------------------
// checkpoint round trip

// Opens dir, compares every tensor of tp 1 and 2 plans against synthetic `seed`. Returns 0
// when all are bit-identical (messages on stderr otherwise).
static int compare_checkpoint(const char *dir, uint64_t seed, const k25_config *expect_cfg) {
    char err[K25_ERR_LEN], path[4200];
    int before = test_failures;
    k25_checkpoint *ck = checkpoint_open(dir, err);
    if (!ck) {
        EXPECT(0, "%s", err);
        return -1;
    }
    k25_config c;
    config_init_defaults(&c);
    checkpoint_config_path(ck, path, sizeof path);
    if (config_load_hf_json(&c, path, err)) {
        EXPECT(0, "%s", err);
        checkpoint_close(ck);
        return -1;
    }
    if (expect_cfg) {
        const k25_config *e = expect_cfg;
        EXPECT(c.hidden == e->hidden && c.n_layers == e->n_layers &&
                  c.first_dense == e->first_dense && c.dense_inter == e->dense_inter &&
                  c.moe_inter == e->moe_inter && c.n_experts == e->n_experts &&
                  c.n_shared == e->n_shared && c.top_k == e->top_k && c.n_group == e->n_group &&
                  c.topk_group == e->topk_group && c.routed_scale == e->routed_scale &&
                  c.n_heads == e->n_heads && c.q_lora_rank == e->q_lora_rank &&
                  c.kv_lora_rank == e->kv_lora_rank && c.qk_nope_dim == e->qk_nope_dim &&
                  c.qk_rope_dim == e->qk_rope_dim && c.v_head_dim == e->v_head_dim &&
                  c.vocab == e->vocab && c.norm_eps == e->norm_eps &&
                  c.rope_theta == e->rope_theta && !strcmp(c.rope_type, e->rope_type) &&
                  c.yarn_factor == e->yarn_factor && c.yarn_orig_max_pos ==
                  e->yarn_orig_max_pos && c.yarn_beta_fast == e->yarn_beta_fast &&
                  c.yarn_mscale_all_dim == e->yarn_mscale_all_dim &&
                  c.experts_int4 == e->experts_int4 &&
                  (!c.experts_int4 || c.quant_group == e->quant_group) &&
                  c.bos_id == e->bos_id && c.eos_ids[0] == e->eos_ids[0] &&
                  c.eos_ids_n == e->eos_ids_n && c.tie_embeddings == e->tie_embeddings,
              "%s: config.json does not read back to the configuration it was written from",
              dir);
    }
    k25_tensor_source fs = checkpoint_source(ck), ss = synth_source(seed);
    for (int tp = 1; tp <= 2; tp++) {
        if (config_check_tp(&c, tp, err)) {
            EXPECT(0, "%s", err);
            continue;
        }
        for (int r = 0; r < tp; r++) {
            k25_weights wf, ws;
            if (weights_plan(&wf, &c, r, tp, 0, c.n_layers, &fs, err)) {
                EXPECT(0, "%s: %s", dir, err);
                continue;
            }
            EXPECT(!weights_plan(&ws, &c, r, tp, 0, c.n_layers, &ss, err), "%s", err);
            enum { CAP = 1 << 14 };
            static const k25_tensor *lf[CAP], *ls[CAP];
            int n = list_tensors(&wf, lf, CAP);
            EXPECT(n == list_tensors(&ws, ls, CAP), "tensor lists differ");
            int files = 0;
            for (int k = 0; k < n; k++) {
                if (lf[k]->kind == K25_SRC_NONE) continue;
                files += lf[k]->kind == K25_SRC_FILE;
                uint8_t *a = read_all(lf[k]), *b = read_all(ls[k]);
                EXPECT(tensor_bytes(lf[k]) == tensor_bytes(ls[k]) &&
                          !memcmp(a, b, tensor_bytes(lf[k])),
                      "%s: %s tp %d rank %d differs from the synthetic tensor", dir,
                      lf[k]->name, tp, r);
                free(a);
                free(b);
            }
            EXPECT(files > 10, "%s: only %d file tensors", dir, files);
            EXPECT(weights_bytes(&wf) == weights_bytes(&ws), "weights_bytes differ");
            weights_free(&wf);
            weights_free(&ws);
        }
    }
    checkpoint_close(ck);
    return test_failures == before ? 0 : -1;
}

static void test_roundtrip(void) {
    if (access("./k25-mkckpt", X_OK) != 0) {
        EXPECT(0, "./k25-mkckpt not built (run from the repository root after make)");
        return;
    }
    char tmp[] = "/tmp/k25-weights-XXXXXX";
    EXPECT(mkdtemp(tmp) != NULL, "mkdtemp");
    char err[K25_ERR_LEN], cmd[8192], dir[4200];
    struct {
        const char *name, *args;
        int bf16, tie;
    } runs[] = {
        {"k25", "--shards 5", 0, 0},
        {"plain", "--shards 3 --no-prefix --bf16-experts", 1, 0},
        {"single", "--single --set model.tie_word_embeddings=true", 0, 1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", tmp, runs[i].name);
        snprintf(cmd, sizeof cmd,
                 "./k25-mkckpt --config config/tiny.ini --synthetic 1234 --out %s %s 2>/dev/null",
                 dir, runs[i].args);
        if (system(cmd) != 0) {
            EXPECT(0, "failed: %s", cmd);
            continue;
        }
        k25_config c;
        EXPECT(!load_config(&c, "config/tiny.ini", err), "%s", err);
        c.experts_int4 = !runs[i].bf16;
        c.tie_embeddings = runs[i].tie;
        EXPECT(compare_checkpoint(dir, 1234, &c) == 0, "round trip %s", runs[i].name);
        EXPECT(verify_checkpoint(dir, err) == 0, "fresh checkpoint fails verification: %s", err);
        // The same files against another seed must differ (the comparison can fail).
        int before = test_failures;
        k25_checkpoint *ck = checkpoint_open(dir, err);
        EXPECT(ck != NULL, "%s", err);
        if (ck) {
            k25_tensor_source fs = checkpoint_source(ck), ss = synth_source(1235);
            k25_weights wf, ws;
            EXPECT(!weights_plan(&wf, &c, 0, 1, 0, c.n_layers, &fs, err), "%s", err);
            EXPECT(!weights_plan(&ws, &c, 0, 1, 0, c.n_layers, &ss, err), "%s", err);
            if (test_failures == before) {
                uint8_t *a = read_all(&wf.layers[1].q_b), *b = read_all(&ws.layers[1].q_b);
                EXPECT(memcmp(a, b, tensor_bytes(&wf.layers[1].q_b)), "seed does not matter");
                free(a);
                free(b);
                weights_free(&wf);
                weights_free(&ws);
            }
            // Names resolve with and without the wrapper prefix.
            int shard;
            EXPECT(checkpoint_find(ck, "model.norm.weight", &shard, NULL) != NULL, "lookup");
            EXPECT(checkpoint_find(ck, "model.nothing", &shard, err) == NULL &&
                      strstr(err, "model.nothing"), "missing tensor message: %s", err);
            checkpoint_close(ck);
        }
    }
    // An INT4 weight_shape that disagrees with the packed tensor's logical shape.
    snprintf(dir, sizeof dir, "%s/k25", tmp);
    const char *ws_name = "model.layers.1.mlp.experts.2.up_proj.weight_shape";
    k25_checkpoint *ck0 = checkpoint_open(dir, err);
    EXPECT(ck0 != NULL, "%s", err);
    if (ck0) {
        int shard;
        const st_tensor *t = checkpoint_find(ck0, ws_name, &shard, err);
        EXPECT(t && t->dtype == ST_I32 && t->numel == 2, "weight_shape tensor: %s", err);
        if (t) {
            int32_t v[2];
            memcpy(v, t->data, 8);
            EXPECT(v[0] == 128 && v[1] == 128, "weight_shape (%d, %d)", v[0], v[1]);
            off_t off = (off_t)(t->data - (const uint8_t *)ck0->shards[shard].map);
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, ck0->shard_names[shard]);
            checkpoint_close(ck0);
            FILE *f = fopen(path, "r+b");
            int32_t bad = 96;
            EXPECT(f && fseek(f, off + 4, SEEK_SET) == 0 && fwrite(&bad, 4, 1, f) == 1, "patch");
            if (f) fclose(f);
            k25_config c;
            load_config(&c, "config/tiny.ini", err);
            ck0 = checkpoint_open(dir, err);
            EXPECT(ck0 != NULL, "%s", err);
            if (ck0) {
                k25_tensor_source fs = checkpoint_source(ck0);
                k25_weights w;
                EXPECT(weights_plan(&w, &c, 0, 1, 0, c.n_layers, &fs, err) == -1 &&
                          strstr(err, ws_name) && strstr(err, "(128, 96), expected (128, 128)"),
                      "wrong weight_shape: %s", err);
            }
        }
        checkpoint_close(ck0);
    }
    // A configuration the checkpoint does not match: INT4 wanted, BF16 stored.
    snprintf(dir, sizeof dir, "%s/plain", tmp);
    k25_checkpoint *ck = checkpoint_open(dir, err);
    if (ck) {
        k25_config c;
        load_config(&c, "config/tiny.ini", err);
        k25_tensor_source fs = checkpoint_source(ck);
        k25_weights w;
        EXPECT(weights_plan(&w, &c, 0, 1, 0, c.n_layers, &fs, err) == -1 &&
                  strstr(err, "weight_packed") && strstr(err, "BF16"),
              "INT4 config on BF16 experts: %s", err);
        checkpoint_close(ck);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    EXPECT(system(cmd) == 0, "cleanup");
}

// ------------------------------------------------------------------------------------------

static int cli(int argc, char **argv) {
    char err[K25_ERR_LEN];
    if (argc == 3 && !strcmp(argv[1], "--verify")) {
        if (verify_checkpoint(argv[2], err)) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        printf("verified\n");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--load")) {
        k25_checkpoint *ck = checkpoint_open(argv[2], err);
        if (!ck) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        k25_config c;
        char path[4200];
        config_init_defaults(&c);
        checkpoint_config_path(ck, path, sizeof path);
        k25_tensor_source fs = checkpoint_source(ck);
        k25_weights w;
        int rc = config_load_hf_json(&c, path, err) ||
                 weights_plan(&w, &c, 0, 1, 0, c.n_layers, &fs, err);
        if (rc) fprintf(stderr, "error: %s\n", err);
        else weights_free(&w), printf("loaded\n");
        checkpoint_close(ck);
        return rc ? 1 : 0;
    }
    if (argc == 4 && !strcmp(argv[1], "--check")) {
        int rc = compare_checkpoint(argv[2], strtoull(argv[3], NULL, 0), NULL);
        if (!rc) printf("identical\n");
        return rc ? 1 : 0;
    }
    fprintf(stderr, "usage: test_weights [--check DIR SEED | --load DIR | --verify DIR]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc > 1) return cli(argc, argv);
    test_int4();
    char err[K25_ERR_LEN];
    const char *inis[] = {"config/tiny.ini", "config/tiny_group.ini"};
    for (int v = 0; v < 4; v++) {
        k25_config c;
        if (load_config(&c, inis[v == 3], err)) {
            EXPECT(0, "%s", err);
            continue;
        }
        if (v == 1) c.experts_int4 = 0;   // BF16 experts
        if (v == 2) c.tie_embeddings = 1; // lm_head = vocabulary slice of the embedding
        k25_tensor_source s = synth_source(99 + (uint64_t)v);
        for (int tp = 1; tp <= 4; tp *= 2) {
            if (config_check_tp(&c, tp, err)) {
                EXPECT(0, "%s", err);
                continue;
            }
            check_tp(&c, &s, tp);
        }
    }
    {
        k25_config c;
        config_init_defaults(&c);
        c.q_lora_rank = 0;
        k25_tensor_source s = synth_source(1);
        k25_weights w;
        EXPECT(weights_plan(&w, &c, 0, 1, 0, 1, &s, err) == -1 && strstr(err, "q_lora_rank"),
              "q_lora_rank 0: %s", err);
    }
    test_synth_values();
    test_roundtrip();
    if (test_failures) {
        fprintf(stderr, "test_weights: %d failure(s)\n", test_failures);
        return 1;
    }
    printf("test_weights: ok\n");
    return 0;
}
