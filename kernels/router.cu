// MoE routing after the router GEMV (logits [T][E] f32): sigmoid scores, the correction bias
// for choosing only, group-limited top-k (groups ranked by the sum of their two best biased
// scores), weights = chosen unbiased scores normalized and scaled. Same rules and tie-breaks as
// the CPU reference (higher value first, then lower index).
#include "cuda_kernels.cuh"

struct vi {
    float v;
    int i;
};

__device__ __forceinline__ bool vi_before(vi a, vi b) {
    return a.v > b.v || (a.v == b.v && a.i < b.i && a.i >= 0) || (b.i < 0 && a.i >= 0);
}

__device__ __forceinline__ vi warp_best(vi x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        vi y;
        y.v = __shfl_xor_sync(0xffffffffu, x.v, o);
        y.i = __shfl_xor_sync(0xffffffffu, x.i, o);
        if (vi_before(y, x)) x = y;
    }
    return x;
}

// Best (value, index) over the block; every thread gets it. red: 32 entries of shared memory.
__device__ vi block_best(vi x, vi *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_best(x);
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    vi r = lane < nw ? red[lane] : vi{-INFINITY, -1};
    return warp_best(r);
}

// One block (256 threads) per token row. Dynamic shared memory: score[E], sel[E] floats,
// ok[E] bytes.
__global__ void __launch_bounds__(256) router_topk_kernel(const float *__restrict__ logits,
                                                          const float *__restrict__ bias, int E,
                                                          int G, int topk_group, int top_k,
                                                          int norm_topk, float scale,
                                                          int32_t *__restrict__ idx,
                                                          float *__restrict__ wts) {
    extern __shared__ float sm[];
    float *score = sm, *sel = sm + E;
    unsigned char *ok = reinterpret_cast<unsigned char *>(sel + E);
    __shared__ vi red[32];
    __shared__ float gscore[256];
    __shared__ int chosen[64];
    k25_pdl_trigger();
    k25_pdl_wait();
    const int t = blockIdx.x;
    const float *lg = logits + (size_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float s = 1.0f / (1.0f + expf(-lg[e]));
        score[e] = s;
        sel[e] = s + bias[e];
        ok[e] = G > 1 ? 0 : 1;
    }
    __syncthreads();
    if (G > 1) {
        const int per = E / G;
        // group scores: a warp per group, its two best biased scores
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int g = warp; g < G; g += blockDim.x >> 5) {
            vi b1 = {-INFINITY, -1};
            for (int j = lane; j < per; j += 32) {
                vi c = {sel[g * per + j], j};
                if (vi_before(c, b1)) b1 = c;
            }
            b1 = warp_best(b1);
            float sum = b1.v;
            if (per >= 2) {
                vi b2 = {-INFINITY, -1};
                for (int j = lane; j < per; j += 32) {
                    if (j == b1.i) continue;
                    vi c = {sel[g * per + j], j};
                    if (vi_before(c, b2)) b2 = c;
                }
                b2 = warp_best(b2);
                sum += b2.v;
            }
            if (lane == 0) gscore[g] = sum;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // topk_group best groups (value desc, index asc), serial: G is small
            unsigned char gtaken[256];
            for (int g = 0; g < G; g++) gtaken[g] = 0;
            for (int j = 0; j < topk_group; j++) {
                int b = -1;
                for (int g = 0; g < G; g++)
                    if (!gtaken[g] && (b < 0 || gscore[g] > gscore[b])) b = g;
                gtaken[b] = 1;
                for (int e = b * per; e < (b + 1) * per; e++) ok[e] = 1;
            }
        }
        __syncthreads();
    }
    for (int k = 0; k < top_k; k++) {
        vi best = {-INFINITY, -1};
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            if (!ok[e]) continue;
            vi c = {sel[e], e};
            if (vi_before(c, best)) best = c;
        }
        best = block_best(best, red);
        if (threadIdx.x == 0) {
            chosen[k] = best.i;
            if (best.i >= 0) ok[best.i] = 0;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int k = 0; k < top_k; k++) sum += chosen[k] >= 0 ? (double)score[chosen[k]] : 0.0;
        for (int k = 0; k < top_k; k++) {
            int e = chosen[k];
            double w = e >= 0 ? (double)score[e] : 0.0;
            if (norm_topk) w /= sum + 1e-20;
            idx[(size_t)t * top_k + k] = e;
            wts[(size_t)t * top_k + k] = (float)(w * scale);
        }
    }
}

void k25k_router_topk(const float *logits, const float *bias, int T, int E, int n_group,
                      int topk_group, int top_k, int norm_topk, float scale, int32_t *idx,
                      float *wts, cudaStream_t s) {
    if (T <= 0) return;
    if (n_group > 256 || top_k > 64 || (n_group > 0 && E % n_group))
        K25_DIE("router: n_group %d / top_k %d / experts %d not supported", n_group, top_k, E);
    size_t smem = sizeof(float) * 2 * (size_t)E + (size_t)E;
    if (smem > 48 * 1024) K25_DIE("router: %d experts exceed the shared-memory top-k", E);
    k25_launch("router_topk", router_topk_kernel, T, 256, smem, s, logits, bias, E, n_group,
               topk_group, top_k, norm_topk, scale, idx, wts);
}
