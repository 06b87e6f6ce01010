// The CPU reference backend: every operation of backend.h in plain C, float32 activations,
// weights kept in their stored format (bf16, int32-packed INT4 + bf16 scales, f32) and widened
// to float one row at a time. Dot products accumulate in double so that the reference is as
// close to exact as cheap arithmetic allows: it is the oracle the CUDA kernels are checked
// against. OpenMP splits matmuls over output rows, attention over (row, head) pairs, the MoE
// over each expert's output rows. Collectives are MPI on host memory (dist.h).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "bench_routing.h"
#include "backend.h"
#include "int4.h"
#include "pipeline.h"
#include "sampler.h"

// ------------------------------------------------------------------------------------------
// State
// ------------------------------------------------------------------------------------------

typedef struct cpu_impl {
    int threads;
    size_t mem_now, mem_peak;   // bytes from alloc() and materialized weights

    // the current batch (copied by set_batch)
    int T, max_seqs, max_blocks;
    int32_t *tokens, *pos, *seq; // [T]
    int32_t *block_table;        // [max_seqs * max_blocks]
    int cap_rows, cap_table;

    // paged latent cache: [n_layers][n_blocks * kv_block][kv_lora + rope]
    float *cache;
    int n_layers, n_blocks, kv_block, kv_width;

    float *inv_freq;             // [rope/2] YaRN inverse frequencies
    float softmax_scale;

    // MoE scratch, grown on demand
    float *moe_act;              // [pairs][I_e_local]
    float *moe_y;                // [T * top_k][D]
    int32_t *moe_pairs;          // [T * top_k] (t*top_k + k) grouped by expert
    size_t moe_act_cap, moe_y_cap, moe_pairs_cap;

    k25_weights *w;              // what load_weights materialized (freed by destroy)
} cpu_impl;

static cpu_impl *impl_of(k25_backend *be) { return (cpu_impl *)be->impl; }

// ------------------------------------------------------------------------------------------
// Memory (host; a size header keeps the byte count for mem_peak)
// ------------------------------------------------------------------------------------------

#define CPU_HDR 64 // keeps the payload 64-byte aligned relative to the block

static void mem_account(cpu_impl *c, size_t add, size_t sub) {
    c->mem_now += add;
    c->mem_now -= sub;
    if (c->mem_now > c->mem_peak) c->mem_peak = c->mem_now;
}

#define HOST_FITS_ADVICE "use the cuda backend, more nodes, a smaller model or a shorter context"

// Dies, naming what and the sizes, when holding `add` more bytes would take this node's ranks
// (each assumed to hold as much as this one: tensor-parallel shards are equal) past the node's
// memory: the kernel would otherwise kill a rank mid-load with no message.
// advice: what the user can change.
static void check_host_fits(k25_backend *be, size_t add, const char *what, const char *advice) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    size_t held = impl_of(be)->mem_now;
    int local = be->dist && be->dist->local_size > 0 ? be->dist->local_size : 1;
    const char *limit_name;
    size_t limit = k25_host_mem_limit(&limit_name);
    if ((double)(held + add) * local <= (double)limit) return;
    K25_DIE("the cpu backend cannot hold %s in host memory: %.2f GiB more on this rank (which "
            "holds %.2f GiB), x %d rank%s on this node = %.2f GiB, more than the node's %.2f "
            "GiB (%s); %s", what, add / GiB, held / GiB, local, local > 1 ? "s" : "",
            (double)(held + add) * local / GiB, limit / GiB, limit_name, advice);
}

static void *cpu_alloc(k25_backend *be, size_t bytes) {
    // a buffer whose size a setting decides (k25_alloc_purpose): checked against the node first,
    // and named by that setting
    const char *why = k25_alloc_purpose_now();
    if (why) check_host_fits(be, bytes, why, "lower the setting it names");
    char *p = k25_calloc(1, bytes + CPU_HDR);
    memcpy(p, &bytes, sizeof bytes);
    mem_account(impl_of(be), bytes, 0);
    return p + CPU_HDR;
}

