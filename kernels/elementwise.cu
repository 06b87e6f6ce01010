// Row-wise and element-wise kernels: embedding gather, RMSNorm (plain and fused with the
// residual add), SiLU*up, add, f32 -> bf16 conversion, and the launch-check helpers.
#include <stdlib.h>
#include <algorithm>
#include <string.h>

#include "cuda_kernels.cuh"

// ------------------------------------------------------------------------------------------
// Launch checks
// ------------------------------------------------------------------------------------------

int k25_env_flag(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

int k25_env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

int k25_cuda_debug_sync(void) {
    static int v = -1;
    if (v < 0) v = k25_env_flag("K25_CUDA_SYNC");
    return v;
}

int k25_pdl_enabled(void) {
    static int v = -1;
    if (v < 0) v = !k25_env_flag("K25_NO_PDL");
    return v;
}

void k25_cuda_launch_check(cudaStream_t s, const char *what, const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        k25_fatal(file, line, "kernel %s: launch failed: %s (%s)", what, cudaGetErrorName(err),
                  cudaGetErrorString(err));
    if (!k25_cuda_debug_sync()) return;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return;
    err = cudaStreamSynchronize(s);
    if (err != cudaSuccess)
        k25_fatal(file, line, "kernel %s: execution failed: %s (%s)", what, cudaGetErrorName(err),
                  cudaGetErrorString(err));
}

// ------------------------------------------------------------------------------------------
// Embedding
// ------------------------------------------------------------------------------------------

// x[t][D] = emb[tokens[t]][D]; an id outside [0, V) writes NaN (and sets *err) so it cannot
// pass unnoticed. One block per row, one 16-byte load (8 bf16) per thread where the row allows:
// with one element per thread the block waited a memory round trip per iteration (12 us for a
// 7168-wide row); k25k_embed gives the block a thread per 8 elements, so the loads are issued
// together.
__global__ void embed_kernel(const int32_t *__restrict__ tokens, const uint16_t *__restrict__ emb,
                             int64_t V, int D, float *__restrict__ x, int *err) {
    k25_pdl_trigger();
    k25_pdl_wait();
    int t = blockIdx.x;
    int tok = tokens[t];
    float *row = x + (size_t)t * D;
    if (tok < 0 || tok >= V) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = __int_as_float(0x7fc00000);
        if (threadIdx.x == 0) atomicExch(err, 1);
        return;
    }
    const uint16_t *src = emb + (size_t)tok * D;
    if ((D & 7) == 0 && ((uintptr_t)emb & 15) == 0 && ((uintptr_t)x & 15) == 0) {
        const uint4 *s8 = reinterpret_cast<const uint4 *>(src);
        float4 *r4 = reinterpret_cast<float4 *>(row);
        for (int i = threadIdx.x; i < D / 8; i += blockDim.x) {
            const uint4 v = s8[i];
            r4[2 * i] = make_float4(k25_bf16_lo(v.x), k25_bf16_hi(v.x), k25_bf16_lo(v.y),
                                    k25_bf16_hi(v.y));
            r4[2 * i + 1] = make_float4(k25_bf16_lo(v.z), k25_bf16_hi(v.z), k25_bf16_lo(v.w),
                                        k25_bf16_hi(v.w));
        }
        return;
    }
    for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = k25_bf16f(src[i]);
}

void k25k_embed(const int32_t *tokens, int T, const uint16_t *emb, int64_t V, int D, float *x,
                int *err, cudaStream_t s) {
    if (T <= 0) return;
    // a thread per 8 elements (896 at D = 7168), 128 to 1024
    const int threads =
        (int)std::min<int64_t>(1024, std::max<int64_t>(128, k25_cdiv(D / 8, 32) * 32));
    k25_launch("embed", embed_kernel, T, threads, 0, s, tokens, emb, V, D, x, err);
}

// ------------------------------------------------------------------------------------------
// RMSNorm
// ------------------------------------------------------------------------------------------
// One block per row, one pass over global memory: every thread loads its chunks of the row
// (and of d, and of w) into registers, h += d is written back at once, the sum of squares comes
// from the registers, one block reduction, then out is written from the registers. The old
// kernel made three dependent passes (add + write h, read back for the sum, read again for the
// output), each a round trip to L2, for rows of a few tens of KB.
//
// Layout: chunk c holds elements 4c..4c+3; thread tid owns chunks tid + k * threads, k < v
// (coalesced 16-byte accesses). The plan (threads, v) depends on n only, and so does the
// summation order: per thread ascending k, within a chunk elements in order (fmaf), then the
// xor butterfly over the warp, then the warp partials in a second butterfly. A row's bits
// therefore do not depend on T, the other rows, or which of the two kernels ran (the loop
// fallback uses the same plan and order; elements past n count as zeros, which add exactly 0).

