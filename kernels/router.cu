// MoE routing after the router GEMV (logits [T][E] f32): sigmoid scores, the correction bias
// for choosing only, group-limited top-k (groups ranked by the sum of their two best biased
// scores), weights = chosen unbiased scores normalized and scaled. Same rules and tie-breaks as
// the CPU reference (higher value first, then lower index).
//
// Two kernels with the same results. The warp kernel (one warp per row, E <= 1024 experts,
// n_group <= 32, top_k <= 32: every configuration we run) holds a row's scores in registers
// and chooses within the warp: a selection round is two hardware warp reductions, no block
// barrier. The block kernel (one block of 256 threads per row, scores in shared memory) covers
// the larger shapes; K25_ROUTER_BLOCK=1 forces it (A/B runs, and the check of that path).
// Up to kSortRows rows (decode batches up to 16, verification steps) one block of the warp
// kernel, a warp per row, holds every row and also runs the MoE routing sort of the choices
// after a block barrier (moe_route.cuh), which saves the sort's own launch on the critical path
// of every MoE layer.
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "bench_routing.h"
#include "moe_route.cuh"
#include "phase_stamps.cuh"

// ------------------------------------------------------------------------------------------
// One warp per row
// ------------------------------------------------------------------------------------------
// A candidate is a 64-bit key whose unsigned order is the choosing order: high word the biased
// score mapped to an order-preserving integer (-0 taken as +0, so equal floats stay equal),
// low word ~expert (the lower index wins among equal scores). Key 0 is "nothing": a real key's
// low word is >= 2^32 - 1024. Decoded, ~low word is the expert, -1 for nothing. Both kernels
// agree on every non-NaN input (the order is total); with NaN scores the block kernel's choice
// depends on its scan order anyway, here a NaN with the sign bit clear ranks first.

constexpr int kRowsPerBlock = 4; // warps (rows) per block of the warp kernel without the sort
constexpr int kSortRows = 16;     // the most rows of the sorting block (a warp each, 512 threads)
constexpr int kMaxTopK = 64;      // k25k_router_topk refuses more
// The routed experts' GEMM follows the sorting launch. Its resident blocks fill every SM's
// registers, and launched early (PDL) they wait there for the sort and keep the shared expert's
// kernels (a side branch that becomes ready while the router runs) off the GPU. Up to this many
// rows the sorting launch triggers that GEMM only at its end, so the shared expert runs beside
// the router instead: 1-1.7% faster a step at 1 row, 0.6-1.1% at 2; at 3 and 4 rows ~1% slower
// (there the shared expert's kernels slow the router's more than the overlap gains:
// bench/NOTES.md, sixteenth round). Above kEarlyTriggerRows it is late again: there the early
// trigger cost 1.2-2.0% a step at 5-16 rows (bench/NOTES.md, twenty-sixth round).
constexpr int kLateTriggerRows = 2;  // late up to this many rows
constexpr int kEarlyTriggerRows = 4; // early from kLateTriggerRows + 1 up to this many rows
static bool sort_trigger_late(int T) { return T <= kLateTriggerRows || T > kEarlyTriggerRows; }

__device__ __forceinline__ uint64_t choice_key(float v, int e) {
    uint32_t u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t)u << 32 | (uint32_t)~e;
}

__device__ __forceinline__ int choice_index(uint64_t key) { return (int)~(uint32_t)key; }

__device__ __forceinline__ uint64_t key_max(uint64_t a, uint64_t b) { return a > b ? a : b; }

// Best key of a lane's NPL candidates: a pairwise tree (depth log2 NPL, not a chain of NPL).
template <int NPL> __device__ __forceinline__ uint64_t lane_best(const uint64_t (&key)[NPL]) {
    uint64_t t[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) t[j] = key[j];
#pragma unroll
    for (int w = 1; w < NPL; w *= 2)
#pragma unroll
        for (int j = 0; j + w < NPL; j += 2 * w) t[j] = key_max(t[j], t[j + w]);
    return t[0];
}

// The warp's largest key, on every lane: the largest high word, then the largest low word among
// the lanes that hold it (two warp reductions in hardware, where a butterfly of 64-bit shuffles
// was five dependent steps of two shuffles each, on the top-k's serial path every round).
__device__ __forceinline__ uint64_t warp_best_key(uint64_t k) {
    const unsigned hi = (unsigned)(k >> 32), lo = (unsigned)k;
    const unsigned best_hi = __reduce_max_sync(0xffffffffu, hi);
    const unsigned best_lo = __reduce_max_sync(0xffffffffu, hi == best_hi ? lo : 0u);
    return (uint64_t)best_hi << 32 | best_lo;
}