static void cpu_free(k25_backend *be, void *ptr) {
    if (!ptr) return;
    char *p = (char *)ptr - CPU_HDR;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    mem_account(impl_of(be), 0, bytes);
    free(p);
}

static void cpu_copy(k25_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_sync(k25_backend *be) { (void)be; }
static size_t cpu_mem_peak(k25_backend *be) { return impl_of(be)->mem_peak; }

// ------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------

static void materialize(k25_backend *be, k25_tensor *t) {
    if (t->kind == K25_SRC_NONE || t->dev) return;
    t->dev_bytes = tensor_bytes(t);
    t->dev = cpu_alloc(be, t->dev_bytes);
    tensor_read_rows(t, 0, t->rows, t->dev);
}

static void release(k25_backend *be, k25_tensor *t) {
    if (!t->dev) return;
    cpu_free(be, t->dev);
    t->dev = NULL;
    t->dev_bytes = 0;
}

// Every tensor of w except the embedding, which stays where its source keeps it (an mmap'd
// shard or the generator) and is read a row at a time.
static void for_each_tensor(k25_backend *be, k25_weights *w,
                            void (*fn)(k25_backend *, k25_tensor *)) {
    fn(be, &w->final_norm);
    fn(be, &w->lm_head);
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        k25_layer *L = &w->layers[l];
        k25_tensor *ts[] = {&L->attn_norm, &L->q_a,      &L->q_a_norm, &L->q_b,
                            &L->kv_a,      &L->kv_a_norm, &L->kv_b,    &L->o_proj,
                            &L->ffn_norm,  &L->ffn_gate, &L->ffn_up,   &L->ffn_down,
                            &L->router,    &L->router_bias};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) fn(be, ts[i]);
        if (!L->is_moe || !L->exp_gate) continue;
        for (int e = 0; e < w->cfg->n_experts; e++) {
            k25_expert_w *ew[] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            for (int j = 0; j < 3; j++) {
                fn(be, &ew[j]->w);
                fn(be, &ew[j]->scale);
            }
        }
    }
}

static void cpu_load_weights(k25_backend *be, k25_weights *w) {
    impl_of(be)->w = w;
    size_t embed = w->embed.kind != K25_SRC_NONE ? tensor_bytes(&w->embed) : 0;
    check_host_fits(be, weights_bytes(w) - embed, "this rank's weights", HOST_FITS_ADVICE);
    for_each_tensor(be, w, materialize);
}

// Row n of a 2-D tensor (bf16 or f32) as float.
static const float *row_f32(const k25_tensor *W, int64_t n, float *buf) {
    if (W->dtype == K25_F32) return (const float *)W->dev + n * W->cols;
    if (W->dtype != K25_BF16) K25_DIE("%s: dtype %s is not a float matrix", W->name,
                                      k25_dtype_name(W->dtype));
    const uint16_t *src = (const uint16_t *)W->dev + n * W->cols;
    for (int64_t k = 0; k < W->cols; k++) buf[k] = k25_bf16_to_f32(src[k]);
    return buf;
}

// A 1-D tensor (norm weight, bias) as float into buf[n].
static void vec_f32(const k25_tensor *v, int64_t n, float *buf) {
    if (v->rows * v->cols != n)
        K25_DIE("%s: %lld elements, expected %lld", v->name, (long long)(v->rows * v->cols),
                (long long)n);
    if (!v->dev) K25_DIE("%s: not loaded", v->name);
    for (int64_t i = 0; i < n; i++)
        buf[i] = v->dtype == K25_F32 ? ((const float *)v->dev)[i]
                                     : k25_bf16_to_f32(((const uint16_t *)v->dev)[i]);
}

