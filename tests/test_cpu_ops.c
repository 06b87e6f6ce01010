// Every CPU backend operation against a straightforward formula computed here in double:
// matmul, RMSNorm, SwiGLU, embedding rows, YaRN frequencies, absorbed MLA over a paged cache
// against naive attention with k = [W_UK c; rope(k_pe)], v = W_UV c (RoPE as complex
// multiplication), noaux_tc routing against exhaustive enumeration of group and expert subsets,
// INT4 MoE against explicitly dequantized weights (and a tensor-parallel split of it).
#include <complex.h>
#undef I // the imaginary unit is written _Complex_I below; I is a dimension
#include <math.h>
#include <string.h>

#include "backend.h"
#include "dist.h"

static int failures;
static uint64_t rng_state = 12345;

static double urand(void) { // uniform [0, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float frand(float a) { return (float)((2 * urand() - 1) * a); }

// max |got - want| <= tol * max |want| (plus a tiny floor)
static void check_close(const char *what, const float *got, const double *want, size_t n,
                        double tol) {
    double ref = 1e-30, err = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(want[i]) > ref) ref = fabs(want[i]);
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = e, at = i;
    }
    int ok = err <= tol * ref;
    printf("%-44s max err %.3e (rel %.3e) %s\n", what, err, err / ref, ok ? "ok" : "FAIL");
    if (!ok) {
        printf("    at %zu: got %.9g want %.9g\n", at, (double)got[at], want[at]);
        failures++;
    }
}

static void check(const char *what, int ok) {
    printf("%-44s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

// A bf16 tensor held in test memory; vals gets the bf16-rounded values as float.
static k25_tensor bf16_tensor(const char *name, int64_t rows, int64_t cols, float amp, float *vals) {
    k25_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = K25_BF16;
    t.rows = t.g_rows = rows;
    t.cols = t.g_cols = cols;
    t.kind = K25_SRC_FILE;
    uint16_t *d = k25_malloc(sizeof(uint16_t) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) {
        float v = frand(amp);
        d[i] = k25_f32_to_bf16(v);
        if (vals) vals[i] = k25_bf16_to_f32(d[i]);
    }
    t.dev = d;
    t.file_data = (const uint8_t *)d;
    return t;
}

static k25_tensor f32_tensor(const char *name, int64_t rows, int64_t cols, const float *vals) {
    k25_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = K25_F32;
    t.rows = t.g_rows = rows;
    t.cols = t.g_cols = cols;
    t.kind = K25_SRC_FILE;
    float *d = k25_malloc(sizeof(float) * (size_t)(rows * cols));
    memcpy(d, vals, sizeof(float) * (size_t)(rows * cols));
    t.dev = d;
    t.file_data = (const uint8_t *)d;
    return t;
}

static void set_rows(k25_backend *be, int T, const int32_t *tok, const int32_t *pos,
                     const int32_t *seq, const int32_t *table, int max_seqs, int max_blocks) {
    k25_batch b = {T, tok, pos, seq, table, max_seqs, max_blocks};
    be->set_batch(be, &b);
}

// ------------------------------------------------------------------------------------------

static void test_dense_ops(k25_backend *be) {
    enum { T = 3, K = 70, N = 37 };
    float W[N * K], x[T * K], y[T * N];
    double ref[T * N];
    k25_tensor w = bf16_tensor("w", N, K, 0.5f, W);
    for (int i = 0; i < T * K; i++) x[i] = frand(2);
    int32_t zeros[T] = {0};
    set_rows(be, T, zeros, zeros, zeros, zeros, 1, 1);
    be->matmul(be, x, &w, T, y);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[t * K + k] * W[n * K + k];
            ref[t * N + n] = s;
        }
    check_close("matmul bf16", y, ref, T * N, 1e-6);
    k25_tensor wf = f32_tensor("wf", N, K, W);
    be->matmul(be, x, &wf, T, y);
    check_close("matmul f32", y, ref, T * N, 1e-6);

    // rmsnorm with a row stride larger than the row
    enum { n = 40, ld = 50 };
    float xs[T * ld], g[n], out[T * n];
    double rref[T * n];
    for (int i = 0; i < T * ld; i++) xs[i] = frand(3);
    k25_tensor gw = bf16_tensor("norm", 1, n, 1.5f, g);
    be->rmsnorm(be, xs, ld, &gw, 1e-5f, T, n, out);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xs[t * ld + i] * xs[t * ld + i];
        for (int i = 0; i < n; i++) rref[t * n + i] = xs[t * ld + i] / sqrt(ss / n + 1e-5) * g[i];
    }
    check_close("rmsnorm (strided rows)", out, rref, T * n, 1e-6);

    // add_rmsnorm: h += d, out = rmsnorm(h)
    float h[T * n], d[T * n];
    double href[T * n];
    for (int i = 0; i < T * n; i++) h[i] = frand(2), d[i] = frand(2), href[i] = (double)h[i] + d[i];
    be->add_rmsnorm(be, h, d, &gw, 1e-6f, T, n, out);
    check_close("add_rmsnorm residual", h, href, T * n, 1e-7);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += href[t * n + i] * href[t * n + i];
        for (int i = 0; i < n; i++) rref[t * n + i] = href[t * n + i] / sqrt(ss / n + 1e-6) * g[i];
    }
    check_close("add_rmsnorm output", out, rref, T * n, 1e-6);

    // silu_mul and add
    float a[T * n], u[T * n], s[T * n];
    for (int i = 0; i < T * n; i++) a[i] = frand(6), u[i] = frand(2);
    be->silu_mul(be, a, u, T, n, s);
    for (int i = 0; i < T * n; i++) rref[i] = a[i] / (1 + exp(-(double)a[i])) * u[i];
    check_close("silu_mul", s, rref, T * n, 1e-6);
    for (int i = 0; i < T * n; i++) rref[i] = (double)s[i] + a[i];
    be->add(be, s, a, T * n);
    check_close("add", s, rref, T * n, 1e-7);

    // embedding rows come from the tensor's source
    enum { V = 20, DE = 12 };
    float E[V * DE], xe[T * DE];
    double eref[T * DE];
    k25_tensor emb = bf16_tensor("embed", V, DE, 1, E);
    int32_t toks[T] = {7, 0, 19};
    set_rows(be, T, toks, zeros, zeros, zeros, 1, 1);
    be->embed(be, &emb, xe);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < DE; i++) eref[t * DE + i] = E[toks[t] * DE + i];
    check_close("embed", xe, eref, T * DE, 0);
    free(w.dev), free(wf.dev), free(gw.dev), free(emb.dev);
}

