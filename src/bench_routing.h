// Uniform routing for benchmarks (run.uniform_routing): a row's top_k experts are drawn
// uniformly, independently of its activations, from a hash of (layer, sequence, position), as a
// load-balanced router spreads a batch's choices over all experts. A synthetic model's router
// concentrates them (at 256 rows ~170 of Kimi's 384 experts get every choice), which changes
// both the bytes a MoE layer reads and the grouped GEMM's regime. The router's weights are
// kept. The rule is here for the CPU backend and the CUDA kernels, so all choose the same experts.
#pragma once

#include <stdint.h>

#include "synth.h"

// h % e, up to e = 2^16 from 32-bit remainders (r32 = 2^32 % e): on the GPU a 64-bit remainder
// is a long dependent chain, and the kernel's draws sit on the top-k's path where the GEMM
// before it does not launch it early.
K25_HD uint32_t k25_uniform_mod(uint64_t h, uint32_t e, uint32_t r32) {
    if (e > 65536u) return (uint32_t)(h % e);
    return ((uint32_t)(h >> 32) % e * r32 + (uint32_t)h % e) % e; // < e^2: no overflow
}

// Candidate j of a row is a hash of (layer, sequence, position, j) reduced to [0, E); the row's
// experts are its first top_k distinct candidates in j order. Counter-based rather than a chain
// of draws, so that a warp computes 32 candidates at once (k25_uniform_experts_warp): one
// thread's serial draws took ~3.7 us in the top-k kernel, on the step's critical path where the
// GEMM before the top-k does not launch it early.
K25_HD uint64_t k25_uniform_seed(int layer, int seq, int pos) {
    return k25_synth_hash(0x756e69666f726dull + (uint64_t)(uint32_t)layer,
                          (uint64_t)(uint32_t)seq, (uint64_t)(uint32_t)pos);
}

// r32 = 2^32 % E (k25_uniform_mod)
K25_HD int k25_uniform_candidate(uint64_t seed, int j, uint32_t e32, uint32_t r32) {
    const uint64_t h = k25_synth_mix(seed + (uint64_t)(j + 1) * 0x9e3779b97f4a7c15ull);
    return (int)k25_uniform_mod(h, e32, r32);
}

K25_HD uint32_t k25_uniform_r32(int E) {
    const uint32_t e32 = (uint32_t)E;
    return (0xffffffffu % e32 + 1u) % e32;
}

// out[0..top_k): distinct experts in [0, E) (top_k <= E), a pure function of the arguments.
K25_HD void k25_uniform_experts(int layer, int seq, int pos, int top_k, int E, int32_t *out) {
    const uint64_t seed = k25_uniform_seed(layer, seq, pos);
    const uint32_t r32 = k25_uniform_r32(E);
    for (int j = 0, k = 0; k < top_k; j++) { // a repeat is skipped; at 8 of 384 experts rare
        const int e = k25_uniform_candidate(seed, j, (uint32_t)E, r32);
        int dup = 0;
        for (int i = 0; i < k; i++) dup |= out[i] == e;
        if (!dup) out[k++] = e;
    }
}

#ifdef __CUDACC__
// The same experts on one warp (every lane calls it; top_k <= 32): lane k < top_k returns the
// row's k-th, the others -1. Lane j takes candidate j; the first occurrences, in lane order, are
// the row's experts where there are top_k of them (at 8 of 384 experts 32 candidates hold ~31
// distinct ones). Otherwise (top_k near E) lane k walks the candidates as the CPU does up to its
// k-th distinct one, a repeat found by recomputing the candidates before it: no list in local
// memory, whose stack frame every kernel that inlines this would carry.
__device__ __forceinline__ int k25_uniform_experts_warp(int layer, int seq, int pos, int top_k,
                                                        int E) {
    const unsigned all = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    const uint64_t seed = k25_uniform_seed(layer, seq, pos);
    const uint32_t r32 = k25_uniform_r32(E);
    const int e = k25_uniform_candidate(seed, lane, (uint32_t)E, r32);
    const unsigned same = __match_any_sync(all, (unsigned)e);
    const unsigned first = __ballot_sync(all, __ffs(same) - 1 == lane);
    if (__popc(first) >= top_k) {
        const int got = __shfl_sync(all, e, lane < top_k ? (int)__fns(first, 0, lane + 1) : 0);
        return lane < top_k ? got : -1;
    }
    int got = -1;
    for (int j = 0, k = 0; lane < top_k && k <= lane; j++) {
        const int ej = k25_uniform_candidate(seed, j, (uint32_t)E, r32);
        bool dup = false;
        for (int i = 0; i < j && !dup; i++)
            dup = k25_uniform_candidate(seed, i, (uint32_t)E, r32) == ej;
        if (!dup && k++ == lane) got = ej;
    }
    return got;
}
#endif