// Dequantized row o of a routed-expert projection (local logical [out][in]).
static void expert_row(const k25_expert_w *e, int group, int64_t o, float *out) {
    if (e->scale.kind == K25_SRC_NONE) {
        const float *r = row_f32(&e->w, o, out);
        if (r != out) memcpy(out, r, sizeof(float) * (size_t)e->in);
        return;
    }
    const uint32_t *packed = (const uint32_t *)e->w.dev + o * e->w.cols;
    const uint16_t *scale = (const uint16_t *)e->scale.dev + o * e->scale.cols;
    for (int64_t i = 0; i < e->in; i++)
        out[i] = (float)int4_unpack(packed[i / 8], (int)(i & 7)) *
                 k25_bf16_to_f32(scale[i / group]);
}

// ------------------------------------------------------------------------------------------
// Arithmetic helpers
// ------------------------------------------------------------------------------------------

static double dot(const float *a, const float *b, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static float silu(float z) { return z / (1.0f + expf(-z)); }

// out[n] = x[n] / rms(x) * w[n]
static void rmsnorm_row(const float *x, const float *w, float eps, int n, float *out) {
    double ss = dot(x, x, n);
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

// Rotates interleaved pairs (x[2i], x[2i+1]) by pos * inv_freq[i]. The angle is rounded to
// float as the reference implementations compute it (float32 positions times inv_freq).
static void rope_row(float *x, const float *inv_freq, int dim, int pos) {
    for (int i = 0; i < dim / 2; i++) {
        float ang = (float)pos * inv_freq[i];
        double c = cos((double)ang), s = sin((double)ang);
        double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = (float)(a * c - b * s);
        x[2 * i + 1] = (float)(a * s + b * c);
    }
}

// ------------------------------------------------------------------------------------------
// Batch and cache
// ------------------------------------------------------------------------------------------

static void cpu_kv_init(k25_backend *be, int n_layers, int n_blocks, int kv_block) {
    cpu_impl *c = impl_of(be);
    cpu_free(be, c->cache);
    c->n_layers = n_layers;
    c->n_blocks = n_blocks;
    c->kv_block = kv_block;
    c->kv_width = be->cfg->kv_lora_rank + be->cfg->qk_rope_dim;
    size_t bytes = sizeof(float) * (size_t)n_layers * n_blocks * kv_block * c->kv_width;
    check_host_fits(be, bytes, "the latent cache", HOST_FITS_ADVICE);
    c->cache = cpu_alloc(be, bytes);
}

static void cpu_set_batch(k25_backend *be, const k25_batch *b) {
    cpu_impl *c = impl_of(be);
    if (b->T > c->cap_rows) {
        c->cap_rows = b->T;
        free(c->tokens);
        free(c->pos);
        free(c->seq);
        c->tokens = k25_malloc(sizeof(int32_t) * (size_t)b->T);
        c->pos = k25_malloc(sizeof(int32_t) * (size_t)b->T);
        c->seq = k25_malloc(sizeof(int32_t) * (size_t)b->T);
    }
    int table = b->max_seqs * b->max_blocks_per_seq;
    if (table > c->cap_table) {
        c->cap_table = table;
        free(c->block_table);
        c->block_table = k25_malloc(sizeof(int32_t) * (size_t)table);
    }
    c->T = b->T;
    c->max_seqs = b->max_seqs;
    c->max_blocks = b->max_blocks_per_seq;
    memcpy(c->tokens, b->tokens, sizeof(int32_t) * (size_t)b->T);
    memcpy(c->pos, b->pos, sizeof(int32_t) * (size_t)b->T);
    memcpy(c->seq, b->seq, sizeof(int32_t) * (size_t)b->T);
    if (table) memcpy(c->block_table, b->block_table, sizeof(int32_t) * (size_t)table);
}

// Cache entry of (sequence s, position p) in local layer `layer`: [kv_lora + rope].
static float *cache_slot(cpu_impl *c, int layer, int s, int p) {
    if (s < 0 || s >= c->max_seqs || p < 0 || p >= c->max_blocks * c->kv_block)
        K25_DIE("cache: sequence %d position %d outside the block table (%d seqs x %d blocks "
                "of %d)", s, p, c->max_seqs, c->max_blocks, c->kv_block);
    int blk = c->block_table[(size_t)s * c->max_blocks + p / c->kv_block];
    if (blk < 0 || blk >= c->n_blocks)
        K25_DIE("cache: sequence %d position %d maps to block %d (have %d)", s, p, blk,
                c->n_blocks);
    size_t tok = (size_t)blk * c->kv_block + p % c->kv_block;
    return c->cache + ((size_t)layer * c->n_blocks * c->kv_block + tok) * c->kv_width;
}

// ------------------------------------------------------------------------------------------
// Operations
// ------------------------------------------------------------------------------------------

static void cpu_embed(k25_backend *be, const k25_tensor *emb, float *x) {
    cpu_impl *c = impl_of(be);
    int64_t D = emb->cols;
    uint16_t *row = k25_malloc(sizeof(uint16_t) * (size_t)D);
    for (int t = 0; t < c->T; t++) {
        int tok = c->tokens[t];
        if (tok < 0 || tok >= emb->rows)
            K25_DIE("token id %d outside the vocabulary (0..%lld)", tok, (long long)emb->rows - 1);
        if (emb->dtype == K25_F32) {
            tensor_read_rows(emb, tok, 1, x + (size_t)t * D);
            continue;
        }
        tensor_read_rows(emb, tok, 1, row);
        for (int64_t i = 0; i < D; i++) x[(size_t)t * D + i] = k25_bf16_to_f32(row[i]);
    }
    free(row);
}

static void cpu_rmsnorm(k25_backend *be, const float *x, int ld, const k25_tensor *w, float eps,
                        int T, int n, float *out) {
    float *wv = k25_malloc(sizeof(float) * (size_t)n);
    vec_f32(w, n, wv);
#pragma omp parallel for num_threads(impl_of(be)->threads) if (T > 1)
    for (int t = 0; t < T; t++) rmsnorm_row(x + (size_t)t * ld, wv, eps, n, out + (size_t)t * n);
    free(wv);
}

static void cpu_add_rmsnorm(k25_backend *be, float *h, const float *d, const k25_tensor *w,
                            float eps, int T, int n, float *out) {
    for (size_t i = 0; i < (size_t)T * n; i++) h[i] += d[i];
    cpu_rmsnorm(be, h, n, w, eps, T, n, out);
}

static void cpu_matmul(k25_backend *be, const float *x, const k25_tensor *W, int T, float *y) {
    int64_t N = W->rows, K = W->cols;
    if (!W->dev) K25_DIE("%s: not loaded", W->name);
#pragma omp parallel num_threads(impl_of(be)->threads)
    {
        float *buf = k25_malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *wr = row_f32(W, n, buf);
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = (float)dot(x + (size_t)t * K, wr, K);
        }
        free(buf);
    }
}

static void cpu_matmul2(k25_backend *be, const float *x, const k25_tensor *W1,
                        const k25_tensor *W2, int T, float *y1, float *y2) {
    cpu_matmul(be, x, W1, T, y1);
    cpu_matmul(be, x, W2, T, y2);
}

static void cpu_silu_mul(k25_backend *be, const float *gate, const float *up, int T, int n,
                         float *out) {
    (void)be;
    for (size_t i = 0; i < (size_t)T * n; i++) out[i] = silu(gate[i]) * up[i];
}

static void cpu_add(k25_backend *be, float *y, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

// Absorbed MLA (../shared/KIMI_K25.md §4.5). Phase 1 writes every row's normalized latent and
// rotated k_pe into the cache, so that phase 2 sees the rows of the same sequence that precede
// it in this step (causal prefill). Phase 2, per (row, head):
//   q_abs = W_UK^T q_nope; s_j = (q_abs . c_j + q_pe . kpe_j) * scale for j <= pos;
//   o_lat = sum_j softmax(s)_j c_j; out = W_UV o_lat.
static void cpu_mla_attention(k25_backend *be, int layer, const k25_layer *L, float *q, float *kv,
                              float *out) {
    cpu_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    int T = c->T, R = cfg->kv_lora_rank, dr = cfg->qk_rope_dim, dn = cfg->qk_nope_dim;
    int dv = cfg->v_head_dim, dq = dn + dr, kvw = R + dr;
    int H = (int)(L->q_b.rows / dq);
    if (layer < 0 || layer >= c->n_layers) K25_DIE("mla: cache layer %d of %d", layer, c->n_layers);
    if (L->kv_b.rows != (int64_t)H * (dn + dv) || L->kv_b.cols != R)
        K25_DIE("%s: shape %lldx%lld, expected %dx%d", L->kv_b.name, (long long)L->kv_b.rows,
                (long long)L->kv_b.cols, H * (dn + dv), R);

    float *nw = k25_malloc(sizeof(float) * (size_t)R);
    vec_f32(&L->kv_a_norm, R, nw);
    int max_len = 0;
    for (int t = 0; t < T; t++) {
        float *slot = cache_slot(c, layer, c->seq[t], c->pos[t]);
        const float *row = kv + (size_t)t * kvw;
        rmsnorm_row(row, nw, cfg->latent_norm_eps, R, slot);
        memcpy(slot + R, row + R, sizeof(float) * (size_t)dr);
        rope_row(slot + R, c->inv_freq, dr, c->pos[t]);
        if (c->pos[t] + 1 > max_len) max_len = c->pos[t] + 1;
        // q_pe of every head rotates in place, once.
        for (int h = 0; h < H; h++) rope_row(q + (size_t)t * H * dq + h * dq + dn, c->inv_freq, dr,
                                             c->pos[t]);
    }
    free(nw);

#pragma omp parallel num_threads(c->threads)
    {
        float *wbuf = k25_malloc(sizeof(float) * (size_t)R);
        float *q_abs = k25_malloc(sizeof(float) * (size_t)R);
        double *o_lat = k25_malloc(sizeof(double) * (size_t)R);
        float *o_latf = k25_malloc(sizeof(float) * (size_t)R);
        double *s = k25_malloc(sizeof(double) * (size_t)max_len);
        float **ctx = k25_malloc(sizeof(float *) * (size_t)max_len);
#pragma omp for schedule(dynamic) collapse(2)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *qh = q + (size_t)t * H * dq + (size_t)h * dq;
                int n = c->pos[t] + 1;
                // q_abs[r] = sum_d q_nope[d] * W_UK[h][d][r]
                double *acc = o_lat;
                for (int r = 0; r < R; r++) acc[r] = 0;
                for (int d = 0; d < dn; d++) {
                    const float *wk = row_f32(&L->kv_b, (int64_t)h * (dn + dv) + d, wbuf);
                    for (int r = 0; r < R; r++) acc[r] += (double)qh[d] * wk[r];
                }
                for (int r = 0; r < R; r++) q_abs[r] = (float)acc[r];
                // scores and softmax over positions 0..pos
                double smax = -INFINITY;
                for (int j = 0; j < n; j++) {
                    ctx[j] = cache_slot(c, layer, c->seq[t], j);
                    s[j] = (dot(q_abs, ctx[j], R) + dot(qh + dn, ctx[j] + R, dr)) * c->softmax_scale;
                    if (s[j] > smax) smax = s[j];
                }
                double sum = 0;
                for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - smax));
                for (int r = 0; r < R; r++) o_lat[r] = 0;
                for (int j = 0; j < n; j++) {
                    double pj = s[j] / sum;
                    for (int r = 0; r < R; r++) o_lat[r] += pj * ctx[j][r];
                }
                for (int r = 0; r < R; r++) o_latf[r] = (float)o_lat[r];
                // out[d] = W_UV[h][d] . o_lat
                float *oh = out + (size_t)t * H * dv + (size_t)h * dv;
                for (int d = 0; d < dv; d++) {
                    const float *wv = row_f32(&L->kv_b, (int64_t)h * (dn + dv) + dn + d, wbuf);
                    oh[d] = (float)dot(o_latf, wv, R);
                }
            }
        free(ctx);
        free(s);
        free(o_latf);
        free(o_lat);
        free(q_abs);
        free(wbuf);
    }
}

