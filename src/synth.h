// Deterministic synthetic weights: every element of every global tensor is a pure function of
// (seed, tensor id, global element index), so a rank generates exactly its slice and the
// values do not depend on the number of ranks. Built from integer operations only and exact
// bf16 values, so the C code and the CUDA kernels (which include this header) produce the same
// bits.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define K25_HD __host__ __device__ __forceinline__
#else
#define K25_HD static inline
#endif

// How a tensor's synthetic values are drawn.
enum {
    K25_SYNTH_UNIFORM = 0, // bf16: r * 2^exp, r uniform in [-127, 127]
    K25_SYNTH_NORM,        // bf16: 1 + r/128, r uniform in [-15, 15] (RMSNorm weights)
    K25_SYNTH_INT4,        // int32: 8 random offset-binary nibbles
    K25_SYNTH_SCALE,       // bf16: (64 + r) * 2^exp, r in [0, 63] (INT4 group scales, positive)
    K25_SYNTH_F32,         // f32: r * 2^exp, r uniform in [-127, 127] (routing bias)
};

K25_HD uint64_t k25_synth_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

K25_HD uint64_t k25_synth_hash(uint64_t seed, uint64_t id, uint64_t idx) {
    return k25_synth_mix(k25_synth_mix(seed ^ k25_synth_mix(id)) ^ idx);
}

// FNV-1a of a tensor's canonical name (without the "language_model." prefix).
K25_HD uint64_t k25_synth_id(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return h;
}

// 2^e as float bits, e in [-126, 127].
K25_HD float k25_synth_pow2(int e) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)(e + 127) << 23;
    return v.f;
}

// The stored bits of element idx: a bf16 (low 16 bits), an int32 or an f32, by kind.
K25_HD uint32_t k25_synth_bits(int kind, int exp, uint64_t seed, uint64_t id, uint64_t idx) {
    uint64_t h = k25_synth_hash(seed, id, idx);
    union { uint32_t u; float f; } v;
    switch (kind) {
    case K25_SYNTH_UNIFORM:
        v.f = (float)((int)(h % 255u) - 127) * k25_synth_pow2(exp);
        return v.u >> 16; // exact in bf16: |r| < 2^8
    case K25_SYNTH_NORM:
        v.f = 1.0f + (float)((int)(h % 31u) - 15) * (1.0f / 128.0f);
        return v.u >> 16;
    case K25_SYNTH_INT4:
        return (uint32_t)(h >> 16);
    case K25_SYNTH_SCALE:
        v.f = (float)(64 + (int)(h % 64u)) * k25_synth_pow2(exp);
        return v.u >> 16;
    default: /* K25_SYNTH_F32 */
        v.f = (float)((int)(h % 255u) - 127) * k25_synth_pow2(exp);
        return v.u;
    }
}
