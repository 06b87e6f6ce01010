// Paged cache allocator: open/grow/close, exhaustion and waiting, truncation, and a random
// workload checked against a plain count of blocks after every operation.
#include "kvcache.h"
#include "test_util.h"

#include <string.h>


static void expect_ok(const k25_kvcache *c, const char *when) {
    char err[K25_ERR_LEN];
    if (kvcache_check(c, err) != 0) EXPECT(0, "%s: %s", when, err);
}

// ------------------------------------------------------------------------------------------
// Fixed scenarios
// ------------------------------------------------------------------------------------------

static void test_basic(void) {
    k25_kvcache c;
    char err[K25_ERR_LEN];
    EXPECT(kvcache_init(&c, 0, 16, 4, 8, err) == -1, "zero blocks accepted");
    EXPECT(kvcache_init(&c, 10, 16, 4, 8, err) == 0, "init: %s", err);
    EXPECT(kvcache_blocks_for(&c, 0) == 0 && kvcache_blocks_for(&c, 1) == 1 &&
               kvcache_blocks_for(&c, 16) == 1 && kvcache_blocks_for(&c, 17) == 2,
           "blocks_for rounding");
    EXPECT(kvcache_available(&c) == 10, "all blocks available at start");

    // Slot 0 asks for 40 positions = 3 blocks, promised but not taken yet.
    EXPECT(kvcache_open(&c, 0, 40) == 0, "open slot 0");
    EXPECT(kvcache_open(&c, 0, 1) == -1, "slot 0 opened twice");
    EXPECT(kvcache_available(&c) == 7 && c.n_free == 10, "promise counted, no block taken");
    EXPECT(kvcache_grow(&c, 0, 17) == 0 && c.held[0] == 2 && c.len[0] == 17, "grow to 17");
    EXPECT(kvcache_available(&c) == 7 && c.n_free == 8, "growing within the promise");
    int b0 = c.block_table[0], b1 = c.block_table[1];
    EXPECT(b0 != b1 && b0 >= 0 && b1 >= 0 && c.block_table[2] == -1, "table row 0");
    expect_ok(&c, "after grow");

    // A sequence that can never fit: longer than the table row, or than the whole cache.
    EXPECT(!kvcache_fits(&c, 8 * 16 + 1) && kvcache_fits(&c, 8 * 16), "table width limit");
    EXPECT(kvcache_open(&c, 1, 8 * 16 + 1) == -1, "open beyond the table width");

    // Exhaustion: 7 unpromised blocks left; slot 1 takes 5, slot 2 cannot get 3.
    EXPECT(kvcache_open(&c, 1, 80) == 0, "open slot 1 (5 blocks)");
    EXPECT(kvcache_open(&c, 2, 48) == -1, "slot 2 must wait: 2 blocks left, needs 3");
    EXPECT(kvcache_open(&c, 2, 32) == 0, "slot 2 with 2 blocks fits");
    EXPECT(kvcache_available(&c) == 0, "everything promised");
    EXPECT(kvcache_open(&c, 3, 1) == -1, "nothing left for slot 3");
    // Growth beyond a promise is refused when every free block is promised to others.
    EXPECT(kvcache_grow(&c, 2, 33) == -1 && c.held[2] == 0 && c.len[2] == 0,
           "grow past the promise refused, nothing changed");
    // Every promise can be honoured in full, in any order.
    EXPECT(kvcache_grow(&c, 1, 80) == 0 && kvcache_grow(&c, 2, 32) == 0 &&
               kvcache_grow(&c, 0, 40) == 0,
           "every promise honoured");
    EXPECT(c.n_free == 0, "cache full");
    expect_ok(&c, "cache full");

    // Closing returns blocks and the promise: slot 3 can now open.
    kvcache_close(&c, 1);
    EXPECT(c.n_free == 5 && kvcache_available(&c) == 5, "close frees 5 blocks");
    for (int i = 0; i < 8; i++) EXPECT(c.block_table[8 + i] == -1, "closed row cleared");
    EXPECT(kvcache_open(&c, 3, 64) == 0, "slot 3 opens after the close");
    expect_ok(&c, "after close + open");

    // Truncation: slot 0 holds 40 positions (3 blocks); roll back to 16 -> 1 block, the two
    // freed blocks stay promised to slot 0, so nobody else can take them.
    kvcache_truncate(&c, 0, 16);
    EXPECT(c.len[0] == 16 && c.held[0] == 1 && c.block_table[0] == b0, "truncate keeps block 0");
    EXPECT(c.block_table[1] == -1 && c.block_table[2] == -1, "truncated entries cleared");
    EXPECT(kvcache_available(&c) == 1, "freed blocks stay promised (1 unpromised: 5-4)");
    EXPECT(kvcache_grow(&c, 0, 40) == 0 && c.held[0] == 3, "grow back after truncate");
    kvcache_truncate(&c, 0, 17);
    EXPECT(c.held[0] == 2 && c.len[0] == 17, "truncate to a block boundary + 1");
    kvcache_truncate(&c, 0, 0);
    EXPECT(c.held[0] == 0 && c.len[0] == 0, "truncate to empty");
    expect_ok(&c, "after truncations");
    for (int s = 0; s < 4; s++) kvcache_close(&c, s);
    EXPECT(c.n_free == 10 && kvcache_available(&c) == 10 && c.owed == 0, "all closed");
    expect_ok(&c, "all closed");
    kvcache_destroy(&c);
}