// Index order for top-k choices: higher value first, then lower index.
static int ranks_before(double va, int ia, double vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Indices of the k best values among v[i] for i with ok[i] (ok NULL: all), best first.
static void top_k_indices(const double *v, const unsigned char *ok, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < n; i++) {
            if (ok && !ok[i]) continue;
            int taken = 0;
            for (int m = 0; m < j; m++) taken |= out[m] == i;
            if (!taken && (b < 0 || ranks_before(v[i], i, v[b], b))) b = i;
        }
        out[j] = b;
    }
}

// noaux_tc routing (../shared/KIMI_K25.md §4.7): sigmoid scores in float, the correction bias
// only for choosing; groups ranked by the sum of their two best biased scores, topk_group
// groups kept, top_k experts among them; weights = chosen unbiased scores, normalized
// (norm_topk_prob, +1e-20), times routed_scaling_factor.
static void cpu_router(k25_backend *be, const float *x, const k25_layer *L, int32_t *idx,
                       float *wts) {
    cpu_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    int E = cfg->n_experts, D = cfg->hidden, K = cfg->top_k;
    int G = cfg->n_group, per = E / G;
    float *bias = k25_malloc(sizeof(float) * (size_t)E);
    vec_f32(&L->router_bias, E, bias);
#pragma omp parallel num_threads(c->threads)
    {
        float *wbuf = k25_malloc(sizeof(float) * (size_t)D);
        double *score = k25_malloc(sizeof(double) * (size_t)E);
        double *sel = k25_malloc(sizeof(double) * (size_t)E);
        double *gscore = k25_malloc(sizeof(double) * (size_t)G);
        unsigned char *ok = k25_malloc((size_t)E);
        int *gtop = k25_malloc(sizeof(int) * (size_t)G);
        int *etop = k25_malloc(sizeof(int) * (size_t)K);
#pragma omp for schedule(static)
        for (int t = 0; t < c->T; t++) {
            for (int e = 0; e < E; e++) {
                float logit = (float)dot(x + (size_t)t * D, row_f32(&L->router, e, wbuf), D);
                score[e] = 1.0f / (1.0f + expf(-logit));
                sel[e] = (float)score[e] + bias[e];
            }
            for (int e = 0; e < E; e++) ok[e] = 1;
            if (G > 1) {
                for (int g = 0; g < G; g++) {
                    int two[2] = {-1, -1}, m = per < 2 ? per : 2;
                    top_k_indices(sel + (size_t)g * per, NULL, per, m, two);
                    gscore[g] = 0;
                    for (int j = 0; j < m; j++) gscore[g] += sel[(size_t)g * per + two[j]];
                }
                top_k_indices(gscore, NULL, G, cfg->topk_group, gtop);
                for (int e = 0; e < E; e++) ok[e] = 0;
                for (int j = 0; j < cfg->topk_group; j++)
                    memset(ok + (size_t)gtop[j] * per, 1, (size_t)per);
            }
            top_k_indices(sel, ok, E, K, etop);
            double sum = 0;
            for (int k = 0; k < K; k++) sum += score[etop[k]];
            for (int k = 0; k < K; k++) {
                double wk = score[etop[k]];
                if (cfg->norm_topk_prob) wk /= sum + 1e-20;
                idx[(size_t)t * K + k] = etop[k];
                wts[(size_t)t * K + k] = (float)(wk * cfg->routed_scale);
            }
            if (cfg->uniform_routing)
                k25_uniform_experts(L->index, c->seq[t], c->pos[t], K, E, idx + (size_t)t * K);
        }
        free(etop);
        free(gtop);
        free(ok);
        free(gscore);
        free(sel);
        free(score);
        free(wbuf);
    }
    free(bias);
}

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    free(p);
    *cap = need;
    return k25_malloc(need);
}