// Most threads per block (chunks per thread in registers: 1..4, see rms_reg_kernel_for).
#define K25_RMS_MAX_THREADS 1024

struct rms_plan {
    int threads, v;
};

// v = the fewest chunks per thread with at most 1024 threads: n = 7168: 896 threads x 2 chunks;
// 1536: 384 x 1; 512: 128 x 1; <= 128: one warp (no shared-memory step). Rows up to 16384
// elements (v <= 4) run from registers, longer ones through the loop kernel with the same plan.
// Why many threads with few chunks each, not 256 x 7: ptxas (CUDA 13.0, SASS of this file)
// keeps a thread's loads ahead of their first use only while they are few. In the add variant
// with 3 or more chunks per thread (6+ loads of h and d) it placed the adds of the first chunks
// between the loads of the last ones, and a warp stalled at its first add cannot issue the
// loads behind it: two L2 round trips instead of one. With 1 or 2 chunks every load is issued
// before the first add (the plain variant keeps up to 4 chunks' loads together). The wider
// block costs little: the row lives on one SM either way, whose L1 takes the same bytes per
// clock whatever the number of warps, and the reduction is one barrier and two 5-step
// butterflies for 28 warps as for 8.
static rms_plan rms_plan_for(int n) {
    const int nv = (int)k25_cdiv(n, 4);
    rms_plan p;
    p.v = (int)k25_cdiv(nv, K25_RMS_MAX_THREADS);
    p.threads = (int)k25_cdiv(k25_cdiv(nv, p.v), 32) * 32;
    return p;
}

__device__ __forceinline__ float rms_sq4(float ss, float a, float b, float c, float d) {
    ss = fmaf(a, a, ss);
    ss = fmaf(b, b, ss);
    ss = fmaf(c, c, ss);
    return fmaf(d, d, ss);
}

// Sum over the block, the same bits in every thread (an xor butterfly gives every lane the same
// sum). One barrier: scratch is used once per kernel. A one-warp block skips the shared-memory
// step (adding the zero partials of absent warps would not change the value).
__device__ __forceinline__ float rms_block_sum(float v, float *scratch) {
    v = k25_warp_sum(v);
    const int nw = blockDim.x >> 5;
    if (nw == 1) return v;
    const int lane = threadIdx.x & 31;
    if (lane == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    return k25_warp_sum(lane < nw ? scratch[lane] : 0.0f);
}

// out = x * r * w with the product in this order in both kernels.
__device__ __forceinline__ float rms_scale(float x, float r, float w) { return x * r * w; }

// The register path: n % 4 == 0, x/h/d/out 16-byte aligned, w 8-byte aligned, ld % 4 == 0,
// v == V. w is constant during a step, so its loads are issued before k25_pdl_wait() (they
// overlap the previous kernel's drain). Every load is coherent (__ldcg, no const __restrict__):
// ptxas moves ld.global.nc across griddepcontrol.wait in both directions, which would lose the
// weight prologue or hoist a read of the previous kernel's output above the wait (PDL rules in
// cuda_common.cuh).
template <bool kAdd, int V>
__global__ void __launch_bounds__(K25_RMS_MAX_THREADS)
    rmsnorm_reg_kernel(const float *x, int ld, float *h, const float *d, const uint16_t *w,
                       float eps, int n, float *out, uint16_t *hi, uint16_t *lo) {
    __shared__ float scratch[32];
    k25_pdl_trigger();
    const int nv = n >> 2, tid = threadIdx.x, nt = blockDim.x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const uint2 *w4 = reinterpret_cast<const uint2 *>(w); // 4 bf16 per chunk
    uint2 wr[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int c = tid + k * nt;
        wr[k] = c < nv ? __ldcg(w4 + c) : make_uint2(0u, 0u);
    }
    k25_pdl_wait();

    // Every load of the row (and of d) is issued before the first use: one round trip.
    const size_t row = blockIdx.x;
    float4 *h4 = reinterpret_cast<float4 *>(h + (kAdd ? row * n : 0));
    const float4 *x4 = kAdd ? h4 : reinterpret_cast<const float4 *>(x + row * ld);
    float4 v[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int c = tid + k * nt;
        v[k] = c < nv ? __ldcg(x4 + c) : zero;
    }
    if (kAdd) {
        const float4 *d4 = reinterpret_cast<const float4 *>(d + row * n);
        float4 e[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int c = tid + k * nt;
            e[k] = c < nv ? __ldcg(d4 + c) : zero;
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int c = tid + k * nt;
            v[k].x += e[k].x;
            v[k].y += e[k].y;
            v[k].z += e[k].z;
            v[k].w += e[k].w;
            if (c < nv) h4[c] = v[k];
        }
    }
    float ss = 0.0f; // chunks past the row are zeros: they add exactly nothing
#pragma unroll
    for (int k = 0; k < V; k++) ss = rms_sq4(ss, v[k].x, v[k].y, v[k].z, v[k].w);
    ss = rms_block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)n + eps);
    float4 *o4 = reinterpret_cast<float4 *>(out + row * n);
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int c = tid + k * nt;
        if (c < nv) {
            const float o[4] = {rms_scale(v[k].x, r, k25_bf16_lo(wr[k].x)),
                                rms_scale(v[k].y, r, k25_bf16_hi(wr[k].x)),
                                rms_scale(v[k].z, r, k25_bf16_lo(wr[k].y)),
                                rms_scale(v[k].w, r, k25_bf16_hi(wr[k].y))};
            o4[c] = make_float4(o[0], o[1], o[2], o[3]);
            if (hi) k25_st_split<4>(hi, lo, row * n + 4 * (size_t)c, o);
        }
    }
}

