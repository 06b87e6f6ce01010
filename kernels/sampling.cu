// Vocabulary-parallel sampling on the device, the same rules as src/sampler.h: each rank scans
// its logits slice on the GPU (greedy / Gumbel-max best, or its exact local top-C candidates by
// a radix select plus an ordered tie pass, and the softmax statistics), the small per-row
// results are gathered over NCCL by the caller, and the host finishes with the CPU sampler's
// own merge rules (sampler_before, sampler_pick). Full logits never leave the device.
#include "cuda_kernels.cuh"
#include "sampler.h"

// Order-preserving unsigned key of a float (larger float -> larger key); NaN has no key.
__device__ __forceinline__ uint32_t f2key(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ bool cand_before(double sa, int ia, double sb, int ib) {
    return sa > sb || (sa == sb && ia < ib);
}

// ------------------------------------------------------------------------------------------
// Greedy / Gumbel: the slice's best per row
// ------------------------------------------------------------------------------------------

// One block per row. The best is a total order (score desc, id asc), so the result does not
// depend on which thread saw which logit: each thread issues its U loads before comparing any
// (a loop of one load per iteration waited one round trip each, 23 us for a 20480 slice).
#define SAMPLE_BEST_THREADS 1024
__global__ void __launch_bounds__(SAMPLE_BEST_THREADS) sample_best_kernel(
    const float *__restrict__ logits, int V_local, int vocab_begin,
    const k25_sampling *__restrict__ params, k25_cand *__restrict__ out) {
    __shared__ double rs[SAMPLE_BEST_THREADS / 32];
    __shared__ int ri[SAMPLE_BEST_THREADS / 32];
    k25_pdl_trigger();
    k25_pdl_wait();
    const int t = blockIdx.x;
    const k25_sampling p = params[t];
    const float *row = logits + (size_t)t * V_local;
    const bool gumbel = p.temp > 0 && p.top_k <= 0 && !(p.top_p < 1);
    double best = -INFINITY;
    int bid = INT32_MAX;
    auto see = [&](float l, int i) {
        if (isnan(l)) return;
        const int id = vocab_begin + i;
        double s = l;
        if (gumbel) s = s / (double)p.temp + sampler_gumbel(p.seed, p.counter, (uint64_t)id);
        if (bid == INT32_MAX || cand_before(s, id, best, bid)) best = s, bid = id;
    };
    constexpr int U = 4;
    const int nt = blockDim.x;
    int i = threadIdx.x;
    for (; i + (U - 1) * nt < V_local; i += U * nt) {
        float l[U];
#pragma unroll
        for (int u = 0; u < U; u++) l[u] = row[i + u * nt];
#pragma unroll
        for (int u = 0; u < U; u++) see(l[u], i + u * nt);
    }
    for (; i < V_local; i += nt) see(row[i], i);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        double s2 = __shfl_xor_sync(0xffffffffu, best, o);
        int i2 = __shfl_xor_sync(0xffffffffu, bid, o);
        if (i2 != INT32_MAX && (bid == INT32_MAX || cand_before(s2, i2, best, bid))) best = s2, bid = i2;
    }
    if (lane == 0) rs[warp] = best, ri[warp] = bid;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (ri[w] != INT32_MAX && (bid == INT32_MAX || cand_before(rs[w], ri[w], best, bid)))
                best = rs[w], bid = ri[w];
        out[t].score = best;
        out[t].id = bid;
    }
}

void k25k_sample_best(const float *logits, int T, int V_local, int vocab_begin,
                      const k25_sampling *params_dev, k25_cand *out_dev, cudaStream_t s) {
    if (T <= 0) return;
    k25_launch("sample_best", sample_best_kernel, T, SAMPLE_BEST_THREADS, 0, s, logits, V_local,
               vocab_begin, params_dev, out_dev);
}

// ------------------------------------------------------------------------------------------
// Candidates: exact local top C (by logit desc, id asc) and softmax statistics
// ------------------------------------------------------------------------------------------

#define CAND_THREADS 1024