// Routed experts, one expert at a time over the rows that chose it (each dequantized weight row
// serves all of them): act = silu(gate x) * (up x), y = down act per (row, choice), then
// out[t] = sum_k wts[t][k] y[t][k] in choice order.
static void cpu_moe(k25_backend *be, const float *x, const k25_layer *L, const int32_t *idx,
                    const float *wts, const float *add, float *out) {
    cpu_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    int T = c->T, K = cfg->top_k, E = cfg->n_experts, D = cfg->hidden;
    int I = (int)L->exp_gate[0].out, group = cfg->quant_group;
    size_t pairs = (size_t)T * K;
    c->moe_pairs = grow(c->moe_pairs, &c->moe_pairs_cap, sizeof(int32_t) * pairs);
    c->moe_act = grow(c->moe_act, &c->moe_act_cap, sizeof(float) * pairs * I);
    c->moe_y = grow(c->moe_y, &c->moe_y_cap, sizeof(float) * pairs * D);
    for (size_t r = 0; r < pairs; r++)
        if (idx[r] < 0 || idx[r] >= E) K25_DIE("moe: expert index %d (have %d)", idx[r], E);

    for (int e = 0; e < E; e++) {
        int n = 0;
        for (size_t r = 0; r < pairs; r++)
            if (idx[r] == e) c->moe_pairs[n++] = (int32_t)r;
        if (!n) continue;
        const k25_expert_w *eg = &L->exp_gate[e], *eu = &L->exp_up[e], *ed = &L->exp_down[e];
        if (eg->in != D || ed->out != D || ed->in != I || eu->out != I)
            K25_DIE("moe: expert %d of layer %d has shapes gate %lldx%lld down %lldx%lld", e,
                    L->index, (long long)eg->out, (long long)eg->in, (long long)ed->out,
                    (long long)ed->in);
        float *act = c->moe_act;
        const int32_t *pr = c->moe_pairs;
#pragma omp parallel num_threads(c->threads)
        {
            size_t wmax = (size_t)(D > I ? D : I); // gate/up rows have D, down rows I
            float *g = k25_malloc(sizeof(float) * wmax);
            float *u = k25_malloc(sizeof(float) * wmax);
#pragma omp for schedule(static)
            for (int o = 0; o < I; o++) {
                expert_row(eg, group, o, g);
                expert_row(eu, group, o, u);
                for (int j = 0; j < n; j++) {
                    const float *xt = x + (size_t)(pr[j] / K) * D;
                    act[(size_t)j * I + o] = silu((float)dot(xt, g, D)) * (float)dot(xt, u, D);
                }
            }
#pragma omp for schedule(static)
            for (int o = 0; o < D; o++) {
                expert_row(ed, group, o, g);
                for (int j = 0; j < n; j++)
                    c->moe_y[(size_t)pr[j] * D + o] = (float)dot(act + (size_t)j * I, g, I);
            }
            free(u);
            free(g);
        }
    }
    for (int t = 0; t < T; t++)
        for (int o = 0; o < D; o++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)wts[(size_t)t * K + k] * c->moe_y[((size_t)t * K + k) * D + o];
            float r = (float)s;
            if (add) r += add[(size_t)t * D + o];
            out[(size_t)t * D + o] = r;
        }
}

