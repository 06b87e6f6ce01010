// Micro benchmark of the BF16-weight projections of a decode step on one GPU at Kimi-K2.5's
// per-rank shapes (TP1, TP2, TP8): every projection (q_a, q_b, kv_a, kv_b, o_proj, shared expert
// gate/up and down, dense MLP gate/up and down, router, lm_head slice) for T = 1, 2, 4, 8, 16
// rows, through the GEMV tile kernel (k25k_gemv_bf16) and through cuBLASLt with split
// activations (k25k_matmul_lt: hi and lo as one GEMM of 2T rows, then their sum), next to the
// byte floor (weight bytes at the device-to-device copy bandwidth measured in the same run).
// Weights rotate through more than 1 GB of copies so that every timed call reads them from
// HBM; times are medians of CUDA-graph replays. Before timing, each shape's GEMV is checked
// against a float64 host reference (three weight rows, every activation row) and for
// bit-identical rows across T (row t of a T-row call against a one-row call on activation
// row t).
//
// Then the pairs that src/model.c runs through matmul2 (q_a + kv_a; shared-expert gate + up at
// TP8/TP2/TP1; dense gate + up at TP8) for T = 1, 4, 8: one pair launch (k25k_gemv2_bf16) against
// the two projections launched one after the other, next to the byte floor of both matrices;
// each pair checked first (float64 host reference on rows of both matrices, rows bit-identical
// between an 8-row and a one-row call). The GEMV kernels use programmatic dependent launch
// unless K25_NO_PDL=1 (the back-to-back launches of a timed graph then overlap: a kernel's first
// weight loads are issued while the one before it drains).
//
//   micro_matmul [--json FILE] [--quick] [--tp N] [--t T] [--no-check] [--no-lt] [--pairs]
//                [--no-pairs] [--warm] [--wgmma]
//   --pairs: the pair table only; --no-pairs: the single projections only; --warm: every call
//   reads the same copy of the weights, from L2 where they fit (what a projection takes when
//   its weights are already in L2: the most that prefetching them could gain); --wgmma: only the
//   table of the warpgroup-MMA kernel for 5..32 rows against cuBLASLt, both from a staged
//   operand (the kernel checked first against a float64 host reference).
#include <math.h>

#include "micro_common.cuh"
#include "synth.h"

#define HID 7168
#define SEED 77
#define TMAX 16

// --warm: every timed call reads copy 0 (from L2 where it fits), the same number of calls
static int warm;
static int copy_of(int r) { return warm ? 0 : r; }

struct proj_shape {
    const char *name;
    int N, K;
};

// The projections of one rank at tensor-parallel size tp (weights.c's slicing: q_a, kv_a and the
// router are replicated; q_b, kv_b, gate/up and lm_head split rows; o_proj and down split K).
static int kimi_shapes(int tp, proj_shape *out) {
    const int H = 64 / tp, S = 2048 / tp, I = 18432 / tp, V = 163840 / tp;
    proj_shape s[] = {{"q_a", 1536, HID},          {"q_b", H * 192, 1536},
                      {"kv_a", 576, HID},          {"kv_b", H * 256, 512},
                      {"o_proj", HID, H * 128},    {"shared gate/up", S, HID},
                      {"shared down", HID, S},     {"dense gate/up", I, HID},
                      {"dense down", HID, I},      {"router", 384, HID},
                      {"lm_head", V, HID}};
    const int n = (int)(sizeof s / sizeof s[0]);
    for (int i = 0; i < n; i++) out[i] = s[i];
    return n;
}

// fn(tp, shape index, shape) for every projection of the TP sizes that --tp selects (default
// 1, 2 and 8).
template <typename F> static void for_each_shape(int argc, char **argv, F fn) {
    const int tps[] = {1, 2, 8};
    for (int tp : tps) {
        if (bench_int(argc, argv, "--tp", tp) != tp) continue;
        proj_shape shapes[16];
        const int n = kimi_shapes(tp, shapes);
        for (int si = 0; si < n; si++) fn(tp, si, shapes[si]);
    }
}

