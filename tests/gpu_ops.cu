// Every operation of the CUDA backend against the CPU reference backend (src/backend_cpu.c) on
// fresh random inputs, with outputs poisoned with NaN before each run, at the shapes of a
// config's tensor-parallel rank (simulated on one GPU: the weights of rank r of tp are planned,
// both backends run the same local slice), plus the synthetic upload checked bit for bit.
//
//   gpu_ops [--config FILE] [--set section.key=value]... [--tp N] [--rank R] [--rows 1,3,17]
//           [--ctx N] [--only NAME]
//
// --only moe_bad_id runs one check that must stop the process (check_moe_bad_id).
//
// Prints one line per check ("ok"/"FAIL", the relative error ||gpu - cpu|| / ||cpu|| and the
// shape) and a closing "N passed, N failed"; exits 1 when any check failed. A failing check
// does not stop the others (a CUDA fault does: run configs as separate processes).
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "cuda_kernels.cuh" // first: gives weights.h C linkage
#include "moe_route.cuh"
#include "backend.h"
#include "checkpoint.h"
#include "config.h"
#include "model.h"
#include "dist.h"
#include "sampler.h"
#include "weights.h"

static int n_pass, n_fail;
static const char *only;

static void report(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

static int want(const char *name) { return !only || strstr(name, only); }

// ------------------------------------------------------------------------------------------
// Random numbers and comparisons
// ------------------------------------------------------------------------------------------

static uint64_t rng_state = 0x1234567ull;
static uint64_t rnd64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rndu(void) { return (float)((rnd64() >> 40) * (1.0 / 16777216.0)); } // [0,1)
static float rndn(void) { // approximately normal
    float s = 0;
    for (int i = 0; i < 4; i++) s += rndu();
    return (s - 2.0f) * 1.7320508f;
}
static void fill_randn(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rndn() * scale;
}

// Relative L2 error; NaN/Inf anywhere in got -> +inf.
static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) return INFINITY;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// ------------------------------------------------------------------------------------------
// Two backends side by side
// ------------------------------------------------------------------------------------------

typedef struct pair {
    k25_backend *cpu, *gpu;
    k25_weights wc, wg;
    const k25_config *cfg;
} pair;

// A buffer on both backends, the GPU one poisoned with NaN bytes.
typedef struct dbuf {
    float *c, *g;
    size_t n;
} dbuf;

static dbuf dbuf_new(pair *p, size_t n) {
    dbuf b = {(float *)p->cpu->alloc(p->cpu, n * 4 + 16), (float *)p->gpu->alloc(p->gpu, n * 4 + 16),
              n};
    return b;
}
static void dbuf_free(pair *p, dbuf *b) {
    p->cpu->free(p->cpu, b->c);
    p->gpu->free(p->gpu, b->g);
}
static void dbuf_set(pair *p, dbuf *b, const float *host) {
    p->cpu->to_device(p->cpu, b->c, host, b->n * 4);
    p->gpu->to_device(p->gpu, b->g, host, b->n * 4);
}
static void dbuf_poison(pair *p, dbuf *b) {
    float *nan = (float *)k25_malloc(b->n * 4);
    for (size_t i = 0; i < b->n; i++) nan[i] = NAN;
    p->cpu->to_device(p->cpu, b->c, nan, b->n * 4);
    p->gpu->to_device(p->gpu, b->g, nan, b->n * 4);
    free(nan);
}
// Relative error of the GPU buffer against the CPU one over the first n elements.
static double dbuf_err(pair *p, dbuf *b, size_t n) {
    float *hc = (float *)k25_malloc(n * 4), *hg = (float *)k25_malloc(n * 4);
    p->cpu->to_host(p->cpu, hc, b->c, n * 4);
    p->gpu->to_host(p->gpu, hg, b->g, n * 4);
    double e = rel_err(hg, hc, n);
    free(hc);
    free(hg);
    return e;
}

static void set_batch_both(pair *p, const k25_batch *b) {
    p->cpu->set_batch(p->cpu, b);
    p->gpu->set_batch(p->gpu, b);
}

// Values of the GPU arrays a[n] and b[n] whose bits differ.
static size_t gpu_bits_differ(pair *p, const float *a, const float *b, size_t n) {
    float *ha = (float *)k25_malloc(sizeof(float) * n);
    float *hb = (float *)k25_malloc(sizeof(float) * n);
    p->gpu->to_host(p->gpu, ha, a, sizeof(float) * n);
    p->gpu->to_host(p->gpu, hb, b, sizeof(float) * n);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&ha[i], &hb[i], 4) != 0;
    free(ha), free(hb);
    return diff;
}

typedef struct batch_buf {
    k25_batch b;
    int32_t *tokens, *pos, *seq, *table;
} batch_buf;

// A batch of T rows: sequences round-robin over n_seq slots, each continuing at pos0[s].
static void batch_make(batch_buf *bb, const k25_config *cfg, int T, int n_seq, const int *start,
                       int max_blocks, int kv_block) {
    bb->tokens = (int32_t *)k25_malloc(sizeof(int32_t) * T);
    bb->pos = (int32_t *)k25_malloc(sizeof(int32_t) * T);
    bb->seq = (int32_t *)k25_malloc(sizeof(int32_t) * T);
    bb->table = (int32_t *)k25_malloc(sizeof(int32_t) * n_seq * max_blocks);
    int next[64];
    for (int s = 0; s < n_seq; s++) next[s] = start[s];
    for (int t = 0; t < T; t++) {
        int s = t % n_seq;
        bb->tokens[t] = (int32_t)(rnd64() % (uint64_t)cfg->vocab);
        bb->seq[t] = s;
        bb->pos[t] = next[s]++;
    }
    // interleaved physical blocks: sequence s, logical block j -> j * n_seq + (n_seq - 1 - s)
    for (int s = 0; s < n_seq; s++)
        for (int j = 0; j < max_blocks; j++)
            bb->table[s * max_blocks + j] = j * n_seq + (n_seq - 1 - s);
    (void)kv_block;
    bb->b.T = T;
    bb->b.tokens = bb->tokens;
    bb->b.pos = bb->pos;
    bb->b.seq = bb->seq;
    bb->b.block_table = bb->table;
    bb->b.max_seqs = n_seq;
    bb->b.max_blocks_per_seq = max_blocks;
}

