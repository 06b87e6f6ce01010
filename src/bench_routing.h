// Uniform routing for benchmarks (run.uniform_routing): a row's top_k experts are drawn
// uniformly, independently of its activations, from a hash of (layer, sequence, position), as a
// load-balanced router spreads a batch's choices over all experts. A synthetic model's router
// concentrates them (at 256 rows ~170 of Kimi's 384 experts get every choice), which changes
// both the bytes a MoE layer reads and the grouped GEMM's regime. The router's weights are
// kept. One function for the CPU backend and the CUDA kernel, so both choose the same experts.
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

// out[0..top_k): distinct experts in [0, E) (top_k <= E), a pure function of the arguments.
K25_HD void k25_uniform_experts(int layer, int seq, int pos, int top_k, int E, int32_t *out) {
    uint64_t h = k25_synth_hash(0x756e69666f726dull + (uint64_t)(uint32_t)layer,
                                (uint64_t)(uint32_t)seq, (uint64_t)(uint32_t)pos);
    const uint32_t e32 = (uint32_t)E, r32 = (0xffffffffu % e32 + 1u) % e32;
    for (int k = 0; k < top_k; k++) {
        int e, dup;
        do { // redraw a repeat; at top_k = 8 of 384 experts that is rare
            h = k25_synth_mix(h + 0x9e3779b97f4a7c15ull);
            e = (int)k25_uniform_mod(h, e32, r32);
            dup = 0;
            for (int j = 0; j < k; j++) dup |= out[j] == e;
        } while (dup);
        out[k] = e;
    }
}
