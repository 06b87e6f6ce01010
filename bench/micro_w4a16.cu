// Micro benchmark of the routed-expert MoE on one GPU at Kimi-K2.5's per-rank shapes (hidden
// 7168, expert width 2048 / TP, top-8): the whole W4A16 pipeline of one step (device routing
// sort with the split-K plans, grouped gate+up GEMM with the split reduction and SiLU*up fused,
// grouped down GEMM, weighted combine) with 8 active experts of M tokens each (the split plan
// each M gets is a table column), next to cuBLASLt BF16 GEMMs of the same shapes (16 calls:
// gate+up and down for each expert) and the bandwidth floor (a device-to-device copy measured in the
// same run). Weights rotate through more than 1 GB of experts so every timed step reads them
// from HBM; times are medians of CUDA-graph replays. Before timing, each TP's pipeline output is
// checked against a float64 host reference of two tokens (relative L2 error <= 1e-2).
//
//   micro_w4a16 [--json FILE] [--quick] [--tp N] [--m M] [--no-check] [--no-gemv]
#include <math.h>

#include "micro_common.cuh"
#include "synth.h"

#define TOPK 8
#define HID 7168
#define EXPERT_W 2048
#define SEED 99

// Synthetic ids of expert e's tensors (checkpoint layout): 0 gate, 1 up, 2 down; +3 scales.
static uint64_t tid(int e, int which) { return 1000003ull * (uint64_t)e + (uint64_t)which; }

static int exp_scale(int K) { return (int)lround(-log2(4.6 * 95.0 * sqrt((double)K))); }

struct tp_setup {
    int tp, I, D, E;                 // experts in the rotation
    uint32_t *gu_w, *dn_w;
    uint16_t *gu_s, *dn_s;
    uint16_t *bf_gu, *bf_dn;         // bf16 rotation for cuBLASLt
    int Eb;
    size_t gu_w_b, gu_s_b, dn_w_b, dn_s_b; // bytes per expert
};