static void cpu_allreduce_sum(k25_backend *be, float *x, size_t n) {
    if (be->dist->tp_size > 1) dist_allreduce_sum_f32(be->dist, x, n);
}

// The sum, then the existing residual add (and norm): one code path for each piece of math.
static void cpu_allreduce_add_rmsnorm(k25_backend *be, float *h, float *d, const k25_tensor *w,
                                      float eps, int T, int n, float *out) {
    cpu_allreduce_sum(be, d, (size_t)T * n);
    if (w)
        cpu_add_rmsnorm(be, h, d, w, eps, T, n, out);
    else
        cpu_add(be, h, d, (size_t)T * n);
}

// One thread of ops: the branch runs in place, in issue order.
static void cpu_fork(k25_backend *be, void (*fn)(void *ctx), void *ctx) {
    (void)be;
    fn(ctx);
}

static void cpu_join(k25_backend *be) { (void)be; }

static void cpu_sample(k25_backend *be, const float *logits, int vocab_begin, int V_local,
                       const k25_sampling *params, int32_t *out) {
    sampler_sample(be->dist->tp, logits, impl_of(be)->T, V_local, vocab_begin, params, out);
}

static void cpu_run_graph(k25_backend *be, int key, void (*fn)(void *ctx), void *ctx) {
    (void)be;
    (void)key;
    fn(ctx);
}