static void batch_free(batch_buf *bb) {
    free(bb->tokens), free(bb->pos), free(bb->seq), free(bb->table);
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

static void check_synth_upload(pair *p) {
    if (!want("synth")) return;
    // plain tensors: the GPU copy must equal tensor_read_rows byte for byte
    const k25_weights *w = &p->wg;
    int L0 = w->layer_begin, Lm = -1;
    for (int l = w->layer_begin; l < w->layer_end; l++)
        if (w->layers[l].is_moe) Lm = l;
    const k25_tensor *ts[8];
    int n = 0;
    ts[n++] = &w->layers[L0].q_a;
    ts[n++] = &w->layers[L0].attn_norm;
    ts[n++] = &w->layers[L0].o_proj; // a column slice
    ts[n++] = &w->lm_head;
    if (Lm >= 0) ts[n++] = &w->layers[Lm].router_bias;
    for (int i = 0; i < n; i++) {
        const k25_tensor *t = ts[i];
        size_t bytes = tensor_bytes(t);
        uint8_t *a = (uint8_t *)k25_malloc(bytes), *b = (uint8_t *)k25_malloc(bytes);
        tensor_read_rows(t, 0, t->rows, a);
        p->gpu->to_host(p->gpu, b, t->dev, bytes);
        size_t bad = 0;
        for (size_t k = 0; k < bytes; k++) bad += a[k] != b[k];
        report(bad == 0, "synth upload %-48s %lldx%lld %s: %zu bytes differ", t->name,
               (long long)t->rows, (long long)t->cols, k25_dtype_name(t->dtype), bad);
        free(a), free(b);
    }
    // expert tensors are repacked after generation: check the generator on them directly
    if (Lm >= 0 && w->cfg->experts_int4 && w->layers[Lm].exp_gate[0].w.kind == K25_SRC_SYNTH) {
        const k25_tensor *es[] = {&w->layers[Lm].exp_gate[1].w, &w->layers[Lm].exp_down[2].w,
                                  &w->layers[Lm].exp_up[3].scale, &w->layers[Lm].exp_down[0].scale};
        for (int i = 0; i < 4; i++) {
            const k25_tensor *t = es[i];
            size_t bytes = tensor_bytes(t);
            uint8_t *a = (uint8_t *)k25_malloc(bytes), *b = (uint8_t *)k25_malloc(bytes);
            void *d;
            CUDA_CHECK(cudaMalloc(&d, bytes));
            k25k_synth_fill(d, (int)k25_dtype_size(t->dtype), t->synth_kind, t->synth_exp,
                            t->synth_seed, t->synth_id, t->rows, t->cols, t->g_cols, t->row0,
                            t->col0, 0);
            CUDA_CHECK(cudaMemcpy(b, d, bytes, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaFree(d));
            tensor_read_rows(t, 0, t->rows, a);
            size_t bad = 0;
            for (size_t k = 0; k < bytes; k++) bad += a[k] != b[k];
            report(bad == 0, "synth generate %-46s %lldx%lld %s: %zu bytes differ", t->name,
                   (long long)t->rows, (long long)t->cols, k25_dtype_name(t->dtype), bad);
            free(a), free(b);
        }
    }
}

// The W4A16 split plan (moe_plan, 32-bit divisions) against its definition in 64-bit arithmetic:
// the fewest splits that reach want = target units (over x target with over > 1, within the
// K25K_MOE_OVER_KB floor), at most KB / 2, then the split count every split is non-empty for.
static void check_moe_plan(void) {
    static const int Ns[] = {32, 64, 512, 4096, 7168, 14336}, Ks[] = {32, 64, 256, 2048, 7168};
    static const int targets[] = {1, 132, 528, 1056}, overs[] = {1, 3};
    long long cases = 0, bad = 0;
    for (int n : Ns)
        for (int k : Ks)
            for (int target : targets)
                for (int over : overs)
                    for (long long it = 0; it <= (1ll << 30); it = it < 4096 ? it + 1 : it * 3) {
                        const int items = (int)it;
                        const int KB = k / 32 > 0 ? k / 32 : 1;
                        const long long rbs = std::max(1, (n / 32 + W4_NW - 1) / W4_NW);
                        const long long base = rbs * std::max(items, 1), want = target;
                        long long ns = base >= want ? 1 : want / base;
                        if (over > 1)
                            ns = std::max(ns, std::min<long long>((over * want + base - 1) / base,
                                                                  KB / K25K_MOE_OVER_KB));
                        ns = std::min<long long>(ns, std::max(KB / 2, 1));
                        const long long per = (KB + ns - 1) / ns;
                        ns = (KB + per - 1) / per;
                        int got_ns, got_kb;
                        moe_plan(n, k, items, target, over, &got_ns, &got_kb);
                        cases++;
                        bad += got_ns != ns || got_kb != (KB + ns - 1) / ns;
                    }
    report(bad == 0, "moe plan: %lld of %lld (N, K, items, target, over) differ from 64-bit", bad,
           cases);
}

static void check_rows_ops(pair *p, int T) {
    const k25_config *cfg = p->cfg;
    const int D = cfg->hidden;
    const k25_layer *L = &p->wg.layers[p->wg.layer_begin];
    const k25_layer *Lc = &p->wc.layers[p->wc.layer_begin];
    float *hx = (float *)k25_malloc(sizeof(float) * (size_t)T * D * 2);
    dbuf x = dbuf_new(p, (size_t)T * D), d = dbuf_new(p, (size_t)T * D), y = dbuf_new(p, (size_t)T * D);
    fill_randn(hx, (size_t)T * D, 1.0f);
    dbuf_set(p, &x, hx);
    fill_randn(hx, (size_t)T * D, 0.5f);
    dbuf_set(p, &d, hx);

    if (want("embed")) {
        dbuf_poison(p, &y);
        p->cpu->embed(p->cpu, &p->wc.embed, y.c);
        p->gpu->embed(p->gpu, &p->wg.embed, y.g);
        double e = dbuf_err(p, &y, (size_t)T * D);
        report(e == 0.0, "embed          T=%-4d D=%d rel=%.2e (exact expected)", T, D, e);
    }
    if (want("rmsnorm")) {
        dbuf_poison(p, &y);
        p->cpu->rmsnorm(p->cpu, x.c, D, &Lc->attn_norm, cfg->norm_eps, T, D, y.c);
        p->gpu->rmsnorm(p->gpu, x.g, D, &L->attn_norm, cfg->norm_eps, T, D, y.g);
        double e = dbuf_err(p, &y, (size_t)T * D);
        report(e <= 1e-5, "rmsnorm        T=%-4d n=%d rel=%.2e", T, D, e);
        if (T > 1) {
            // each row alone gives the T-row call's bits: a row's norm does not depend on the
            // step's other rows (speculative verification equals plain decoding)
            float *y1 = (float *)p->gpu->alloc(p->gpu, sizeof(float) * (size_t)T * D);
            for (int t = 0; t < T; t++)
                p->gpu->rmsnorm(p->gpu, x.g + (size_t)t * D, D, &L->attn_norm, cfg->norm_eps, 1,
                                D, y1 + (size_t)t * D);
            size_t diff = gpu_bits_differ(p, y.g, y1, (size_t)T * D);
            report(diff == 0, "rmsnorm        T=%-4d n=%d same bits row by row: %zu values differ",
                   T, D, diff);
            p->gpu->free(p->gpu, y1);
        }
        // strided input: the first q_lora values of each [D] row (ld = D)
        int n2 = cfg->q_lora_rank < D ? cfg->q_lora_rank : D;
        dbuf_poison(p, &y);
        p->cpu->rmsnorm(p->cpu, x.c, D, &Lc->q_a_norm, cfg->latent_norm_eps, T, n2, y.c);
        p->gpu->rmsnorm(p->gpu, x.g, D, &L->q_a_norm, cfg->latent_norm_eps, T, n2, y.g);
        e = dbuf_err(p, &y, (size_t)T * n2);
        report(e <= 1e-5, "rmsnorm ld=%-4d T=%-4d n=%d rel=%.2e", D, T, n2, e);
    }
    if (want("add_rmsnorm")) {
        // both backends add into their own copy of x; compare h and out
        dbuf h = dbuf_new(p, (size_t)T * D);
        fill_randn(hx, (size_t)T * D, 1.0f);
        dbuf_set(p, &h, hx);
        dbuf_poison(p, &y);
        p->cpu->add_rmsnorm(p->cpu, h.c, d.c, &Lc->ffn_norm, cfg->norm_eps, T, D, y.c);
        p->gpu->add_rmsnorm(p->gpu, h.g, d.g, &L->ffn_norm, cfg->norm_eps, T, D, y.g);
        double e1 = dbuf_err(p, &h, (size_t)T * D), e2 = dbuf_err(p, &y, (size_t)T * D);
        report(e1 <= 1e-6 && e2 <= 1e-5, "add_rmsnorm    T=%-4d n=%d rel(h)=%.2e rel(out)=%.2e", T,
               D, e1, e2);
        dbuf_free(p, &h);
    }
    if (want("silu_mul") || want("add")) {
        dbuf_poison(p, &y);
        p->cpu->silu_mul(p->cpu, x.c, d.c, T, D, y.c);
        p->gpu->silu_mul(p->gpu, x.g, d.g, T, D, y.g);
        double e = dbuf_err(p, &y, (size_t)T * D);
        report(e <= 1e-6, "silu_mul       T=%-4d n=%d rel=%.2e", T, D, e);
        p->cpu->add(p->cpu, y.c, x.c, (size_t)T * D);
        p->gpu->add(p->gpu, y.g, x.g, (size_t)T * D);
        e = dbuf_err(p, &y, (size_t)T * D);
        report(e <= 1e-6, "add            T=%-4d n=%d rel=%.2e", T, D, e);
    }
    dbuf_free(p, &x), dbuf_free(p, &d), dbuf_free(p, &y);
    free(hx);
}

// Rows up to which the backend's projections run on the GEMV (K25_GEMV_MAX_T, as the backend).
static int gemv_max_rows(void) {
    const char *mt = getenv("K25_GEMV_MAX_T");
    return mt && *mt ? atoi(mt) : K25K_GEMV_MAX_T_DEFAULT;
}

// The path of a T-row projection of N x K (the backend's choice: K25_GEMV_MAX_T, then the
// warpgroup-MMA kernel up to K25_WGMMA_MAX_T rows on sm_90 with split activations, K a multiple
// of 8 from 64 on and K slices it takes (k25k_wgmma_preferred), then cuBLASLt).
static const char *matmul_path(int T, int N, int K) {
    if (T <= gemv_max_rows()) return "gemv";
    const char *mt = getenv("K25_WGMMA_MAX_T");
    const int wg = mt && *mt ? atoi(mt) : K25K_WGMMA_MAX_T_DEFAULT;
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const int applies = K >= 64 && K % 8 == 0 && k25k_split_activations() && major == 9 &&
                        !minor && k25k_wgmma_preferred(N, K);
    return T <= wg && applies ? "wgmma" : "cublaslt";
}

// One projection: y = x W^T on both backends.
static void check_matmul_one(pair *p, const k25_tensor *Wc, const k25_tensor *Wg, int T,
                             const char *what) {
    const int N = (int)Wg->rows, K = (int)Wg->cols;
    float *hx = (float *)k25_malloc(sizeof(float) * (size_t)T * K);
    fill_randn(hx, (size_t)T * K, 1.0f);
    dbuf x = dbuf_new(p, (size_t)T * K), y = dbuf_new(p, (size_t)T * N);
    dbuf_set(p, &x, hx);
    dbuf_poison(p, &y);
    p->cpu->matmul(p->cpu, x.c, Wc, T, y.c);
    p->gpu->matmul(p->gpu, x.g, Wg, T, y.g);
    double e = dbuf_err(p, &y, (size_t)T * N);
    // The GEMV (T <= K25_GEMV_MAX_T, default K25K_GEMV_MAX_T_DEFAULT) keeps f32 activations and accumulation (~1e-6
    // against the float64-accumulating CPU); cuBLASLt takes them as two bf16 halves (~1e-5), or
    // rounded to bf16 once with K25_BF16_ACTIVATIONS=1 (~3e-3).
    const int gemv = T <= gemv_max_rows();
    report(e <= (gemv || k25k_split_activations() ? 1e-4 : 1e-2),
           "matmul %-8s T=%-4d N=%-6d K=%-6d rel=%.2e (%s)", what, T, N, K, e,
           matmul_path(T, N, K));
    if (gemv && T > 1) {
        // The same rows in calls of 1, 2, 3, ... rows (every GEMV row tile: 1, 2, 4, 8, partial
        // tiles) must give the T-row call's results bit for bit: a row's result does not depend
        // on the other rows of the step (speculative verification equals plain decoding).
        float *yc = (float *)p->gpu->alloc(p->gpu, sizeof(float) * (size_t)T * N);
        int calls = 0;
        for (int t0 = 0, len = 1; t0 < T; t0 += len, len++) {
            if (t0 + len > T) len = T - t0;
            p->gpu->matmul(p->gpu, x.g + (size_t)t0 * K, Wg, len, yc + (size_t)t0 * N);
            calls++;
        }
        size_t diff = gpu_bits_differ(p, y.g, yc, (size_t)T * N);
        report(diff == 0, "matmul %-8s T=%-4d N=%-6d K=%-6d same bits in %d calls of 1, 2, ... "
               "rows: %zu values differ", what, T, N, K, calls, diff);
        p->gpu->free(p->gpu, yc);
    }
    const int wg_min = gemv_max_rows() + 1; // the fewest rows the warpgroup-MMA kernel takes
    if (!strcmp(matmul_path(T, N, K), "wgmma") && T >= 2 * wg_min) {
        // Its K-slice plan depends on N and K only and a column's MMA sums do not depend on the
        // others: the rows in calls of wg_min, wg_min + 1, ... rows give the T-row call's bits
        float *yc = (float *)p->gpu->alloc(p->gpu, sizeof(float) * (size_t)T * N);
        int calls = 0;
        for (int t0 = 0, len = wg_min; t0 < T; t0 += len, len++) {
            if (T - (t0 + len) < wg_min) len = T - t0; // no call below the kernel's rows
            p->gpu->matmul(p->gpu, x.g + (size_t)t0 * K, Wg, len, yc + (size_t)t0 * N);
            calls++;
        }
        size_t diff = gpu_bits_differ(p, y.g, yc, (size_t)T * N);
        report(diff == 0, "matmul %-8s T=%-4d N=%-6d K=%-6d same bits in %d calls of %d, %d, ... "
               "rows: %zu values differ (wgmma)", what, T, N, K, calls, wg_min, wg_min + 1, diff);
        p->gpu->free(p->gpu, yc);
    }
    dbuf_free(p, &x), dbuf_free(p, &y);
    free(hx);
}

// Values of the GPU buffer b[from, b->n) that are not NaN (still poisoned: nothing written).
static size_t dbuf_written_past(pair *p, dbuf *b, size_t from) {
    float *h = (float *)k25_malloc(sizeof(float) * b->n);
    p->gpu->to_host(p->gpu, h, b->g, sizeof(float) * b->n);
    size_t bad = 0;
    for (size_t i = from; i < b->n; i++) bad += !isnan(h[i]);
    free(h);
    return bad;
}

// Two projections of the same input (matmul2: y1 = x W1^T, y2 = x W2^T) on both backends: both
// outputs against the CPU's with matmul's tolerance, nothing written past either output; on the
// GEMV the rows of both outputs bit for bit in calls of 1, 2, 3, ... rows, and for the pair
// launch, where its K-slice plan equals each matrix's, against two matmul calls bit for bit.
static void check_matmul2_pair(pair *p, const k25_tensor *W1c, const k25_tensor *W1g,
                               const k25_tensor *W2c, const k25_tensor *W2g, int T,
                               const char *what) {
    const int N1 = (int)W1g->rows, N2 = (int)W2g->rows, K = (int)W1g->cols;
    const size_t guard = 64, n1 = (size_t)T * N1, n2 = (size_t)T * N2;
    float *hx = (float *)k25_malloc(sizeof(float) * (size_t)T * K);
    fill_randn(hx, (size_t)T * K, 1.0f);
    dbuf x = dbuf_new(p, (size_t)T * K), y1 = dbuf_new(p, n1 + guard), y2 = dbuf_new(p, n2 + guard);
    dbuf_set(p, &x, hx);
    dbuf_poison(p, &y1);
    dbuf_poison(p, &y2);
    p->cpu->matmul2(p->cpu, x.c, W1c, W2c, T, y1.c, y2.c);
    p->gpu->matmul2(p->gpu, x.g, W1g, W2g, T, y1.g, y2.g);
    const double e1 = dbuf_err(p, &y1, n1), e2 = dbuf_err(p, &y2, n2);
    const size_t past = dbuf_written_past(p, &y1, n1) + dbuf_written_past(p, &y2, n2);
    // which path the backend took: one pair launch, or two projections (GEMV or cuBLASLt)
    const int gemv = T <= gemv_max_rows();
    const int fused = gemv && k25k_gemv2_applies(x.g, (const uint16_t *)W1g->dev,
                                                 (const uint16_t *)W2g->dev, N1, N2, K);
    // above the GEMV, a pair allocated as one block (W2 right after W1) is one GEMM
    const int one_block = (const uint16_t *)W2g->dev == (const uint16_t *)W1g->dev + (size_t)N1 * K;
    const int wgmma = !strcmp(matmul_path(T, one_block ? N1 + N2 : N1, K), "wgmma");
    const char *path = fused       ? "gemv pair"
                       : gemv      ? "gemv x2"
                       : one_block ? (wgmma ? "wgmma, one launch" : "cublaslt, one GEMM")
                                   : matmul_path(T, N1, K);
    // as matmul (see check_matmul_one)
    const double tol = gemv || k25k_split_activations() ? 1e-4 : 1e-2;
    report(e1 <= tol && e2 <= tol && past == 0,
           "matmul2 %-14s T=%-4d N=%d+%d K=%-6d rel=%.2e, %.2e, %zu values written past the "
           "outputs (%s)", what, T, N1, N2, K, e1, e2, past, path);
    if (fused) {
        // With the same K-slice count for N1 + N2 as for each matrix alone, the pair sums every
        // row in the single projection's order: then both outputs equal matmul's bit for bit.
        int ks, ks1, ks2, rpb;
        k25k_gemv_plan(N1 + N2, K, &ks, &rpb);
        k25k_gemv_plan(N1, K, &ks1, &rpb);
        k25k_gemv_plan(N2, K, &ks2, &rpb);
        if (ks == ks1 && ks == ks2) {
            float *ys1 = (float *)p->gpu->alloc(p->gpu, sizeof(float) * n1);
            float *ys2 = (float *)p->gpu->alloc(p->gpu, sizeof(float) * n2);
            p->gpu->matmul(p->gpu, x.g, W1g, T, ys1);
            p->gpu->matmul(p->gpu, x.g, W2g, T, ys2);
            const size_t diff =
                gpu_bits_differ(p, y1.g, ys1, n1) + gpu_bits_differ(p, y2.g, ys2, n2);
            report(diff == 0, "matmul2 %-14s T=%-4d N=%d+%d K=%-6d same bits as two matmul "
                   "calls (%d K slices each): %zu values differ", what, T, N1, N2, K, ks, diff);
            p->gpu->free(p->gpu, ys1);
            p->gpu->free(p->gpu, ys2);
        }
    }
    if (gemv && T > 1) {
        // the T-row call's rows again in calls of 1, 2, 3, ... rows: a row's bits must not
        // depend on the other rows of the call (every row tile 1, 2, 4, 8, partial tiles)
        float *yc1 = (float *)p->gpu->alloc(p->gpu, sizeof(float) * n1);
        float *yc2 = (float *)p->gpu->alloc(p->gpu, sizeof(float) * n2);
        int calls = 0;
        for (int t0 = 0, len = 1; t0 < T; t0 += len, len++) {
            if (t0 + len > T) len = T - t0;
            p->gpu->matmul2(p->gpu, x.g + (size_t)t0 * K, W1g, W2g, len, yc1 + (size_t)t0 * N1,
                            yc2 + (size_t)t0 * N2);
            calls++;
        }
        const size_t diff = gpu_bits_differ(p, y1.g, yc1, n1) + gpu_bits_differ(p, y2.g, yc2, n2);
        report(diff == 0, "matmul2 %-14s T=%-4d N=%d+%d K=%-6d same bits in %d calls of 1, 2, "
               "... rows: %zu values differ (%s)", what, T, N1, N2, K, calls, diff, path);
        p->gpu->free(p->gpu, yc1);
        p->gpu->free(p->gpu, yc2);
    }
    dbuf_free(p, &x), dbuf_free(p, &y1), dbuf_free(p, &y2);
    free(hx);
}

// The matmul2 pairs of the model (src/model.c): every layer's q_a + kv_a and gate + up (the
// dense MLP, or the shared expert of a MoE layer, where present), each distinct shape once.
static void check_matmul2_pairs(pair *p, int T) {
    if (!want("matmul2")) return;
    int seen[16][3], n_seen = 0;
    for (int l = p->wg.layer_begin; l < p->wg.layer_end; l++) {
        const k25_layer *Lg = &p->wg.layers[l], *Lc = &p->wc.layers[l];
        for (int k = 0; k < 2; k++) {
            const k25_tensor *A = k ? &Lg->ffn_gate : &Lg->q_a, *B = k ? &Lg->ffn_up : &Lg->kv_a;
            if (A->kind == K25_SRC_NONE || B->kind == K25_SRC_NONE) continue;
            const int key[3] = {(int)A->rows, (int)B->rows, (int)A->cols};
            int dup = 0;
            for (int i = 0; i < n_seen; i++) dup |= !memcmp(seen[i], key, sizeof key);
            if (dup || n_seen == 16) continue;
            memcpy(seen[n_seen++], key, sizeof key);
            const char *what = !k ? "q_a+kv_a" : Lg->is_moe ? "shared gate+up" : "gate+up";
            if (k)
                check_matmul2_pair(p, &Lc->ffn_gate, A, &Lc->ffn_up, B, T, what);
            else
                check_matmul2_pair(p, &Lc->q_a, A, &Lc->kv_a, B, T, what);
        }
    }
}

static void check_matmul_singles(pair *p, int T) {
    if (!want("matmul")) return;
    const k25_layer *Lg = &p->wg.layers[p->wg.layer_begin], *Lc = &p->wc.layers[p->wc.layer_begin];
    check_matmul_one(p, &Lc->q_a, &Lg->q_a, T, "q_a");
    check_matmul_one(p, &Lc->q_b, &Lg->q_b, T, "q_b");
    check_matmul_one(p, &Lc->kv_a, &Lg->kv_a, T, "kv_a");
    check_matmul_one(p, &Lc->o_proj, &Lg->o_proj, T, "o_proj");
    if (Lg->ffn_gate.kind != K25_SRC_NONE) {
        check_matmul_one(p, &Lc->ffn_gate, &Lg->ffn_gate, T, "gate");
        check_matmul_one(p, &Lc->ffn_down, &Lg->ffn_down, T, "down");
    }
    check_matmul_one(p, &p->wc.lm_head, &p->wg.lm_head, T, "lm_head");
    // the router's shape (N = experts, small) through the same GEMV
    for (int l = p->wg.layer_begin; l < p->wg.layer_end; l++)
        if (p->wg.layers[l].is_moe) {
            check_matmul_one(p, &p->wc.layers[l].router, &p->wg.layers[l].router, T, "router");
            break;
        }
}

typedef struct swiglu_args {
    k25_backend *be;
    const k25_layer *L;
    int T;
    float *x, *gate, *up, *act, *out;
} swiglu_args;

// down(silu(gate(x)) * up(x)), as the dense MLP or the shared expert runs it.
static void run_swiglu(void *arg) {
    swiglu_args *a = (swiglu_args *)arg;
    const int I = (int)a->L->ffn_gate.rows;
    a->be->matmul2(a->be, a->x, &a->L->ffn_gate, &a->L->ffn_up, a->T, a->gate, a->up);
    a->be->silu_mul(a->be, a->gate, a->up, a->T, I, a->act);
    a->be->matmul(a->be, a->act, &a->L->ffn_down, a->T, a->out);
}

// The dense MLP's or shared expert's chain on the main stream, then as a side branch beside a
// main-stream norm that stages its output for the product after it: neither stream's products
// may take the other's staged operand.
static void check_staged_swiglu(pair *p, int T, const k25_layer *Lc, const k25_layer *Lg,
                                double tol, const char *path) {
    if (Lg->ffn_gate.kind == K25_SRC_NONE) return;
    const int D = p->cfg->hidden, I = (int)Lg->ffn_gate.rows;
    const size_t td = (size_t)T * D, ti = (size_t)T * I;
    float *hx = (float *)k25_malloc(sizeof(float) * td);
    dbuf x = dbuf_new(p, td), y = dbuf_new(p, td), out = dbuf_new(p, td), o2 = dbuf_new(p, ti);
    dbuf g = dbuf_new(p, ti), u = dbuf_new(p, ti), act = dbuf_new(p, ti);
    fill_randn(hx, td, 1.0f);
    dbuf_set(p, &x, hx);
    k25_backend *be[2] = {p->cpu, p->gpu};
    for (int side = 0; side < 2; side++) {
        dbuf_poison(p, &out);
        for (int k = 0; k < 2; k++) {
            const k25_layer *L = k ? Lg : Lc;
            swiglu_args a = {be[k], L, T, k ? x.g : x.c, k ? g.g : g.c, k ? u.g : u.c,
                             k ? act.g : act.c, k ? out.g : out.c};
            if (!side) {
                run_swiglu(&a);
                continue;
            }
            be[k]->fork(be[k], run_swiglu, &a);
            be[k]->rmsnorm(be[k], k ? x.g : x.c, D, &L->ffn_norm, p->cfg->norm_eps, T, D,
                           k ? y.g : y.c);
            be[k]->matmul(be[k], k ? y.g : y.c, &L->ffn_gate, T, k ? o2.g : o2.c);
            be[k]->join(be[k]);
        }
        const double e = dbuf_err(p, &out, td), e2 = side ? dbuf_err(p, &o2, ti) : 0.0;
        report(e <= tol && e2 <= tol,
               "swiglu gate+up, silu_mul, down T=%-4d rel=%.2e, %.2e (%s, %s)", T, e, e2,
               side ? "side branch beside a norm -> matmul" : "main stream", path);
    }
    dbuf_free(p, &x), dbuf_free(p, &y), dbuf_free(p, &out), dbuf_free(p, &o2);
    dbuf_free(p, &g), dbuf_free(p, &u), dbuf_free(p, &act);
    free(hx);
}

// Above the GEMV's row limit a norm writes the bf16 operand of the projections that read its
// output beside it (kernels/backend_cuda.cu, "Staged operands"). The products must match the
// CPU after each norm, and must see a write into the norm's output made in between (a partial
// one too): a stale operand would give errors of order 1.
static void check_staged(pair *p, int T) {
    if (!want("staged")) return;
    const k25_config *cfg = p->cfg;
    const int D = cfg->hidden;
    const k25_layer *Lg = &p->wg.layers[p->wg.layer_begin], *Lc = &p->wc.layers[p->wc.layer_begin];
    const int N1 = (int)Lg->q_a.rows, N2 = (int)Lg->kv_a.rows;
    const size_t td = (size_t)T * D, half = (size_t)(T / 2) * D;
    float *hx = (float *)k25_malloc(sizeof(float) * td);
    dbuf x = dbuf_new(p, td), d = dbuf_new(p, td), h = dbuf_new(p, td), y = dbuf_new(p, td);
    dbuf o1 = dbuf_new(p, (size_t)T * N1), o2 = dbuf_new(p, (size_t)T * N2);
    fill_randn(hx, td, 1.0f);
    dbuf_set(p, &x, hx);
    fill_randn(hx, td, 0.5f);
    dbuf_set(p, &d, hx);
    fill_randn(hx, td, 1.0f);
    dbuf_set(p, &h, hx);
    const double tol = k25k_split_activations() ? 1e-4 : 1e-2;
    const char *path = T > gemv_max_rows() ? "staged" : "gemv, nothing staged";
    const float eps = cfg->norm_eps;
    k25_backend *be[2] = {p->cpu, p->gpu};
    for (int k = 0; k < 2; k++) {
        const k25_layer *L = k ? Lg : Lc;
        float *X = k ? x.g : x.c, *Y = k ? y.g : y.c, *O1 = k ? o1.g : o1.c, *O2 = k ? o2.g : o2.c;
        be[k]->rmsnorm(be[k], X, D, &L->attn_norm, eps, T, D, Y);
        be[k]->matmul2(be[k], Y, &L->q_a, &L->kv_a, T, O1, O2);
    }
    double e1 = dbuf_err(p, &o1, (size_t)T * N1), e2 = dbuf_err(p, &o2, (size_t)T * N2);
    report(e1 <= tol && e2 <= tol, "staged rmsnorm -> matmul2 q_a+kv_a T=%-4d rel=%.2e, %.2e (%s)",
           T, e1, e2, path);

    for (int k = 0; k < 2; k++) { // the later rows of the output written after the norm
        const k25_layer *L = k ? Lg : Lc;
        float *X = k ? x.g : x.c, *Y = k ? y.g : y.c, *O1 = k ? o1.g : o1.c;
        be[k]->rmsnorm(be[k], X, D, &L->attn_norm, eps, T, D, Y);
        be[k]->add(be[k], Y + half, k ? d.g : d.c, td - half);
        be[k]->matmul(be[k], Y, &L->q_a, T, O1);
    }
    e1 = dbuf_err(p, &o1, (size_t)T * N1);
    report(e1 <= tol, "staged rmsnorm, add into rows %d.., matmul q_a T=%-4d rel=%.2e (%s)", T / 2,
           T, e1, path);

    for (int k = 0; k < 2; k++) { // the output replaced from the host after the norm
        const k25_layer *L = k ? Lg : Lc;
        float *X = k ? x.g : x.c, *Y = k ? y.g : y.c, *O1 = k ? o1.g : o1.c;
        be[k]->rmsnorm(be[k], X, D, &L->attn_norm, eps, T, D, Y);
        be[k]->to_device(be[k], Y, hx, sizeof(float) * td);
        be[k]->matmul(be[k], Y, &L->q_a, T, O1);
    }
    e1 = dbuf_err(p, &o1, (size_t)T * N1);
    report(e1 <= tol, "staged rmsnorm, to_device, matmul q_a T=%-4d rel=%.2e (%s)", T, e1, path);

    for (int k = 0; k < 2; k++) { // another buffer's product after the norm; then add_rmsnorm's
        const k25_layer *L = k ? Lg : Lc;
        float *X = k ? x.g : x.c, *Y = k ? y.g : y.c, *O1 = k ? o1.g : o1.c, *O2 = k ? o2.g : o2.c;
        be[k]->rmsnorm(be[k], X, D, &L->attn_norm, eps, T, D, Y);
        be[k]->matmul(be[k], X, &L->q_a, T, O1);
        be[k]->add_rmsnorm(be[k], k ? h.g : h.c, k ? d.g : d.c, &L->ffn_norm, eps, T, D, Y);
        be[k]->matmul(be[k], Y, &L->kv_a, T, O2);
    }
    e1 = dbuf_err(p, &o1, (size_t)T * N1), e2 = dbuf_err(p, &o2, (size_t)T * N2);
    report(e1 <= tol && e2 <= tol, "staged rmsnorm, matmul of its input; add_rmsnorm -> matmul "
           "T=%-4d rel=%.2e, %.2e (%s)", T, e1, e2, path);

    for (int k = 0; k < 2; k++) { // the block end (one rank: the add and norm kernel)
        const k25_layer *L = k ? Lg : Lc;
        float *Y = k ? y.g : y.c, *O1 = k ? o1.g : o1.c, *O2 = k ? o2.g : o2.c;
        be[k]->allreduce_add_rmsnorm(be[k], k ? h.g : h.c, k ? d.g : d.c, &L->attn_norm, eps, T,
                                     D, Y);
        be[k]->matmul2(be[k], Y, &L->q_a, &L->kv_a, T, O1, O2);
    }
    e1 = dbuf_err(p, &o1, (size_t)T * N1), e2 = dbuf_err(p, &o2, (size_t)T * N2);
    report(e1 <= tol && e2 <= tol, "staged allreduce_add_rmsnorm -> matmul2 T=%-4d rel=%.2e, "
           "%.2e (%s)", T, e1, e2, path);
    dbuf_free(p, &x), dbuf_free(p, &d), dbuf_free(p, &h), dbuf_free(p, &y);
    dbuf_free(p, &o1), dbuf_free(p, &o2);
    free(hx);
    check_staged_swiglu(p, T, Lc, Lg, tol, path);
}

// --only matmul: both groups; --only matmul2: the pairs alone.
static void check_matmuls(pair *p, int T) {
    check_matmul_singles(p, T);
    check_matmul2_pairs(p, T);
}

static int first_moe(const k25_weights *w) {
    for (int l = w->layer_begin; l < w->layer_end; l++)
        if (w->layers[l].is_moe) return l;
    return -1;
}

// Both backends' MoE on the routing hic [T][K] (copied to both sides) with the weights wts and
// the input x; the relative error of the GPU's output y.
static double moe_on_routing(pair *p, const k25_layer *Lc, const k25_layer *Lg, const dbuf *x,
                             const dbuf *wts, dbuf *y, int32_t *ic, int32_t *ig,
                             const int32_t *hic, int T, int K, int D) {
    p->cpu->to_device(p->cpu, ic, hic, sizeof(int32_t) * T * K);
    p->gpu->to_device(p->gpu, ig, hic, sizeof(int32_t) * T * K);
    dbuf_poison(p, y);
    p->cpu->moe(p->cpu, x->c, Lc, ic, wts->c, NULL, y->c);
    p->gpu->moe(p->gpu, x->g, Lg, ig, wts->g, NULL, y->g);
    p->gpu->sync(p->gpu);
    return dbuf_err(p, y, (size_t)T * D);
}

static void check_moe(pair *p, int T) {
    const k25_config *cfg = p->cfg;
    int l = first_moe(&p->wg);
    if (l < 0) return;
    const int D = cfg->hidden, K = cfg->top_k, E = cfg->n_experts;
    const k25_layer *Lg = &p->wg.layers[l], *Lc = &p->wc.layers[l];
    float *hx = (float *)k25_malloc(sizeof(float) * (size_t)T * D);
    fill_randn(hx, (size_t)T * D, 1.0f);
    dbuf x = dbuf_new(p, (size_t)T * D), y = dbuf_new(p, (size_t)T * D);
    dbuf_set(p, &x, hx);
    int32_t *ic = (int32_t *)p->cpu->alloc(p->cpu, sizeof(int32_t) * T * K);
    int32_t *ig = (int32_t *)p->gpu->alloc(p->gpu, sizeof(int32_t) * T * K);
    dbuf wts = dbuf_new(p, (size_t)T * K);
    int32_t *hic = (int32_t *)k25_malloc(sizeof(int32_t) * T * K);
    int32_t *hig = (int32_t *)k25_malloc(sizeof(int32_t) * T * K);
    float *hwc = (float *)k25_malloc(sizeof(float) * T * K), *hwg = (float *)k25_malloc(sizeof(float) * T * K);

    if (want("router")) {
        dbuf_poison(p, &y); // here: a host write between the router and the moe below would
                            // make the GPU sort again in the moe call
        p->cpu->router(p->cpu, x.c, Lc, ic, wts.c);
        p->gpu->router(p->gpu, x.g, Lg, ig, wts.g);
        p->cpu->to_host(p->cpu, hic, ic, sizeof(int32_t) * T * K);
        p->gpu->to_host(p->gpu, hig, ig, sizeof(int32_t) * T * K);
        p->cpu->to_host(p->cpu, hwc, wts.c, sizeof(float) * T * K);
        p->gpu->to_host(p->gpu, hwg, wts.g, sizeof(float) * T * K);
        int same = 0, rows_diff = 0;
        double werr = 0;
        for (int t = 0; t < T; t++) {
            int row_same = 1;
            for (int k = 0; k < K; k++) {
                int e = hic[t * K + k], found = -1;
                for (int j = 0; j < K; j++)
                    if (hig[t * K + j] == e) found = j;
                if (found < 0) {
                    row_same = 0;
                    continue;
                }
                double dw = fabs((double)hwg[t * K + found] - hwc[t * K + k]);
                if (!(dw <= werr)) werr = isnan(dw) ? INFINITY : dw;
            }
            same += row_same;
            rows_diff += !row_same;
        }
        // a differing row is only acceptable as a near-tie of biased scores; on random
        // inputs those are rare: allow at most one row in 64. Uniform routing draws the ids
        // from (layer, sequence, position) alone: every row the same.
        int ok = (cfg->uniform_routing ? rows_diff == 0 : rows_diff * 64 <= T) && werr <= 1e-4;
        report(ok, "router         T=%-4d E=%d top_k=%d rows with the same experts %d/%d, "
               "max |dw| %.2e", T, E, K, same, T, werr);
        // the MoE on the GPU router's own choices, right after it (where the router's launch
        // also ran the routing sort), against the CPU's MoE on the same choices and weights
        p->gpu->moe(p->gpu, x.g, Lg, ig, wts.g, NULL, y.g);
        p->cpu->to_device(p->cpu, ic, hig, sizeof(int32_t) * T * K);
        p->cpu->to_device(p->cpu, wts.c, hwg, sizeof(float) * T * K);
        p->cpu->moe(p->cpu, x.c, Lc, ic, wts.c, NULL, y.c);
        p->gpu->sync(p->gpu);
        double e = dbuf_err(p, &y, (size_t)T * D);
        report(e <= 1e-2, "moe after router T=%-4d (the GPU router's choices) rel=%.2e", T, e);
    }
    if (want("moe")) {
        // the CPU's routing fed to both MoE implementations
        p->cpu->router(p->cpu, x.c, Lc, ic, wts.c);
        p->cpu->to_host(p->cpu, hic, ic, sizeof(int32_t) * T * K);
        p->cpu->to_host(p->cpu, hwc, wts.c, sizeof(float) * T * K);
        p->gpu->to_device(p->gpu, ig, hic, sizeof(int32_t) * T * K);
        p->gpu->to_device(p->gpu, wts.g, hwc, sizeof(float) * T * K);
        dbuf_poison(p, &y);
        double t0 = k25_now_ms();
        p->cpu->moe(p->cpu, x.c, Lc, ic, wts.c, NULL, y.c);
        double t1 = k25_now_ms();
        p->gpu->moe(p->gpu, x.g, Lg, ig, wts.g, NULL, y.g);
        p->gpu->sync(p->gpu);
        double e = dbuf_err(p, &y, (size_t)T * D);
        report(e <= 1e-2, "moe            T=%-4d E=%d top_k=%d I_local=%lld D=%d rel=%.2e (cpu %.0f ms)",
               T, E, K, (long long)Lg->exp_gate[0].out, D, e, t1 - t0);
        { // with the shared expert's addend, read by the combine: the same sums, then the add
            const size_t td = (size_t)T * D;
            float *ha = (float *)k25_malloc(sizeof(float) * td);
            float *hy0 = (float *)k25_malloc(sizeof(float) * td);
            float *hy1 = (float *)k25_malloc(sizeof(float) * td);
            fill_randn(ha, td, 1.0f);
            dbuf ad = dbuf_new(p, td);
            dbuf_set(p, &ad, ha);
            p->gpu->to_host(p->gpu, hy0, y.g, sizeof(float) * td);
            p->gpu->moe(p->gpu, x.g, Lg, ig, wts.g, ad.g, y.g);
            p->gpu->to_host(p->gpu, hy1, y.g, sizeof(float) * td);
            size_t differ = 0;
            for (size_t i = 0; i < td; i++) differ += hy1[i] != hy0[i] + ha[i];
            report(differ == 0,
                   "moe + add      T=%-4d %zu of %zu elements differ from moe, then + add", T,
                   differ, td);
            dbuf_free(p, &ad);
            free(ha), free(hy0), free(hy1);
        }
        // every row on the same K experts: long slot lists (several 32-token passes)
        const int step = (E - 1) / K > 0 ? (E - 1) / K : 1;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) hic[t * K + k] = (1 + k * step) % E;
        e = moe_on_routing(p, Lc, Lg, &x, &wts, &y, ic, ig, hic, T, K, D);
        report(e <= 1e-2, "moe same-set   T=%-4d (every row on the same experts) rel=%.2e", T, e);
        // skewed: every row picks K distinct experts out of a pool of K..K+2 (item counts from
        // K upward, so the device-side split plan differs from the uniform routing's), then
        // one hot expert every row shares plus distinct random others from all E
        for (int pass = 0; pass < 2; pass++) {
            const int pool = pass == 0 ? (K + T % 3 < E ? K + T % 3 : E) : E;
            int perm[1024];
            if (pool > 1024) break;
            for (int t = 0; t < T; t++) {
                for (int i = 0; i < pool; i++) perm[i] = i;
                if (pass == 1) perm[0] = E / 2, perm[E / 2] = 0; // expert E/2 first: the hot one
                for (int k = pass; k < K; k++) { // partial Fisher-Yates over perm[k..pool)
                    int j = k + (int)(rnd64() % (uint64_t)(pool - k));
                    int tmp = perm[k];
                    perm[k] = perm[j], perm[j] = tmp;
                }
                for (int k = 0; k < K; k++) hic[t * K + k] = (perm[k] + 3 * pass) % E;
            }
            e = moe_on_routing(p, Lc, Lg, &x, &wts, &y, ic, ig, hic, T, K, D);
            report(e <= 1e-2, "moe %s T=%-4d (%s) rel=%.2e", pass ? "hot-expert" : "skewed    ", T,
                   pass ? "one expert in every row, the rest uniform" : "rows from a pool of K..K+2 experts",
                   e);
        }
        // each expert chosen twice in a row (the router's top-k never does; the op allows it):
        // at one row every choice is its own item of one slot
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) hic[t * K + k] = (1 + (k / 2) * step + t) % E;
        e = moe_on_routing(p, Lc, Lg, &x, &wts, &y, ic, ig, hic, T, K, D);
        report(e <= 1e-2, "moe duplicates T=%-4d (every expert twice in its row) rel=%.2e", T, e);
        // one token in every row, on the same experts with the same weights: every row's bits
        // must be row 0's. Above 16 rows an expert's slots are cut into several items, and which
        // rows land in which follows the routing sort's atomics.
        for (int t = 1; t < T; t++) {
            memcpy(hx + (size_t)t * D, hx, sizeof(float) * D);
            memcpy(hwc + (size_t)t * K, hwc, sizeof(float) * K);
        }
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) hic[t * K + k] = (1 + k * step) % E;
        p->gpu->to_device(p->gpu, x.g, hx, sizeof(float) * (size_t)T * D);
        p->gpu->to_device(p->gpu, wts.g, hwc, sizeof(float) * T * K);
        p->gpu->to_device(p->gpu, ig, hic, sizeof(int32_t) * T * K);
        p->gpu->moe(p->gpu, x.g, Lg, ig, wts.g, NULL, y.g);
        float *hy = (float *)k25_malloc(sizeof(float) * (size_t)T * D);
        p->gpu->to_host(p->gpu, hy, y.g, sizeof(float) * (size_t)T * D);
        int differ = 0;
        for (int t = 1; t < T; t++)
            differ += memcmp(hy + (size_t)t * D, hy, sizeof(float) * D) != 0;
        report(differ == 0, "moe one token  T=%-4d in every row: %d of %d rows differ from row 0",
               T, differ, T - 1);
        free(hy);
    }
    p->cpu->free(p->cpu, ic);
    p->gpu->free(p->gpu, ig);
    dbuf_free(p, &wts), dbuf_free(p, &x), dbuf_free(p, &y);
    free(hic), free(hig), free(hwc), free(hwg), free(hx);
}

