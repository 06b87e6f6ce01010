// BF16-weight projections y[T][N] = x[T][K] W^T (W [N][K] bf16 row-major, x and y f32): a
// GEMV-style tile kernel for few rows (every weight row read once for up to 16 activation rows
// staged in shared memory, f32 accumulate, split-K over a thread-block cluster for small N, the
// same summation order for every T; also two projections of the same x in one launch), then the
// warpgroup-MMA kernel of matmul_wgmma.cu up to K25_WGMMA_MAX_T rows where its K slices are
// short (k25k_wgmma_preferred), and cuBLASLt for the rest (activations converted to bf16 in a
// workspace, f32 accumulate and output). The GEMV kernels are launched with programmatic
// dependent launch (k25_launch).
#include <cooperative_groups.h>
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
// GEMV (few rows)
// ------------------------------------------------------------------------------------------
//
// Tile kernel: a block owns G groups of (warps x GT_RW) weight rows and one slice of K; the K
// slices of the same rows form one thread-block cluster (up to 8 blocks) and are summed through
// distributed shared memory. Each block stages its slice of the TT activation rows in shared
// memory once (f32) and then streams its weight rows, every 16-byte weight load feeding TT x 8
// FMAs. A warp keeps GT_IT steps (one 16-byte load per lane and row) in flight in a register
// ring, across row-group boundaries, so a block streams without bubbles; the grid is sized to
// one wave of clusters (G grows instead) so that no SM waits on a tail.
//
// Summation order: a lane sums its chunks in ascending order (fmaf, element by element), the
// warp sums its lanes by a fixed butterfly, the cluster sums its slices in rank order. The slice
// plan depends on N and K only (gemv_slices), so y[t][n] is bit-identical for every T: a row's
// result does not depend on which other rows share the step.
//
// Pair (k25k_gemv2_bf16): q_a + kv_a, gate + up read the same x; at batch 1 each alone is too
// small to fill the GPU (one DRAM round trip plus the cluster reduction dominate), so one launch
// takes the rows of both matrices, a row group reading its weights from, and writing to, the
// matrix its row index falls in. The plan is that of one N1 + N2 matrix.

#define GT_RW 4      // weight rows per warp (every activation value loaded is used GT_RW times)
#define GT_IT 4      // steps (16-byte loads per lane and row) in flight per warp
#define GT_SLICE 128 // preferred most 16-byte chunks (1024 K-elements) per K slice
#define GT_MAX_KS 8  // slices per cluster (portable cluster size)
#define GT_MAX_G 64  // most row groups per block

// K slices for an N x K matrix (power of two, at most GT_MAX_KS): slices of at most GT_SLICE
// chunks, then more slices while fewer than two blocks per SM would be busy and each slice keeps
// every lane busy (>= 32 chunks).
static int gemv_slices(int N, int K, int sms) {
    const int nchunk = K / 8, nb = (int)k25_cdiv(N, 8 * GT_RW);
    int ks = 1;
    while (ks < GT_MAX_KS && k25_cdiv(nchunk, ks) > GT_SLICE) ks *= 2;
    while (ks < GT_MAX_KS && (int64_t)nb * ks < 2 * sms && k25_cdiv(nchunk, 2 * ks) >= 32) ks *= 2;
    return ks;
}

static int gemv_sms(void) {
    static int sms = -1;
    return k25_device_attr(&sms, cudaDevAttrMultiProcessorCount);
}

