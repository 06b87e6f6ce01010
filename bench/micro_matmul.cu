// Micro benchmark of the BF16-weight projections of a decode step on one GPU at Kimi-K2.5's
// per-rank shapes (TP1, TP2, TP8): every projection (q_a, q_b, kv_a, kv_b, o_proj, shared expert
// gate/up and down, dense MLP gate/up and down, router, lm_head slice) for T = 1, 2, 4, 8, 16
// rows, through the GEMV tile kernel (k25k_gemv_bf16) and through cuBLASLt with split
// activations (k25k_matmul_lt, two bf16 products), next to the byte floor (weight bytes at the
// device-to-device copy bandwidth measured in the same run). Weights rotate through more than
// 1 GB of copies so that every timed call reads them from HBM; times are medians of CUDA-graph
// replays. Before timing, each shape's GEMV is checked against a float64 host reference (three
// weight rows, every activation row) and for bit-identical rows across T (row t of a T-row call
// against a one-row call on activation row t).
//
//   micro_matmul [--json FILE] [--quick] [--tp N] [--t T] [--no-check] [--no-lt]
#include <math.h>

#include "micro_common.cuh"
#include "synth.h"

#define HID 7168
#define SEED 77
#define TMAX 16

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

int main(int argc, char **argv) {
    const int quick = bench_flag(argc, argv, "--quick"), no_lt = bench_flag(argc, argv, "--no-lt");
    cudaStream_t s;
    int sms;
    const double copy_gbs = bench_start_single_gpu(argc, argv, &s, &sms);
    printf("# BF16 projections y[T][N] = x[T][K] W^T (x f32, W bf16): GEMV tile kernel vs "
           "cuBLASLt (split activations: two bf16 products); bytes = N K 2; floor = bytes at the "
           "copy bandwidth; weights rotated through > 1 GB\n");
    k25k_blas *blas = k25k_blas_create((size_t)32 << 20);
    k25k_blas_reserve(blas, (size_t)2 * TMAX * 18432);
    float *x, *y, *y1;
    CUDA_CHECK(cudaMalloc(&x, sizeof(float) * TMAX * 18432));
    CUDA_CHECK(cudaMalloc(&y, sizeof(float) * TMAX * 163840));
    CUDA_CHECK(cudaMalloc(&y1, sizeof(float) * 163840));
    k25k_synth_fill(x, 4, K25_SYNTH_F32, -7, SEED, 1, TMAX, 18432, 18432, 0, 0, s);
    const int Ts_full[] = {1, 2, 4, 8, 16}, Ts_quick[] = {1, 4, 16};
    const int *Ts = quick ? Ts_quick : Ts_full, nT = quick ? 3 : 5;
    const int iters = quick ? 10 : 20;
    int fails = 0, not_same = 0;
    printf("\n| TP | projection | N x K | slices x rows | T | floor us | GEMV us | GB/s | %% of "
           "copy | cuBLASLt us | %% of copy | speedup |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const int tps[] = {1, 2, 8};
    for (int ti = 0; ti < 3; ti++) {
        const int tp = tps[ti];
        if (bench_int(argc, argv, "--tp", tp) != tp) continue;
        proj_shape shapes[16];
        const int n_shapes = kimi_shapes(tp, shapes);
        for (int si = 0; si < n_shapes; si++) {
            const proj_shape &sh = shapes[si];
            const int N = sh.N, K = sh.K;
            const size_t wb = (size_t)N * K * 2;
            int copies = (int)ceil(1.1e9 / (double)wb);
            if (copies < 2) copies = 2;
            if (copies > 600) copies = 600;
            uint16_t *rot;
            CUDA_CHECK(cudaMalloc(&rot, wb * copies));
            k25k_synth_fill(rot, 2, K25_SYNTH_UNIFORM, -14, SEED, 100 + si, (int64_t)copies * N,
                            K, K, 0, 0, s);
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
                    k25k_gemv_bf16(x, rot + (size_t)r * N * K, T, N, K, y, s);
                });
                double us_lt = no_lt ? 0 : time_graph_us(s, copies, iters, [&](int r) {
                    k25k_matmul_lt(blas, x, rot + (size_t)r * N * K, T, N, K, y, s);
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
        }
    }
    cudaFree(x), cudaFree(y), cudaFree(y1);
    k25k_blas_destroy(blas);
    printf("\n# GEMV rows bit-identical across T = 1..%d: %s (%d shapes differ)\n", TMAX,
           not_same ? "no" : "yes", not_same);
    printf("# correctness checks failed: %d\n", fails);
    bench_jsonl("{\"bench\":\"matmul_check\",\"fails\":%d,\"shapes_not_bit_identical\":%d}", fails,
                not_same);
    if (bench_json) fclose(bench_json);
    return fails ? 1 : 0;
}