// --only moe_bad_id: a step of T rows whose last choice is an expert id outside [0, E). The GPU's
// routing sort leaves that choice out (one row: its GEMMs skip the item no id made) and flags
// it; the backend must then stop at the sync with the error, so reaching the report below is
// the failure. tests/run_gpu.sh runs this under compute-sanitizer (no access outside the
// buffers on the way) and checks for the message.
static void check_moe_bad_id(pair *p, int T) {
    const k25_config *cfg = p->cfg;
    int l = first_moe(&p->wg);
    if (l < 0) return;
    const int D = cfg->hidden, K = cfg->top_k, E = cfg->n_experts;
    const k25_layer *Lg = &p->wg.layers[l];
    float *hx = (float *)k25_malloc(sizeof(float) * (size_t)T * D);
    fill_randn(hx, (size_t)T * D, 1.0f);
    dbuf x = dbuf_new(p, (size_t)T * D), y = dbuf_new(p, (size_t)T * D), wts = dbuf_new(p, (size_t)T * K);
    dbuf_set(p, &x, hx);
    float *hw = (float *)k25_malloc(sizeof(float) * T * K);
    int32_t *hi = (int32_t *)k25_malloc(sizeof(int32_t) * T * K);
    const int step = (E - 1) / K > 0 ? (E - 1) / K : 1;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) hi[t * K + k] = (1 + k * step) % E, hw[t * K + k] = 1.0f / K;
    hi[T * K - 1] = E;
    int32_t *ig = (int32_t *)p->gpu->alloc(p->gpu, sizeof(int32_t) * T * K);
    p->gpu->to_device(p->gpu, ig, hi, sizeof(int32_t) * T * K);
    p->gpu->to_device(p->gpu, wts.g, hw, sizeof(float) * T * K);
    p->gpu->moe(p->gpu, x.g, Lg, ig, wts.g, NULL, y.g);
    p->gpu->sync(p->gpu);
    report(0, "moe bad id     T=%-4d expert %d of %d: the step went on without an error", T, E, E);
    p->gpu->free(p->gpu, ig);
    dbuf_free(p, &wts), dbuf_free(p, &x), dbuf_free(p, &y);
    free(hi), free(hw), free(hx);
}