// Group-limited routing on the warp: which of the lane's candidates (bit j: expert j*32 + lane)
// lie in the topk_group best groups. A group's score is the sum of its two largest biased
// scores; only values matter there (the two best by value-then-index have the two largest
// values), so a group is one top-2 merge of floats across the warp. Groups are then chosen like
// experts (higher score, then lower group index), one key per lane g < G.
template <int NPL>
__device__ __forceinline__ uint32_t kept_by_groups(const float (&sel)[NPL], int lane, int E,
                                                   int G, int topk_group) {
    const int per = E / G;
    int grp[NPL]; // lane's candidate j: its group, -1 past E
#pragma unroll
    for (int j = 0; j < NPL; j++) grp[j] = j * 32 + lane < E ? (j * 32 + lane) / per : -1;
    float gscore = -INFINITY; // lane g: group g's score
    for (int g = 0; g < G; g++) {
        float m1 = -INFINITY, m2 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            if (grp[j] != g) continue;
            if (sel[j] > m1) {
                m2 = m1;
                m1 = sel[j];
            } else if (sel[j] > m2) {
                m2 = sel[j];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float o1 = __shfl_xor_sync(0xffffffffu, m1, o);
            const float o2 = __shfl_xor_sync(0xffffffffu, m2, o);
            m2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
            m1 = fmaxf(m1, o1);
        }
        if (lane == g) gscore = per >= 2 ? m1 + m2 : m1;
    }
    uint64_t gkey = lane < G ? choice_key(gscore, lane) : 0;
    uint32_t groups = 0;
    for (int r = 0; r < topk_group; r++) {
        const int g = choice_index(warp_best_key(gkey));
        if (g < 0) break;
        groups |= 1u << g;
        if (lane == g) gkey = 0;
    }
    uint32_t kept = 0;
#pragma unroll
    for (int j = 0; j < NPL; j++)
        if (grp[j] >= 0 && (groups >> grp[j] & 1u)) kept |= 1u << j;
    return kept;
}

// Row t's choices into idx / wts (and sidx, the same layout in shared memory, when not NULL),
// by one warp: lane holds experts j*32 + lane, j < NPL (coalesced loads), b the bias of those
// experts. drawn >= 0: the lane's id is drawn (benchmarks' uniform routing), its weight still the
// router's k-th.
template <int NPL, bool LO>
__device__ __forceinline__ void topk_row(const float *logits, const float *logits_lo,
                                         const float (&b)[NPL], int t, int E, int G,
                                         int topk_group, int top_k, int norm_topk, float scale,
                                         int32_t *idx, float *wts, int32_t *sidx, int drawn) {
    const int lane = threadIdx.x & 31;
    const float *lg = logits + (size_t)t * E; // [E]
    // every load issued before the first use: the division's slow path is a branch, and loads
    // written next to it would each wait for the previous score (NPL round trips, not one)
    float score[NPL], sel[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) score[j] = j * 32 + lane < E ? __ldcg(lg + j * 32 + lane) : 0.0f;
    if constexpr (LO) {
        const float *ll = logits_lo + (size_t)t * E;
        float lo[NPL];
#pragma unroll
        for (int j = 0; j < NPL; j++) lo[j] = j * 32 + lane < E ? __ldcg(ll + j * 32 + lane) : 0.0f;
#pragma unroll
        for (int j = 0; j < NPL; j++) score[j] += lo[j];
    }
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        score[j] = 1.0f / (1.0f + expf(-score[j]));
        sel[j] = score[j] + b[j];
    }
    const uint32_t kept = G > 1 ? kept_by_groups(sel, lane, E, G, topk_group) : ~0u;
    uint64_t key[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++)
        key[j] = j * 32 + lane < E && (kept >> j & 1u) ? choice_key(sel[j], j * 32 + lane) : 0;

    // top_k rounds: the warp's best of the lanes' bests; the lane that held it drops it and
    // takes its next best. Lane k keeps the k-th choice.
    uint64_t mine = lane_best(key);
    int chosen = -1;
    for (int k = 0; k < top_k; k++) {
        const int e = choice_index(warp_best_key(mine));
        if (lane == k) chosen = e;
        if (k + 1 == top_k) break;
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (j * 32 + lane == e) key[j] = 0;
        mine = lane_best(key);
    }

    // lane k < top_k: the unbiased score of its choice, from the lane that holds it; the sum in
    // choice order and in double, as the CPU reference and the block kernel
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        const float v = __shfl_sync(0xffffffffu, score[j], chosen & 31);
        if (chosen >= 0 && chosen >> 5 == j) s = v;
    }
    double sum = 0.0;
    for (int k = 0; k < top_k; k++) sum += (double)__shfl_sync(0xffffffffu, s, k);
    if (lane < top_k) {
        double w = (double)s;
        if (norm_topk) w /= sum + 1e-20;
        const int id = drawn >= 0 ? drawn : chosen;
        idx[(size_t)t * top_k + lane] = id;
        if (sidx) sidx[t * top_k + lane] = id;
        wts[(size_t)t * top_k + lane] = (float)(w * scale);
    }
}