// Any n and alignment (and rows too long for registers): the same plan and summation order,
// element by element, the row read a second time for the output (a thread re-reads only the
// elements it wrote itself). Waits at the top.
template <bool kAdd>
__global__ void __launch_bounds__(K25_RMS_MAX_THREADS)
    rmsnorm_loop_kernel(const float *x, int ld, float *h, const float *d, const uint16_t *w,
                        float eps, int n, int v, float *out, uint16_t *hi, uint16_t *lo) {
    __shared__ float scratch[32];
    k25_pdl_trigger();
    k25_pdl_wait();
    const size_t row = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    float *hr = kAdd ? h + row * n : nullptr;
    const float *xr = kAdd ? hr : x + row * ld;
    const float *dr = kAdd ? d + row * n : nullptr;
    float ss = 0.0f;
    for (int k = 0; k < v; k++) {
        const int i0 = 4 * (tid + k * nt);
        if (i0 >= n) break;
        float a[4];
#pragma unroll
        for (int j = 0; j < 4; j++) a[j] = i0 + j < n ? xr[i0 + j] : 0.0f;
        if (kAdd) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (i0 + j < n) {
                    a[j] += dr[i0 + j];
                    hr[i0 + j] = a[j];
                }
        }
        ss = rms_sq4(ss, a[0], a[1], a[2], a[3]);
    }
    ss = rms_block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)n + eps);
    float *o = out + row * n;
    for (int k = 0; k < v; k++) {
        const int i0 = 4 * (tid + k * nt);
        if (i0 >= n) break;
        for (int j = 0; j < 4 && i0 + j < n; j++) {
            const float y = rms_scale(xr[i0 + j], r, k25_bf16f(w[i0 + j]));
            o[i0 + j] = y;
            if (hi) k25_st_split<1>(hi, lo, row * n + i0 + j, &y);
        }
    }
}

typedef void (*rms_reg_fn)(const float *, int, float *, const float *, const uint16_t *, float,
                           int, float *, uint16_t *, uint16_t *);

template <bool kAdd>
static rms_reg_fn rms_reg_kernel_for(int v) {
    switch (v) {
    case 1: return rmsnorm_reg_kernel<kAdd, 1>;
    case 2: return rmsnorm_reg_kernel<kAdd, 2>;
    case 3: return rmsnorm_reg_kernel<kAdd, 3>;
    case 4: return rmsnorm_reg_kernel<kAdd, 4>;
    default: return nullptr;
    }
}

static int rms_aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

// kAdd: h (stride n) += d, then the norm of h; else the norm of x (stride ld).
template <bool kAdd>
static void rmsnorm_launch(const char *what, const float *x, int ld, float *h, const float *d,
                           const uint16_t *w, float eps, int T, int n, float *out,
                           uint16_t *hi, uint16_t *lo, cudaStream_t s) {
    if (T <= 0 || n <= 0) return;
    const rms_plan p = rms_plan_for(n);
    const int vec = n % 4 == 0 && ld % 4 == 0 && rms_aligned(kAdd ? (const void *)h : x, 16) &&
                    (!kAdd || rms_aligned(d, 16)) && rms_aligned(out, 16) && rms_aligned(w, 8) &&
                    rms_aligned(hi, 8) && rms_aligned(lo, 8);
    rms_reg_fn reg = vec ? rms_reg_kernel_for<kAdd>(p.v) : nullptr;
    if (reg)
        k25_launch(what, reg, T, p.threads, 0, s, x, ld, h, d, w, eps, n, out, hi, lo);
    else
        k25_launch(what, rmsnorm_loop_kernel<kAdd>, T, p.threads, 0, s, x, ld, h, d, w, eps, n,
                   p.v, out, hi, lo);
}