// Prefill of ctx + s * skew positions for sequence s in chunks (rows of the sequences not yet
// at their length, interleaved), then one step of T_decode rows (T_decode / n_seq per sequence:
// batch decode, or a verification step causal within itself); compares every call. Each call's
// output then goes through o_proj on both backends from the GPU's attention output: above the
// GEMV's rows the GPU's product reads the operand the attention staged, which must be that
// output's (a stale or misplaced one gives errors of order 1).
static void check_mla(pair *p, int T_decode, int n_seq, int ctx, int kv_block, int skew) {
    if (!want("mla")) return;
    const k25_config *cfg = p->cfg;
    const k25_layer *Lg = &p->wg.layers[p->wg.layer_begin], *Lc = &p->wc.layers[p->wc.layer_begin];
    const int dq = cfg->qk_nope_dim + cfg->qk_rope_dim, H = (int)(Lg->q_b.rows / dq);
    const int W = cfg->kv_lora_rank + cfg->qk_rope_dim, dv = cfg->v_head_dim;
    const int max_blocks = (ctx + (n_seq - 1) * skew + T_decode + kv_block) / kv_block + 1;
    const int n_blocks = max_blocks * n_seq;
    p->cpu->kv_init(p->cpu, 1, n_blocks, kv_block);
    p->gpu->kv_init(p->gpu, 1, n_blocks, kv_block);
    int start[64] = {0}, tgt[64];
    double worst = 0, worst_o = 0;
    int steps = 0;
    const int D = cfg->hidden;
    // prefill chunks of up to 128 rows (rows of all sequences interleaved), then decode steps
    int remaining = 0;
    for (int s = 0; s < n_seq; s++) remaining += tgt[s] = ctx + s * skew;
    while (remaining > 0 || steps < 1000) {
        int T = remaining > 0 ? (remaining < 128 ? remaining : 128) : T_decode;
        if (remaining <= 0 && T > n_seq) T = n_seq * ((T + n_seq - 1) / n_seq);
        batch_buf bb;
        batch_make(&bb, cfg, T, n_seq, start, max_blocks, kv_block);
        if (remaining > 0) { // T <= remaining: every row finds a sequence below its length
            int next[64], s = 0;
            memcpy(next, start, sizeof next);
            for (int t = 0; t < T; t++) {
                while (next[s] >= tgt[s]) s = (s + 1) % n_seq;
                bb.seq[t] = s;
                bb.pos[t] = next[s]++;
                s = (s + 1) % n_seq;
            }
        }
        for (int t = 0; t < T; t++) start[bb.seq[t]] = bb.pos[t] + 1;
        set_batch_both(p, &bb.b);
        float *hq = (float *)k25_malloc(sizeof(float) * (size_t)T * H * dq);
        float *hkv = (float *)k25_malloc(sizeof(float) * (size_t)T * W);
        fill_randn(hq, (size_t)T * H * dq, 1.0f);
        fill_randn(hkv, (size_t)T * W, 1.0f);
        dbuf q = dbuf_new(p, (size_t)T * H * dq), kv = dbuf_new(p, (size_t)T * W),
             o = dbuf_new(p, (size_t)T * H * dv), y = dbuf_new(p, (size_t)T * D);
        dbuf_set(p, &q, hq);
        dbuf_set(p, &kv, hkv);
        dbuf_poison(p, &o);
        p->cpu->mla_attention(p->cpu, 0, Lc, q.c, kv.c, o.c);
        p->gpu->mla_attention(p->gpu, 0, Lg, q.g, kv.g, o.g);
        p->gpu->sync(p->gpu);
        double e = dbuf_err(p, &o, (size_t)T * H * dv);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        int last = remaining <= 0;
        if (last || e > 2e-2)
            report(e <= 2e-2, "mla            T=%-4d H=%d seqs=%d pos up to %d..%d kv_block=%d rel=%.2e",
                   T, H, n_seq, start[0] - 1, start[n_seq - 1] - 1, kv_block, e);
        p->gpu->to_host(p->gpu, o.c, o.g, sizeof(float) * (size_t)T * H * dv);
        p->cpu->matmul(p->cpu, o.c, &Lc->o_proj, T, y.c);
        p->gpu->matmul(p->gpu, o.g, &Lg->o_proj, T, y.g);
        const double eo = dbuf_err(p, &y, (size_t)T * D);
        if (!(eo <= worst_o)) worst_o = isnan(eo) ? INFINITY : eo;
        const double tol_o = k25k_split_activations() ? 1e-4 : 1e-2;
        if (last || eo > tol_o)
            report(eo <= tol_o, "mla -> o_proj  T=%-4d (worst of %d calls) rel=%.2e (%s)", T,
                   steps + 1, worst_o, T > gemv_max_rows() ? "staged" : "gemv");
        dbuf_free(p, &q), dbuf_free(p, &kv), dbuf_free(p, &o), dbuf_free(p, &y);
        free(hq), free(hkv);
        batch_free(&bb);
        remaining -= T;
        steps++;
        if (last) break;
    }
}