// Block of kRowsPerBlock warps, warp w: row blockIdx.x * kRowsPerBlock + w; SORT: the one block,
// warp w: row w of every row of the step (up to kSortRows), and more warps for the sort. The
// bias is a weight: it is loaded before the wait, while the router's projection still runs; the
// logits (its output) are read after it, with coherent loads like the bias (see the PDL rules in
// cuda_common.cuh). trigger_late: the next kernel is triggered at the end, not at the start
// (sort_trigger_late). LO: the logits are logits + logits_lo (above the GEMV's rows; a template
// argument so that the kernels of the GEMV's rows keep their code).
template <int NPL, bool SORT, bool LO>
__global__ void __launch_bounds__(SORT ? 512 : 32 * kRowsPerBlock)
    router_topk_warp_kernel(const float *logits, const float *logits_lo, const float *bias, int T,
                            int E, int G, int topk_group, int top_k, int norm_topk, float scale,
                            int32_t *__restrict__ idx, float *__restrict__ wts,
                            k25k_moe_route r, int I, int D, moe_sort_opts o, k25k_uniform uni,
                            int trigger_late) {
    const int lane = threadIdx.x & 31;
    const int t = (SORT ? 0 : blockIdx.x * kRowsPerBlock) + (threadIdx.x >> 5);
    K25_STAMP(K25_SITE_ROUTER, 0);
    if (!trigger_late) k25_pdl_trigger();
    float b[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) b[j] = j * 32 + lane < E ? __ldcg(bias + j * 32 + lane) : 0.0f;
    // Benchmarks' uniform routing: the row's ids are a function of step inputs (uploaded before
    // the step's first kernel), so the warp draws them before the wait, while the router's
    // projection runs (lane k the k-th): a cost of the benchmark's instrument, not of the model.
    const int drawn = uni.pos && t < T ? k25_uniform_experts_warp(uni.layer, uni.seq[t],
                                                                  uni.pos[t], top_k, E)
                                       : -1;
    // SORT: the ids also in shared memory, where the sort reads them (T <= kSortRows rows,
    // top_k <= 32 choices each: a lane's each)
    __shared__ int32_t sort_idx[SORT ? kSortRows * 32 : 1];
    int32_t *const sidx = SORT ? sort_idx : nullptr;
    k25_pdl_wait();
    K25_STAMP(K25_SITE_ROUTER, 1);
    if (t < T)
        topk_row<NPL, LO>(logits, logits_lo, b, t, E, G, topk_group, top_k, norm_topk, scale, idx,
                          wts, sidx, drawn);
    K25_STAMP(K25_SITE_ROUTER, 2);
    if constexpr (SORT) {
        extern __shared__ int sort_sm[];
        __syncthreads(); // every row's ids written
        moe_route_block<true>(sidx, T * top_k, top_k, E, I, D, o, r, sort_sm);
    }
    K25_STAMP(K25_SITE_ROUTER, 3);
    if (trigger_late) k25_pdl_trigger();
}

// ------------------------------------------------------------------------------------------
// One block per row (large shapes)
// ------------------------------------------------------------------------------------------

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
                                                          const float *__restrict__ logits_lo,
                                                          const float *__restrict__ bias, int E,
                                                          int G, int topk_group, int top_k,
                                                          int norm_topk, float scale,
                                                          int32_t *__restrict__ idx,
                                                          float *__restrict__ wts,
                                                          k25k_uniform uni) {
    extern __shared__ float sm[];
    float *score = sm, *sel = sm + E;
    unsigned char *ok = reinterpret_cast<unsigned char *>(sel + E);
    __shared__ vi red[32];
    __shared__ float gscore[256];
    __shared__ int chosen[kMaxTopK];
    k25_pdl_trigger();
    k25_pdl_wait();
    const int t = blockIdx.x;
    const float *lg = logits + (size_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float x = logits_lo ? lg[e] + logits_lo[(size_t)t * E + e] : lg[e];
        float s = 1.0f / (1.0f + expf(-x));
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
        if (uni.pos) // benchmarks: the drawn ids, the router's weights (as the warp kernel)
            k25_uniform_experts(uni.layer, uni.seq[t], uni.pos[t], top_k, E,
                                idx + (size_t)t * top_k);
    }
}

