// BF16-weight projections y[T][N] = x[T][K] W^T (W [N][K] bf16 row-major, x and y f32):
// a GEMV kernel for few rows (f32 activations, f32 accumulate, 16-byte weight loads, split over
// K inside a block when N is small so that enough warps stream the weights), and cuBLASLt for
// more rows (activations converted to bf16 in a workspace, f32 accumulate and output).
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.cuh"

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            k25_fatal(__FILE__, __LINE__, "cuBLAS error %d (%s) in %s", (int)st_,                  \
                      cublasLtGetStatusName(st_), #call);                                          \
    } while (0)

// ------------------------------------------------------------------------------------------
// GEMV
// ------------------------------------------------------------------------------------------

#define GEMV_WARPS 8

// Block: 8 warps = (8 / ks) rows x ks K-parts. Each warp accumulates up to TT token rows
// (rows t0 .. t0+TT of this block's y-slice) for its K-part; the K-parts of a row are summed in
// shared memory in fixed order, so results do not depend on timing.
template <int TT, bool kVec>
__global__ void __launch_bounds__(256) gemv_bf16_kernel(const float *__restrict__ x,
                                                        const uint16_t *__restrict__ W, int T,
                                                        int N, int K, float *__restrict__ y,
                                                        int ks) {
    __shared__ float red[GEMV_WARPS][TT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows_per_block = GEMV_WARPS / ks;
    const int r_in_block = warp / ks, kpart = warp % ks;
    const int n = blockIdx.x * rows_per_block + r_in_block;
    const int t0 = blockIdx.y * TT;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    if (n < N) {
        const uint16_t *wr = W + (size_t)n * K;
        if (kVec) {
            const int nchunk = K >> 3;
            const uint4 *w4 = reinterpret_cast<const uint4 *>(wr);
#pragma unroll 4
            for (int c = kpart * 32 + lane; c < nchunk; c += ks * 32) {
                uint4 wv = __ldg(w4 + c);
                float wf[8] = {k25_bf16_lo(wv.x), k25_bf16_hi(wv.x), k25_bf16_lo(wv.y),
                               k25_bf16_hi(wv.y), k25_bf16_lo(wv.z), k25_bf16_hi(wv.z),
                               k25_bf16_lo(wv.w), k25_bf16_hi(wv.w)};
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    if (t0 + t < T) {
                        const float4 *xr =
                            reinterpret_cast<const float4 *>(x + (size_t)(t0 + t) * K) + 2 * c;
                        float4 a = __ldg(xr), b = __ldg(xr + 1);
                        acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                                  wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        } else {
            for (int k = kpart * 32 + lane; k < K; k += ks * 32) {
                float wv = k25_bf16f(wr[k]);
#pragma unroll
                for (int t = 0; t < TT; t++)
                    if (t0 + t < T) acc[t] += wv * x[(size_t)(t0 + t) * K + k];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = k25_warp_sum(acc[t]);
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < TT; t++) red[warp][t] = acc[t];
    }
    __syncthreads();
    if (kpart == 0 && lane < TT && n < N && t0 + lane < T) {
        float s = 0.0f;
        for (int j = 0; j < ks; j++) s += red[r_in_block * ks + j][lane];
        y[(size_t)(t0 + lane) * N + n] = s;
    }
}

template <int TT>
static void gemv_launch(const float *x, const uint16_t *W, int T, int N, int K, float *y,
                        cudaStream_t s) {
    // K-parts per row: enough warps in flight when N is small (132 SMs x 64 warps).
    int ks = N >= 8192 ? 1 : (N >= 4096 ? 2 : (N >= 2048 ? 4 : 8));
    if (K < 256 * ks) ks = K >= 1024 ? 4 : (K >= 512 ? 2 : 1);
    int rows_per_block = GEMV_WARPS / ks;
    dim3 grid((unsigned)k25_cdiv(N, rows_per_block), (unsigned)k25_cdiv(T, TT));
    bool vec = (K % 8 == 0) && ((uintptr_t)x % 16 == 0) && ((uintptr_t)W % 16 == 0);
    if (vec)
        gemv_bf16_kernel<TT, true><<<grid, 256, 0, s>>>(x, W, T, N, K, y, ks);
    else
        gemv_bf16_kernel<TT, false><<<grid, 256, 0, s>>>(x, W, T, N, K, y, ks);
    K25_LAUNCH_CHECK(s, "gemv_bf16");
}

void k25k_gemv_bf16(const float *x, const uint16_t *W, int T, int N, int K, float *y,
                    cudaStream_t s) {
    if (T <= 0 || N <= 0) return;
    if (T == 1)
        gemv_launch<1>(x, W, T, N, K, y, s);
    else if (T == 2)
        gemv_launch<2>(x, W, T, N, K, y, s);
    else if (T <= 4)
        gemv_launch<4>(x, W, T, N, K, y, s);
    else
        gemv_launch<8>(x, W, T, N, K, y, s);
}

// ------------------------------------------------------------------------------------------
// cuBLASLt
// ------------------------------------------------------------------------------------------

#define LT_PLANS 128

typedef struct lt_plan {
    int N, K, T, valid;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

struct k25k_blas {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    void *workspace;
    size_t ws_bytes;
    uint16_t *xb;       // bf16 copy of the activations
    size_t xb_cap;      // elements
    lt_plan plans[LT_PLANS];
    int n_plans, next_evict;
    int gemv_max_t;     // GEMV for T <= this
};

k25k_blas *k25k_blas_create(size_t workspace_bytes) {
    k25k_blas *b = (k25k_blas *)k25_calloc(1, sizeof *b);
    CUBLAS_CHECK(cublasLtCreate(&b->lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&b->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(b->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(b->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    b->ws_bytes = workspace_bytes;
    CUDA_CHECK(cudaMalloc(&b->workspace, b->ws_bytes));
    const char *e = getenv("K25_GEMV_MAX_T");
    // measured on H200 (bench/micro_w4a16): the GEMV streams at 65-100% of copy bandwidth at
    // T = 1 but falls to ~20% at T = 8, where cuBLASLt does better
    b->gemv_max_t = e && *e ? atoi(e) : 2;
    return b;
}

static void plan_release(lt_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    p->valid = 0;
}

void k25k_blas_destroy(k25k_blas *b) {
    if (!b) return;
    for (int i = 0; i < b->n_plans; i++) plan_release(&b->plans[i]);
    cublasLtMatmulDescDestroy(b->desc);
    cublasLtDestroy(b->lt);
    cudaFree(b->workspace);
    cudaFree(b->xb);
    free(b);
}

void k25k_blas_reserve(k25k_blas *b, size_t elems) {
    if (elems <= b->xb_cap) return;
    // Captured graphs may hold the old buffer: the caller drops them before growing.
    CUDA_CHECK(cudaDeviceSynchronize());
    if (b->xb) CUDA_CHECK(cudaFree(b->xb));
    CUDA_CHECK(cudaMalloc(&b->xb, elems * sizeof(uint16_t)));
    b->xb_cap = elems;
}

size_t k25k_blas_capacity(const k25k_blas *b) { return b->xb_cap; }

static lt_plan *plan_get(k25k_blas *b, int N, int K, int T) {
    for (int i = 0; i < b->n_plans; i++) {
        lt_plan *p = &b->plans[i];
        if (p->valid && p->N == N && p->K == K && p->T == T) return p;
    }
    lt_plan *p;
    if (b->n_plans < LT_PLANS) {
        p = &b->plans[b->n_plans++];
    } else {
        p = &b->plans[b->next_evict];
        b->next_evict = (b->next_evict + 1) % LT_PLANS;
        plan_release(p);
    }
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->T = T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, T, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, T, N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &b->ws_bytes, sizeof b->ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, b->desc, p->a, p->b, p->c, p->c, pref, 1,
                                                &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1)
        K25_DIE("cuBLASLt: no algorithm for bf16 GEMM N=%d K=%d T=%d", N, K, T);
    p->algo = res.algo;
    p->valid = 1;
    return p;
}

static void lt_gemm(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N, int K,
                    float *y, float beta, cudaStream_t s);

void k25k_matmul_lt(k25k_blas *b, const float *x, const uint16_t *W, int T, int N, int K,
                    float *y, cudaStream_t s) {
    if (T <= 0 || N <= 0) return;
    const int split = k25k_split_activations();
    size_t need = (size_t)T * K * (split ? 2 : 1);
    if (need > b->xb_cap)
        K25_DIE("matmul: bf16 activation workspace holds %zu elements, %zu needed (reserve "
                "before the step)", b->xb_cap, need);
    if (!split) {
        k25k_f32_to_bf16(x, need, b->xb, s);
        k25k_matmul_lt_bf16(b, b->xb, W, T, N, K, y, s);
        return;
    }
    // y = W hi + W lo: the second product accumulates (beta = 1)
    k25k_f32_to_bf16_split(x, (size_t)T * K, b->xb, b->xb + (size_t)T * K, s);
    lt_gemm(b, b->xb, W, T, N, K, y, 0.0f, s);
    lt_gemm(b, b->xb + (size_t)T * K, W, T, N, K, y, 1.0f, s);
}

void k25k_matmul_lt_bf16(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N, int K,
                         float *y, cudaStream_t s) {
    if (T <= 0 || N <= 0) return;
    lt_gemm(b, xb, W, T, N, K, y, 0.0f, s);
}

static void lt_gemm(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N, int K,
                    float *y, float beta, cudaStream_t s) {
    lt_plan *p = plan_get(b, N, K, T);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(b->lt, b->desc, &alpha, W, p->a, xb, p->b, &beta, y, p->c, y,
                                p->c, &p->algo, b->workspace, b->ws_bytes, s));
    K25_LAUNCH_CHECK(s, "cublasLt matmul");
}

void k25k_matmul(k25k_blas *b, const float *x, const uint16_t *W, int T, int N, int K, float *y,
                 cudaStream_t s) {
    if (T <= b->gemv_max_t)
        k25k_gemv_bf16(x, W, T, N, K, y, s);
    else
        k25k_matmul_lt(b, x, W, T, N, K, y, s);
}