// Block per row. Writes out[t][0..n) sorted (z desc, id asc), n_out[t] = n, stats[t].
// Rows that are not in candidate mode get n = 0.
__global__ void __launch_bounds__(CAND_THREADS) sample_cand_kernel(
    const float *__restrict__ logits, int V_local, int vocab_begin,
    const k25_sampling *__restrict__ params, int c_max, k25_cand *__restrict__ out,
    int *__restrict__ n_out, k25_softmax_stats *__restrict__ stats) {
    __shared__ unsigned int hist[256];
    __shared__ int tot[32];
    __shared__ unsigned long long keys[K25_SAMPLE_CAND_MAX];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_need, s_count, s_gt;
    __shared__ double dred[32];
    k25_pdl_trigger();
    k25_pdl_wait(); // above the early return, which writes n_out too
    const int t = blockIdx.x;
    const k25_sampling p = params[t];
    const float *row = logits + (size_t)t * V_local;
    const bool cand_mode = p.temp > 0 && (p.top_k > 0 || p.top_p < 1);
    if (!cand_mode) {
        if (threadIdx.x == 0) n_out[t] = 0;
        return;
    }
    int c = p.top_k > 0 && p.top_k < K25_SAMPLE_CAND_MAX ? p.top_k : K25_SAMPLE_CAND_MAX;
    if (c > c_max) c = c_max;

    // non-NaN count
    int nn = 0;
    for (int i = threadIdx.x; i < V_local; i += blockDim.x) nn += !isnan(row[i]);
    int total;
    k25_block_incl_scan(nn, tot, &total);
    if (c > total) c = total;

    // radix select of the c-th largest key, 8 bits at a time from the top
    if (threadIdx.x == 0) s_prefix = 0, s_mask = 0, s_need = c;
    __syncthreads();
    for (int shift = 24; shift >= 0 && c > 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int i = threadIdx.x; i < V_local; i += blockDim.x) {
            float l = row[i];
            if (isnan(l)) continue;
            uint32_t k = f2key(l);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int need = s_need;
            int b = 255;
            for (; b > 0; b--) {
                if ((int)hist[b] >= need) break;
                need -= (int)hist[b];
            }
            s_need = need; // how many of the keys equal to the final threshold are needed
            s_prefix = prefix | ((uint32_t)b << shift);
            s_mask = mask | (0xffu << shift);
        }
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int need_eq = s_need;
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    // keys strictly above the threshold (fewer than c of them), any order
    for (int i = threadIdx.x; i < V_local && c > 0; i += blockDim.x) {
        float l = row[i];
        if (isnan(l)) continue;
        uint32_t k = f2key(l);
        if (k > thr) {
            int pos = atomicAdd(&s_count, 1);
            keys[pos] = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)i);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) s_gt = s_count;
    __syncthreads();
    // keys equal to the threshold: the lowest ids, in id order
    int taken = 0;
    for (int base = 0; base < V_local && taken < need_eq && c > 0; base += blockDim.x) {
        int i = base + threadIdx.x;
        int f = 0;
        if (i < V_local) {
            float l = row[i];
            f = !isnan(l) && f2key(l) == thr;
        }
        int tot_f;
        int incl = k25_block_incl_scan(f, tot, &tot_f);
        if (f && taken + incl - 1 < need_eq)
            keys[s_gt + taken + incl - 1] = ((unsigned long long)thr << 32) | (0xffffffffu - (uint32_t)i);
        taken += tot_f;
    }
    __syncthreads();
    // bitonic sort, descending, over a power of two >= c (padding with zeros sorts last)
    int n2 = 1;
    while (n2 < c) n2 <<= 1;
    for (int i = c + threadIdx.x; i < n2; i += blockDim.x) keys[i] = 0ull;
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n2; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    bool desc = (i & k) == 0;
                    unsigned long long a = keys[i], b = keys[ixj];
                    if (desc ? (a < b) : (a > b)) keys[i] = b, keys[ixj] = a;
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
        int li = (int)(0xffffffffu - (uint32_t)(keys[i] & 0xffffffffu));
        k25_cand cd;
        cd.score = (double)row[li] / (double)p.temp;
        cd.id = vocab_begin + li;
        out[(size_t)t * c_max + i] = cd;
    }
    if (threadIdx.x == 0) n_out[t] = c;

    // softmax statistics of z over the slice (needed by top-p without top-k)
    double zmax = -INFINITY;
    for (int i = threadIdx.x; i < V_local; i += blockDim.x) {
        float l = row[i];
        if (!isnan(l)) zmax = fmax(zmax, (double)l / (double)p.temp);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) zmax = fmax(zmax, __shfl_xor_sync(0xffffffffu, zmax, o));
    __syncthreads();
    if (lane == 0) dred[warp] = zmax;
    __syncthreads();
    zmax = dred[0];
    for (int w = 1; w < 32; w++) zmax = fmax(zmax, dred[w]);
    double sum = 0.0;
    if (zmax != -INFINITY)
        for (int i = threadIdx.x; i < V_local; i += blockDim.x) {
            float l = row[i];
            if (!isnan(l)) sum += exp((double)l / (double)p.temp - zmax);
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncthreads();
    if (lane == 0) dred[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s2 = 0.0;
        for (int w = 0; w < 32; w++) s2 += dred[w];
        stats[t].zmax = zmax;
        stats[t].sum = s2;
    }
}

void k25k_sample_candidates(const float *logits, int T, int V_local, int vocab_begin,
                            const k25_sampling *params_dev, int c_max, k25_cand *out_dev,
                            int *n_dev, k25_softmax_stats *stats_dev, cudaStream_t s) {
    if (T <= 0) return;
    if (c_max > K25_SAMPLE_CAND_MAX) K25_DIE("sampling: %d candidates (at most %d)", c_max,
                                             K25_SAMPLE_CAND_MAX);
    k25_launch("sample_candidates", sample_cand_kernel, T, CAND_THREADS, 0, s, logits, V_local,
               vocab_begin, params_dev, c_max, out_dev, n_dev, stats_dev);
}