// ------------------------------------------------------------------------------------------

// YaRN frequencies from ../shared/KIMI_K25.md §4.3, in double.
static void yarn_ref(const k25_config *c, double *inv) {
    int dim = c->qk_rope_dim;
    double corr_fast = dim * log(c->yarn_orig_max_pos / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(c->rope_theta));
    double corr_slow = dim * log(c->yarn_orig_max_pos / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(c->rope_theta));
    double low = fmax(floor(corr_fast), 0), high = fmin(ceil(corr_slow), dim - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        double base = pow(c->rope_theta, -2.0 * i / dim);
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1);
        inv[i] = base * (1 - ramp) + base / c->yarn_factor * ramp;
    }
}

// Rotation of interleaved pairs as complex multiplication.
static void rope_complex(const float *x, int dim, int pos, const float *inv, double *out) {
    for (int i = 0; i < dim / 2; i++) {
        double complex z = x[2 * i] + _Complex_I * x[2 * i + 1];
        z *= cexp(_Complex_I * (double)((float)pos * inv[i]));
        out[2 * i] = creal(z);
        out[2 * i + 1] = cimag(z);
    }
}

// Absorbed MLA over a paged cache with two interleaved sequences (prefill rows of both in one
// step, then one decode row each) against naive per-head attention.
static void test_mla(k25_backend *be, const k25_config *c) {
    int R = c->kv_lora_rank, dr = c->qk_rope_dim, dn = c->qk_nope_dim, dv = c->v_head_dim;
    int H = 3, dq = dn + dr, kvw = R + dr;
    enum { KB = 4, NB = 6, MAXB = 3 };
    float inv[64];
    double invr[64];
    config_rope_inv_freq(c, inv);
    yarn_ref(c, invr);
    {
        double e = 0;
        for (int i = 0; i < dr / 2; i++) e = fmax(e, fabs(inv[i] - invr[i]) / invr[i]);
        check("YaRN inverse frequencies", e < 1e-6);
    }
    k25_layer L;
    memset(&L, 0, sizeof L);
    float *kvb = k25_malloc(sizeof(float) * (size_t)H * (dn + dv) * R);
    float *nw = k25_malloc(sizeof(float) * (size_t)R);
    L.kv_b = bf16_tensor("kv_b", (int64_t)H * (dn + dv), R, 0.3f, kvb);
    L.kv_a_norm = bf16_tensor("kv_a_norm", 1, R, 1.2f, nw);
    L.q_b.rows = (int64_t)H * dq; // mla reads the head count from q_b's rows
    be->kv_init(be, 2, NB, KB);
    // sequence 0 -> blocks 4, 1; sequence 1 -> blocks 2, 5
    int32_t table[2 * MAXB] = {4, 1, -1, 2, 5, -1};
    float scale = config_softmax_scale(c);

    // history of raw kv rows per sequence, for the naive reference
    enum { MAXP = 8 };
    float hist[2][MAXP][64 + 16];
    int32_t seq1[9] = {0, 1, 0, 0, 1, 0, 1, 0, 0}, pos1[9] = {0, 0, 1, 2, 1, 3, 2, 4, 5};
    int32_t seq2[2] = {1, 0}, pos2[2] = {3, 6};
    for (int step = 0; step < 2; step++) {
        int T = step == 0 ? 9 : 2;
        const int32_t *sq = step == 0 ? seq1 : seq2, *ps = step == 0 ? pos1 : pos2;
        int32_t toks[9] = {0};
        set_rows(be, T, toks, ps, sq, table, 2, MAXB);
        float *q = k25_malloc(sizeof(float) * (size_t)T * H * dq);
        float *q0 = k25_malloc(sizeof(float) * (size_t)T * H * dq);
        float *kv = k25_malloc(sizeof(float) * (size_t)T * kvw);
        float *out = k25_malloc(sizeof(float) * (size_t)T * H * dv);
        double *ref = k25_malloc(sizeof(double) * (size_t)T * H * dv);
        for (int i = 0; i < T * H * dq; i++) q0[i] = q[i] = frand(1.5f);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < kvw; i++) hist[sq[t]][ps[t]][i] = kv[t * kvw + i] = frand(2);
        be->mla_attention(be, 1, &L, q, kv, out);

        for (int t = 0; t < T; t++) {
            int s = sq[t], p = ps[t];
            for (int h = 0; h < H; h++) {
                const float *qh = q0 + (size_t)t * H * dq + h * dq;
                double qfull[64];
                for (int d = 0; d < dn; d++) qfull[d] = qh[d];
                rope_complex(qh + dn, dr, p, inv, qfull + dn);
                double sc[MAXP], mx = -INFINITY, vsum[64] = {0}, z = 0;
                double v[MAXP][64];
                for (int j = 0; j <= p; j++) {
                    // c_j = rmsnorm(latent) * w;  k_j = [W_UK c_j ; rope(k_pe_j)];  v_j = W_UV c_j
                    double cj[64], ss = 0, k[64];
                    for (int r = 0; r < R; r++) ss += (double)hist[s][j][r] * hist[s][j][r];
                    for (int r = 0; r < R; r++)
                        cj[r] = hist[s][j][r] / sqrt(ss / R + c->latent_norm_eps) * nw[r];
                    for (int d = 0; d < dn + dv; d++) {
                        double acc = 0;
                        for (int r = 0; r < R; r++) acc += kvb[((size_t)h * (dn + dv) + d) * R + r] * cj[r];
                        if (d < dn) k[d] = acc;
                        else v[j][d - dn] = acc;
                    }
                    rope_complex(hist[s][j] + R, dr, j, inv, k + dn);
                    double dotp = 0;
                    for (int d = 0; d < dq; d++) dotp += qfull[d] * k[d];
                    sc[j] = dotp * scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= p; j++) z += (sc[j] = exp(sc[j] - mx));
                for (int j = 0; j <= p; j++)
                    for (int d = 0; d < dv; d++) vsum[d] += sc[j] / z * v[j][d];
                for (int d = 0; d < dv; d++) ref[((size_t)t * H + h) * dv + d] = vsum[d];
            }
        }
        check_close(step == 0 ? "MLA absorbed vs naive: prefill, 2 seqs" :
                                "MLA absorbed vs naive: decode, 2 seqs",
                    out, ref, (size_t)T * H * dv, 2e-6);
        free(q), free(q0), free(kv), free(out), free(ref);
    }
    free(kvb), free(nw), free(L.kv_b.dev), free(L.kv_a_norm.dev);
}

