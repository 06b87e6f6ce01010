// INT4 routed-expert weights in the compressed-tensors "pack-quantized" layout (Kimi-K2.5
// routed experts, ../shared/KIMI_K25.md §2.3).
//
// A logical weight W [N][K] (y = W x) is stored as
//   packed int32 [N][K/8]:  column k of row n is nibble k%8 of word packed[n][k/8], LSB first;
//                           the nibble is offset binary u = q + 8, q in [-8, 7]
//   scale  bf16  [N][K/32]: W[n][k] = q[n][k] * scale[n][k/32]
// Header-only so the CPU code, tests and tools share one definition.
#pragma once
#include <stdint.h>

#include "common.h"

#define K25_INT4_PER_WORD 8

// Packs 8 signed values q[i] in [-8, 7] (clamped) into one word, q[0] in the lowest nibble.
static inline uint32_t int4_pack8(const int q[8]) {
    uint32_t w = 0;
    for (int i = 0; i < 8; i++) {
        int v = q[i] < -8 ? -8 : (q[i] > 7 ? 7 : q[i]);
        w |= (uint32_t)(v + 8) << (4 * i);
    }
    return w;
}

// Signed value of nibble i (0..7) of a packed word.
static inline int int4_unpack(uint32_t word, int i) {
    return (int)((word >> (4 * i)) & 0xFu) - 8;
}

// Dequantized element k of one row: packed row int32[K/8], scale row bf16[K/32].
static inline float int4_dequant_at(const uint32_t *packed, const uint16_t *scale, int64_t k) {
    return (float)int4_unpack(packed[k / 8], (int)(k & 7)) * k25_bf16_to_f32(scale[k / 32]);
}

// Dequantizes one row of k elements (k a multiple of 32) into out[k].
static inline void int4_dequant(const uint32_t *packed, const uint16_t *scale, int64_t k,
                                float *out) {
    for (int64_t g = 0; g < k / 32; g++) {
        float s = k25_bf16_to_f32(scale[g]);
        for (int j = 0; j < 4; j++) {
            uint32_t w = packed[g * 4 + j];
            for (int i = 0; i < 8; i++) out[g * 32 + j * 8 + i] = (float)int4_unpack(w, i) * s;
        }
    }
}