// Expert e's weights: gate/up [I][D/8] words + [I][D/32] scales, down [D][I/8] + [D][I/32],
// generated in the checkpoint layout and repacked.
static void make_experts(tp_setup &S, cudaStream_t s) {
    const int I = S.I, D = S.D;
    S.gu_w_b = (size_t)2 * I * D / 2, S.gu_s_b = (size_t)2 * I * (D / 32) * 2;
    S.dn_w_b = (size_t)D * I / 2, S.dn_s_b = (size_t)D * (I / 32) * 2;
    CUDA_CHECK(cudaMalloc(&S.gu_w, S.gu_w_b * S.E));
    CUDA_CHECK(cudaMalloc(&S.gu_s, S.gu_s_b * S.E));
    CUDA_CHECK(cudaMalloc(&S.dn_w, S.dn_w_b * S.E));
    CUDA_CHECK(cudaMalloc(&S.dn_s, S.dn_s_b * S.E));
    uint32_t *g, *u, *d;
    uint16_t *gs, *us, *ds;
    CUDA_CHECK(cudaMalloc(&g, (size_t)I * D / 2));
    CUDA_CHECK(cudaMalloc(&u, (size_t)I * D / 2));
    CUDA_CHECK(cudaMalloc(&d, (size_t)I * D / 2));
    CUDA_CHECK(cudaMalloc(&gs, (size_t)I * D / 16));
    CUDA_CHECK(cudaMalloc(&us, (size_t)I * D / 16));
    CUDA_CHECK(cudaMalloc(&ds, (size_t)I * D / 16));
    for (int e = 0; e < S.E; e++) {
        k25k_synth_fill(g, 4, K25_SYNTH_INT4, 0, SEED, tid(e, 0), I, D / 8, D / 8, 0, 0, s);
        k25k_synth_fill(u, 4, K25_SYNTH_INT4, 0, SEED, tid(e, 1), I, D / 8, D / 8, 0, 0, s);
        k25k_synth_fill(d, 4, K25_SYNTH_INT4, 0, SEED, tid(e, 2), D, I / 8, I / 8, 0, 0, s);
        k25k_synth_fill(gs, 2, K25_SYNTH_SCALE, exp_scale(D), SEED, tid(e, 3), I, D / 32, D / 32, 0, 0, s);
        k25k_synth_fill(us, 2, K25_SYNTH_SCALE, exp_scale(D), SEED, tid(e, 4), I, D / 32, D / 32, 0, 0, s);
        k25k_synth_fill(ds, 2, K25_SYNTH_SCALE, exp_scale(I), SEED, tid(e, 5), D, I / 32, I / 32, 0, 0, s);
        k25k_w4_repack(g, u, gs, us, 2 * I, D, 32, 1, (uint32_t *)((char *)S.gu_w + S.gu_w_b * e),
                       (uint16_t *)((char *)S.gu_s + S.gu_s_b * e), s);
        k25k_w4_repack(d, NULL, ds, NULL, D, I, 32, 0, (uint32_t *)((char *)S.dn_w + S.dn_w_b * e),
                       (uint16_t *)((char *)S.dn_s + S.dn_s_b * e), s);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    cudaFree(g), cudaFree(u), cudaFree(d), cudaFree(gs), cudaFree(us), cudaFree(ds);
    // bf16 rotation for cuBLASLt: gate+up [2I][D] and down [D][I] per expert
    size_t per = (size_t)3 * I * D;
    CUDA_CHECK(cudaMalloc(&S.bf_gu, per * 2 * S.Eb / 3 * 2));
    CUDA_CHECK(cudaMalloc(&S.bf_dn, per * 2 * S.Eb / 3));
    k25k_synth_fill(S.bf_gu, 2, K25_SYNTH_UNIFORM, -14, SEED, 7, (int64_t)S.Eb * 2 * I, D, D, 0, 0, s);
    k25k_synth_fill(S.bf_dn, 2, K25_SYNTH_UNIFORM, -13, SEED, 8, (int64_t)S.Eb * D, I, I, 0, 0, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
}

static void free_experts(tp_setup &S) {
    cudaFree(S.gu_w), cudaFree(S.gu_s), cudaFree(S.dn_w), cudaFree(S.dn_s);
    cudaFree(S.bf_gu), cudaFree(S.bf_dn);
}

// Host value of a dequantized weight (checkpoint layout) from the generator.
static double host_w(int e, int which, int rows_K, int row, int k, int sexp) {
    uint32_t word = k25_synth_bits(K25_SYNTH_INT4, 0, SEED, tid(e, which),
                                   (uint64_t)row * (rows_K / 8) + k / 8);
    int q = (int)((word >> (4 * (k & 7))) & 0xF) - 8;
    uint32_t sb = k25_synth_bits(K25_SYNTH_SCALE, sexp, SEED, tid(e, which + 3),
                                 (uint64_t)row * (rows_K / 32) + k / 32);
    return q * (double)k25_bf16_to_f32((uint16_t)sb);
}

struct moe_ws {
    k25k_moe_route r;
    int *ints;
    float *part1, *h, *part2;
};

static void ws_alloc(moe_ws &w, int T, int E, int I, int D, int num_sms) {
    int A = T * TOPK, ma = k25k_moe_max_items(T, TOPK, E);
    const size_t n_done = (size_t)ma * k25k_moe_row_blocks(2 * I);
    size_t ints = (size_t)E * 3 + 2 + 2 * (size_t)A + 3 * (size_t)ma + 2 + 4 + n_done + 2;
    CUDA_CHECK(cudaMalloc(&w.ints, ints * sizeof(int)));
    CUDA_CHECK(cudaMemset(w.ints, 0, ints * sizeof(int)));
    int *p = w.ints;
    w.r.counts = p, p += E;
    w.r.offsets = p, p += E + 1;
    w.r.active = p, p += E;
    w.r.n_active = p, p += 1;
    w.r.slot_token = p, p += A;
    w.r.slot_of = p, p += A;
    w.r.item_expert = p, p += ma;
    w.r.item_p0 = p, p += ma;
    w.r.n_items = p, p += 1;
    w.r.plan = p, p += 4;
    w.r.tile_done = p, p += n_done; // zeroed with the rest
    w.r.unit_next = p, p += 2;
    w.r.item_ready = p, p += ma;
    w.r.err = p;
    CUDA_CHECK(cudaMalloc(&w.part1, sizeof(float) * k25k_moe_part_floats(2 * I, D, A, num_sms)));
    CUDA_CHECK(cudaMalloc(&w.h, sizeof(float) * (size_t)A * I));
    CUDA_CHECK(cudaMalloc(&w.part2, sizeof(float) * k25k_moe_part_floats(D, I, A, num_sms)));
}

static void ws_free(moe_ws &w) { cudaFree(w.ints), cudaFree(w.part1), cudaFree(w.h), cudaFree(w.part2); }

// One MoE step: idx [T][8] on the device.
static void moe_step(const tp_setup &S, moe_ws &w, const int32_t *idx, const float *wts,
                     const float *x, int T, float *out, int num_sms, cudaStream_t s) {
    int A = T * TOPK;
    k25k_moe_sort(idx, T, TOPK, S.E, S.I, S.D, num_sms, &w.r, s);
    k25k_moe_w4a16_gemm(S.gu_w, S.gu_s, S.E, 2 * S.I, S.D, 1, x, S.D, w.r.slot_token, &w.r, T,
                        TOPK, num_sms, w.part1, w.h, s); // SiLU*up fused
    k25k_moe_w4a16_gemm(S.dn_w, S.dn_s, S.E, S.D, S.I, 0, w.h, S.I, NULL, &w.r, T, TOPK, num_sms,
                        w.part2, NULL, s);
    k25k_moe_combine(w.part2, w.r.plan + 2, A, S.D, w.r.slot_of, wts, T, TOPK, NULL, out, s);
}

// Pipeline output for T tokens on experts 0..7 against the host reference (tokens 0, T-1).
static int check(const tp_setup &S, int T, const float *x_dev, int num_sms, cudaStream_t s) {
    moe_ws w;
    ws_alloc(w, T, S.E, S.I, S.D, num_sms);
    std::vector<int32_t> idx((size_t)T * TOPK);
    std::vector<float> wts((size_t)T * TOPK);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < TOPK; k++) idx[t * TOPK + k] = (k * 5 + t) % TOPK, wts[t * TOPK + k] = 0.1f * (k + 1);
    int32_t *di;
    float *dw, *dout;
    CUDA_CHECK(cudaMalloc(&di, idx.size() * 4));
    CUDA_CHECK(cudaMalloc(&dw, wts.size() * 4));
    CUDA_CHECK(cudaMalloc(&dout, (size_t)T * S.D * 4));
    CUDA_CHECK(cudaMemcpy(di, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dw, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0xff, (size_t)T * S.D * 4)); // NaN poison
    moe_step(S, w, di, dw, x_dev, T, dout, num_sms, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> got((size_t)T * S.D), xh((size_t)T * S.D);
    CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(xh.data(), x_dev, xh.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    const int I = S.I, D = S.D;
    double num = 0, den = 0;
    const int nt = T > 1 ? 2 : 1;
    const int toks[2] = {0, T - 1};
    std::vector<double> ref((size_t)nt * D, 0.0), act((size_t)nt * I);
    for (int e = 0; e < TOPK; e++) { // every checked token uses experts 0..7 in some order
#pragma omp parallel for schedule(static)
        for (int i = 0; i < I; i++) {
            double g[2] = {0, 0}, u[2] = {0, 0};
            for (int j = 0; j < D; j++) {
                double wg = host_w(e, 0, D, i, j, exp_scale(D)), wu = host_w(e, 1, D, i, j, exp_scale(D));
                for (int ti = 0; ti < nt; ti++) {
                    g[ti] += wg * xh[(size_t)toks[ti] * D + j];
                    u[ti] += wu * xh[(size_t)toks[ti] * D + j];
                }
            }
            for (int ti = 0; ti < nt; ti++) act[(size_t)ti * I + i] = g[ti] / (1.0 + exp(-g[ti])) * u[ti];
        }
        double wk[2] = {0, 0};
        for (int ti = 0; ti < nt; ti++)
            for (int k = 0; k < TOPK; k++)
                if (idx[toks[ti] * TOPK + k] == e) wk[ti] = wts[toks[ti] * TOPK + k];
#pragma omp parallel for schedule(static)
        for (int d = 0; d < D; d++) {
            double y[2] = {0, 0};
            for (int i = 0; i < I; i++) {
                double wd = host_w(e, 2, I, d, i, exp_scale(I));
                for (int ti = 0; ti < nt; ti++) y[ti] += wd * act[(size_t)ti * I + i];
            }
            for (int ti = 0; ti < nt; ti++) ref[(size_t)ti * D + d] += wk[ti] * y[ti];
        }
    }
    for (int ti = 0; ti < nt; ti++)
        for (int d = 0; d < D; d++) {
            double gv = got[(size_t)toks[ti] * D + d], rv = ref[(size_t)ti * D + d];
            if (!isfinite(gv)) bad = 1;
            num += (gv - rv) * (gv - rv);
            den += rv * rv;
        }
    double rel = sqrt(num / (den > 0 ? den : 1));
    int ok = !bad && rel <= 1e-2;
    printf("# check TP%d T=%d: relative error vs float64 host reference %.2e %s\n", S.tp, T, rel,
           ok ? "ok" : "FAIL");
    bench_jsonl("{\"bench\":\"w4a16_check\",\"tp\":%d,\"T\":%d,\"rel_err\":%.3e,\"ok\":%d}", S.tp,
                T, rel, ok);
    cudaFree(di), cudaFree(dw), cudaFree(dout);
    ws_free(w);
    return ok;
}

int main(int argc, char **argv) {
    const int quick = bench_flag(argc, argv, "--quick");
    cudaStream_t s;
    int sms;
    const double copy_gbs = bench_start_single_gpu(argc, argv, &s, &sms);
    printf("# W4A16: one MoE step = sort + gate/up GEMM (+ SiLU*up) + down GEMM + combine over 8 "
           "active experts of M tokens each; bytes = INT4 weights + bf16 scales of 8 experts\n");
    printf("# cuBLASLt: 16 BF16 GEMMs (gate+up [M x %d] x [%d x 2I], down [M x I] x [I x %d]) "
           "per step, bf16 activations given\n", HID, HID, HID);
    k25k_blas *blas = k25k_blas_create((size_t)32 << 20);
    int fails = 0;
    const int Ms_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    const int Ms_quick[] = {1, 2, 4, 8, 16, 64};
    const int *Ms = quick ? Ms_quick : Ms_full;
    const int nM = quick ? 6 : 9;
    printf("\n| TP | M/expert | W4A16 step us | GB/s | %% of copy | gate+up GEMM us (%% copy) | down GEMM us (%% copy) | cuBLASLt us | BF16 GB/s | speedup | splits x k-blocks gate+up, down |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    const int tps[] = {8, 2, 1};
    for (int ti = 0; ti < 3; ti++) {
        if (bench_int(argc, argv, "--tp", tps[ti]) != tps[ti]) continue;
        tp_setup S;
        memset(&S, 0, sizeof S);
        S.tp = tps[ti];
        S.I = EXPERT_W / S.tp;
        S.D = HID;
        double per_int4 = 3.0 * S.I * S.D * 0.5625;
        S.E = (int)ceil(1.2e9 / per_int4 / TOPK) * TOPK;
        if (S.E < 2 * TOPK) S.E = 2 * TOPK;
        double per_bf16 = 3.0 * S.I * S.D * 2;
        S.Eb = (int)ceil(1.2e9 / per_bf16 / TOPK) * TOPK;
        make_experts(S, s);
        float *x;
        const int Tmax = 256;
        CUDA_CHECK(cudaMalloc(&x, sizeof(float) * Tmax * S.D));
        k25k_synth_fill(x, 4, K25_SYNTH_F32, -7, SEED, 5, Tmax, S.D, S.D, 0, 0, s);
        uint16_t *xb;
        CUDA_CHECK(cudaMalloc(&xb, sizeof(uint16_t) * Tmax * S.D));
        k25k_f32_to_bf16(x, (size_t)Tmax * S.D, xb, s);
        if (!bench_flag(argc, argv, "--no-check")) {
            fails += !check(S, 1, x, sms, s);
            fails += !check(S, 16, x, sms, s); // split plan of 8 items, two MMA n-tiles
            fails += !check(S, 37, x, sms, s);
        }
        float *out, *y1, *y2;
        CUDA_CHECK(cudaMalloc(&out, sizeof(float) * Tmax * S.D));
        CUDA_CHECK(cudaMalloc(&y1, sizeof(float) * Tmax * 2 * S.I));
        CUDA_CHECK(cudaMalloc(&y2, sizeof(float) * Tmax * S.D));
        for (int mi = 0; mi < nM; mi++) {
            const int M = Ms[mi], T = M; // every token on the same 8 experts: M tokens each
            if (bench_int(argc, argv, "--m", M) != M) continue;
            const int R = S.E / TOPK < 48 ? S.E / TOPK : 48;
            std::vector<int32_t> idx((size_t)R * T * TOPK);
            std::vector<float> wts((size_t)T * TOPK, 0.125f);
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < TOPK; k++) idx[((size_t)r * T + t) * TOPK + k] = r * TOPK + k;
            int32_t *di;
            float *dw;
            CUDA_CHECK(cudaMalloc(&di, idx.size() * 4));
            CUDA_CHECK(cudaMalloc(&dw, wts.size() * 4));
            CUDA_CHECK(cudaMemcpy(di, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dw, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
            moe_ws w;
            ws_alloc(w, T, S.E, S.I, S.D, sms);
            int iters = quick ? 10 : 20;
            double us = time_graph_us(s, R, iters, [&](int r) {
                moe_step(S, w, di + (size_t)r * T * TOPK, dw, x, T, out, sms, s);
            });
            // the two grouped GEMMs alone (each rep sorted once beforehand; every rep routes to
            // other experts, so the rotation still applies)
            std::vector<moe_ws> wss(R);
            for (int r = 0; r < R; r++) {
                ws_alloc(wss[r], T, S.E, S.I, S.D, sms);
                k25k_moe_sort(di + (size_t)r * T * TOPK, T, TOPK, S.E, S.I, S.D, sms, &wss[r].r, s);
            }
            int plan[4];
            CUDA_CHECK(cudaMemcpy(plan, wss[0].r.plan, sizeof plan, cudaMemcpyDeviceToHost));
            double us_g1 = time_graph_us(s, R, iters, [&](int r) {
                k25k_moe_w4a16_gemm(S.gu_w, S.gu_s, S.E, 2 * S.I, S.D, 1, x, S.D, wss[r].r.slot_token,
                                    &wss[r].r, T, TOPK, sms, wss[r].part1, wss[r].h, s);
            });
            double us_g2 = time_graph_us(s, R, iters, [&](int r) {
                k25k_moe_w4a16_gemm(S.dn_w, S.dn_s, S.E, S.D, S.I, 0, wss[r].h, S.I, NULL, &wss[r].r, T,
                                    TOPK, sms, wss[r].part2, NULL, s);
            });
            for (int r = 0; r < R; r++) ws_free(wss[r]);
            const int Rb = S.Eb / TOPK < 48 ? S.Eb / TOPK : 48;
            double us_lt = time_graph_us(s, Rb, iters, [&](int r) {
                for (int k = 0; k < TOPK; k++) {
                    int e = r * TOPK + k;
                    k25k_matmul_lt_bf16(blas, xb, S.bf_gu + (size_t)e * 2 * S.I * S.D, T, 2 * S.I,
                                        S.D, y1, s);
                    k25k_matmul_lt_bf16(blas, xb, S.bf_dn + (size_t)e * S.D * S.I, T, S.D, S.I, y2, s);
                }
            });
            double bytes = TOPK * 3.0 * S.I * S.D * 0.5625, bytes_bf = TOPK * 3.0 * S.I * S.D * 2;
            double gbs = bytes / (us * 1e-6) / 1e9, gbs_lt = bytes_bf / (us_lt * 1e-6) / 1e9;
            double b1 = TOPK * 2.0 * S.I * S.D * 0.5625, b2 = TOPK * 1.0 * S.I * S.D * 0.5625;
            printf("| %d | %d | %.1f | %.0f | %.0f%% | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f | %.0f | %.2fx | %dx%d, %dx%d |\n",
                   S.tp, M, us, gbs, 100.0 * gbs / copy_gbs, us_g1, 100.0 * b1 / (us_g1 * 1e3) / copy_gbs,
                   us_g2, 100.0 * b2 / (us_g2 * 1e3) / copy_gbs, us_lt, gbs_lt, us_lt / us, plan[0],
                   plan[1], plan[2], plan[3]);
            fflush(stdout);
            bench_jsonl("{\"bench\":\"w4a16_moe\",\"tp\":%d,\"I\":%d,\"D\":%d,\"M\":%d,\"experts\":8,"
                        "\"us\":%.2f,\"gbs\":%.1f,\"pct_copy\":%.1f,\"gate_up_us\":%.2f,\"down_us\":%.2f,"
                        "\"cublaslt_us\":%.2f,\"cublaslt_gbs\":%.1f,\"speedup\":%.3f}",
                        S.tp, S.I, S.D, M, us, gbs, 100.0 * gbs / copy_gbs, us_g1, us_g2, us_lt, gbs_lt,
                        us_lt / us);
            ws_free(w);
            cudaFree(di), cudaFree(dw);
        }
        cudaFree(x), cudaFree(xb), cudaFree(out), cudaFree(y1), cudaFree(y2);
        free_experts(S);
    }
    if (bench_flag(argc, argv, "--no-gemv")) goto done;
    {
    // BF16 projections of a decode step (GEMV for T <= 16, cuBLASLt above), weights rotated
    printf("\n# BF16 projections at Kimi-K2.5 TP1 shapes (GEMV for T <= 16, else cuBLASLt with split "
           "activations); weights rotated through > 1 GB\n");
    printf("\n| projection | N x K | T | us | GB/s | %% of copy |\n|---|---:|---:|---:|---:|---:|\n");
    struct { const char *name; int N, K; } shapes[] = {
        {"q_a", 1536, 7168}, {"q_b", 12288, 1536}, {"kv_a", 576, 7168}, {"o_proj", 7168, 8192},
        {"shared gate", 2048, 7168}, {"shared down", 7168, 2048}, {"router", 384, 7168},
        {"lm_head/8", 20480, 7168}};
    uint16_t *rot;
    const size_t rot_bytes = (size_t)1300 << 20;
    CUDA_CHECK(cudaMalloc(&rot, rot_bytes));
    k25k_synth_fill(rot, 2, K25_SYNTH_UNIFORM, -14, SEED, 9, (int64_t)(rot_bytes / 2 / 7168), 7168, 7168, 0, 0, s);
    float *gx, *gy;
    CUDA_CHECK(cudaMalloc(&gx, sizeof(float) * 64 * 8192));
    CUDA_CHECK(cudaMalloc(&gy, sizeof(float) * 64 * 20480));
    k25k_synth_fill(gx, 4, K25_SYNTH_F32, -7, SEED, 10, 64, 8192, 8192, 0, 0, s);
    k25k_blas_reserve(blas, (size_t)2 * 64 * 8192);
    const int Ts[] = {1, 2, 4, 8, 64};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ti = 0; ti < 5; ti++) {
            const int N = shapes[si].N, K = shapes[si].K, T = Ts[ti];
            const size_t wb = (size_t)N * K * 2;
            const int copies = (int)(rot_bytes / wb) < 64 ? (int)(rot_bytes / wb) : 64;
            double us = time_graph_us(s, copies, quick ? 10 : 20, [&](int r) {
                k25k_matmul(blas, gx, NULL, rot + (size_t)r * N * K, T, N, K, gy, s);
            });
            double gbs = wb / (us * 1e-6) / 1e9;
            printf("| %s | %d x %d | %d | %.1f | %.0f | %.0f%% |\n", shapes[si].name, N, K, T, us, gbs,
                   100 * gbs / copy_gbs);
            bench_jsonl("{\"bench\":\"matmul_bf16\",\"name\":\"%s\",\"N\":%d,\"K\":%d,\"T\":%d,\"us\":%.2f,"
                        "\"gbs\":%.1f,\"pct_copy\":%.1f}", shapes[si].name, N, K, T, us, gbs, 100 * gbs / copy_gbs);
        }
    cudaFree(rot), cudaFree(gx), cudaFree(gy);
    }
done:
    k25k_blas_destroy(blas);
    printf("\n# correctness checks failed: %d\n", fails);
    if (bench_json) fclose(bench_json);
    return fails ? 1 : 0;
}