// ------------------------------------------------------------------------------------------

// Sum over a bit mask's members.
static double mask_sum(const double *v, uint64_t mask, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        if (mask >> i & 1) s += v[i];
    return s;
}

// The best k-subset of the allowed items (by total value), by enumerating all subsets.
static uint64_t best_subset(const double *v, int n, int k, uint64_t allowed) {
    uint64_t best = 0;
    double bs = -INFINITY;
    for (uint64_t m = 0; m < (1ull << n); m++) {
        if ((m & ~allowed) || __builtin_popcountll(m) != k) continue;
        double s = mask_sum(v, m, n);
        if (s > bs) bs = s, best = m;
    }
    return best;
}

static void test_router(k25_backend *be, k25_config *c, int n_group, int topk_group) {
    enum { T = 24, D = 48, E = 16, K = 4 };
    c->n_experts = E, c->top_k = K, c->n_group = n_group, c->topk_group = topk_group;
    c->hidden = D;
    int per = E / n_group;
    float W[E * D], x[T * D], bias[E], wts[T * K];
    int32_t idx[T * K];
    k25_layer L;
    memset(&L, 0, sizeof L);
    L.router = bf16_tensor("router", E, D, 0.2f, W);
    for (int e = 0; e < E; e++) bias[e] = frand(0.3f);
    L.router_bias = f32_tensor("bias", 1, E, bias);
    for (int i = 0; i < T * D; i++) x[i] = frand(1);
    int32_t zeros[T] = {0};
    set_rows(be, T, zeros, zeros, zeros, zeros, 1, 1);
    be->router(be, x, &L, idx, wts);

    int sets_ok = 1, limited = 0;
    float wref[T * K];
    double werr = 0;
    for (int t = 0; t < T; t++) {
        double sc[E], sel[E], gs[8];
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int i = 0; i < D; i++) l += (double)x[t * D + i] * W[e * D + i];
            sc[e] = 1 / (1 + exp(-l));
            sel[e] = sc[e] + bias[e];
        }
        // group score = best pair of the group; groups = best topk_group-subset of groups
        for (int g = 0; g < n_group; g++) {
            uint64_t pair = best_subset(sel + g * per, per, per < 2 ? per : 2, (1ull << per) - 1);
            gs[g] = mask_sum(sel + g * per, pair, per);
        }
        uint64_t groups = best_subset(gs, n_group, topk_group, (1ull << n_group) - 1), allowed = 0;
        for (int g = 0; g < n_group; g++)
            if (groups >> g & 1) allowed |= ((1ull << per) - 1) << (g * per);
        uint64_t want = best_subset(sel, E, K, allowed);
        if (want != best_subset(sel, E, K, (1ull << E) - 1)) limited++;
        uint64_t got = 0;
        for (int k = 0; k < K; k++) got |= 1ull << idx[t * K + k];
        sets_ok &= got == want;
        double z = 0;
        for (int k = 0; k < K; k++) z += sc[idx[t * K + k]];
        for (int k = 0; k < K; k++) {
            wref[t * K + k] = (float)(sc[idx[t * K + k]] / (z + 1e-20) * c->routed_scale);
            werr = fmax(werr, fabs(wref[t * K + k] - wts[t * K + k]) / wref[t * K + k]);
        }
    }
    char name[96];
    snprintf(name, sizeof name, "router choice, %d groups keep %d", n_group, topk_group);
    check(name, sets_ok);
    snprintf(name, sizeof name, "router weights, %d groups keep %d (%.1e)", n_group, topk_group, werr);
    check(name, werr < 1e-5);
    if (n_group > 1) check("router: group limiting changed some choices", limited > 0);
    free(L.router.dev), free(L.router_bias.dev);
}