static void cpu_gather_logits(k25_backend *be, const float *logits, int V_local, int t,
                              float *out) {
    const float *row = logits + (size_t)t * V_local;
    if (be->dist->tp_size == 1) {
        memcpy(out, row, sizeof(float) * (size_t)V_local);
        return;
    }
    MPI_CHECK(MPI_Allgather(row, V_local, MPI_FLOAT, out, V_local, MPI_FLOAT, be->dist->tp));
}

// Activations are host memory: MPI sends them as they are.
static void cpu_pp_send(k25_backend *be, const float *x, size_t n, int stage) {
    pipeline_send_host(be->dist, x, n, stage);
}

static void cpu_pp_recv(k25_backend *be, float *x, size_t n, int stage) {
    pipeline_recv_host(be->dist, x, n, stage);
}

// ------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------

static void cpu_destroy(k25_backend *be) {
    cpu_impl *c = impl_of(be);
    if (c->w) for_each_tensor(be, c->w, release);
    cpu_free(be, c->cache);
    free(c->tokens);
    free(c->pos);
    free(c->seq);
    free(c->block_table);
    free(c->moe_act);
    free(c->moe_y);
    free(c->moe_pairs);
    free(c->inv_freq);
    free(c);
    free(be);
}

k25_backend *backend_cpu_create(const k25_config *cfg, const k25_dist *dist, int threads) {
    k25_backend *be = k25_calloc(1, sizeof *be);
    cpu_impl *c = k25_calloc(1, sizeof *c);
    if (threads <= 0) {
        int local = dist && dist->local_size > 0 ? dist->local_size : 1;
        threads = omp_get_num_procs() / local;
    }
    c->threads = threads > 0 ? threads : 1;
    c->inv_freq = k25_malloc(sizeof(float) * (size_t)(cfg->qk_rope_dim / 2 + 1));
    config_rope_inv_freq(cfg, c->inv_freq);
    c->softmax_scale = config_softmax_scale(cfg);

    be->name = "cpu";
    be->impl = c;
    be->cfg = cfg;
    be->dist = dist;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->to_device = cpu_copy;
    be->to_host = cpu_copy;
    be->sync = cpu_sync;
    be->mem_peak = cpu_mem_peak;
    be->load_weights = cpu_load_weights;
    be->kv_init = cpu_kv_init;
    be->kv_value_bytes = sizeof(float);
    be->set_batch = cpu_set_batch;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->add_rmsnorm = cpu_add_rmsnorm;
    be->matmul = cpu_matmul;
    be->matmul2 = cpu_matmul2;
    be->silu_mul = cpu_silu_mul;
    be->add = cpu_add;
    be->mla_attention = cpu_mla_attention;
    be->router = cpu_router;
    be->moe = cpu_moe;
    be->allreduce_sum = cpu_allreduce_sum;
    be->sample = cpu_sample;
    be->run_graph = cpu_run_graph;
    be->gather_logits = cpu_gather_logits;
    be->pp_send = cpu_pp_send;
    be->pp_recv = cpu_pp_recv;
    be->allreduce_add_rmsnorm = cpu_allreduce_add_rmsnorm;
    be->fork = cpu_fork;
    be->join = cpu_join;
    return be;
}
