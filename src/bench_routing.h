// Uniform routing for benchmarks (run.uniform_routing): a row's top_k experts are drawn
// uniformly, independently of its activations, from a hash of (layer, sequence, position), as a
// load-balanced router spreads a batch's choices over all experts. A synthetic model's router
// concentrates them (at 256 rows ~170 of Kimi's 384 experts get every choice), which changes
// both the bytes a MoE layer reads and the grouped GEMM's regime. The router's weights are
// kept. One function for the CPU backend and the CUDA kernel, so both choose the same experts.
#pragma once

#include <stdint.h>

#include "synth.h"

// out[0..top_k): distinct experts in [0, E) (top_k <= E), a pure function of the arguments.
K25_HD void k25_uniform_experts(int layer, int seq, int pos, int top_k, int E, int32_t *out) {
    uint64_t h = k25_synth_hash(0x756e69666f726dull + (uint64_t)(uint32_t)layer,
                                (uint64_t)(uint32_t)seq, (uint64_t)(uint32_t)pos);
    for (int k = 0; k < top_k; k++) {
        int e, dup;
        do { // redraw a repeat; at top_k = 8 of 384 experts that is rare
            h = k25_synth_mix(h + 0x9e3779b97f4a7c15ull);
            e = (int)(h % (uint64_t)E);
            dup = 0;
            for (int j = 0; j < k; j++) dup |= out[j] == e;
        } while (dup);
        out[k] = e;
    }
}