// ------------------------------------------------------------------------------------------

// A random INT4 expert projection [out][in] (packed words, bf16 scales) and its dequantized
// values computed bit by bit here.
typedef struct q4 {
    uint32_t *packed;
    uint16_t *scale;
    double *w;
    int out, in;
} q4;

static q4 q4_random(int out, int in, int group) {
    q4 q = {k25_malloc(sizeof(uint32_t) * (size_t)out * in / 8),
            k25_malloc(sizeof(uint16_t) * (size_t)out * in / group),
            k25_malloc(sizeof(double) * (size_t)out * in), out, in};
    for (int i = 0; i < out * in / 8; i++) q.packed[i] = (uint32_t)(urand() * 4294967296.0);
    // scales of at most 3 significant bits: q * scale is exact in bf16 (for the bf16 path)
    for (int i = 0; i < out * in / group; i++) q.scale[i] = k25_f32_to_bf16((float)(1 + (int)(urand() * 8)) / 128.0f);
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            uint32_t word = q.packed[(size_t)o * (in / 8) + i / 8];
            int nib = (int)((word >> (4 * (i % 8))) & 15u);
            q.w[(size_t)o * in + i] = (nib - 8) * (double)k25_bf16_to_f32(q.scale[(size_t)o * (in / group) + i / group]);
        }
    return q;
}