// Growth beyond the promise takes unpromised blocks only.
static void test_beyond_promise(void) {
    k25_kvcache c;
    char err[K25_ERR_LEN];
    EXPECT(kvcache_init(&c, 4, 4, 2, 4, err) == 0, "init: %s", err);
    EXPECT(kvcache_open(&c, 0, 4) == 0 && kvcache_open(&c, 1, 8) == 0, "open two");
    EXPECT(kvcache_grow(&c, 0, 8) == 0 && c.held[0] == 2, "slot 0 takes the one spare block");
    EXPECT(kvcache_available(&c) == 0, "spare gone");
    EXPECT(kvcache_grow(&c, 0, 12) == -1, "no more spare blocks");
    EXPECT(kvcache_grow(&c, 1, 8) == 0, "slot 1 still gets its promise");
    expect_ok(&c, "beyond promise");
    kvcache_destroy(&c);
}

// ------------------------------------------------------------------------------------------
// Random workload against a plain model of the counts
// ------------------------------------------------------------------------------------------

static uint64_t rng = 88172645463325252ull;
static int rnd(int n) { return test_rnd(&rng, n); }

static void test_random(void) {
    enum { NB = 37, BS = 5, SEQS = 6, W = 12 };
    k25_kvcache c;
    char err[K25_ERR_LEN];
    EXPECT(kvcache_init(&c, NB, BS, SEQS, W, err) == 0, "init: %s", err);
    int open[SEQS] = {0}, maxlen[SEQS] = {0}, len[SEQS] = {0};
    for (int it = 0; it < 20000 && test_failures == 0; it++) {
        int s = rnd(SEQS), op = rnd(4);
        // What a plain count says: blocks promised to open slots (their max) and held beyond.
        int promised = 0, held_beyond = 0;
        for (int i = 0; i < SEQS; i++)
            if (open[i]) {
                int p = (maxlen[i] + BS - 1) / BS, h = (len[i] + BS - 1) / BS;
                promised += p;
                held_beyond += h > p ? h - p : 0;
            }
        int avail = NB - promised - held_beyond;
        EXPECT(kvcache_available(&c) == avail, "it %d: available %d, expected %d", it,
               kvcache_available(&c), avail);
        if (op == 0 && !open[s]) {
            int m = 1 + rnd(W * BS + 3);
            int want = (m + BS - 1) / BS <= W && (m + BS - 1) / BS <= avail;
            int got = kvcache_open(&c, s, m) == 0;
            EXPECT(got == want, "it %d: open(%d, %d) = %d, expected %d", it, s, m, got, want);
            if (got) open[s] = 1, maxlen[s] = m, len[s] = 0;
        } else if (op == 1 && open[s]) {
            // Grow within the promise always succeeds; sometimes try beyond.
            int n = rnd(4) && maxlen[s] > len[s] ? len[s] + rnd(maxlen[s] - len[s] + 1)
                                                 : len[s] + rnd(2 * BS + 1);
            int have = (len[s] + BS - 1) / BS, need = (n + BS - 1) / BS;
            int p = (maxlen[s] + BS - 1) / BS;
            int from_promise = need > have ? (need < p ? need : p) - have : 0;
            if (from_promise < 0) from_promise = 0;
            int beyond = need > have ? need - have - from_promise : 0;
            int want = need <= W && beyond <= avail;
            int got = kvcache_grow(&c, s, n) == 0;
            EXPECT(got == want, "it %d: grow(%d, %d) from %d = %d, expected %d", it, s, n, len[s],
                   got, want);
            if (got && n > len[s]) len[s] = n;
        } else if (op == 2 && open[s]) {
            int n = rnd(len[s] + 1);
            kvcache_truncate(&c, s, n);
            len[s] = n;
        } else if (op == 3 && open[s]) {
            kvcache_close(&c, s);
            open[s] = 0, len[s] = 0;
        }
        for (int i = 0; i < SEQS; i++)
            EXPECT(c.len[i] == len[i], "it %d: slot %d length %d, expected %d", it, i, c.len[i],
                   len[i]);
        if (kvcache_check(&c, err) != 0) EXPECT(0, "it %d: %s", it, err);
    }
    kvcache_destroy(&c);
}

int main(void) {
    test_basic();
    test_beyond_promise();
    test_random();
    if (test_failures) {
        fprintf(stderr, "test_kvcache: %d failures\n", test_failures);
        return 1;
    }
    printf("test_kvcache: ok\n");
    return 0;
}
