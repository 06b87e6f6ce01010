// Uniform routing for benchmarks (src/bench_routing.h): every row gets top_k distinct experts in
// range, the same ones for the same (layer, sequence, position), other ones for another layer;
// over a 256-row step of Kimi's shape (384 experts, top-8) the choices cover nearly every expert
// with counts as spread as independent uniform draws (a chi-square bound), which is what the
// option is for.
#include <stdio.h>
#include <string.h>

#include "bench_routing.h"

static int failures;

static void check(const char *what, int ok) {
    printf("%-70s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

int main(void) {
    enum { E = 384, K = 8, T = 256 };
    int32_t a[K], b[K];
    int distinct_ok = 1, range_ok = 1, same_ok = 1, layer_differs = 0;
    for (int t = 0; t < T; t++) {
        k25_uniform_experts(3, t, 300 + t, K, E, a);
        k25_uniform_experts(3, t, 300 + t, K, E, b);
        same_ok &= !memcmp(a, b, sizeof a);
        for (int k = 0; k < K; k++) {
            range_ok &= a[k] >= 0 && a[k] < E;
            for (int j = 0; j < k; j++) distinct_ok &= a[j] != a[k];
        }
        k25_uniform_experts(4, t, 300 + t, K, E, b);
        layer_differs += memcmp(a, b, sizeof a) != 0;
    }
    check("every row: top_k experts in [0, E), all distinct", distinct_ok && range_ok);
    check("the same (layer, sequence, position): the same experts", same_ok);
    check("another layer: other experts (at least 250 of 256 rows)", layer_differs >= 250);

    // the draws' remainder from 32-bit parts against the 64-bit one: edge and random h, divisors
    // on both sides of the 2^16 limit
    static const uint32_t divisors[] = {1, 2, 3, 7, 384, 1000, 65535, 65536, 65537, 2147483647u,
                                        4294967295u};
    int mod_ok = 1;
    for (size_t d = 0; d < sizeof divisors / sizeof divisors[0]; d++) {
        const uint32_t e = divisors[d], r32 = (0xffffffffu % e + 1u) % e;
        uint64_t h = 0x0123456789abcdefull;
        for (int i = 0; i < 100000; i++) {
            h = k25_synth_mix(h);
            const uint64_t x = i < 4 ? (uint64_t[]){0, ~0ull, 0xffffffffull, 1ull << 32}[i] : h;
            mod_ok &= k25_uniform_mod(x, e, r32) == x % e;
        }
    }
    check("h % e from 32-bit remainders equals the 64-bit remainder", mod_ok);

    // top_k = E: a permutation (the redraw loop terminates and fills every expert)
    int32_t all[16];
    int seen[16] = {0}, perm_ok = 1;
    k25_uniform_experts(0, 1, 2, 16, 16, all);
    for (int k = 0; k < 16; k++) seen[all[k]]++;
    for (int e = 0; e < 16; e++) perm_ok &= seen[e] == 1;
    check("top_k = E: a permutation of the experts", perm_ok);

    // one 256-row step of 8 sequences x 32 positions, per layer: experts used and the spread
    int worst_used = E;
    double worst_x2 = 0, best_x2 = 1e30;
    for (int layer = 0; layer < 61; layer++) {
        int cnt[E] = {0};
        for (int s = 0; s < 8; s++)
            for (int p = 0; p < 32; p++) {
                k25_uniform_experts(layer, s, 1000 + p, K, E, a);
                for (int k = 0; k < K; k++) cnt[a[k]]++;
            }
        int used = 0;
        double mean = (double)T * K / E, x2 = 0;
        for (int e = 0; e < E; e++) {
            used += cnt[e] > 0;
            x2 += (cnt[e] - mean) * (cnt[e] - mean) / mean;
        }
        if (used < worst_used) worst_used = used;
        if (x2 > worst_x2) worst_x2 = x2;
        if (x2 < best_x2) best_x2 = x2;
    }
    // expected: 384 (1 - e^-5.33) = 382 experts used; chi-square ~ 383 +- 28 per layer
    char line[128];
    snprintf(line, sizeof line, "256 rows x 61 layers: at least 370 of 384 experts used (worst %d)",
             worst_used);
    check(line, worst_used >= 370);
    snprintf(line, sizeof line, "256 rows x 61 layers: chi-square in [270, 500] (%.0f..%.0f)",
             best_x2, worst_x2);
    check(line, best_x2 >= 270 && worst_x2 <= 500);

    printf("%d failed\n", failures);
    return failures != 0;
}