// The slice [o0, o0+no) x [i0, i0+ni) as an expert projection in backend layout.
static k25_expert_w q4_slice(const q4 *q, int o0, int no, int i0, int ni, int group) {
    k25_expert_w e;
    memset(&e, 0, sizeof e);
    e.out = no, e.in = ni;
    uint32_t *p = k25_malloc(sizeof(uint32_t) * (size_t)no * ni / 8);
    uint16_t *s = k25_malloc(sizeof(uint16_t) * (size_t)no * ni / group);
    for (int o = 0; o < no; o++) {
        memcpy(p + (size_t)o * ni / 8, q->packed + (size_t)(o0 + o) * q->in / 8 + i0 / 8, sizeof(uint32_t) * ni / 8);
        memcpy(s + (size_t)o * ni / group, q->scale + (size_t)(o0 + o) * q->in / group + i0 / group,
               sizeof(uint16_t) * ni / group);
    }
    e.w.dtype = K25_I32, e.w.rows = no, e.w.cols = ni / 8, e.w.kind = K25_SRC_FILE, e.w.dev = p;
    e.scale.dtype = K25_BF16, e.scale.rows = no, e.scale.cols = ni / group, e.scale.kind = K25_SRC_FILE;
    e.scale.dev = s;
    return e;
}

// The same projection as bf16 weights (rounded), for the non-quantized expert path.
static k25_expert_w bf16_slice(const q4 *q, int o0, int no, int i0, int ni) {
    k25_expert_w e;
    memset(&e, 0, sizeof e);
    e.out = no, e.in = ni;
    uint16_t *d = k25_malloc(sizeof(uint16_t) * (size_t)no * ni);
    for (int o = 0; o < no; o++)
        for (int i = 0; i < ni; i++) d[(size_t)o * ni + i] = k25_f32_to_bf16((float)q->w[(size_t)(o0 + o) * q->in + i0 + i]);
    e.w.dtype = K25_BF16, e.w.rows = no, e.w.cols = ni, e.w.kind = K25_SRC_FILE, e.w.dev = d;
    return e;
}

static void free_experts(k25_expert_w *e, int n) {
    for (int i = 0; i < n; i++) free(e[i].w.dev), free(e[i].scale.dev);
    free(e);
}