// ------------------------------------------------------------------------------------------
// Launcher
// ------------------------------------------------------------------------------------------

// sort: the routing sort in the same launch, every row in one block (T <= kSortRows), a warp per
// row and enough warps for the sort's pass over the experts (one warp per 32 of them, up to 16).
template <int NPL>
static void launch_warp(const float *logits, const float *logits_lo, const float *bias, int T,
                        int E, int G, int topk_group, int top_k, int norm_topk, float scale,
                        int32_t *idx, float *wts, const k25k_route_sort *sort, k25k_uniform uni,
                        cudaStream_t s) {
    const int rows = T < kRowsPerBlock ? T : kRowsPerBlock;
    if (sort) {
        const int threads = (int)std::max<int64_t>(
            32 * std::max(T, kRowsPerBlock), std::min<int64_t>(512, k25_cdiv(E, 32) * 32));
        auto *kernel = logits_lo ? router_topk_warp_kernel<NPL, true, true>
                                 : router_topk_warp_kernel<NPL, true, false>;
        k25_launch("router_topk_sort", kernel, 1, threads,
                   k25k_moe_route_smem(T * top_k, E), s, logits, logits_lo, bias, T, E, G,
                   topk_group, top_k, norm_topk, scale, idx, wts, *sort->r, sort->I, sort->D,
                   k25k_moe_sort_opts(T, top_k, sort->I, sort->D, sort->num_sms), uni,
                   sort_trigger_late(T));
        return;
    }
    auto *kernel = logits_lo ? router_topk_warp_kernel<NPL, false, true>
                             : router_topk_warp_kernel<NPL, false, false>;
    k25_launch("router_topk_warp", kernel, (unsigned)k25_cdiv(T, kRowsPerBlock), 32 * rows, 0, s,
               logits, logits_lo, bias, T, E, G, topk_group, top_k, norm_topk, scale, idx, wts,
               k25k_moe_route{}, 0, 0, moe_sort_opts{}, uni, 0);
}

static int router_block_forced(void) {
    static int forced = -1;
    if (forced < 0) forced = k25_env_flag("K25_ROUTER_BLOCK");
    return forced;
}

int k25k_router_topk(const float *logits, const float *logits_lo, const float *bias, int T,
                     int E, int n_group, int topk_group, int top_k, int norm_topk, float scale,
                     int32_t *idx, float *wts, const k25k_route_sort *sort,
                     const k25k_uniform *uni, cudaStream_t s) {
    if (T <= 0) return 0;
    if (n_group > 256 || top_k > kMaxTopK || (n_group > 0 && E % n_group))
        K25_DIE("router: n_group %d / top_k %d / experts %d not supported", n_group, top_k, E);
    if (uni && top_k > E) K25_DIE("uniform routing: top_k %d exceeds %d experts", top_k, E);
    const int G = n_group > 1 ? n_group : 1, per_lane = (int)k25_cdiv(E, 32);
    const k25k_uniform u = uni ? *uni : k25k_uniform{NULL, NULL, 0};
    if (!router_block_forced() && G <= 32 && top_k <= 32 && per_lane <= 32) {
        auto *launch = per_lane <= 1    ? launch_warp<1>
                       : per_lane <= 2  ? launch_warp<2>
                       : per_lane <= 4  ? launch_warp<4>
                       : per_lane <= 8  ? launch_warp<8>
                       : per_lane <= 12 ? launch_warp<12>
                       : per_lane <= 16 ? launch_warp<16>
                                        : launch_warp<32>;
        if (T > kSortRows) sort = NULL;
        launch(logits, logits_lo, bias, T, E, G, topk_group, top_k, norm_topk, scale, idx, wts,
               sort, u, s);
        return sort != NULL;
    }
    size_t smem = sizeof(float) * 2 * (size_t)E + (size_t)E;
    if (smem > 48 * 1024) K25_DIE("router: %d experts exceed the shared-memory top-k", E);
    k25_launch("router_topk", router_topk_kernel, T, 256, smem, s, logits, logits_lo, bias, E,
               n_group, topk_group, top_k, norm_topk, scale, idx, wts, u);
    return 0;
}

// This file's phase stamps (kernels/phases.cu reads them)
K25_PHASES_READER(k25k_phases_read_router)