// sampling and the logits gather share one set of logits
static void check_sampling(pair *p, int T) {
    if (!want("sample") && !want("gather")) return;
    const int V = p->wg.vocab_local, vb = p->wg.vocab_begin;
    float *hl = (float *)k25_malloc(sizeof(float) * (size_t)T * V);
    fill_randn(hl, (size_t)T * V, 3.0f);
    if (V > 3) hl[1] = hl[2] = 50.0f; // a greedy tie in row 0: the lower id must win
    dbuf lg = dbuf_new(p, (size_t)T * V);
    dbuf_set(p, &lg, hl);
    int start[1] = {0};
    batch_buf bb;
    batch_make(&bb, p->cfg, T, 1, start, 64, 64);
    set_batch_both(p, &bb.b);
    k25_sampling *ps = (k25_sampling *)k25_calloc(T, sizeof(k25_sampling));
    const char *names[] = {"greedy", "temperature", "top-k", "top-p", "top-k+top-p"};
    for (int mode = 0; mode < 5 && want("sample"); mode++) {
        for (int t = 0; t < T; t++) {
            ps[t].temp = mode == 0 ? 0.0f : 0.7f + 0.1f * (t % 3);
            ps[t].top_k = (mode == 2 || mode == 4) ? 1 + (t * 7) % 50 : 0;
            ps[t].top_p = (mode == 3 || mode == 4) ? 0.5f + 0.1f * (t % 4) : 1.0f;
            ps[t].seed = 1234 + mode;
            ps[t].counter = (uint64_t)t * 3 + 1;
        }
        int32_t *oc = (int32_t *)k25_malloc(sizeof(int32_t) * T), *og = (int32_t *)k25_malloc(sizeof(int32_t) * T);
        p->cpu->sample(p->cpu, lg.c, vb, V, ps, oc);
        p->gpu->sample(p->gpu, lg.g, vb, V, ps, og);
        int same = 0;
        for (int t = 0; t < T; t++) same += oc[t] == og[t];
        report(same == T, "sample %-12s T=%-4d V_local=%d same tokens %d/%d", names[mode], T, V,
               same, T);
        free(oc), free(og);
    }
    if (want("gather")) {
        float *a = (float *)k25_malloc(sizeof(float) * p->cfg->vocab);
        float *b = (float *)k25_malloc(sizeof(float) * p->cfg->vocab);
        p->gpu->gather_logits(p->gpu, lg.g, V, T - 1, b);
        p->cpu->gather_logits(p->cpu, lg.c, V, T - 1, a);
        double e = rel_err(b, a, (size_t)V); // single rank: the local slice
        report(e == 0.0, "gather_logits  row %d V_local=%d rel=%.2e", T - 1, V, e);
        free(a), free(b);
    }
    free(ps);
    dbuf_free(p, &lg);
    batch_free(&bb);
    free(hl);
}