void k25k_rmsnorm(const float *x, int ld, const uint16_t *w, float eps, int T, int n, float *out,
                  uint16_t *hi, uint16_t *lo, cudaStream_t s) {
    rmsnorm_launch<false>("rmsnorm", x, ld, nullptr, nullptr, w, eps, T, n, out, hi, lo, s);
}

void k25k_add_rmsnorm(float *h, const float *d, const uint16_t *w, float eps, int T, int n,
                      float *out, uint16_t *hi, uint16_t *lo, cudaStream_t s) {
    rmsnorm_launch<true>("add_rmsnorm", nullptr, n, h, d, w, eps, T, n, out, hi, lo, s);
}

// ------------------------------------------------------------------------------------------
// Element-wise
// ------------------------------------------------------------------------------------------

// Every element-wise kernel takes V consecutive elements per thread and iteration: V = 4 (16-byte
// f32 loads and stores) where the count and every pointer allow it, else 1; each element gets
// the same arithmetic either way. One 4-byte load per thread and iteration left the 256-row
// decode step's conversions at a third of copy bandwidth and its sums at half (ncu, 7 MB each).

// Grid-stride loop over the n / V groups of V elements: f(i) for group start i.
#define K25_FOR_GROUPS(n, V, i)                                                                     \
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * (V); i < (n);              \
         i += (size_t)gridDim.x * blockDim.x * (V))

template <int V>
__global__ void silu_mul_kernel(const float *__restrict__ g, const float *__restrict__ u,
                                size_t n, float *__restrict__ out) {
    k25_pdl_trigger();
    k25_pdl_wait();
    K25_FOR_GROUPS(n, V, i) {
        float a[V], b[V], o[V];
        k25_ldv<V>(g + i, a);
        k25_ldv<V>(u + i, b);
#pragma unroll
        for (int v = 0; v < V; v++) o[v] = k25_silu(a[v]) * b[v];
        k25_stv<V>(out + i, o);
    }
}

// out = a + b over the n / V groups (out may be a: each group is read before it is written).
// SPLIT: the sums are also written as the next product's bf16 operand (lo: NULL without the
// second half), as k25k_f32_to_bf16_split(out) would.
template <int V, bool SPLIT = false>
__device__ __forceinline__ void sum2_groups(float *out, const float *a, const float *b, size_t n,
                                            uint16_t *hi = nullptr, uint16_t *lo = nullptr) {
    K25_FOR_GROUPS(n, V, i) {
        float x[V], y[V];
        k25_ldv<V>(a + i, x);
        k25_ldv<V>(b + i, y);
#pragma unroll
        for (int v = 0; v < V; v++) x[v] += y[v];
        k25_stv<V>(out + i, x);
        if constexpr (SPLIT) k25_st_split<V>(hi, lo, i, x);
    }
}

template <int V> __global__ void add_kernel(float *y, const float *__restrict__ x, size_t n) {
    k25_pdl_trigger();
    k25_pdl_wait();
    sum2_groups<V>(y, y, x, n);
}

template <int V, bool SPLIT>
__global__ void sum2_kernel(float *out, const float *a, const float *b, size_t n, uint16_t *hi,
                            uint16_t *lo) {
    k25_pdl_trigger();
    k25_pdl_wait();
    sum2_groups<V, SPLIT>(out, a, b, n, hi, lo);
}

// The products of a pair's one GEMM, p [2T][N1 + N2] (hi rows, then lo rows), summed into the
// two outputs: the same sum as sum2 per element. V = 4 needs N1 and N2 multiples of 4 (a group
// never straddles the two outputs or two rows).
template <int V>
__global__ void sum2_pair_kernel(float *__restrict__ y1, float *__restrict__ y2,
                                 const float *__restrict__ p, int T, int N1, int N2) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const int N = N1 + N2;
    const size_t n = (size_t)T * N;
    K25_FOR_GROUPS(n, V, i) {
        const int t = (int)(i / N), c = (int)(i - (size_t)t * N);
        float x[V], y[V];
        k25_ldv<V>(p + i, x);
        k25_ldv<V>(p + n + i, y);
#pragma unroll
        for (int v = 0; v < V; v++) x[v] += y[v];
        k25_stv<V>(c < N1 ? y1 + (size_t)t * N1 + c : y2 + (size_t)t * N2 + (c - N1), x);
    }
}

