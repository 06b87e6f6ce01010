// The routing sort of a step's choices (a counting sort by expert) and the split-K plans of the
// grouped W4A16 GEMMs, as the device code of one block. Its own kernel runs it
// (k25k_moe_sort, moe_w4a16.cu), and so does the router's top-k when one block holds every row
// of the step (router.cu): the sort then costs no launch of its own.
#pragma once

#include "cuda_kernels.cuh"

#define W4_NW 4          // warps per block, one 32-row tile each
// r.item_p0 of an item: its first slot << W4_ITEM_BITS | its slot count (1..K25K_MOE_PASS)
#define W4_ITEM_BITS 6
static_assert(K25K_MOE_PASS < (1 << W4_ITEM_BITS), "an item's slot count fits its bits");
// An expert cut into items of at least pass / 2 slots each: none as short as the GEMM's packed
// n-tile (4 slots, moe_w4a16.cu), whichever pass the step uses.
static_assert(K25K_MOE_PASS_MIN / 2 > 4, "a cut expert's items are longer than the packed tile's");
static_assert(31 - W4_ITEM_BITS <= 25, "a step's choices fit the routing scan's 25-bit fields");

// Split-K plan of an N x K GEMM over `items` work items, at least 2 k-blocks per split, no empty
// split: at most `target` (item, row-block, split) units, the resident blocks, one unit each
// (up to three times as many shorter units, taken from the ticket counter as blocks finish,
// measured 20-28% slower at the TP1 and TP2 shapes with 1-16 tokens per expert, where the units
// are about equally long). over > 1, for items of unequal length (many slots, see
// moe_route_block) and for every step of more than K25_MOE_OVER_ROWS rows (moe_w4a16.cu): up to
// over x target units, so that the ticket counter can even out the blocks, but splits of at
// least K25K_MOE_OVER_KB k-blocks (each split costs a unit's start and its partial sums: 32
// rows of the synthetic model lost 25% with 10 splits of 23 k-blocks in place of 3). The split
// count does not grow with items, nor shrink with target or over, which bounds the workspace by
// the fewest items a step can have, the largest target and K25K_MOE_OVER.
#define K25K_MOE_OVER 3
#define K25K_MOE_OVER_KB 56
__host__ __device__ static inline void moe_plan(int N, int K, int items, int target, int over,
                                                int *n_splits, int *kb_per_split) {
    const int KB = K / 32 > 0 ? K / 32 : 1;
    const int rbs = (N / 32 + W4_NW - 1) / W4_NW > 0 ? (N / 32 + W4_NW - 1) / W4_NW : 1;
    const int want = target > 0 ? target : 1, want_over = over > 1 ? over * want : want;
    // rbs x items may pass 2^31; the divisions need it only below want_over, so in 32 bits (in
    // the routing sort's one thread a 64-bit division is a long call)
    const long long base64 = (long long)rbs * (items > 0 ? items : 1);
    const int base = base64 < want_over ? (int)base64 : want_over;
    int ns = base >= want ? 1 : want / base;
    if (over > 1) {
        int more = base >= want_over ? 1 : (want_over + base - 1) / base;
        const int most = KB / K25K_MOE_OVER_KB;
        if (more > most) more = most;
        if (more > ns) ns = more;
    }
    const int cap = KB / 2 > 0 ? KB / 2 : 1; // keep >= 2 k-blocks per split
    if (ns > cap) ns = cap;
    const int per = (KB + ns - 1) / ns;
    ns = (KB + per - 1) / per;           // every split writes its partials
    *n_splits = ns;
    *kb_per_split = (KB + ns - 1) / ns; // <= per, with the same split count (the GEMM's formula)
}

// What the routing sort makes its items and plans for: the resident GEMM blocks (target), the
// average slots from which items count as long (0: never), the most slots per item
// (K25K_MOE_PASS, or K25K_MOE_PASS_MIN), over_all: the plans over-split every step, as those
// of long items (moe_plan's over), not only those; one_plan: a one-row step's plans (gate+up's
// split count and k-blocks per split, then down's), which do not depend on the routing.
struct moe_sort_opts {
    int target, long_slots, pass, over_all;
    int one_plan[4];
};
// The options of a step of T rows (top_k choices each; experts of I x D), from the knobs
// (moe_w4a16.cu): the same for the routing sort's own kernel, the router's fused one and the
// one-row GEMMs.
moe_sort_opts k25k_moe_sort_opts(int T, int top_k, int I, int D, int num_sms);