// Copies of an N x K bf16 matrix (synthetic stream id) for the timed calls to rotate through:
// more than 1 GB, so that every call reads its weights from HBM. Complete on return: the kernels
// read their weights before their PDL wait.
static uint16_t *rotating_weights(int N, int K, int id, cudaStream_t s, int *copies) {
    const size_t wb = (size_t)N * K * 2;
    int c = (int)ceil(1.1e9 / (double)wb);
    if (c < 2) c = 2;
    if (c > 600) c = 600;
    uint16_t *rot;
    CUDA_CHECK(cudaMalloc(&rot, wb * c));
    k25k_synth_fill(rot, 2, K25_SYNTH_UNIFORM, -14, SEED, id, (int64_t)c * N, K, K, 0, 0, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    *copies = c;
    return rot;
}

// GEMV output for T rows against a float64 host reference (weight rows 0, N/2, N-1 of copy 0,
// every activation row): error relative to sum |w x|. Then row t of the T-row call against a
// one-row call on activation row t, bit for bit.
static int check_shape(const proj_shape &sh, const uint16_t *W, const float *x, float *y,
                       float *y1, int T, cudaStream_t s, int *bit_same) {
    const int N = sh.N, K = sh.K;
    CUDA_CHECK(cudaMemsetAsync(y, 0xff, sizeof(float) * T * N, s)); // NaN poison
    k25k_gemv_bf16(x, W, T, N, K, y, s);
    std::vector<float> got((size_t)T * N), one((size_t)N), xh((size_t)T * K);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(xh.data(), x, xh.size() * 4, cudaMemcpyDeviceToHost));
    const int rows[3] = {0, N / 2, N - 1};
    std::vector<uint16_t> wr((size_t)K);
    double worst = 0;
    int finite = 1;
    for (int i = 0; i < 3; i++) {
        CUDA_CHECK(cudaMemcpy(wr.data(), W + (size_t)rows[i] * K, (size_t)K * 2,
                              cudaMemcpyDeviceToHost));
        for (int t = 0; t < T; t++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)k25_bf16_to_f32(wr[k]) * xh[(size_t)t * K + k];
                ref += p, mag += fabs(p);
            }
            double g = got[(size_t)t * N + rows[i]];
            if (!isfinite(g)) finite = 0;
            double e = fabs(g - ref) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    }
    int same = 1;
    for (int t = 0; t < T; t++) {
        CUDA_CHECK(cudaMemsetAsync(y1, 0xff, sizeof(float) * N, s));
        k25k_gemv_bf16(x + (size_t)t * K, W, 1, N, K, y1, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(one.data(), y1, one.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(one.data(), got.data() + (size_t)t * N, (size_t)N * 4)) same = 0;
    }
    *bit_same = same;
    const int ok = finite && worst <= 1e-5;
    if (!ok)
        printf("# check %s N=%d K=%d T=%d: error %.2e (relative to sum |w x|) FAIL\n", sh.name, N,
               K, T, worst);
    return ok;
}

// ------------------------------------------------------------------------------------------
// Pairs of projections of the same input (matmul2)
// ------------------------------------------------------------------------------------------

#define PAIR_TMAX 8 // K25K_GEMV_MAX_T_DEFAULT: the most rows matmul2 runs on the GEMV

struct pair_shape {
    int tp; // 0: replicated (every TP)
    const char *name;
    int N1, N2, K;
};

static const pair_shape kimi_pairs[] = {
    {0, "q_a+kv_a", 1536, 576, HID},        {8, "shared gate+up", 256, 256, HID},
    {2, "shared gate+up", 1024, 1024, HID}, {1, "shared gate+up", 2048, 2048, HID},
    {8, "dense gate+up", 2304, 2304, HID},
};

// Host float64 x[t] . row of W (bf16 [K]), and sum |w x| (the error scale).
static void host_dot(const uint16_t *W, int row, const float *x, int K, double *ref, double *mag) {
    std::vector<uint16_t> wr((size_t)K);
    CUDA_CHECK(cudaMemcpy(wr.data(), W + (size_t)row * K, (size_t)K * 2, cudaMemcpyDeviceToHost));
    double r = 0, m = 0;
    for (int k = 0; k < K; k++) {
        double p = (double)k25_bf16_to_f32(wr[k]) * x[k];
        r += p, m += fabs(p);
    }
    *ref = r, *mag = m;
}