// The whole forward pass (model.c over both backends, CUDA graphs on unless K25_NO_GRAPH):
// a prefill of n_prompt rows with every row's logits, then n_decode greedy steps fed with the
// CPU's tokens. Worst relative L2 error and cosine of the logits rows; the GPU's argmax must
// equal the CPU's wherever the CPU's top two logits are not a near-tie.
static void check_model(const k25_config *cfg, const k25_tensor_source *src, k25_dist *dist,
                        int n_prompt, int n_decode) {
    if (!want("model")) return;
    char err[K25_ERR_LEN];
    k25_weights wc, wg;
    if (weights_plan(&wc, cfg, 0, 1, 0, cfg->n_layers, src, err) ||
        weights_plan(&wg, cfg, 0, 1, 0, cfg->n_layers, src, err))
        K25_DIE("%s", err);
    k25_backend *cpu = backend_cpu_create(cfg, dist, 0), *gpu = backend_cuda_create(cfg, dist);
    k25_model_opts opts = {1, n_prompt > 8 ? n_prompt : 8, 16, 0, 0};
    k25_model *mc = model_create(cfg, &wc, cpu, dist, &opts);
    k25_model *mg = model_create(cfg, &wg, gpu, dist, &opts);
    const int nb = model_n_blocks(mc), V = cfg->vocab;
    int32_t *table = (int32_t *)k25_malloc(sizeof(int32_t) * nb);
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;
    int32_t *tok = (int32_t *)k25_malloc(sizeof(int32_t) * n_prompt), *pos = (int32_t *)k25_malloc(sizeof(int32_t) * n_prompt);
    int32_t *seq = (int32_t *)k25_calloc(n_prompt, sizeof(int32_t)), *rows = (int32_t *)k25_malloc(sizeof(int32_t) * n_prompt);
    for (int t = 0; t < n_prompt; t++) tok[t] = (int32_t)(rnd64() % (uint64_t)V), pos[t] = t, rows[t] = t;
    k25_sampling *ps = (k25_sampling *)k25_calloc(n_prompt, sizeof(k25_sampling));
    float *lc = (float *)k25_malloc(sizeof(float) * (size_t)n_prompt * V);
    float *lg = (float *)k25_malloc(sizeof(float) * (size_t)n_prompt * V);
    int32_t *oc = (int32_t *)k25_malloc(sizeof(int32_t) * n_prompt), *og = (int32_t *)k25_malloc(sizeof(int32_t) * n_prompt);
    double worst = 0, worst_cos = 1;
    int argmax_bad = 0, steps = 0, worst_row = -1;
    for (int step = 0; step <= n_decode; step++) {
        int T = step == 0 ? n_prompt : 1;
        if (step > 0) tok[0] = oc[0], pos[0] = n_prompt + step - 1;
        else
            for (int t = 0; t < T; t++) pos[t] = t;
        k25_batch b = {T, tok, pos, seq, table, 1, nb};
        model_step(mc, &b, rows, T, ps, oc, lc);
        model_step(mg, &b, rows, T, ps, og, lg);
        for (int t = 0; t < T; t++) {
            const float *a = lc + (size_t)t * V, *g = lg + (size_t)t * V;
            double e = rel_err(g, a, V), dot = 0, na = 0, ng = 0;
            for (int v = 0; v < V; v++) dot += (double)a[v] * g[v], na += (double)a[v] * a[v], ng += (double)g[v] * g[v];
            double cs = dot / sqrt(na * ng + 1e-300);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, worst_row = pos[t];
            if (!(cs >= worst_cos)) worst_cos = isnan(cs) ? -1 : cs;
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int v = 0; v < V; v++) {
                if (a[v] > m1) m2 = m1, m1 = a[v];
                else if (a[v] > m2) m2 = a[v];
            }
            if (oc[t] != og[t] && (m1 - m2) > 1e-3f * fabsf(m1)) argmax_bad++;
        }
        steps += T;
    }
    report(worst <= 1e-2 && worst_cos >= 0.9999 && argmax_bad == 0,
           "model          %d prompt rows + %d decode steps: worst logits rel=%.2e (position %d), "
           "worst cosine %.6f, greedy tokens differing outside near-ties %d", n_prompt, n_decode,
           worst, worst_row, worst_cos, argmax_bad);
    model_free(mc);
    model_free(mg);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    weights_free(&wc);
    weights_free(&wg);
    free(table), free(tok), free(pos), free(seq), free(rows), free(ps), free(lc), free(lg), free(oc), free(og);
}