// The plan the routing sort writes for one of a step's two GEMMs (N x K): for the step's items,
// at least ceil(A / K25K_MOE_PASS) (the fewest items and so the largest plans the workspaces are
// sized for, even when invalid expert ids drop choices), exactly top_k for one row whatever the
// ids; over-split for long items or where the options say so. The one-row GEMMs compute the
// same plan on the host (k25k_moe_w4a16_gemm).
__host__ __device__ static inline void moe_step_plan(int N, int K, int run_items, int A, int top_k,
                                                     bool long_items, const moe_sort_opts &o,
                                                     int *n_splits, int *kb_per_split) {
    const int lo = A == top_k ? A : (A + K25K_MOE_PASS - 1) / K25K_MOE_PASS;
    const int items = run_items > lo ? run_items : lo;
    moe_plan(N, K, items, o.target, long_items || o.over_all ? K25K_MOE_OVER : 1, n_splits,
             kb_per_split);
}

// The most choices of a one-row step that the one-row GEMMs take (a warp's lanes, see
// moe_w4a16.cu); more go through the general GEMMs.
#define K25K_MOE_ONE_MAX_K 32

// One block. counts/offsets per expert, the active experts in ascending id, and for every
// choice a = t*top_k + k its slot (position in the expert-sorted list) and the slot's token.
// The order of slots inside an expert depends on atomics, which is harmless: every slot's
// result depends only on its own token, its expert and the expert's slot count, not on which of
// the expert's items holds it. An item is up to o.pass slots of one expert; an expert with more
// is cut into items of equal size (one more slot in the first ones), so that none is short
// enough for the GEMM to pack hi and lo into one n-tile (at most 4 slots), whose sums round
// differently from the lo tile's: which tokens a short last item held followed the atomics.
// Last, two warps write the split plans of the two GEMMs (moe_step_plan), or, for one row,
// thread 0 the host's (o.one_plan). One row's items are each one slot, in expert order, so that
// item i is slot i (which the one-row GEMMs rely on, even where an expert is chosen twice; every
// slot holds the one token, so no rounding follows the atomics), and its items past the valid
// choices are marked -1 (the one-row GEMMs run top_k of them).
// SM_IDX: idx is in shared memory (the router's kernel, whose warps have just chosen the ids:
// read twice, the global copy cost two L2 round trips); otherwise the previous kernel's output,
// read with coherent loads. sm: 2 * E ints of shared memory (k25k_moe_route_smem).
template <bool SM_IDX>
static __device__ __forceinline__ void moe_route_block(const int32_t *idx, int A, int top_k,
                                                       int E, int I, int D, moe_sort_opts o,
                                                       const k25k_moe_route &r, int *sm) {
    const bool one_row = A == top_k;
    const int pass = one_row ? 1 : o.pass;
    int *cnt = sm, *fill = sm + E;
    __shared__ unsigned long long tot[32];
    __shared__ int run_slots, run_active, run_items;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    if (threadIdx.x == 0) run_slots = run_active = run_items = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < A; a += blockDim.x) {
        const int e = SM_IDX ? idx[a] : __ldcg(idx + a);
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1);
        else
            atomicExch(r.err, 1);
    }
    __syncthreads();
    // Above 16 rows (the GEMM's items of up to 16 slots, 32 with K25_MOE_PASS=32) a unit's time
    // grows with its item's slots (1 to 4 MMA n-tiles). Where the items hold long_slots slots or
    // more on average, taken in expert order the blocks that draw the long units last end last,
    // and the next GEMM's blocks wait for them. The items are then placed in descending slot count
    // (a counting sort; the order inside a count follows the atomics, which only reorders
    // independent units), so that the longest run first and the short ones fill in behind them,
    // and the plans over-split (moe_plan's over).
    __shared__ int next_of_len[K25K_MOE_PASS + 1]; // next item position of each slot count
    __shared__ int long_items;
    const bool may_sort = o.long_slots > 0 && A > 16 * top_k;
    if (may_sort) {
        for (int n = threadIdx.x; n <= pass; n += blockDim.x) next_of_len[n] = 0;
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const int v = cnt[e], np = (v + pass - 1) / pass;
            if (!v) continue;
            const int base = np > 1 ? v / np : v, big = v - base * np; // items of base + 1: big
            if (big) atomicAdd(&next_of_len[base + 1], big);
            atomicAdd(&next_of_len[base], np - big);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int at = 0;
            for (int n = pass; n >= 1; n--) {
                const int c = next_of_len[n];
                next_of_len[n] = at;
                at += c;
            }
            long_items = A >= o.long_slots * at; // at: the step's items
        }
        __syncthreads();
    }
    const bool by_length = may_sort && long_items;
    for (int base = 0; base < E; base += blockDim.x) {
        int e = base + threadIdx.x;
        int v = e < E ? cnt[e] : 0, f = v > 0, np = (v + pass - 1) / pass;
        // one scan of the three counts, packed (three scans were 9 barriers): slots and items
        // below 2^25 (A, bounded with the item encoding), active experts below 2^13 (E, bounded by
        // the shared memory of k25k_moe_route_smem)
        unsigned long long total;
        const unsigned long long in = (unsigned long long)v | (unsigned long long)np << 25 |
                                      (unsigned long long)f << 50;
        const unsigned long long incl = k25_block_incl_scan(in, tot, &total);
        const int m25 = (1 << 25) - 1;
        const int iv = (int)(incl & m25), ip = (int)(incl >> 25 & m25), iff = (int)(incl >> 50);
        const int total_v = (int)(total & m25), total_p = (int)(total >> 25 & m25),
                  total_f = (int)(total >> 50);
        if (e < E) {
            int off = run_slots + iv - v;
            r.offsets[e] = off;
            r.counts[e] = v;
            fill[e] = off;
            if (f) r.active[run_active + iff - 1] = e;
            const int base = np > 1 ? v / np : v, big = v - base * np; // decode: np <= 1
            for (int p = 0, it = run_items + ip - np; p < np; p++, it++) {
                const int n = base + (p < big), p0 = off + p * base + min(p, big);
                const int at = by_length ? atomicAdd(&next_of_len[n], 1) : it;
                r.item_expert[at] = e;
                r.item_p0[at] = (p0 << W4_ITEM_BITS) | n;
                if (r.item_ready) r.item_ready[at] = 0;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            run_slots += total_v;
            run_active += total_f;
            run_items += total_p;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        r.offsets[E] = run_slots;
        *r.n_active = run_active;
        *r.n_items = run_items;
    }
    if (one_row) {
        if (threadIdx.x == 0)
            for (int p = 0; p < 4; p++) r.plan[p] = o.one_plan[p];
        for (int i = run_items + (int)threadIdx.x; i < top_k; i += blockDim.x)
            r.item_expert[i] = -1;
    } else {
        // the two plans side by side in two warps where the block has them (a chain of
        // divisions)
        const int down_plan_thread = blockDim.x > 32 ? 32 : 0;
        if (threadIdx.x == 0)
            moe_step_plan(2 * I, D, run_items, A, top_k, by_length, o, &r.plan[0], &r.plan[1]);
        if (threadIdx.x == down_plan_thread)
            moe_step_plan(D, I, run_items, A, top_k, by_length, o, &r.plan[2], &r.plan[3]);
    }
    __syncthreads();
    for (int a = threadIdx.x; a < A; a += blockDim.x) {
        const int e = SM_IDX ? idx[a] : __ldcg(idx + a);
        if (e >= 0 && e < E) {
            int pos = atomicAdd(&fill[e], 1);
            r.slot_token[pos] = a / top_k;
            r.slot_of[a] = pos;
        } else {
            r.slot_of[a] = -1;
        }
    }
}