// x [T][K] f32; grid (ks, row blocks, T tiles of TT), cluster (ks,1,1); block row b owns rows
// [b G rows, (b + 1) G rows) of N = N1 (+ N2). Rows [0, N1) come from W1 [N1][K] bf16 and go to
// y1 [T][N1]; for a pair (PAIR: two projections of the same x in one launch) rows [N1, N1 + N2)
// come from W2 [N2][K] and go to y2 [T][N2]. N1 is then a multiple of the rows per group, so a
// warp's GT_RW rows never straddle the two matrices. Dynamic shared memory: xs [TT][2][cps]
// float4 (this slice of the TT rows; plane h holds elements 8c + 4h .. 8c + 4h + 3 of chunk c,
// so that the lanes' 16-byte reads are contiguous and conflict-free), part [TT][G rows] (this
// slice's partial sums).
//
// Programmatic dependent launch: the first GT_IT steps of weights are loaded before
// k25_pdl_wait(), so this projection's weight stream is already in flight while the kernel
// before it drains (weights are written only at load time, never by a kernel of the step);
// the activations x (the previous kernel's output) are read, and y written, after it.
template <int TT, bool PAIR>
__global__ void __launch_bounds__(256, TT <= 2 ? 2 : 1)
    gemv_tile_kernel(const float *__restrict__ x, const uint16_t *__restrict__ W1,
                     const uint16_t *__restrict__ W2, int T, int N1, int N2, int K,
                     float *__restrict__ y1, float *__restrict__ y2, int cps, int G) {
    k25_pdl_trigger();
    extern __shared__ float4 gt_smem[];
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int rows = nwarps * GT_RW, brows = G * rows, ks = gridDim.x, q = blockIdx.x;
    const int N = PAIR ? N1 + N2 : N1;
    const int nb0 = blockIdx.y * brows, t0 = blockIdx.z * TT;
    const int nchunk = K >> 3, c_beg = q * cps;
    const int len = max(0, min(nchunk, c_beg + cps) - c_beg); // chunks of this slice
    const int ipg = (len + 31) >> 5, S = G * ipg;             // steps per row group, in all
    float4 *xs = gt_smem;                                      // [TT][2][cps]
    float *part = reinterpret_cast<float *>(gt_smem + (size_t)TT * 2 * cps); // [TT][brows]
    const size_t ld4 = (size_t)K >> 3;
    const uint4 *W4a = reinterpret_cast<const uint4 *>(W1);
    // W2 addressed by the pair's row index: row n >= N1 at W4b + n ld4 (integer arithmetic, so
    // that picking the matrix is one select per step, not a second index computation)
    const uint4 *W4b = reinterpret_cast<const uint4 *>(reinterpret_cast<uintptr_t>(W2) -
                                                      (uintptr_t)N1 * ld4 * sizeof(uint4));

    // step s = (row group g, lane iteration i): chunk i * 32 + lane of rows g rows + warp GT_RW
    // + r. pro: a load of the prologue, before k25_pdl_wait(): coherent (ld.global.cg), because
    // ptxas may sink ld.global.nc loads below griddepcontrol.wait and the prologue would be lost
    auto load_step = [&](int s, uint4 (&w)[GT_RW], bool pro) {
        const int g = ipg ? s / ipg : 0, c = (s - g * ipg) * 32 + lane;
        const int n = nb0 + g * rows + warp * GT_RW;
        const uint4 *Wm = PAIR && n >= N1 ? W4b : W4a; // the warp's GT_RW rows: one matrix
#pragma unroll
        for (int r = 0; r < GT_RW; r++) {
            const uint4 *a = Wm + (size_t)(n + r) * ld4 + c_beg + c;
            w[r] = !(s < S && c < len && n + r < N) ? make_uint4(0, 0, 0, 0)
                   : pro                            ? __ldcg(a)
                                                    : __ldg(a);
        }
    };
    uint4 w[GT_IT][GT_RW];
#pragma unroll
    for (int p = 0; p < GT_IT; p++) load_step(p, w[p], true);

    // x comes from the previous kernel and y may still be read by it: nothing before this line
    // touches either
    k25_pdl_wait();

    // stage the activations while the first weights are on their way; coherent loads (__ldcg),
    // since ptxas may hoist ld.global.nc loads of the previous kernel's output above the wait
    {
        const int n4 = 2 * len;
        const float4 *x4 = reinterpret_cast<const float4 *>(x) + (size_t)c_beg * 2;
        for (int idx = threadIdx.x; idx < TT * n4; idx += blockDim.x) {
            const int t = idx / n4, j = idx - t * n4;
            xs[(2 * t + (j & 1)) * cps + (j >> 1)] =
                t0 + t < T ? __ldcg(x4 + (size_t)(t0 + t) * (K >> 2) + j)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    __syncthreads();

    float acc[GT_RW][TT];
#pragma unroll
    for (int r = 0; r < GT_RW; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[r][t] = 0.0f;

    for (int s0 = 0; s0 < S; s0 += GT_IT) {
#pragma unroll
        for (int p = 0; p < GT_IT; p++) {
            const int s = s0 + p;
            if (s >= S) break;
            const int g = s / ipg, i = s - g * ipg, c = i * 32 + lane;
            if (c < len) {
                float wf[GT_RW][8];
#pragma unroll
                for (int r = 0; r < GT_RW; r++) {
                    wf[r][0] = k25_bf16_lo(w[p][r].x), wf[r][1] = k25_bf16_hi(w[p][r].x);
                    wf[r][2] = k25_bf16_lo(w[p][r].y), wf[r][3] = k25_bf16_hi(w[p][r].y);
                    wf[r][4] = k25_bf16_lo(w[p][r].z), wf[r][5] = k25_bf16_hi(w[p][r].z);
                    wf[r][6] = k25_bf16_lo(w[p][r].w), wf[r][7] = k25_bf16_hi(w[p][r].w);
                }
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    const float4 a = xs[2 * t * cps + c], b = xs[(2 * t + 1) * cps + c];
#pragma unroll
                    for (int r = 0; r < GT_RW; r++) {
                        float v = acc[r][t];
                        v = fmaf(wf[r][0], a.x, v), v = fmaf(wf[r][1], a.y, v);
                        v = fmaf(wf[r][2], a.z, v), v = fmaf(wf[r][3], a.w, v);
                        v = fmaf(wf[r][4], b.x, v), v = fmaf(wf[r][5], b.y, v);
                        v = fmaf(wf[r][6], b.z, v), v = fmaf(wf[r][7], b.w, v);
                        acc[r][t] = v;
                    }
                }
            }
            load_step(s + GT_IT, w[p], false);
            if (i == ipg - 1) { // end of row group g: its partial sums to shared memory
#pragma unroll
                for (int r = 0; r < GT_RW; r++)
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        const float v = k25_warp_sum(acc[r][t]);
                        if (lane == 0) part[t * brows + g * rows + warp * GT_RW + r] = v;
                        acc[r][t] = 0.0f;
                    }
            }
        }
    }
    if (len == 0) // an empty slice (K small for the plan) still owes its zeros
        for (int e = threadIdx.x; e < TT * brows; e += blockDim.x) part[e] = 0.0f;
    // the slices of the cluster: block q sums entries [q E / ks, (q+1) E / ks) in rank order
    cluster.sync();
    const int E = TT * brows, e_beg = q * E / ks, e_end = (q + 1) * E / ks;
    for (int e = e_beg + threadIdx.x; e < e_end; e += blockDim.x) {
        float v = 0.0f;
        for (int j = 0; j < ks; j++) v += cluster.map_shared_rank(part, j)[e];
        const int t = e / brows, n = nb0 + (e - t * brows);
        if (t0 + t < T) {
            if (n < N1)
                y1[(size_t)(t0 + t) * N1 + n] = v;
            else if (PAIR && n < N)
                y2[(size_t)(t0 + t) * N2 + (n - N1)] = v;
        }
    }
    cluster.sync(); // keep this block's partials alive until the cluster has read them
}

// Fallback for unaligned or odd shapes (K % 8 != 0, misaligned pointers, slices too large for
// shared memory): one weight row per (8 / ks) warps, activations read through the L1.
template <int TT>
__global__ void __launch_bounds__(256) gemv_rows_kernel(const float *__restrict__ x,
                                                        const uint16_t *__restrict__ W, int T,
                                                        int N, int K, float *__restrict__ y,
                                                        int ks) {
    k25_pdl_trigger();
    k25_pdl_wait(); // weights and activations are read interleaved: nothing to issue before
    __shared__ float red[8][TT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows_per_block = 8 / ks;
    const int r_in_block = warp / ks, kpart = warp % ks;
    const int n = blockIdx.x * rows_per_block + r_in_block;
    const int t0 = blockIdx.y * TT;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    if (n < N) {
        const uint16_t *wr = W + (size_t)n * K;
        for (int k = kpart * 32 + lane; k < K; k += ks * 32) {
            float wv = k25_bf16f(wr[k]);
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t0 + t < T) acc[t] = fmaf(wv, x[(size_t)(t0 + t) * K + k], acc[t]);
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

static size_t gemv_tile_smem(int TT, int cps, int brows) {
    return (size_t)TT * 2 * cps * sizeof(float4) + (size_t)TT * brows * sizeof(float);
}

// Largest dynamic shared memory a block may opt into.
static int gemv_smem_optin(void) {
    static int optin = -1;
    return k25_device_attr(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

// Lets the tile kernel use all the shared memory a block may have (once per instance; done for
// every one by k25k_blas_create, outside any graph capture).
template <int TT, bool PAIR>
static void gemv_allow_smem(void) {
    static bool done = false;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(gemv_tile_kernel<TT, PAIR>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    gemv_smem_optin()));
    done = true;
}

// Clusters of the tile kernel that fit on the device at once (cached per launch shape).
template <int TT, bool PAIR>
static int gemv_max_clusters(int ks, int threads, size_t smem) {
    static struct { int ks, threads, n; size_t smem; } cache[32];
    static int n_cache = 0;
    for (int i = 0; i < n_cache; i++)
        if (cache[i].ks == ks && cache[i].threads == threads && cache[i].smem == smem)
            return cache[i].n;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = ks, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)ks);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, gemv_tile_kernel<TT, PAIR>, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    if (n_cache < 32) cache[n_cache].ks = ks, cache[n_cache].threads = threads,
                      cache[n_cache].smem = smem, cache[n_cache++].n = n;
    return n;
}

// Warps per block: 4 when blocks of 8 warps would leave SMs idle (rows per block do not change
// the summation order, only the K slices do).
static int gemv_warps(int N, int ks, int sms) {
    return k25_cdiv(N, 8 * GT_RW) * ks < sms ? 4 : 8;
}

// The tile kernel's plan for N x K (N = N1 + N2 for a pair): K slices, 16-byte chunks per
// slice, warps and rows per row group. Depends on N and K only.
typedef struct gemv_plan {
    int ks, cps, warps, rows;
} gemv_plan;

static gemv_plan gemv_plan_for(int N, int K) {
    gemv_plan p;
    const int sms = gemv_sms();
    p.ks = gemv_slices(N, K, sms);
    p.cps = (int)k25_cdiv(K / 8, p.ks);
    p.warps = gemv_warps(N, p.ks, sms);
    p.rows = p.warps * GT_RW;
    return p;
}

static bool gemv_aligned(const void *p) { return (uintptr_t)p % 16 == 0; }

// One tile-kernel launch for rows N1 (+ N2 for a pair); false (nothing launched) when the
// shapes or pointers do not fit it (see gemv_tile_kernel).
template <int TT, bool PAIR>
static bool gemv_tile_launch(const float *x, const uint16_t *W1, const uint16_t *W2, int T,
                             int N1, int N2, int K, float *y1, float *y2, cudaStream_t s) {
    const int N = PAIR ? N1 + N2 : N1;
    const gemv_plan pl = gemv_plan_for(N, K);
    const bool vec =
        K % 8 == 0 && gemv_aligned(x) && gemv_aligned(W1) && (!PAIR || gemv_aligned(W2));
    const int optin = gemv_smem_optin();
    if (!vec || gemv_tile_smem(TT, pl.cps, pl.rows) > (size_t)optin) return false;
    gemv_allow_smem<TT, PAIR>();
    const int clusters =
        gemv_max_clusters<TT, PAIR>(pl.ks, 32 * pl.warps, gemv_tile_smem(TT, pl.cps, pl.rows));
    if (clusters <= 0) return false;
    // one wave: as many row blocks as clusters fit (per T tile), G row groups each
    const int nb = (int)k25_cdiv(N, pl.rows), tiles = (int)k25_cdiv(T, TT);
    int per_tile = clusters / tiles > 1 ? clusters / tiles : 1;
    int G = (int)k25_cdiv(nb, per_tile < nb ? per_tile : nb);
    if (G > GT_MAX_G) G = GT_MAX_G;
    while (G > 1 && gemv_tile_smem(TT, pl.cps, G * pl.rows) > (size_t)optin) G--;
    const size_t smem = gemv_tile_smem(TT, pl.cps, G * pl.rows);
    const dim3 grid((unsigned)pl.ks, (unsigned)k25_cdiv(nb, G), (unsigned)tiles);
    void (*kernel)(const float *, const uint16_t *, const uint16_t *, int, int, int, int, float *,
                   float *, int, int) = gemv_tile_kernel<TT, PAIR>;
    k25_launch_cluster(PAIR ? "gemv_bf16 pair tile" : "gemv_bf16 tile", kernel, grid,
                       dim3(32 * pl.warps), smem, s, pl.ks, x, W1, W2, T, N1, N2, K, y1, y2,
                       pl.cps, G);
    return true;
}

template <int TT>
static void gemv_launch(const float *x, const uint16_t *W, int T, int N, int K, float *y,
                        cudaStream_t s) {
    if (gemv_tile_launch<TT, false>(x, W, (const uint16_t *)nullptr, T, N, 0, K, y,
                                    (float *)nullptr, s))
        return;
    int kp = N >= 8192 ? 1 : (N >= 4096 ? 2 : (N >= 2048 ? 4 : 8));
    if (K < 256 * kp) kp = K >= 1024 ? 4 : (K >= 512 ? 2 : 1);
    const dim3 grid((unsigned)k25_cdiv(N, 8 / kp), (unsigned)k25_cdiv(T, TT));
    k25_launch("gemv_bf16 rows", gemv_rows_kernel<TT>, grid, dim3(256), 0, s, x, W, T, N, K, y, kp);
}

void k25k_gemv_plan(int N, int K, int *k_slices, int *rows_per_block) {
    const gemv_plan p = gemv_plan_for(N, K);
    *k_slices = p.ks;
    *rows_per_block = p.rows;
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
    else if (T <= 8)
        gemv_launch<8>(x, W, T, N, K, y, s);
    else
        gemv_launch<16>(x, W, T, N, K, y, s); // T > 16: tiles of 16 rows, weights re-read per tile
}

int k25k_gemv2_applies(const float *x, const uint16_t *W1, const uint16_t *W2, int N1, int N2,
                       int K) {
    if (N1 <= 0 || N2 <= 0 || K % 8 != 0) return 0;
    if (!gemv_aligned(x) || !gemv_aligned(W1) || !gemv_aligned(W2)) return 0;
    // Decided from the shapes alone, never from T, so that a row's bits do not depend on the
    // step's row count: row groups within one matrix, and a cluster of the largest row tile (16:
    // the most shared memory and registers) fitting on the device, which every smaller tile then
    // does too.
    const gemv_plan pl = gemv_plan_for(N1 + N2, K);
    const size_t smem16 = gemv_tile_smem(16, pl.cps, pl.rows);
    if (N1 % pl.rows != 0 || smem16 > (size_t)gemv_smem_optin()) return 0;
    gemv_allow_smem<16, true>();
    return gemv_max_clusters<16, true>(pl.ks, 32 * pl.warps, smem16) > 0;
}

int k25k_gemv2_bf16(const float *x, const uint16_t *W1, const uint16_t *W2, int T, int N1,
                    int N2, int K, float *y1, float *y2, cudaStream_t s) {
    if (!k25k_gemv2_applies(x, W1, W2, N1, N2, K)) return 0;
    if (T <= 0) return 1;
    bool ok;
    if (T == 1)
        ok = gemv_tile_launch<1, true>(x, W1, W2, T, N1, N2, K, y1, y2, s);
    else if (T == 2)
        ok = gemv_tile_launch<2, true>(x, W1, W2, T, N1, N2, K, y1, y2, s);
    else if (T <= 4)
        ok = gemv_tile_launch<4, true>(x, W1, W2, T, N1, N2, K, y1, y2, s);
    else if (T <= 8)
        ok = gemv_tile_launch<8, true>(x, W1, W2, T, N1, N2, K, y1, y2, s);
    else
        ok = gemv_tile_launch<16, true>(x, W1, W2, T, N1, N2, K, y1, y2, s);
    return ok; // false only if the occupancy answer contradicts k25k_gemv2_applies
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
    float *ys;          // products of stacked hi / lo activations, k25k_blas_products
    size_t ys_cap;      // floats
    lt_plan plans[LT_PLANS];
    int n_plans, next_evict;
    int gemv_max_t;     // GEMV for T <= this
    int wgmma_max_t;    // above it, the warpgroup-MMA kernel for T <= this (split operand)
    struct lt_batched_plan *bplans; // [LT_BPLANS], k25k_gemm_bf16_strided
    int n_bplans, next_bevict;
};

k25k_blas *k25k_blas_create(size_t workspace_bytes) {
    k25k_blas *b = (k25k_blas *)k25_calloc(1, sizeof *b);
    CUBLAS_CHECK(cublasLtCreate(&b->lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&b->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(b->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(b->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    b->ws_bytes = workspace_bytes;
    gemv_allow_smem<1, false>(), gemv_allow_smem<2, false>(), gemv_allow_smem<4, false>();
    gemv_allow_smem<8, false>(), gemv_allow_smem<16, false>();
    gemv_allow_smem<1, true>(), gemv_allow_smem<2, true>(), gemv_allow_smem<4, true>();
    gemv_allow_smem<8, true>(), gemv_allow_smem<16, true>();
    CUDA_CHECK(cudaMalloc(&b->workspace, b->ws_bytes));
    // Measured on H200 (bench/micro_matmul): the tile GEMV beats cuBLASLt's two bf16 products
    // by 1.1-2x at T = 4 and loses at T = 16 (0.4-0.9x: its f32 FMAs, 2 T flops per 2-byte
    // weight, then outrun the CUDA cores); at T = 5-8 the whole step in a graph was ~2.5 ms
    // slower with it (bench/NOTES.md, tenth round), so it takes steps of up to 4 rows, where a
    // row's result also does not depend on T (speculative verification at k = 3 = plain
    // decoding bit for bit).
    b->gemv_max_t = k25_env_int("K25_GEMV_MAX_T", K25K_GEMV_MAX_T_DEFAULT);
    b->wgmma_max_t = k25_env_int("K25_WGMMA_MAX_T", K25K_WGMMA_MAX_T_DEFAULT);
    return b;
}

static void plan_release(lt_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    p->valid = 0;
}

static void bplans_free(k25k_blas *b);

void k25k_blas_destroy(k25k_blas *b) {
    if (!b) return;
    for (int i = 0; i < b->n_plans; i++) plan_release(&b->plans[i]);
    bplans_free(b);
    cublasLtMatmulDescDestroy(b->desc);
    cublasLtDestroy(b->lt);
    cudaFree(b->workspace);
    cudaFree(b->xb);
    cudaFree(b->ys);
    free(b);
}

// Grows a workspace *buf of *cap elements to n. Captured graphs may hold the old buffer: the
// caller drops them before growing.
static void blas_grow(void **buf, size_t *cap, size_t n, size_t elem_bytes) {
    if (n <= *cap) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (*buf) CUDA_CHECK(cudaFree(*buf));
    CUDA_CHECK(cudaMalloc(buf, n * elem_bytes));
    *cap = n;
}

void k25k_blas_reserve(k25k_blas *b, size_t elems) {
    blas_grow(reinterpret_cast<void **>(&b->xb), &b->xb_cap, elems, sizeof(uint16_t));
}

size_t k25k_blas_capacity(const k25k_blas *b) { return b->xb_cap; }

void k25k_blas_reserve_products(k25k_blas *b, size_t floats) {
    blas_grow(reinterpret_cast<void **>(&b->ys), &b->ys_cap, floats, sizeof(float));
}

float *k25k_blas_products(const k25k_blas *b, int T, size_t row_floats) {
    const size_t floats = (size_t)2 * T * row_floats;
    return T <= k25k_lt_one_pass_rows() && floats <= b->ys_cap ? b->ys : NULL;
}

int k25k_blas_gemv_max_t(const k25k_blas *b) { return b->gemv_max_t; }

int k25k_lt_one_pass_rows(void) {
    static int rows = -1;
    if (rows < 0) rows = k25_env_int("K25_LT_ONE_PASS_T", K25K_LT_ONE_PASS_T_DEFAULT);
    return rows;
}

// Index of the cache entry a new plan goes to: the next unused one, else the oldest (round
// robin); the caller releases what it held.
static int lt_slot(int *n, int *next_evict, int cap) {
    if (*n < cap) return (*n)++;
    const int i = *next_evict;
    *next_evict = (i + 1) % cap;
    return i;
}

// The heuristic's first algorithm for desc on these layouts within the workspace, for operands
// aligned to `align` bytes (0: cuBLASLt's default assumption). 0 when it has none.
static int lt_pick_algo(k25k_blas *b, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                        cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, int align,
                        cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &b->ws_bytes, sizeof b->ws_bytes));
    if (align > 0) {
        const uint32_t al = (uint32_t)align;
        const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al, sizeof al));
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found >= 1) *algo = res.algo;
    return found >= 1;
}

static lt_plan *plan_get(k25k_blas *b, int N, int K, int T) {
    for (int i = 0; i < b->n_plans; i++) {
        lt_plan *p = &b->plans[i];
        if (p->valid && p->N == N && p->K == K && p->T == T) return p;
    }
    lt_plan *p = &b->plans[lt_slot(&b->n_plans, &b->next_evict, LT_PLANS)];
    plan_release(p);
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->T = T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, T, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, T, N));
    if (!lt_pick_algo(b, b->desc, p->a, p->b, p->c, 0, &p->algo))
        K25_DIE("cuBLASLt: no algorithm for bf16 GEMM N=%d K=%d T=%d", N, K, T);
    p->valid = 1;
    return p;
}

static void lt_gemm(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N, int K,
                    float *y, float beta, cudaStream_t s);

// The activations x [T][K] as the bf16 operand: hi [T][K] then, when split, lo [T][K]; xs when
// the kernel that wrote x staged it already, else converted into the workspace. Returns it.
static const uint16_t *lt_stage(k25k_blas *b, const float *x, const uint16_t *xs, int T, int K,
                                cudaStream_t s) {
    if (xs) return xs;
    const int split = k25k_split_activations();
    size_t need = (size_t)T * K * (split ? 2 : 1);
    if (need > b->xb_cap)
        K25_DIE("matmul: bf16 activation workspace holds %zu elements, %zu needed (reserve "
                "before the step)", b->xb_cap, need);
    if (split)
        k25k_f32_to_bf16_split(x, (size_t)T * K, b->xb, b->xb + (size_t)T * K, s);
    else
        k25k_f32_to_bf16(x, need, b->xb, s);
    return b->xb;
}

// y = x W^T from the staged activations: y = W hi (+ W lo). The staging puts lo right after
// hi, so [hi; lo] is one 2T-row operand: up to k25k_lt_one_pass_rows() one GEMM reads the
// weights once and sum2 adds the halves (the same sum as the second product accumulating
// into the first, lo + hi); above, two GEMMs. keep_parts: the one GEMM's products are returned
// unsummed (hi rows, then lo rows) and y is not written; NULL: y holds the result.
static const float *lt_products(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N,
                                int K, float *y, bool keep_parts, cudaStream_t s) {
    const int split = k25k_split_activations();
    float *y2 = split ? k25k_blas_products(b, T, (size_t)N) : NULL;
    if (y2) {
        lt_gemm(b, xb, W, 2 * T, N, K, y2, 0.0f, s);
        if (keep_parts) return y2;
        k25k_sum2(y, y2, y2 + (size_t)T * N, (size_t)T * N, s);
        return NULL;
    }
    lt_gemm(b, xb, W, T, N, K, y, 0.0f, s);
    if (split) lt_gemm(b, xb + (size_t)T * K, W, T, N, K, y, 1.0f, s);
    return NULL;
}

void k25k_matmul_lt(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W, int T,
                    int N, int K, float *y, cudaStream_t s) {
    if (T <= 0 || N <= 0) return;
    lt_products(b, lt_stage(b, x, xs, T, K, s), W, T, N, K, y, false, s);
}

// The warpgroup-MMA kernel for [W1; W2] (N2 = 0: W1 alone) from the split operand, where the
// dispatch takes it: up to its rows, for the shapes it is preferred for. Whether it ran.
static bool wgmma_products(const k25k_blas *b, const uint16_t *xb, const uint16_t *W1, int T,
                           int N1, int N2, int K, float *y1, float *y2, cudaStream_t s) {
    return k25k_split_activations() && T <= b->wgmma_max_t && k25k_wgmma_preferred(N1 + N2, K) &&
           k25k_matmul_wgmma(xb, W1, T, N1, N2, K, y1, y2, s);
}

// The products above the GEMV's rows from the staged operand: the warpgroup-MMA kernel where
// the dispatch takes it (y written, NULL returned), else cuBLASLt's (lt_products).
static const float *split_products(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T,
                                   int N, int K, float *y, bool keep_parts, cudaStream_t s) {
    if (wgmma_products(b, xb, W, T, N, 0, K, y, NULL, s)) return NULL;
    return lt_products(b, xb, W, T, N, K, y, keep_parts, s);
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

void k25k_matmul(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W, int T, int N,
                 int K, float *y, cudaStream_t s) {
    if (T <= b->gemv_max_t)
        k25k_gemv_bf16(x, W, T, N, K, y, s);
    else if (T > 0 && N > 0)
        split_products(b, lt_stage(b, x, xs, T, K, s), W, T, N, K, y, false, s);
}

const float *k25k_matmul_parts(k25k_blas *b, const float *x, const uint16_t *xs,
                               const uint16_t *W, int T, int N, int K, float *y, cudaStream_t s) {
    if (T <= b->gemv_max_t || T <= 0 || N <= 0) {
        k25k_matmul(b, x, xs, W, T, N, K, y, s);
        return NULL;
    }
    return split_products(b, lt_stage(b, x, xs, T, K, s), W, T, N, K, y, true, s);
}

void k25k_matmul2(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W1,
                  const uint16_t *W2, int T, int N1, int N2, int K, float *y1, float *y2,
                  cudaStream_t s) {
    if (T <= 0) return;
    if (T <= b->gemv_max_t) {
        if (k25k_gemv2_bf16(x, W1, W2, T, N1, N2, K, y1, y2, s)) return;
        k25k_gemv_bf16(x, W1, T, N1, K, y1, s);
        k25k_gemv_bf16(x, W2, T, N2, K, y2, s);
        return;
    }
    // the activations converted once for both products
    const uint16_t *xb = lt_stage(b, x, xs, T, K, s);
    // W2 right after W1: [W1; W2] is one N1 + N2 row matrix, one GEMM over [hi; lo]
    const bool adjacent =
        k25k_split_activations() && N1 > 0 && N2 > 0 && W2 == W1 + (size_t)N1 * K;
    if (adjacent && wgmma_products(b, xb, W1, T, N1, N2, K, y1, y2, s)) return;
    float *p = adjacent ? k25k_blas_products(b, T, (size_t)(N1 + N2)) : NULL;
    if (p) {
        lt_gemm(b, xb, W1, 2 * T, N1 + N2, K, p, 0.0f, s);
        k25k_sum2_pair(y1, y2, p, T, N1, N2, s);
        return;
    }
    if (N1 > 0) split_products(b, xb, W1, T, N1, K, y1, false, s);
    if (N2 > 0) split_products(b, xb, W2, T, N2, K, y2, false, s);
}

// ------------------------------------------------------------------------------------------
// cuBLASLt, strided batches (per-head products of the MLA prefill)
// ------------------------------------------------------------------------------------------

// Row-major Y_i[M][N] = X_i[M][K] op(W_i) is, column-major, Y_i^T [N x M] = op(W_i)^T X_i^T:
// A = W_i (stored [N][K]: a K x N column-major matrix, transposed; stored [K][N]: N x K, as
// is), B = X_i^T (K x M, ld ldx), C = D = Y_i^T (N x M, ld ldy). The descriptor and the layouts
// carry the transposition, the batch and the strides, so a plan is kept per full shape; the
// alignment the heuristic may assume is that of the actual pointers, strides and leading
// dimensions (at most 256 bytes, its default), so that no algorithm needing more is picked.
#define LT_BPLANS 16

typedef struct lt_batched_plan {
    int valid, w_nk, M, N, K, batch, align;
    int64_t ldx, sx, ldw, sw, ldy, sy;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_batched_plan;

static void bplan_release(lt_batched_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
    p->valid = 0;
}

static void bplans_free(k25k_blas *b) {
    for (int i = 0; i < b->n_bplans; i++) bplan_release(&b->bplans[i]);
    free(b->bplans);
}

// Largest power of two <= 256 dividing the address and every byte step.
static int lt_align(const void *p, int64_t step_bytes[], int n) {
    uint64_t m = (uint64_t)(uintptr_t)p | 256;
    for (int i = 0; i < n; i++) m |= (uint64_t)step_bytes[i];
    return (int)(m & (~m + 1));
}

static void lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int rows, int cols, int64_t ld,
                      int batch, int64_t stride) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                  sizeof batch));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride));
}