template <int V>
__global__ void f32_to_bf16_kernel(const float *__restrict__ x, size_t n,
                                   uint16_t *__restrict__ y) {
    k25_pdl_trigger();
    k25_pdl_wait();
    K25_FOR_GROUPS(n, V, i) {
        float a[V];
        uint16_t h[V];
        k25_ldv<V>(x + i, a);
#pragma unroll
        for (int v = 0; v < V; v++) h[v] = k25_f2bf(a[v]);
        k25_stv<V>(y + i, h);
    }
}

template <int V>
__global__ void f32_to_bf16_split_kernel(const float *__restrict__ x, size_t n,
                                         uint16_t *__restrict__ hi, uint16_t *__restrict__ lo) {
    k25_pdl_trigger();
    k25_pdl_wait();
    K25_FOR_GROUPS(n, V, i) {
        float a[V];
        k25_ldv<V>(x + i, a);
        k25_st_split<V>(hi, lo, i, a);
    }
}

#undef K25_FOR_GROUPS

static int grid_for(size_t n) {
    size_t b = (n + 255) / 256;
    return (int)(b > 8192 ? 8192 : (b ? b : 1));
}

void k25k_silu_mul(const float *gate, const float *up, size_t n, float *out, cudaStream_t s) {
    if (!n) return;
    if (k25_vec4(n, {gate, up, out}))
        k25_launch("silu_mul", silu_mul_kernel<4>, grid_for(n / 4), 256, 0, s, gate, up, n, out);
    else
        k25_launch("silu_mul", silu_mul_kernel<1>, grid_for(n), 256, 0, s, gate, up, n, out);
}

void k25k_add(float *y, const float *x, size_t n, cudaStream_t s) {
    if (!n) return;
    if (k25_vec4(n, {y, x}))
        k25_launch("add", add_kernel<4>, grid_for(n / 4), 256, 0, s, y, x, n);
    else
        k25_launch("add", add_kernel<1>, grid_for(n), 256, 0, s, y, x, n);
}

void k25k_sum2(float *out, const float *a, const float *b, size_t n, cudaStream_t s) {
    k25k_sum2_split(out, a, b, n, nullptr, nullptr, s);
}

void k25k_sum2_split(float *out, const float *a, const float *b, size_t n, uint16_t *hi,
                     uint16_t *lo, cudaStream_t s) {
    if (!n) return;
    const bool v4 = k25_vec4(n, {out, a, b}, {hi, lo});
    auto *kernel = v4 ? (hi ? sum2_kernel<4, true> : sum2_kernel<4, false>)
                      : (hi ? sum2_kernel<1, true> : sum2_kernel<1, false>);
    k25_launch("sum2", kernel, grid_for(v4 ? n / 4 : n), 256, 0, s, out, a, b, n, hi, lo);
}

void k25k_sum2_pair(float *y1, float *y2, const float *p, int T, int N1, int N2, cudaStream_t s) {
    const size_t n = (size_t)T * (N1 + N2);
    if (!n) return;
    if (N1 % 4 == 0 && N2 % 4 == 0 && k25_vec4(n, {y1, y2, p, p + n}))
        k25_launch("sum2_pair", sum2_pair_kernel<4>, grid_for(n / 4), 256, 0, s, y1, y2, p, T,
                   N1, N2);
    else
        k25_launch("sum2_pair", sum2_pair_kernel<1>, grid_for(n), 256, 0, s, y1, y2, p, T, N1,
                   N2);
}

void k25k_f32_to_bf16(const float *x, size_t n, uint16_t *y, cudaStream_t s) {
    if (!n) return;
    if (k25_vec4(n, {x}, {y}))
        k25_launch("f32_to_bf16", f32_to_bf16_kernel<4>, grid_for(n / 4), 256, 0, s, x, n, y);
    else
        k25_launch("f32_to_bf16", f32_to_bf16_kernel<1>, grid_for(n), 256, 0, s, x, n, y);
}

void k25k_f32_to_bf16_split(const float *x, size_t n, uint16_t *hi, uint16_t *lo, cudaStream_t s) {
    if (!n) return;
    if (k25_vec4(n, {x}, {hi, lo}))
        k25_launch("f32_to_bf16_split", f32_to_bf16_split_kernel<4>, grid_for(n / 4), 256, 0, s,
                   x, n, hi, lo);
    else
        k25_launch("f32_to_bf16_split", f32_to_bf16_split_kernel<1>, grid_for(n), 256, 0, s, x,
                   n, hi, lo);
}