// The pair launch for PAIR_TMAX rows against a float64 host reference (rows 0, N - 1 of each
// matrix, every activation row), then row t of both outputs against a one-row pair call on
// activation row t, bit for bit. Returns 1 when the values are right.
static int check_pair(const pair_shape &sh, const uint16_t *W1, const uint16_t *W2,
                      const float *x, float *y1, float *y2, cudaStream_t s, int *bit_same) {
    const int N1 = sh.N1, N2 = sh.N2, K = sh.K, T = PAIR_TMAX;
    float *o1, *o2;
    CUDA_CHECK(cudaMalloc(&o1, sizeof(float) * N1));
    CUDA_CHECK(cudaMalloc(&o2, sizeof(float) * N2));
    CUDA_CHECK(cudaMemsetAsync(y1, 0xff, sizeof(float) * T * N1, s)); // NaN poison
    CUDA_CHECK(cudaMemsetAsync(y2, 0xff, sizeof(float) * T * N2, s));
    k25k_gemv2_bf16(x, W1, W2, T, N1, N2, K, y1, y2, s);
    std::vector<float> g1((size_t)T * N1), g2((size_t)T * N2), xh((size_t)T * K);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(g1.data(), y1, g1.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(g2.data(), y2, g2.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(xh.data(), x, xh.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    int finite = 1;
    for (int m = 0; m < 2; m++) {
        const int N = m ? N2 : N1, rows[2] = {0, N - 1};
        const uint16_t *W = m ? W2 : W1;
        const std::vector<float> &got = m ? g2 : g1;
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < T; t++) {
                double ref, mag;
                host_dot(W, rows[i], xh.data() + (size_t)t * K, K, &ref, &mag);
                const double g = got[(size_t)t * N + rows[i]];
                if (!isfinite(g)) finite = 0;
                const double e = fabs(g - ref) / (mag > 0 ? mag : 1);
                if (e > worst) worst = e;
            }
        for (size_t i = 0; i < got.size(); i++)
            if (!isfinite(got[i])) finite = 0; // every output written
    }
    int same = 1;
    std::vector<float> one1((size_t)N1), one2((size_t)N2);
    for (int t = 0; t < T; t++) {
        CUDA_CHECK(cudaMemsetAsync(o1, 0xff, sizeof(float) * N1, s));
        CUDA_CHECK(cudaMemsetAsync(o2, 0xff, sizeof(float) * N2, s));
        k25k_gemv2_bf16(x + (size_t)t * K, W1, W2, 1, N1, N2, K, o1, o2, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(one1.data(), o1, one1.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(one2.data(), o2, one2.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(one1.data(), g1.data() + (size_t)t * N1, (size_t)N1 * 4) ||
            memcmp(one2.data(), g2.data() + (size_t)t * N2, (size_t)N2 * 4))
            same = 0;
    }
    CUDA_CHECK(cudaFree(o1));
    CUDA_CHECK(cudaFree(o2));
    *bit_same = same;
    const int ok = finite && worst <= 1e-5;
    if (!ok)
        printf("# check pair %s %d+%d x %d T=%d: error %.2e (relative to sum |w x|)%s FAIL\n",
               sh.name, N1, N2, K, T, worst, finite ? "" : ", non-finite outputs");
    return ok;
}

// The pair table: one pair launch against two launches. Adds to *fails / *not_same.
static void bench_pairs(int argc, char **argv, const float *x, float *y1, float *y2,
                        double copy_gbs, cudaStream_t s, int *fails, int *not_same) {
    const int quick = bench_flag(argc, argv, "--quick"), iters = quick ? 10 : 20;
    const int Ts[] = {1, 4, 8}, tp_sel = bench_int(argc, argv, "--tp", 0);
    printf("\n# pairs (matmul2): one launch over N1 + N2 rows (its slice plan from N1 + N2 and K) "
           "vs the two projections launched back to back; floor = both matrices' bytes at the "
           "copy bandwidth; programmatic dependent launch %s\n",
           k25_pdl_enabled() ? "on" : "off (K25_NO_PDL)");
    printf("\n| TP | pair | N1 + N2 x K | slices x rows: pair / each | T | floor us | pair us | "
           "%% of copy | two launches us | %% of copy | speedup |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const int n_pairs = (int)(sizeof kimi_pairs / sizeof kimi_pairs[0]);
    for (int pi = 0; pi < n_pairs; pi++) {
        const pair_shape &sh = kimi_pairs[pi];
        if (tp_sel && sh.tp && sh.tp != tp_sel) continue;
        const int N1 = sh.N1, N2 = sh.N2, K = sh.K;
        const size_t b1 = (size_t)N1 * K * 2, b2 = (size_t)N2 * K * 2, wb = b1 + b2;
        int copies = (int)ceil(1.1e9 / (double)wb);
        if (copies < 2) copies = 2;
        if (copies > 600) copies = 600;
        uint16_t *r1, *r2; // separate allocations, as the model's tensors
        CUDA_CHECK(cudaMalloc(&r1, b1 * copies));
        CUDA_CHECK(cudaMalloc(&r2, b2 * copies));
        k25k_synth_fill(r1, 2, K25_SYNTH_UNIFORM, -14, SEED, 300 + 2 * pi, (int64_t)copies * N1, K,
                        K, 0, 0, s);
        k25k_synth_fill(r2, 2, K25_SYNTH_UNIFORM, -14, SEED, 301 + 2 * pi, (int64_t)copies * N2, K,
                        K, 0, 0, s);
        // the GEMV reads its weights before waiting for the previous kernel: complete them first
        CUDA_CHECK(cudaStreamSynchronize(s));
        char tp_s[8] = "all";
        if (sh.tp) snprintf(tp_s, sizeof tp_s, "%d", sh.tp);
        if (!k25k_gemv2_applies(x, r1, r2, N1, N2, K)) {
            printf("| %s | %s | %d + %d x %d | pair launch does not apply | | | | | | | |\n", tp_s,
                   sh.name, N1, N2, K);
            *fails += 1;
            CUDA_CHECK(cudaFree(r1));
            CUDA_CHECK(cudaFree(r2));
            continue;
        }
        int ks, rpb, ks1, rpb1, ks2, rpb2;
        k25k_gemv_plan(N1 + N2, K, &ks, &rpb);
        k25k_gemv_plan(N1, K, &ks1, &rpb1);
        k25k_gemv_plan(N2, K, &ks2, &rpb2);
        int same = -1;
        if (!bench_flag(argc, argv, "--no-check")) {
            *fails += !check_pair(sh, r1, r2, x, y1, y2, s, &same);
            *not_same += !same;
        }
        for (int tj = 0; tj < 3; tj++) {
            const int T = Ts[tj];
            if (bench_int(argc, argv, "--t", T) != T) continue;
            const double us = time_graph_us(s, copies, iters, [&](int r) {
                k25k_gemv2_bf16(x, r1 + (size_t)copy_of(r) * N1 * K,
                                r2 + (size_t)copy_of(r) * N2 * K, T, N1, N2, K, y1, y2, s);
            });
            const double us2 = time_graph_us(s, copies, iters, [&](int r) {
                k25k_gemv_bf16(x, r1 + (size_t)copy_of(r) * N1 * K, T, N1, K, y1, s);
                k25k_gemv_bf16(x, r2 + (size_t)copy_of(r) * N2 * K, T, N2, K, y2, s);
            });
            const double floor_us = wb / (copy_gbs * 1e3);
            const double pct = 100 * wb / (us * 1e3) / copy_gbs;
            const double pct2 = 100 * wb / (us2 * 1e3) / copy_gbs;
            printf("| %s | %s | %d + %d x %d | %d x %d / %d x %d, %d x %d | %d | %.2f | %.2f | "
                   "%.0f%% | %.2f | %.0f%% | %.2fx |\n", tp_s, sh.name, N1, N2, K, ks, rpb, ks1,
                   rpb1, ks2, rpb2, T, floor_us, us, pct, us2, pct2, us2 / us);
            fflush(stdout);
            bench_jsonl("{\"bench\":\"matmul2_pair\",\"tp\":%d,\"name\":\"%s\",\"N1\":%d,"
                        "\"N2\":%d,\"K\":%d,\"T\":%d,\"k_slices\":%d,\"rows_per_block\":%d,"
                        "\"floor_us\":%.3f,\"pair_us\":%.3f,\"pair_pct_copy\":%.1f,"
                        "\"separate_us\":%.3f,\"separate_pct_copy\":%.1f,\"speedup\":%.3f,"
                        "\"bit_identical_across_T\":%d,\"pdl\":%d}",
                        sh.tp, sh.name, N1, N2, K, T, ks, rpb, floor_us, us, pct, us2, pct2,
                        us2 / us, same, k25_pdl_enabled());
        }
        CUDA_CHECK(cudaFree(r1));
        CUDA_CHECK(cudaFree(r2));
    }
}

// ------------------------------------------------------------------------------------------
// The warpgroup-MMA kernel (5..32 rows) against cuBLASLt, both from the staged operand
// ------------------------------------------------------------------------------------------

// k25k_matmul_wgmma on T rows of x, staged as the norms stage it ([hi; lo] in xs).
static void wgmma_run(const float *x, uint16_t *xs, const uint16_t *W, int T, int N, int K,
                      float *y, cudaStream_t s) {
    k25k_f32_to_bf16_split(x, (size_t)T * K, xs, xs + (size_t)T * K, s);
    if (!k25k_matmul_wgmma(xs, W, T, N, 0, K, y, NULL, s)) {
        printf("# wgmma does not apply to N=%d K=%d T=%d\n", N, K, T);
        exit(1);
    }
}

// The kernel on TMAX rows against a float64 host reference (weight rows 0, N/2, N-1, every
// activation row); then whether row t of the TMAX-row call equals a one-row call's bits (the
// plan is T-independent; reported, not required). Returns 1 when the values are right.
static int check_wgmma(const proj_shape &sh, const uint16_t *W, const float *x, uint16_t *xs,
                       float *y, float *y1, cudaStream_t s, int *bit_same) {
    const int N = sh.N, K = sh.K, T = TMAX;
    CUDA_CHECK(cudaMemsetAsync(y, 0xff, sizeof(float) * T * N, s)); // NaN poison
    wgmma_run(x, xs, W, T, N, K, y, s);
    std::vector<float> got((size_t)T * N), one((size_t)N), xh((size_t)T * K);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(xh.data(), x, xh.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    int finite = 1;
    for (size_t i = 0; i < got.size(); i++)
        if (!isfinite(got[i])) finite = 0; // every output written
    const int rows[3] = {0, N / 2, N - 1};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < T; t++) {
            double ref, mag;
            host_dot(W, rows[i], xh.data() + (size_t)t * K, K, &ref, &mag);
            const double e = fabs(got[(size_t)t * N + rows[i]] - ref) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    int same = 1;
    for (int t = 0; t < T; t++) {
        wgmma_run(x + (size_t)t * K, xs, W, 1, N, K, y1, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(one.data(), y1, one.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(one.data(), got.data() + (size_t)t * N, (size_t)N * 4)) same = 0;
    }
    *bit_same = same;
    const int ok = finite && worst <= 1e-5;
    if (!ok)
        printf("# check wgmma %s N=%d K=%d T=%d: error %.2e (relative to sum |w x|)%s FAIL\n",
               sh.name, N, K, T, worst, finite ? "" : ", non-finite outputs");
    return ok;
}

// The table: the kernel against the cuBLASLt GEMM of [hi; lo] and its sum, both reading an
// operand staged before the timed calls (as the norms stage it in a step). Adds to *fails.
static void bench_wgmma(int argc, char **argv, k25k_blas *lt, const float *x, float *y,
                        float *y1, double copy_gbs, cudaStream_t s, int *fails) {
    const int quick = bench_flag(argc, argv, "--quick"), iters = quick ? 10 : 20;
    const int Ts[] = {5, 8, 16, 32};
    uint16_t *xs;
    CUDA_CHECK(cudaMalloc(&xs, sizeof(uint16_t) * 2 * TMAX * 18432)); // 2 x 32 x 7168 too
    printf("\n# warpgroup-MMA kernel (k25k_matmul_wgmma) vs cuBLASLt ([hi; lo] as one GEMM, then "
           "the sum), both from the staged split operand; floor = weight bytes at the copy "
           "bandwidth\n");
    printf("\n| TP | projection | N x K | K slices | T | floor us | wgmma us | %% of copy | "
           "cuBLASLt us | %% of copy | speedup |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for_each_shape(argc, argv, [&](int tp, int si, const proj_shape &sh) {
        const int N = sh.N, K = sh.K;
        const size_t wb = (size_t)N * K * 2;
        int copies;
        uint16_t *rot = rotating_weights(N, K, 100 + si, s, &copies);
        int same = -1;
        if (!bench_flag(argc, argv, "--no-check"))
            *fails += !check_wgmma(sh, rot, x, xs, y, y1, s, &same);
        for (int tj = 0; tj < 4; tj++) {
            const int T = Ts[tj];
            if (bench_int(argc, argv, "--t", T) != T) continue;
            // 32 rows where the buffers (sized for TMAX rows of the widest shapes) hold them
            if ((size_t)T * K > (size_t)TMAX * 18432 || (size_t)T * N > (size_t)TMAX * 163840)
                continue;
            k25k_f32_to_bf16_split(x, (size_t)T * K, xs, xs + (size_t)T * K, s);
            const double us = time_graph_us(s, copies, iters, [&](int r) {
                k25k_matmul_wgmma(xs, rot + (size_t)copy_of(r) * N * K, T, N, 0, K, y, NULL,
                                  s);
            });
            const double us_lt = time_graph_us(s, copies, iters, [&](int r) {
                k25k_matmul_lt(lt, x, xs, rot + (size_t)copy_of(r) * N * K, T, N, K, y, s);
            });
            const double floor_us = wb / (copy_gbs * 1e3);
            const double pct = 100 * wb / (us * 1e3) / copy_gbs;
            const double pct_lt = 100 * wb / (us_lt * 1e3) / copy_gbs;
            const int ks = k25k_wgmma_slices(N, K);
            printf("| %d | %s | %d x %d | %d | %d | %.2f | %.2f | %.0f%% | %.2f | %.0f%% | "
                   "%.2fx |\n", tp, sh.name, N, K, ks, T, floor_us, us, pct, us_lt, pct_lt,
                   us_lt / us);
            fflush(stdout);
            bench_jsonl("{\"bench\":\"matmul_wgmma\",\"tp\":%d,\"name\":\"%s\",\"N\":%d,"
                        "\"K\":%d,\"T\":%d,\"k_slices\":%d,\"floor_us\":%.3f,"
                        "\"wgmma_us\":%.3f,\"wgmma_pct_copy\":%.1f,\"cublaslt_us\":%.3f,"
                        "\"cublaslt_pct_copy\":%.1f,\"speedup\":%.3f,"
                        "\"bit_identical_across_T\":%d}",
                        tp, sh.name, N, K, T, ks, floor_us, us, pct, us_lt, pct_lt,
                        us_lt / us, same);
        }
        CUDA_CHECK(cudaFree(rot));
    });
    CUDA_CHECK(cudaFree(xs));
}

int main(int argc, char **argv) {
    const int quick = bench_flag(argc, argv, "--quick"), no_lt = bench_flag(argc, argv, "--no-lt");
    warm = bench_flag(argc, argv, "--warm");
    cudaStream_t s;
    int sms;
    const double copy_gbs = bench_start_single_gpu(argc, argv, &s, &sms);
    printf("# BF16 projections y[T][N] = x[T][K] W^T (x f32, W bf16): GEMV tile kernel vs "
           "cuBLASLt (split activations: hi and lo stacked as one GEMM of 2T rows up to %d rows, "
           "then their sum); bytes = N K 2; floor = bytes at the copy bandwidth; %s\n",
           k25k_lt_one_pass_rows(),
           warm ? "every call reads the same copy of the weights (--warm: L2 where they fit)"
                : "weights rotated through > 1 GB");
    k25k_blas *blas = k25k_blas_create((size_t)32 << 20);
    k25k_blas_reserve(blas, (size_t)2 * TMAX * 18432);
    // hi and lo as one GEMM of 2T rows where it applies (T <= k25k_lt_one_pass_rows()), as in
    // the backend
    if (k25k_split_activations()) k25k_blas_reserve_products(blas, (size_t)2 * TMAX * 163840);
    float *x, *y, *y1, *y2;
    CUDA_CHECK(cudaMalloc(&x, sizeof(float) * TMAX * 18432));
    CUDA_CHECK(cudaMalloc(&y, sizeof(float) * TMAX * 163840));
    CUDA_CHECK(cudaMalloc(&y1, sizeof(float) * 163840));
    CUDA_CHECK(cudaMalloc(&y2, sizeof(float) * TMAX * 18432)); // a pair's second output
    k25k_synth_fill(x, 4, K25_SYNTH_F32, -7, SEED, 1, TMAX, 18432, 18432, 0, 0, s);
    const int Ts_full[] = {1, 2, 4, 8, 16}, Ts_quick[] = {1, 4, 16};
    const int *Ts = quick ? Ts_quick : Ts_full, nT = quick ? 3 : 5;
    const int iters = quick ? 10 : 20;
    int fails = 0, not_same = 0;
    printf("\n| TP | projection | N x K | slices x rows | T | floor us | GEMV us | GB/s | %% of "
           "copy | cuBLASLt us | %% of copy | speedup |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const int only_wgmma = bench_flag(argc, argv, "--wgmma");
    const int singles = !bench_flag(argc, argv, "--pairs") && !only_wgmma;
    if (singles) for_each_shape(argc, argv, [&](int tp, int si, const proj_shape &sh) {
        const int N = sh.N, K = sh.K;
        const size_t wb = (size_t)N * K * 2;
        int copies;
        uint16_t *rot = rotating_weights(N, K, 100 + si, s, &copies);
        int ks, rpb;
        k25k_gemv_plan(N, K, &ks, &rpb);
        int same = -1;
        if (!bench_flag(argc, argv, "--no-check")) {
            fails += !check_shape(sh, rot, x, y, y1, TMAX, s, &same);
            not_same += !same;
        }
        for (int tj = 0; tj < nT; tj++) {
            const int T = Ts[tj];
            if (bench_int(argc, argv, "--t", T) != T) continue;
            double us = time_graph_us(s, copies, iters, [&](int r) {
                k25k_gemv_bf16(x, rot + (size_t)copy_of(r) * N * K, T, N, K, y, s);
            });
            double us_lt = no_lt ? 0 : time_graph_us(s, copies, iters, [&](int r) {
                k25k_matmul_lt(blas, x, NULL, rot + (size_t)copy_of(r) * N * K, T, N, K, y,
                               s);
            });
            const double floor_us = wb / (copy_gbs * 1e3);
            const double gbs = wb / (us * 1e3), gbs_lt = no_lt ? 0 : wb / (us_lt * 1e3);
            printf("| %d | %s | %d x %d | %d x %d | %d | %.2f | %.2f | %.0f | %.0f%% | %.2f | "
                   "%.0f%% | %.2fx |\n", tp, sh.name, N, K, ks, rpb, T, floor_us, us, gbs,
                   100 * gbs / copy_gbs, us_lt, 100 * gbs_lt / copy_gbs, us_lt / us);
            fflush(stdout);
            bench_jsonl("{\"bench\":\"matmul_proj\",\"tp\":%d,\"name\":\"%s\",\"N\":%d,"
                        "\"K\":%d,\"T\":%d,\"k_slices\":%d,\"rows_per_block\":%d,"
                        "\"floor_us\":%.3f,"
                        "\"gemv_us\":%.3f,\"gemv_gbs\":%.1f,\"gemv_pct_copy\":%.1f,"
                        "\"cublaslt_us\":%.3f,\"cublaslt_gbs\":%.1f,\"cublaslt_pct_copy\":%.1f,"
                        "\"speedup\":%.3f,\"bit_identical_across_T\":%d}",
                        tp, sh.name, N, K, T, ks, rpb, floor_us, us, gbs, 100 * gbs / copy_gbs,
                        us_lt, gbs_lt, 100 * gbs_lt / copy_gbs, us_lt / us, same);
        }
        CUDA_CHECK(cudaFree(rot));
    });
    if (only_wgmma) bench_wgmma(argc, argv, blas, x, y, y1, copy_gbs, s, &fails);
    if (!bench_flag(argc, argv, "--no-pairs") && !only_wgmma)
        bench_pairs(argc, argv, x, y, y2, copy_gbs, s, &fails, &not_same);
    cudaFree(x), cudaFree(y), cudaFree(y1), cudaFree(y2);
    k25k_blas_destroy(blas);
    printf("\n# GEMV rows bit-identical across T (singles 1..%d, pairs 1..%d): %s (%d shapes "
           "differ)\n", TMAX, PAIR_TMAX, not_same ? "no" : "yes", not_same);
    printf("# correctness checks failed: %d\n", fails);
    bench_jsonl("{\"bench\":\"matmul_check\",\"fails\":%d,\"shapes_not_bit_identical\":%d}", fails,
                not_same);
    if (bench_json) fclose(bench_json);
    return fails ? 1 : 0;
}