static lt_batched_plan *bplan_get(k25k_blas *b, int w_nk, int M, int N, int K, int batch,
                                  int64_t ldx, int64_t sx, int64_t ldw, int64_t sw, int64_t ldy,
                                  int64_t sy, int align) {
    if (!b->bplans) b->bplans = (lt_batched_plan *)k25_calloc(LT_BPLANS, sizeof *b->bplans);
    for (int i = 0; i < b->n_bplans; i++) {
        lt_batched_plan *p = &b->bplans[i];
        if (p->valid && p->w_nk == w_nk && p->M == M && p->N == N && p->K == K &&
            p->batch == batch && p->ldx == ldx && p->sx == sx && p->ldw == ldw && p->sw == sw &&
            p->ldy == ldy && p->sy == sy && p->align == align)
            return p;
    }
    lt_batched_plan *p = &b->bplans[lt_slot(&b->n_bplans, &b->next_bevict, LT_BPLANS)];
    bplan_release(p);
    memset(p, 0, sizeof *p);
    p->w_nk = w_nk, p->M = M, p->N = N, p->K = K, p->batch = batch, p->align = align;
    p->ldx = ldx, p->sx = sx, p->ldw = ldw, p->sw = sw, p->ldy = ldy, p->sy = sy;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = w_nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (w_nk)
        lt_layout(&p->a, CUDA_R_16BF, K, N, ldw, batch, sw);
    else
        lt_layout(&p->a, CUDA_R_16BF, N, K, ldw, batch, sw);
    lt_layout(&p->b, CUDA_R_16BF, K, M, ldx, batch, sx);
    lt_layout(&p->c, CUDA_R_32F, N, M, ldy, batch, sy);
    if (!lt_pick_algo(b, p->desc, p->a, p->b, p->c, align, &p->algo))
        K25_DIE("cuBLASLt: no algorithm for %d batched bf16 GEMMs M=%d N=%d K=%d", batch, M, N, K);
    p->valid = 1;
    return p;
}

void k25k_gemm_bf16_strided(k25k_blas *b, int w_nk, int M, int N, int K, int batch,
                            const uint16_t *x, int64_t ldx, int64_t sx, const uint16_t *w,
                            int64_t ldw, int64_t sw, float *y, int64_t ldy, int64_t sy,
                            float beta, cudaStream_t s) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    int64_t steps[6] = {ldx * 2, sx * 2, ldw * 2, sw * 2, ldy * 4, sy * 4};
    int align = lt_align(x, steps, 6);
    const int aw = lt_align(w, steps, 6), ay = lt_align(y, steps, 6);
    if (aw < align) align = aw;
    if (ay < align) align = ay;
    lt_batched_plan *p = bplan_get(b, w_nk, M, N, K, batch, ldx, sx, ldw, sw, ldy, sy, align);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(b->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                                &p->algo, b->workspace, b->ws_bytes, s));
    K25_LAUNCH_CHECK(s, "cublasLt batched matmul");
}