static void test_moe(k25_backend *be, k25_config *c) {
    enum { T = 5, D = 64, I = 128, E = 6, K = 3, G = 32 };
    c->hidden = D, c->n_experts = E, c->top_k = K, c->quant_group = G;
    q4 gate[E], up[E], down[E];
    for (int e = 0; e < E; e++) gate[e] = q4_random(I, D, G), up[e] = q4_random(I, D, G), down[e] = q4_random(D, I, G);
    float x[T * D], wts[T * K], out[T * D], part[T * D];
    double ref[T * D];
    int32_t idx[T * K] = {0, 3, 5, 3, 1, 0, 2, 4, 5, 5, 3, 1, 3, 0, 2};
    for (int i = 0; i < T * D; i++) x[i] = frand(1);
    for (int i = 0; i < T * K; i++) wts[i] = (float)(0.2 + urand());
    for (int t = 0; t < T; t++)
        for (int o = 0; o < D; o++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                int e = idx[t * K + k];
                double y = 0;
                for (int j = 0; j < I; j++) {
                    double g = 0, u = 0;
                    for (int i = 0; i < D; i++) {
                        g += gate[e].w[(size_t)j * D + i] * x[t * D + i];
                        u += up[e].w[(size_t)j * D + i] * x[t * D + i];
                    }
                    y += down[e].w[(size_t)o * I + j] * (g / (1 + exp(-g)) * u);
                }
                s += wts[t * K + k] * y;
            }
            ref[t * D + o] = s;
        }
    int32_t zeros[T] = {0};
    set_rows(be, T, zeros, zeros, zeros, zeros, 1, 1);

    // whole experts, then a two-way tensor-parallel split (gate/up rows, down columns) summed
    for (int tp = 1; tp <= 2; tp++) {
        for (int i = 0; i < T * D; i++) part[i] = 0;
        for (int r = 0; r < tp; r++) {
            int w = I / tp;
            k25_layer L;
            memset(&L, 0, sizeof L);
            L.exp_gate = k25_calloc(E, sizeof(k25_expert_w));
            L.exp_up = k25_calloc(E, sizeof(k25_expert_w));
            L.exp_down = k25_calloc(E, sizeof(k25_expert_w));
            for (int e = 0; e < E; e++) {
                L.exp_gate[e] = q4_slice(&gate[e], r * w, w, 0, D, G);
                L.exp_up[e] = q4_slice(&up[e], r * w, w, 0, D, G);
                L.exp_down[e] = q4_slice(&down[e], 0, D, r * w, w, G);
            }
            be->moe(be, x, &L, idx, wts, NULL, out);
            for (int i = 0; i < T * D; i++) part[i] += out[i];
            free_experts(L.exp_gate, E), free_experts(L.exp_up, E), free_experts(L.exp_down, E);
        }
        check_close(tp == 1 ? "MoE INT4 vs dequantized formula" : "MoE INT4, 2-way split summed",
                    part, ref, T * D, 2e-6);
    }

    k25_layer L;
    memset(&L, 0, sizeof L);
    L.exp_gate = k25_calloc(E, sizeof(k25_expert_w));
    L.exp_up = k25_calloc(E, sizeof(k25_expert_w));
    L.exp_down = k25_calloc(E, sizeof(k25_expert_w));
    for (int e = 0; e < E; e++) {
        L.exp_gate[e] = bf16_slice(&gate[e], 0, I, 0, D);
        L.exp_up[e] = bf16_slice(&up[e], 0, I, 0, D);
        L.exp_down[e] = bf16_slice(&down[e], 0, D, 0, I);
    }
    be->moe(be, x, &L, idx, wts, NULL, out);
    check_close("MoE bf16 experts", out, ref, T * D, 2e-6);
    // with an addend (the shared expert's output): the routed sum rounded, then the add
    float add[T * D], out_add[T * D];
    for (int i = 0; i < T * D; i++) add[i] = frand(1);
    be->moe(be, x, &L, idx, wts, add, out_add);
    int differ = 0;
    for (int i = 0; i < T * D; i++) differ += out_add[i] != out[i] + add[i];
    check("MoE with an addend: every element the routed sum + add", differ == 0);
    free_experts(L.exp_gate, E), free_experts(L.exp_up, E), free_experts(L.exp_down, E);
    for (int e = 0; e < E; e++) {
        q4 *qs[3] = {&gate[e], &up[e], &down[e]};
        for (int j = 0; j < 3; j++) free(qs[j]->packed), free(qs[j]->scale), free(qs[j]->w);
    }
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN];
    k25_config c;
    config_init_defaults(&c);
    if (config_load_ini(&c, "config/tiny.ini", err)) K25_DIE("%s", err);
    k25_backend *be = backend_cpu_create(&c, &d, 2);

    test_dense_ops(be);
    test_mla(be, &c);
    test_router(be, &c, 1, 1);
    test_router(be, &c, 4, 2);
    test_router(be, &c, 8, 3);
    test_moe(be, &c);

    be->destroy(be);
    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    dist_finalize(&d);
    return failures ? 1 : 0;
}