// ------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    k25_dist dist;
    dist_init(&dist, &argc, &argv);
    char err[K25_ERR_LEN];
    if (dist_setup_groups(&dist, dist.world_size, 1, err)) K25_DIE("%s", err);
    k25_config cfg;
    config_init_defaults(&cfg);
    const char *config = "config/tiny.ini", *model_dir = NULL;
    int tp = 1, rank = 0, ctx = 200;
    int rows[16] = {1, 3, 8, 17, 64}, n_rows = 5;
    const char *sets[32];
    int n_sets = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model_dir = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            n_rows = 0;
            for (char *s = strtok(argv[++i], ","); s && n_rows < 16; s = strtok(NULL, ","))
                rows[n_rows++] = atoi(s);
        } else
            K25_DIE("usage: gpu_ops [--config FILE] [--set k=v] [--tp N] [--rank R] [--rows "
                    "1,3,17] [--ctx N] [--only NAME] (bad argument %s)", argv[i]);
    }
    k25_checkpoint *ck = NULL;
    if (model_dir) {
        ck = checkpoint_open(model_dir, err);
        if (!ck) K25_DIE("%s", err);
        char path[1024];
        checkpoint_config_path(ck, path, sizeof path);
        if (config_load_hf_json(&cfg, path, err)) K25_DIE("%s", err);
        config = model_dir;
    } else if (config_load_ini(&cfg, config, err)) {
        K25_DIE("%s", err);
    }
    for (int i = 0; i < n_sets; i++)
        if (config_set(&cfg, sets[i], err)) K25_DIE("%s", err);
    if (config_validate(&cfg, err) || config_check_tp(&cfg, tp, err)) K25_DIE("%s", err);
    printf("# gpu_ops: %s, rank %d of tp %d (simulated on one GPU), hidden %d, experts %d x "
           "%d/%d, heads %d/%d, vocab %d/%d\n", config, rank, tp, cfg.hidden, cfg.n_experts,
           cfg.moe_inter / tp, cfg.moe_inter, cfg.n_heads / tp, cfg.n_heads, cfg.vocab / tp,
           cfg.vocab);

    pair p;
    memset(&p, 0, sizeof p);
    p.cfg = &cfg;
    k25_tensor_source src = ck ? checkpoint_source(ck) : synth_source(7);
    if (weights_plan(&p.wc, &cfg, rank, tp, 0, cfg.n_layers, &src, err) ||
        weights_plan(&p.wg, &cfg, rank, tp, 0, cfg.n_layers, &src, err))
        K25_DIE("%s", err);
    p.cpu = backend_cpu_create(&cfg, &dist, 0);
    p.gpu = backend_cuda_create(&cfg, &dist);
    double t0 = k25_now_ms();
    p.cpu->load_weights(p.cpu, &p.wc);
    double t1 = k25_now_ms();
    p.gpu->load_weights(p.gpu, &p.wg);
    p.gpu->sync(p.gpu);
    double t2 = k25_now_ms();
    printf("# weights: cpu %.0f ms, gpu %.0f ms (%.2f GiB)\n", t1 - t0, t2 - t1,
           weights_bytes(&p.wg) / (1024.0 * 1024 * 1024));
    p.cpu->kv_init(p.cpu, 1, 64, 64);
    p.gpu->kv_init(p.gpu, 1, 64, 64);

    check_synth_upload(&p);
    if (want("moe")) check_moe_plan();
    for (int i = 0; i < n_rows; i++) {
        int start[1] = {0};
        batch_buf bb;
        batch_make(&bb, &cfg, rows[i], 1, start, 64, 64);
        set_batch_both(&p, &bb.b);
        if (only && !strcmp(only, "moe_bad_id")) check_moe_bad_id(&p, rows[i]); // stops
        check_rows_ops(&p, rows[i]);
        check_matmuls(&p, rows[i]);
        check_staged(&p, rows[i]);
        check_moe(&p, rows[i]);
        batch_free(&bb);
    }
    check_mla(&p, 1, 1, ctx, 64, 0);
    check_mla(&p, 4, 2, ctx / 2 + 3, 16, 0);
    check_mla(&p, 6, 3, 5, 16, 0);
    check_mla(&p, 3, 3, ctx / 3 + 1, 64, ctx / 2 + 17); // batch decode, three lengths
    check_mla(&p, 8, 2, 70, 64, ctx + 5);               // 4 verification rows per sequence
    check_sampling(&p, 5);
    check_sampling(&p, 1);

    p.gpu->destroy(p.gpu);
    p.cpu->destroy(p.cpu);
    weights_free(&p.wc);
    weights_free(&p.wg);
    // the whole forward pass, single rank (small models only: two full copies of the weights)
    // The model check uses the f32 latent cache: routing is discontinuous, and the rounding of
    // a bf16 cache (~1e-3) flips near-tie expert choices against the float64-accumulating CPU
    // reference on these small models (the op checks above cover the bf16 cache).
    if (tp == 1 && (size_t)cfg.hidden * cfg.n_experts <= (size_t)1 << 16) {
        setenv("K25_KV_F32", "1", 0);
        check_model(&cfg, &src, &dist, 24, 12);
        check_model(&cfg, &src, &dist, 5, 40);
    }
    if (ck) checkpoint_close(ck);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    dist_finalize(&dist);
    return n_fail ? 1 : 0;
}
