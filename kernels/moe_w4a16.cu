// Routed experts on the GPU: device-side routing (a counting sort of the T*top_k choices into
// per-expert slot lists and the split-K plans), the grouped W4A16 GEMM over all active experts
// of a step in one launch (gate+up with its split reduction and SiLU*up fused, then down), the
// separate SiLU*up reduction (BF16 experts) and the weighted per-token combine.
//
// Weight layout (repacked once at load, same bytes as the checkpoint: 0.5625 B/weight).
// An expert matrix W [N][K] (N rows = outputs, K inputs) is cut into tiles of 32 rows x 32
// inputs (one quantization group). Tile (nt, kb) is 512 bytes: lane l of a warp reads 16 bytes,
// four words, each word the 8 nibbles of one m16n8k16 A fragment (rows 16 x k 16) for that
// lane, so a single coalesced 16-byte load per lane feeds four tensor-core MMAs:
//   word 0: rows [0,16)  k [0,16)    word 1: rows [0,16)  k [16,32)
//   word 2: rows [16,32) k [0,16)    word 3: rows [16,32) k [16,32)
// Inside a word, nibble j holds fragment element: j=0 (g, 2c), 4 (g, 2c+1), 1 (g+8, 2c),
// 5 (g+8, 2c+1), 2 (g, 2c+8), 6 (g, 2c+9), 3 (g+8, 2c+8), 7 (g+8, 2c+9)   (g = l/4, c = l%4),
// so ((w >> 4j) & 0x000f000f) | 0x43004300 is a bf16 pair 128+u, and subtracting 136 gives the
// signed values exactly (the lop3 / magic-number dequantization).
// Scales: tile (nt, kb) has 8 x 4 bf16: [g][rows g, g+8, g+16, g+24], one 8-byte load per lane.
// gate+up: one matrix of 2*I rows where tile nt holds gate rows [16nt, 16nt+16) in its first
// 16 rows and up rows [16nt, 16nt+16) in its last 16, so the epilogue sees both halves.
//
// Activations are staged in shared memory as bf16 (the MMA B operand, tokens as the n=8
// dimension); accumulation is f32; each quantization group's partial product is scaled once.
// Split-K partial sums go to a workspace part[split][slot][N] and are reduced in fixed order,
// so results are deterministic (no float atomics).
//
// Split-K plan: the number of work items (and so of GEMM blocks without splits) is only known on
// the device, after the routing sort, and it ranges from top_k (every token on the same experts)
// to min(E, A) + A/16. The routing kernel therefore picks n_splits and kb_per_split of both GEMMs
// from the actual item count (moe_plan) and stores them in r.plan; the GEMMs run a persistent
// grid-stride loop over (item, row-block, split) units and the reductions read n_splits from
// r.plan. A given routing always gives the same plan and the same fixed-order sums, so results
// are deterministic; the same tokens routed differently may be summed in a different split
// grouping (f32 rounding differences only). One row is the exception: its top_k items are known
// in number and layout, and its GEMMs take the plan from the host (the ONE instantiation).
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "moe_route.cuh"
#include "phase_stamps.cuh"

#define W4_ONE_GATE_UP_PER_SM 2 // one row's gate+up blocks an SM (the plan's target)

// ------------------------------------------------------------------------------------------
// Routing: counting sort of the choices by expert
// ------------------------------------------------------------------------------------------

// The routing sort as a kernel of its own (moe_route.cuh). It triggers the routed experts' GEMM
// at its end, not its start: that GEMM's resident blocks fill every SM's registers and would
// keep the shared expert's side branch off the GPU while they wait for this sort.
__global__ void __launch_bounds__(1024) moe_route_kernel(const int32_t *__restrict__ idx, int A,
                                                         int top_k, int E, int I, int D,
                                                         moe_sort_opts o,
                                                         k25k_moe_route r) {
    extern __shared__ int sm[];
    k25_pdl_wait();
    moe_route_block<false>(idx, A, top_k, E, I, D, o, r, sm);
    k25_pdl_trigger();
}

// The routing sort's knobs, read once (the fields of moe_sort_opts):
//   K25_MOE_LONG_SLOTS: slots per item on average from which a step's items count as long
//     (moe_route_block), 0 = never. 1 (was 8): every step above 16 rows runs its items longest
//     first. Under uniform routing (1.4-5.3 slots an item at 32-256 rows) 1.4% / 2.1% / 3.5% /
//     2.4% / 3.4% faster a step at 32 / 64 / 96 / 128 / 256 rows than with 8; 2 gained the same
//     from 96 rows and nothing below. At 256 rows gate+up's last blocks ended 45 us after its
//     median block, 25 with the order, and the down GEMM waits for the last (phase stamps,
//     bench/NOTES.md, thirty-fifth round);
//   K25_MOE_PASS: the most slots per item above 16 rows (an expert holds at most T): 16, for the
//     2-tile GEMM (see w4_ntt), or 32 (the 4-tile GEMM). Under uniform routing (~5 slots an item
//     at 256 rows) the 2-tile GEMM's 4 blocks per SM beat the 4-tile one's 3 by 6-9% of the step
//     from 64 to 256 rows; under the synthetic router's concentrated routing (~11 slots, some
//     experts above 16 whose weights are then read twice) it gained 6-9% from 32 to 128 rows and
//     lost 2% at 256 (bench/NOTES.md, eleventh round);
//   K25_MOE_OVER_ROWS: the rows above which every step's plans over-split, not only those of long
//     items (default 8; 0: every step). Under uniform routing (twelfth round, twice alternated):
//     12 / 16 / 32 / 64 / 128 / 256 rows 6.5% / 1% / 7% / 2% / 3% / 3% faster, 8 rows 0.5% slower;
//     under the synthetic router, whose steps above 16 rows mostly have long items anyway,
//     within 1% from 8 to 256 rows. Over factor and split floor (K25K_MOE_OVER, _OVER_KB): 6 or
//     a floor of 112 k-blocks gained 2% at 32 rows and lost 2-3% at 64-256 (uniform) or 6% at 64
//     (synthetic router).
//   K25_MOE_FLOW_ROWS: the fewest rows of a step whose down GEMM takes each item as its gate+up
//     rows finish (the kernel's FLOW) instead of waiting for gate+up's end; 0 = never. 5: under
//     uniform routing 5 / 6 / 8 / 12 / 16 rows 4.5 / 6.1 / 5.0 / 4.9 / 3.2% faster a step, 24-192
//     rows 3.1-4.5%, 256 rows 2.1%; 3 and 4 rows 0.5% and 1.3% slower (the steps whose routing
//     launch triggers gate+up early), 2 rows within the spread (bench/NOTES.md, thirty-sixth
//     round). One row has its own early down GEMM. Steps below the rule run the kernels' own
//     instantiation without FLOW (the kernel's FLOW says why).
typedef struct moe_knobs {
    int long_slots, pass, over_rows, flow_rows;
} moe_knobs;
static const moe_knobs &moe_knobs_read(void) {
    static moe_knobs k = {-1, 0, 0, 0};
    if (k.long_slots < 0) {
        k.flow_rows = k25_env_int("K25_MOE_FLOW_ROWS", 5);
        const int l = k25_env_int("K25_MOE_LONG_SLOTS", 1);
        k.pass = k25_env_int("K25_MOE_PASS", K25K_MOE_PASS_MIN) == K25K_MOE_PASS
                     ? K25K_MOE_PASS
                     : K25K_MOE_PASS_MIN;
        k.over_rows = k25_env_int("K25_MOE_OVER_ROWS", 8);
        k.long_slots = l > 0 ? l : 0;
    }
    return k;
}

static int moe_pass(int T) { return T > 16 ? moe_knobs_read().pass : K25K_MOE_PASS; }

// MMA n-tiles of the grouped GEMM's instantiation at T rows, the most slots of an item: 1 up to 8
// rows, 2 up to 16 (or items of 16 slots), 4 above.
static int w4_ntt(int T) {
    return T <= 8 ? 1 : T <= 16 || moe_pass(T) == K25K_MOE_PASS_MIN ? 2 : 4;
}

size_t k25k_moe_route_smem(int A, int E) {
    const size_t smem = sizeof(int) * 2 * (size_t)E;
    if (smem > 48 * 1024) K25_DIE("moe routing: %d experts exceed the shared-memory sort", E);
    if (A >= (1 << (31 - W4_ITEM_BITS)))
        K25_DIE("moe routing: %d choices exceed the work item encoding", A);
    return smem;
}

moe_sort_opts k25k_moe_sort_opts(int T, int top_k, int I, int D, int num_sms) {
    const moe_knobs &k = moe_knobs_read();
    moe_sort_opts o = {k25k_moe_route_target(T, num_sms), k.long_slots, moe_pass(T),
                       T > k.over_rows, {0, 0, 0, 0}};
    if (T == 1) { // top_k items whatever the ids (moe_step_plan): no division on the device
        // gate+up over fewer blocks, leaving each SM room for the down GEMM's (the kernel's
        // early streaming)
        moe_sort_opts g = o;
        g.target = W4_ONE_GATE_UP_PER_SM * (num_sms > 0 ? num_sms : 1);
        moe_step_plan(2 * I, D, top_k, top_k, top_k, false, g, &o.one_plan[0], &o.one_plan[1]);
        moe_step_plan(D, I, top_k, top_k, top_k, false, o, &o.one_plan[2], &o.one_plan[3]);
    }
    return o;
}

void k25k_moe_sort(const int32_t *idx, int T, int top_k, int E, int I, int D, int num_sms,
                   const k25k_moe_route *r, cudaStream_t s) {
    int A = T * top_k;
    if (A <= 0) return;
    k25_launch("moe_route", moe_route_kernel, 1, 1024, k25k_moe_route_smem(A, E), s, idx, A,
               top_k, E, I, D, k25k_moe_sort_opts(T, top_k, I, D, num_sms), *r);
}

// ------------------------------------------------------------------------------------------
// Repacking (load time)
// ------------------------------------------------------------------------------------------

// Nibble (row, col) of a checkpoint-layout packed matrix [rows][K/8].
__device__ __forceinline__ uint32_t nib_at(const uint32_t *w, int K, int row, int col) {
    return (w[(size_t)row * (K / 8) + col / 8] >> (4 * (col & 7))) & 0xFu;
}

// Source row of tile-local row rl of row tile nt: gate_up takes the first 16 from a (gate), the
// last 16 from b (up); otherwise rows are consecutive in a.
__device__ __forceinline__ const uint32_t *tile_src(const uint32_t *a, const uint32_t *b,
                                                     int gate_up, int nt, int rl, int *row) {
    if (gate_up) {
        *row = nt * 16 + (rl & 15);
        return rl < 16 ? a : b;
    }
    *row = nt * 32 + rl;
    return a;
}

__global__ void w4_repack_weights_kernel(const uint32_t *__restrict__ wa,
                                         const uint32_t *__restrict__ wb, int N, int K,
                                         int gate_up, uint32_t *__restrict__ dst) {
    size_t n_words = (size_t)(N / 32) * (K / 32) * 128;
    int KB = K / 32;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words;
         i += (size_t)gridDim.x * blockDim.x) {
        int wi = (int)(i & 3), lane = (int)((i >> 2) & 31);
        size_t tile = i >> 7;
        int kb = (int)(tile % KB), nt = (int)(tile / KB);
        int sub = wi >> 1, kst = wi & 1, g = lane >> 2, c = lane & 3;
        int rowA, rowB;
        const uint32_t *sA = tile_src(wa, wb, gate_up, nt, sub * 16 + g, &rowA);
        const uint32_t *sB = tile_src(wa, wb, gate_up, nt, sub * 16 + g + 8, &rowB);
        int kk = kb * 32 + kst * 16;
        uint32_t v = nib_at(sA, K, rowA, kk + 2 * c) | nib_at(sB, K, rowB, kk + 2 * c) << 4 |
                     nib_at(sA, K, rowA, kk + 2 * c + 8) << 8 |
                     nib_at(sB, K, rowB, kk + 2 * c + 8) << 12 |
                     nib_at(sA, K, rowA, kk + 2 * c + 1) << 16 |
                     nib_at(sB, K, rowB, kk + 2 * c + 1) << 20 |
                     nib_at(sA, K, rowA, kk + 2 * c + 9) << 24 |
                     nib_at(sB, K, rowB, kk + 2 * c + 9) << 28;
        dst[i] = v;
    }
}

__global__ void w4_repack_scales_kernel(const uint16_t *__restrict__ sa,
                                        const uint16_t *__restrict__ sb, int N, int K, int group,
                                        int gate_up, uint16_t *__restrict__ dst) {
    size_t n = (size_t)(N / 32) * (K / 32) * 32;
    int KB = K / 32, ng = K / group;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int q = (int)(i & 3), g = (int)((i >> 2) & 7);
        size_t tile = i >> 5;
        int kb = (int)(tile % KB), nt = (int)(tile / KB);
        int rl = g + 8 * q; // q: rows g, g+8, g+16, g+24
        int row;
        // tile_src works on packed words; the same row mapping applies to the scale rows.
        const uint16_t *src = gate_up ? (rl < 16 ? sa : sb) : sa;
        row = gate_up ? nt * 16 + (rl & 15) : nt * 32 + rl;
        dst[i] = src[(size_t)row * ng + (kb * 32) / group];
    }
}

void k25k_w4_repack(const uint32_t *wa, const uint32_t *wb, const uint16_t *sa,
                    const uint16_t *sb, int N, int K, int group, int gate_up, uint32_t *dst_w,
                    uint16_t *dst_s, cudaStream_t s) {
    if (N % 32 || K % 32 || group % 32)
        K25_DIE("W4A16 repack: N=%d K=%d group=%d must be multiples of 32", N, K, group);
    size_t nw = (size_t)(N / 32) * (K / 32) * 128;
    int grid = (int)(k25_cdiv((int64_t)nw, 256) < 65535 ? k25_cdiv((int64_t)nw, 256) : 65535);
    w4_repack_weights_kernel<<<grid, 256, 0, s>>>(wa, wb, N, K, gate_up, dst_w);
    K25_LAUNCH_CHECK(s, "w4_repack_weights");
    size_t ns = (size_t)(N / 32) * (K / 32) * 32;
    grid = (int)(k25_cdiv((int64_t)ns, 256) < 65535 ? k25_cdiv((int64_t)ns, 256) : 65535);
    w4_repack_scales_kernel<<<grid, 256, 0, s>>>(sa, sb, N, K, group, gate_up, dst_s);
    K25_LAUNCH_CHECK(s, "w4_repack_scales");
}

// ------------------------------------------------------------------------------------------
// Grouped W4A16 GEMM (tensor cores)
// ------------------------------------------------------------------------------------------

// k-blocks (of 32) of activations staged in shared memory at a time (a larger chunk staged
// once per small-M unit cost 16 more registers per thread: 3 blocks per SM instead of 4)
#define W4_KCB 8
// Words per staged row: the chunk's bf16 pairs + 16 words of padding, so that the two rows a
// quarter-warp reads with 16-byte loads fall in opposite halves of the 32 banks.
#define W4_XS (W4_KCB * 16 + 16)
// Each warp streams its tile's weights and scales through its own ring of W4_STAGES chunks in
// shared memory, filled by bulk copies: chunk c + 1 is in flight while chunk c is consumed, and
// no warp waits for another's bytes.
#define W4_STAGES 2
#define W4_KB_W 512 // bytes of one 32 x 32 tile's weights (k-block)
#define W4_KB_S 64  // bytes of its scales
#define W4_STAGE_W (W4_KCB * W4_KB_W) // a stage: the chunk's weights, then its scales
#define W4_STAGE_BYTES (W4_KCB * (W4_KB_W + W4_KB_S))
#define W4_RING_BYTES (W4_NW * W4_STAGES * W4_STAGE_BYTES)
#define W4_ROW_GROUP_ROWS 128 // the fewest rows of a step whose down GEMM takes row groups

__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1, const float c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
}

// (a & b) | c in one LOP3: written as C, the two constant operands made ptxas emit an AND and an
// OR (one immediate per LOP3), 8 of the 15 instructions of a word's dequantization.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// One packed word -> the four bf16x2 registers of an A fragment, exact signed values: nibbles
// 4j and 4j + 16 under the exponent of 128 (0x4300 | n = 128 + n), minus 136.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t r[4]) {
    const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)0x4308),
                                                   __ushort_as_bfloat16((unsigned short)0x4308));
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t t = lop3_and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);
        __nv_bfloat162 v = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&t), bias);
        r[j] = *reinterpret_cast<uint32_t *>(&v);
    }
}

// n / d for any 32-bit n and d >= 1, given m = 0xffffffff / d (once per block): m undershoots
// 2^32 / d by less than one, so the multiply-high is the quotient or one less, and one compare
// corrects it. A unit's start divided its number twice, ~25 instructions each (a reciprocal
// and its corrections), where a one-chunk unit runs ~480 of consume a warp.
__device__ __forceinline__ unsigned w4_div(unsigned n, unsigned d, unsigned m) {
    const unsigned q = __umulhi(n, m);
    return n - q * d >= d ? q + 1 : q;
}

// Staged position of column pair p of a k-block: pairs p, p + 4, p + 8, p + 12 (one lane's B
// fragments for the k-block's two MMAs) side by side, read as one 16-byte load.
__device__ __forceinline__ int w4_pair_slot(int p) {
    return (p & ~15) | ((p & 3) << 2) | ((p >> 2) & 3);
}

// Split s of a gate / up sum goes into accumulator s % 8, and the sums are added as a tree at the
// end: a fixed order. The loads of W4_SPLITS_AHEAD splits are issued before their adds (past the
// last split they load the last one again and add nothing): one L2 round trip where a loop of one
// split at a time waited for each split short of 8. The fused tail takes as many as its steps'
// gate+up plans have (W4_TAIL_AHEAD: up to 8 at 1-8 rows, 4 above), since a load past the last
// split still costs an L2 request; more than 8 at once held too many registers in the GEMM's
// tail (ptxas then let each add wait for its load).
#define W4_SPLITS_AHEAD 8
#define W4_TAIL_AHEAD(NTT) ((NTT) == 1 ? 8 : 4)

// Splits [ks, ks + AHEAD) of one gate / up pair (partials at p and p + I, split stride `stride`
// floats) into their accumulators; past the last split the loads repeat it and add nothing. L2
// loads: the partials may come from other blocks of the same kernel (the fused reduction).
template <int AHEAD>
__device__ __forceinline__ void gate_up_add_splits(const float *p, size_t stride, int ks,
                                                   int n_splits, int I, float (&g8)[8],
                                                   float (&u8)[8]) {
#pragma unroll
    for (int u = 0; u < AHEAD; u++) {
        const size_t at = (size_t)min(ks + u, n_splits - 1) * stride;
        const float g = __ldcg(p + at), up = __ldcg(p + at + I);
        if (ks + u < n_splits) g8[u & 7] += g, u8[u & 7] += up;
    }
}

// silu(sum gate) * (sum up), each sum its 8 accumulators added as a tree
__device__ __forceinline__ float gate_up_silu(const float (&g8)[8], const float (&u8)[8]) {
    const float gs = ((g8[0] + g8[1]) + (g8[2] + g8[3])) + ((g8[4] + g8[5]) + (g8[6] + g8[7]));
    const float us = ((u8[0] + u8[1]) + (u8[2] + u8[3])) + ((u8[4] + u8[5]) + (u8[6] + u8[7]));
    return k25_silu(gs) * us;
}

// silu(sum gate) * (sum up) of one (slot, i) over the n_splits partials at p (gate) and p + I
// (up), split stride `stride` floats.
__device__ __forceinline__ float gate_up_sum(const float *p, size_t stride, int n_splits, int I) {
    float g8[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int ks = 0; ks < n_splits; ks += W4_SPLITS_AHEAD)
        gate_up_add_splits<W4_SPLITS_AHEAD>(p, stride, ks, n_splits, I, g8, u8);
    return gate_up_silu(g8, u8);
}

// The fused reduction of one finished (item, row-block): h for intermediate columns
// [rb * 16 W4_NW, +16 W4_NW) of the item's mp slots from slot0, the same sums as gate_up_sum,
// with W4_TV outputs per thread at a time so that their loads are in flight together (the
// partials sit in L2; one output at a time would be a chain of L2 round trips at M = 16).
#define W4_TV 2
template <int AHEAD>
__device__ __forceinline__ void gate_up_tail(const float *__restrict__ part,
                                             float *__restrict__ h, size_t slot0, int mp, int rb,
                                             int I, int A, int n_splits) {
    const int cols = W4_NW * 16, N = 2 * I, n_out = mp * cols;
    const size_t stride = (size_t)A * N;
    for (int o0 = 0; o0 < n_out; o0 += W4_TV * blockDim.x) {
        float g8[W4_TV][8], u8[W4_TV][8];
        const float *p[W4_TV];
        bool ok[W4_TV];
#pragma unroll
        for (int v = 0; v < W4_TV; v++) {
            const int id = o0 + v * blockDim.x + threadIdx.x;
            const int m = id / cols, i = rb * cols + (id - m * cols);
            ok[v] = id < n_out && i < I;
            p[v] = part + (slot0 + m) * N + i;
#pragma unroll
            for (int u = 0; u < 8; u++) g8[v][u] = 0.0f, u8[v][u] = 0.0f;
        }
        for (int ks = 0; ks < n_splits; ks += AHEAD) {
#pragma unroll
            for (int v = 0; v < W4_TV; v++)
                if (ok[v]) gate_up_add_splits<AHEAD>(p[v], stride, ks, n_splits, I, g8[v], u8[v]);
        }
#pragma unroll
        for (int v = 0; v < W4_TV; v++) {
            if (!ok[v]) continue;
            const int id = o0 + v * blockDim.x + threadIdx.x;
            const int m = id / cols, i = rb * cols + (id - m * cols);
            h[(slot0 + m) * I + i] = gate_up_silu(g8[v], u8[v]);
        }
    }
}

// Persistent grid: block b takes unit b, then the next unit no block has taken (a ticket counter,
// see the unit loop), of the n_items x row-blocks x n_splits units of the step (plan r.plan[pl],
// r.plan[pl + 1] from the routing kernel; an item is one expert and up to NTT x 8 of its slots, a
// row-block W4_NW tiles of 32 rows, a split kb_per_split k-blocks; with RGS a unit may hold RG
// row-blocks, see RG). Consecutive units are the splits of one row-block, so neighbouring blocks
// stream neighbouring weights. Each unit streams its tiles' weights over its K range once.
//   X: activation rows [*][x_ld] f32; row of slot j is row_index[j] (gate_up: the slot's token)
//      or j itself (down: the slot's intermediate row).
//   part: [n_splits][A][N] f32 (gate_up: gate at [0, I), up at [I, 2I)).
//   h: gate_up only, optional: h[A][I] = silu(gate) * up, written by the last of the n_splits
//      units of each (item, row-block) to finish (counted in r.tile_done, which that unit resets
//      to 0), summed in fixed split order, so the result does not depend on which unit is last.
// NTT: MMA n-tiles of 8 tokens kept in registers (1 when no expert can have more than 8 slots).
// SPLIT: activations as two bf16 operands, hi = bf16(x) and lo = bf16(x - hi), each multiplied
// by the exact INT4 weights (about f32 accuracy; twice the MMAs, except for units of up to 4
// slots, whose hi and lo share one n-tile); otherwise hi only. A template argument: as a
// run-time flag it put a branch in every k-block (see the consume).
// Registers: at most 128 for NTT <= 2 (4 blocks per SM), 168 for NTT = 4 (3 per SM); the few
// spills (16-100 bytes) are loop-invariant addresses, outside the chunk loop.
// ONE: a step of one row (A = top_k <= K25K_MOE_ONE_MAX_K choices). Its plan is the host's
// (one_splits splits, the one the routing sort writes), item i is slot i, and every slot's
// activation row is row 0 (gate_up) or its own: after the wait, a unit loads only its expert
// (-1 for an item that invalid ids left out, moe_route_block), where the other steps
// first load the plan, then the item, then the slot's token, then its activations, each load
// waiting for the one before it (four L2 round trips ahead of the staging at batch 1;
// bench/NOTES.md).
// FLOW: the instantiation for steps whose down GEMM takes each item as gate+up finishes it (see
// the wait below; both GEMMs of such a step). Its own instantiation: as a run-time flag its
// values stayed live through the unit loop of every step, and the one-tile kernel spilled 40
// bytes of stack where it had spilled 8 (2-4 rows, which never flow, 2.6-2.8% slower a step).
// Without it the kernels compile to their machine code from before FLOW (scripts/sass_same.py).
// Shared memory: the staging tiles plus the warps' rings (W4_RING_BYTES, dynamic).
template <int NTT, bool SPLIT, bool ONE, bool RGS, bool FLOW>
__global__ void __launch_bounds__(W4_NW * 32, NTT <= 2 ? 4 : 3) w4a16_grouped_kernel(
    const uint4 *__restrict__ Wt, const uint2 *__restrict__ St, size_t w_stride, size_t s_stride,
    int N, int K, int gate_up, const float *__restrict__ X, int x_ld,
    const int *__restrict__ row_index, k25k_moe_route r, int pl, float *__restrict__ part, int A,
    float *__restrict__ h, int one_splits) {
    static_assert(!ONE || NTT == 1, "one row: items of one slot");
    static_assert(!ONE || !RGS, "one row: a row-block a unit");
    static_assert(!ONE || !FLOW, "one row: its own early down GEMM");
    constexpr int KCB = W4_KCB, XS = W4_XS, S = W4_STAGES;
    extern __shared__ __align__(128) uint8_t w4_ring[]; // [W4_NW][S][W4_STAGE_BYTES]
    __shared__ __align__(16) uint32_t xs[NTT * 8 * XS];
    __shared__ __align__(16) uint32_t xl[NTT * 8 * XS];
    __shared__ __align__(8) uint64_t full[W4_NW][S]; // a stage's bytes have landed
    __shared__ int xrow[NTT * 8]; // activation row of each of the unit's slots
    __shared__ int last_split;
    __shared__ int next_unit[2]; // the unit after the current one (two: see the unit loop)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#ifdef K25_PHASES
    const int site = gate_up ? K25_SITE_GATE_UP : K25_SITE_DOWN;
#endif
    K25_STAMP(site, 0);
    uint8_t *ring = w4_ring + warp * S * W4_STAGE_BYTES;
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < S; i++) k25_mbar_init(&full[warp][i], 1);
        k25_mbar_init_fence();
    }
    __syncwarp();
    // The expert of every unit comes from the routing kernel: no weight address is known before
    // the wait. Except in one row's down GEMM: its launch follows gate+up's wait (one row's
    // gate+up triggers it only then), which followed the routing, so its first unit's weights
    // stream before its own wait, in blocks that find room beside gate+up's (one row runs
    // gate+up at W4_ONE_GATE_UP_PER_SM blocks an SM, k25k_moe_sort_opts). Elsewhere gate+up's
    // blocks fill the SMs, and the down GEMM's start as they leave (FLOW, below).
    // FLOW (with r.item_ready set: steps of K25_MOE_FLOW_ROWS rows or more): the down GEMM does not
    // wait for gate+up's end either. A unit streams its weights, then waits for its item's
    // gate+up row-blocks (counted in r.item_ready as their SiLU*up is written), so the blocks
    // that start as gate+up's leave take the items already done, where all of them waited for
    // gate+up's last block. gate+up then triggers the down GEMM after its own wait, so the
    // routing sort has ended before any down block reads its items (coherent loads: this launch
    // has not waited for anything). The launch still waits for gate+up before it ends.
    const bool flow = FLOW && r.item_ready != nullptr;
    const bool early = (ONE || flow) && !gate_up, late_trigger = (ONE || flow) && gate_up;
    if (!late_trigger) k25_pdl_trigger();
    if (!early) k25_pdl_wait();
    if (!early) K25_STAMP(site, 1);
    if (late_trigger) k25_pdl_trigger();
    bool waited = !early;
    // the routing's outputs: from L2 where this launch reads them before any wait
    auto routed = [&](const int *p) { return early ? __ldcg(p) : *p; };
    // kb_per_split = ceil(KB / n_splits) (moe_plan), computed: a second plan load was issued
    // after the early exit and waited for before the item loads (one more dependent load)
    const int n_splits = ONE ? one_splits : routed(r.plan + pl);
    const int NT = N / 32, KB = K / 32;
    const int kb_per_split = (KB + n_splits - 1) / n_splits;
    const int rbs = (NT + W4_NW - 1) / W4_NW;
    const int items = ONE ? A : routed(r.n_items);
    // FLOW: gate+up's row-blocks an item has (K = I here), and the last item this thread saw
    // complete
    const bool flow_down = flow && !gate_up;
    const int need = (2 * K / 32 + W4_NW - 1) / W4_NW;
    int ready_item = -1;
    // Row-blocks per unit (RG). Where a tile is one chunk (the down GEMM at TP8: K = 256) and
    // units are plentiful, a unit takes RG consecutive row-blocks of its item: its activations
    // are staged once for all of them and the ring streams their chunks back to back, where every
    // row-block was a unit of its own with its own start, staging and barriers around one chunk.
    // RGS: the instantiation that may group, launched for the down GEMM of long steps only
    // (k25k_moe_w4a16_gemm says why).
    int RG = 1;
    if (RGS && !h && n_splits == 1 && KB <= KCB) {
        const int units1 = items * rbs, grid = (int)gridDim.x;
        RG = rbs % 4 == 0 && units1 >= 8 * grid ? 4 : rbs % 2 == 0 && units1 >= 4 * grid ? 2 : 1;
    }
    const int rgs = rbs / RG;
    const int n_units = items * rgs * n_splits;
    const unsigned per_item = (unsigned)(rgs * n_splits), per_item_m = 0xffffffffu / per_item;
    const unsigned splits_m = 0xffffffffu / (unsigned)n_splits;
    const int I = N / 2;
    const uint64_t policy = k25_l2_evict_first();
    // chunks this warp has issued into and consumed from its ring, over all its units: the
    // stage is the count mod S, the mbarrier phase its parity
    uint32_t issued = 0, consumed = 0;

    // Units past the first gridDim.x go to the blocks in the order they ask: thread 0 takes a
    // ticket when its block starts a unit (the atomic's latency hidden behind the unit) and the
    // block reads it when the unit ends. Every unit run takes one ticket, so the tickets of a
    // launch are 0 .. n_units - 1 and the one that draws the last returns the counter to 0 for
    // the next launch. next_unit alternates between two entries: entry it & 1, written at the
    // start of unit it and read at its end, is written again only after a barrier of unit it + 1
    // that every thread passes after its read.
    int *const tickets = r.unit_next + (pl >> 1);
    int it = 0;
    for (int unit = blockIdx.x; unit < n_units; unit = next_unit[it++ & 1]) {
    if (threadIdx.x == 0) {
        const int tk = atomicAdd(tickets, 1);
        if (tk == n_units - 1) atomicExch(tickets, 0);
        next_unit[it & 1] = gridDim.x + tk;
    }
    const int item = (int)w4_div(unit, per_item, per_item_m), rem = unit - item * (int)per_item;
    const int rg = (int)w4_div(rem, n_splits, splits_m), ks = rem - rg * n_splits;
    const int rb = rg * RG;
    // the item's slots come with it (not from counts/offsets of its expert, one more dependent
    // load before the first weight load)
    const int e = routed(r.item_expert + item);
    const int enc = ONE ? 1 : routed(r.item_p0 + item);
    if (ONE && e < 0) { // an item no id made (block-uniform; next_unit is read after a barrier)
        __syncthreads();
        continue;
    }
    // FLOW: the item's count, requested with its expert and waited for after the weights' copies
    // (every thread: each one's acquire orders its own loads of h)
    int ready = flow_down && item != ready_item ? k25_ld_acquire(r.item_ready + item) : need;
    if (it == 0) K25_STAMP_AFTER(site, 2, e);
    const int slot0 = ONE ? item : enc >> W4_ITEM_BITS;
    const int mp = min(NTT * 8, enc & ((1 << W4_ITEM_BITS) - 1));
    const int nt = rb * W4_NW + warp;
    const int kb0 = ks * kb_per_split;
    const int kb1 = min(KB, kb0 + kb_per_split);
    const uint4 *wt = Wt + (size_t)e * w_stride + (size_t)nt * KB * 32;
    const uint2 *st = St + (size_t)e * s_stride + (size_t)nt * KB * 8;
    // chunk kc's k-blocks of the unit's row tile rt (row-block rb + rt) into the next stage of
    // the ring (one lane copies; the count is the warp's). The stage was last read a ring ago,
    // in this unit or the previous one: every lane's reads are ordered before the copy's writes
    // first.
    auto issue = [&](int rt, int kc) {
        const int nk = min(kb1 - kc, KCB), q = issued % S;
        const size_t tw = (size_t)rt * W4_NW * KB;
        __syncwarp();
        if (lane == 0) {
            k25_fence_proxy_async();
            uint8_t *dst = ring + q * W4_STAGE_BYTES;
            k25_mbar_expect_tx(&full[warp][q], nk * (W4_KB_W + W4_KB_S));
            k25_bulk_g2s(dst, wt + (tw + kc) * 32, nk * W4_KB_W, &full[warp][q], policy);
            k25_bulk_g2s(dst + W4_STAGE_W, st + (tw + kc) * 8, nk * W4_KB_S, &full[warp][q],
                         policy);
        }
        issued++;
    };
    // the ring's first S chunks: the tile's, or (RG > 1, one chunk a tile) the first S tiles'
    if (RG == 1) {
        if (nt < NT)
            for (int i = 0; i < S && kb0 + i * KCB < kb1; i++) issue(0, kb0 + i * KCB);
    } else {
        for (int i = 0; i < S && i < RG; i++)
            if (nt + i * W4_NW < NT) issue(i, kb0);
    }
    if (flow_down) { // the item's h complete: its gate+up row-blocks counted
        while (ready < need) {
            __nanosleep(128);
            ready = k25_ld_acquire(r.item_ready + item);
        }
        ready_item = item;
        if (it == 0) K25_STAMP(site, 1);
    } else if (!waited) { // the activations are the previous kernel's
        k25_pdl_wait();
        waited = true;
        K25_STAMP(site, 1);
    }
    // read by the staging after the chunk loop's first barrier; the previous unit's last
    // staging finished before its second one
    if (threadIdx.x < mp)
        xrow[threadIdx.x] = !row_index ? slot0 + threadIdx.x
                            : ONE      ? 0
                                       : row_index[slot0 + threadIdx.x];

    float acc[NTT][2][4];
    auto zero_acc = [&]() {
#pragma unroll
        for (int j = 0; j < NTT; j++)
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[j][s2][q] = 0.0f;
    };
    zero_acc();

    // Thread cp stages column pair cp of every slot (16 KCB pairs <= blockDim.x), the loads of
    // SB slots in flight together: one L2 round trip per SB slots. (One slot per iteration, its
    // row looked up each time, made a prefill chunk of 11 slots a chain of 22 dependent loads:
    // ~6x the weight bytes' time at 512 rows, kernels/NOTES.md.) The first SB slots of the next
    // chunk are loaded before the current chunk is consumed, so at decode (1-2 slots per
    // expert) no staging waits for L2; their rows are kept in registers. 4 of them at NTT = 2
    // (items of up to 16 slots: ~5 at 256 rows under uniform routing), 1.5-3% faster than 2
    // from 64 to 256 rows there; 8 at NTT = 4 (~11 slots an item at 256 rows of the synthetic
    // router): 1-3% faster than 4 from 64 to 256 rows, and fewer spills (ptxas, split: 24 / 24
    // bytes against 76 / 128).
    static_assert(16 * KCB <= W4_NW * 32, "one column pair per thread");
    constexpr int SB = NTT == 1 ? 2 : NTT == 2 ? 4 : 8;
    const int cp = threadIdx.x;
    int rr[SB];
#pragma unroll
    for (int u = 0; u < SB; u++)
        rr[u] = u >= mp ? 0 : !row_index ? slot0 + u : ONE ? 0 : row_index[slot0 + u];
    float2 vn[SB]; // the next chunk's first SB slots, column pair cp
    auto load_next = [&](int kc) {
        if (cp < min(kb1 - kc, KCB) * 16) {
            const float *xc = X + (size_t)kc * 32 + 2 * cp;
#pragma unroll
            for (int u = 0; u < SB; u++)
                if (u < mp) vn[u] = *reinterpret_cast<const float2 *>(xc + (size_t)rr[u] * x_ld);
        }
    };
    // Up to 4 slots (decode: most experts hold 1-2 tokens) the lo halves go into rows 4-7 of the
    // hi tile instead of a tile of their own: one MMA then yields both products, in different
    // output columns, which the epilogue adds. Half the MMAs of a split unit, where the 8-token
    // n-tile was mostly empty anyway. The sums round differently from the lo tile's: only an
    // expert's only item can be this short (moe_route_block cuts longer experts evenly).
    const bool packed = SPLIT && mp <= 4;
    auto store_x = [&](int m, int xp, float2 v) {
        const uint32_t hi = k25_pack_bf16x2(v.x, v.y);
        xs[m * XS + xp] = hi;
        if (SPLIT) {
            const uint32_t lo = k25_pack_bf16x2(v.x - k25_bf16_lo(hi), v.y - k25_bf16_hi(hi));
            (packed ? xs + (m + 4) * XS : xl + m * XS)[xp] = lo;
        }
    };
    load_next(kb0);

    for (int rt = 0; rt < RG; rt++) { // row tiles; the activations are staged for the first
    const int ntr = nt + rt * W4_NW;
    // kb0 < kb1 (moe_plan makes no empty split): no loop guard, which let the expert id's load
    // sink past the guard, behind the wait for the item's slots (one more dependent load)
    int kc0 = kb0;
    do {
        const int nk = min(kb1 - kc0, KCB);
        const int pairs = nk * 16;
        if (rt == 0) { // block-uniform
        __syncthreads(); // the previous chunk's (or unit's) readers are done with xs
        if (cp < pairs) {
            const float *xc = X + (size_t)kc0 * 32 + 2 * cp;
            const int xp = w4_pair_slot(cp);
#pragma unroll
            for (int u = 0; u < SB; u++)
                if (u < mp) store_x(u, xp, vn[u]);
            for (int m0 = SB; m0 < mp; m0 += SB) {
                float2 v[SB];
#pragma unroll
                for (int u = 0; u < SB; u++)
                    if (m0 + u < mp)
                        v[u] = *reinterpret_cast<const float2 *>(xc + (size_t)xrow[m0 + u] * x_ld);
#pragma unroll
                for (int u = 0; u < SB; u++) {
                    if (m0 + u >= mp) break;
                    store_x(m0 + u, xp, v[u]);
                }
            }
        }
        __syncthreads();
        if (kc0 + KCB < kb1) load_next(kc0 + KCB);
        }
        if (ntr < NT) {
            const int q = consumed % S;
            k25_mbar_wait(&full[warp][q], (consumed / S) & 1);
            if (consumed == 0) K25_STAMP(site, 3);
            const uint4 *rw = reinterpret_cast<const uint4 *>(ring + q * W4_STAGE_BYTES) + lane;
            const uint2 *rs =
                reinterpret_cast<const uint2 *>(ring + q * W4_STAGE_BYTES + W4_STAGE_W) + g;
            // NJ n-tiles of 8 slots, with no guard inside the chunk: the k-blocks form one basic
            // block, so the scheduler interleaves their dequantization and MMA chains (behind
            // a guard per k-block, each chain's latency was paid in turn: ~3 warps per
            // scheduler do not hide it). Slots past mp and k-blocks past nk compute on stale
            // staging and ring bytes: an MMA's output column depends only on its own slot, and
            // a partial chunk (!FULL) drops the k-blocks past nk by selection, not by product.
            auto consume = [&](auto nj_tag, auto full_tag, auto lo_tag) {
                constexpr int NJ = decltype(nj_tag)::value;
                constexpr bool FULL = decltype(full_tag)::value;
                constexpr bool LO = decltype(lo_tag)::value; // the lo halves in a tile of their own
#pragma unroll
                for (int u = 0; u < KCB; u++) {
                    const bool live = FULL || u < nk;
                    const uint4 w = rw[u * 32];
                    const uint2 sc = rs[u * 8];
                    uint32_t a[2][2][4];
                    dequant_word(w.x, a[0][0]);
                    dequant_word(w.y, a[0][1]);
                    dequant_word(w.z, a[1][0]);
                    dequant_word(w.w, a[1][1]);
                    const float sv[4] = {k25_bf16_lo(sc.x), k25_bf16_hi(sc.x),
                                         k25_bf16_lo(sc.y), k25_bf16_hi(sc.y)};
                    const int pl2 = u * 16; // pair offset of this k-block in xs
#pragma unroll
                    for (int j = 0; j < NJ; j++) {
                        const uint4 xv = *reinterpret_cast<const uint4 *>(
                            xs + (j * 8 + g) * XS + pl2 + 4 * c);
                        const uint32_t b00 = xv.x, b01 = xv.y, b10 = xv.z, b11 = xv.w;
                        uint32_t l00 = 0, l01 = 0, l10 = 0, l11 = 0;
                        if (LO) {
                            const uint4 lv = *reinterpret_cast<const uint4 *>(
                                xl + (j * 8 + g) * XS + pl2 + 4 * c);
                            l00 = lv.x, l01 = lv.y, l10 = lv.z, l11 = lv.w;
                        }
#pragma unroll
                        for (int s2 = 0; s2 < 2; s2++) {
                            const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                            float tmp[4];
                            mma_bf16_16816(tmp, a[s2][0], b00, b01, z);
                            mma_bf16_16816(tmp, a[s2][1], b10, b11, tmp);
                            if (LO) {
                                mma_bf16_16816(tmp, a[s2][0], l00, l01, tmp);
                                mma_bf16_16816(tmp, a[s2][1], l10, l11, tmp);
                            }
#pragma unroll
                            for (int q = 0; q < 4; q++) {
                                const float v = acc[j][s2][q] + tmp[q] * sv[2 * s2 + (q >> 1)];
                                acc[j][s2][q] = live ? v : acc[j][s2][q];
                            }
                        }
                    }
                }
            };
            // n-tiles holding the unit's slots (NTT = 4: 3 rounds up to 4)
            const int nj = (mp + 7) >> 3;
            using lo_t = std::integral_constant<bool, SPLIT>;
            auto run = [&](auto full_tag) {
                if (packed)
                    consume(std::integral_constant<int, 1>(), full_tag, std::false_type());
                else if (NTT == 1 || nj == 1)
                    consume(std::integral_constant<int, 1>(), full_tag, lo_t());
                else if (NTT == 2 || nj == 2)
                    consume(std::integral_constant<int, NTT < 2 ? 1 : 2>(), full_tag, lo_t());
                else
                    consume(std::integral_constant<int, NTT>(), full_tag, lo_t());
            };
            if (nk == KCB) run(std::true_type());
            else run(std::false_type());
            consumed++;
            if (RG == 1) {
                if (kc0 + S * KCB < kb1) issue(0, kc0 + S * KCB);
            } else if (rt + S < RG && ntr + S * W4_NW < NT) {
                issue(rt + S, kb0);
            }
        }
    } while ((kc0 += KCB) < kb1);
    if (ntr < NT) {
        if (packed) // column m + 4 holds slot m's lo product: lane c + 2 (lane ^ 2) has it
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    acc[0][s2][q] += __shfl_xor_sync(0xffffffffu, acc[0][s2][q], 2);
#pragma unroll
        for (int j = 0; j < NTT; j++)
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int tok = j * 8 + 2 * c + (q & 1);
                    if (tok >= mp) continue; // packed: lanes c >= 2 hold columns 4-7, tok >= 4
                    int rl = g + (q >= 2 ? 8 : 0); // row within the 16-row half
                    int n = gate_up ? (s2 == 0 ? ntr * 16 + rl : I + ntr * 16 + rl)
                                    : ntr * 32 + s2 * 16 + rl;
                    part[((size_t)ks * A + slot0 + tok) * N + n] = acc[j][s2][q];
                }
    }
    if (rt + 1 < RG) zero_acc();
    } // row tiles
    if (it == 0) K25_STAMP(site, 4);
    if (h) { // block-uniform
        if (n_splits > 1) {
            // One thread orders the whole block's partial stores (made before the barrier)
            // before the count (release) and the other splits' partials before the block's
            // reads (acquire), as a grid-wide barrier does: an acq_rel fence in one thread, not
            // a sequentially consistent fence (MEMBAR.SC) in every warp.
            __syncthreads();
            if (threadIdx.x == 0) {
                int *cnt = r.tile_done + (size_t)item * rbs + rb;
                asm volatile("fence.acq_rel.gpu;" ::: "memory");
                const int last = atomicAdd(cnt, 1) == n_splits - 1;
                if (last) {
                    *cnt = 0; // every split has counted: ready for the next call
                    asm volatile("fence.acq_rel.gpu;" ::: "memory");
                }
                last_split = last;
            }
            __syncthreads();
            if (it == 0) K25_STAMP(site, 5);
            if (!last_split) continue;
        } else {
            __syncthreads(); // this block's partials are visible to all its threads
        }
        gate_up_tail<W4_TAIL_AHEAD(NTT)>(part, h, (size_t)slot0, mp, rb, I, A, n_splits);
        if (flow) { // every thread's h of the row-block, then the count that releases it
            __syncthreads();
            if (threadIdx.x == 0) k25_red_release_add(r.item_ready + item, 1);
        }
    }
    if (it == 0) K25_STAMP(site, 6);
    } // units
    // FLOW's down GEMM, or one row's whose items had no expert: the launch still ends after
    // gate+up's
    if (!waited) k25_pdl_wait();
    K25_STAMP(site, 7);
    K25_STAMP_UNITS(site, it);
}


int k25k_split_activations(void) {
    static int v = -1;
    if (v < 0) v = !k25_env_flag("K25_BF16_ACTIVATIONS");
    return v;
}

int k25k_moe_row_blocks(int N) { return (int)k25_cdiv(N / 32, W4_NW); }

int k25k_moe_max_items(int T, int top_k, int E) {
    int A = T * top_k;
    return (A < E ? A : E) + (int)k25_cdiv(A, K25K_MOE_PASS_MIN);
}

// Resident blocks per SM of one instantiation (the persistent grid's size), asked once; the
// first call also lets the kernel have its ring (more than the default dynamic shared memory
// for some instantiations). No carveout preference: with cudaSharedmemCarveoutMaxShared set,
// batch-1 decode lost 0.13 ms a token (61 layers), the same kernels with programmatic
// dependent launch off did not (bench/NOTES.md): the SMs' L1 / shared-memory split then
// differs from the kernels around it, and an SM is reconfigured only once it is empty.
template <int NTT, bool SPLIT, bool ONE, bool RGS, bool FLOW> static int w4_blocks_per_sm(void) {
    static int v = 0;
    if (!v) {
        int b = 0;
        auto *kernel = w4a16_grouped_kernel<NTT, SPLIT, ONE, RGS, FLOW>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        W4_RING_BYTES));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, W4_NW * 32,
                                                                 W4_RING_BYTES));
        v = b > 0 ? b : 1;
    }
    return v;
}

template <int NTT, bool ONE = false, bool RGS = false, bool FLOW = false>
static int w4_blocks_per_sm(void) {
    return k25k_split_activations() ? w4_blocks_per_sm<NTT, true, ONE, RGS, FLOW>()
                                    : w4_blocks_per_sm<NTT, false, ONE, RGS, FLOW>();
}

// Blocks of the grouped GEMM resident at once for steps of T rows (the persistent grid), of the
// instantiation w4_ntt(T).
static int w4_resident(int T, int num_sms) {
    const int n = w4_ntt(T);
    const int b = n == 1 ? w4_blocks_per_sm<1>() : n == 2 ? w4_blocks_per_sm<2>()
                                                          : w4_blocks_per_sm<4>();
    return b * (num_sms > 0 ? num_sms : 1);
}

int k25k_moe_route_target(int T, int num_sms) { return w4_resident(T, num_sms); }

size_t k25k_moe_part_floats(int N, int K, int A, int num_sms) {
    if (A <= 0) return 0;
    // the plan is largest for the fewest items (at least ceil(A / PASS), moe_route_kernel) and
    // the largest target (any T)
    int target = w4_resident(1, num_sms), t2 = w4_resident(16, num_sms),
        t4 = w4_resident(17, num_sms);
    if (t2 > target) target = t2;
    if (t4 > target) target = t4;
    int ns, kb;
    moe_plan(N, K, (int)k25_cdiv(A, K25K_MOE_PASS), target, K25K_MOE_OVER, &ns, &kb);
    return (size_t)ns * A * N;
}

// one_splits: the one-row plan's split count (ONE), else 0 (the plan is the device's)
template <int NTT, bool ONE, bool RGS, bool FLOW>
static void w4_launch_as(const uint4 *w4, const uint2 *s2, size_t w_stride, size_t s_stride,
                         int N, int K, int gate_up, const float *X, int x_ld,
                         const int *row_index, const k25k_moe_route *r, int A, int max_units,
                         int num_sms, float *part, float *h, int one_splits, cudaStream_t s) {
    int64_t grid = (int64_t)w4_blocks_per_sm<NTT, ONE, RGS, FLOW>() * (num_sms > 0 ? num_sms : 1);
    if (grid > max_units) grid = max_units;
    if (grid < 1) grid = 1;
    auto *kernel = k25k_split_activations() ? w4a16_grouped_kernel<NTT, true, ONE, RGS, FLOW>
                                            : w4a16_grouped_kernel<NTT, false, ONE, RGS, FLOW>;
    k25_launch("w4a16_grouped", kernel, (unsigned)grid, W4_NW * 32, W4_RING_BYTES, s, w4, s2,
               w_stride, s_stride, N, K, gate_up, X, x_ld, row_index, *r, gate_up ? 0 : 2, part,
               A, gate_up ? h : NULL, one_splits);
}

// The instantiation of a step of NTT-tile items: with row groups (RGS) or FLOW (both GEMMs of
// the step, or neither) or both
template <int NTT>
static void w4_launch(const uint4 *w4, const uint2 *s2, size_t w_stride, size_t s_stride, int N,
                      int K, int gate_up, const float *X, int x_ld, const int *row_index,
                      const k25k_moe_route *r, int A, int max_units, int num_sms,
                      float *part, float *h, bool row_groups, bool flow, cudaStream_t s) {
    auto as = [&](auto rgs, auto fl) {
        w4_launch_as<NTT, false, decltype(rgs)::value, decltype(fl)::value>(
            w4, s2, w_stride, s_stride, N, K, gate_up, X, x_ld, row_index, r, A, max_units,
            num_sms, part, h, 0, s);
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (row_groups) flow ? as(yes(), yes()) : as(yes(), no());
    else flow ? as(no(), yes()) : as(no(), no());
}

void k25k_moe_w4a16_gemm(const uint32_t *Wt, const uint16_t *St, int E, int N, int K,
                         int gate_up, const float *X, int x_ld, const int *row_index,
                         const k25k_moe_route *r, int T, int top_k, int num_sms, float *part,
                         float *h, cudaStream_t s) {
    const int A = T * top_k;
    if (A <= 0) return;
    size_t w_stride = (size_t)(N / 32) * (K / 32) * 32; // uint4 per expert
    size_t s_stride = (size_t)(N / 32) * (K / 32) * 8;  // uint2 per expert
    const int64_t rbs = k25_cdiv(N / 32, W4_NW);
    // units = items x rbs x n_splits <= K25K_MOE_OVER x target + items x rbs (moe_plan): no
    // more blocks
    int64_t mu = (int64_t)K25K_MOE_OVER * w4_resident(T, num_sms) +
                 rbs * k25k_moe_max_items(T, top_k, E);
    const int max_units = (int)(mu < (1 << 30) ? mu : (1 << 30));
    const uint4 *w4 = reinterpret_cast<const uint4 *>(Wt);
    const uint2 *s2 = reinterpret_cast<const uint2 *>(St);
    const int ntt = w4_ntt(T);
    // Row groups (the kernel's RGS) for the down GEMM's one-chunk tiles from this many rows. Its
    // own instantiation: where both GEMMs run one kernel's code, the row-tile loop's registers
    // cost gate+up 5% at 16 rows; as a second kernel it costs the instruction cache of every
    // launch, which short steps do not win back (bench/NOTES.md: 16 rows 3% slower, 64 even, 256
    // rows 3% faster).
    const bool row_groups = !gate_up && K <= W4_KCB * 32 && T >= W4_ROW_GROUP_ROWS;
    const int flow_rows = moe_knobs_read().flow_rows;
    const bool flow = flow_rows > 0 && T >= flow_rows;
    if (T == 1 && top_k <= K25K_MOE_ONE_MAX_K) {
        // the plan the routing sort writes (k25k_moe_sort_opts)
        const moe_sort_opts o = k25k_moe_sort_opts(T, top_k, gate_up ? N / 2 : K,
                                                   gate_up ? K : N, num_sms);
        const int ns = o.one_plan[gate_up ? 0 : 2];
        w4_launch_as<1, true, false, false>(w4, s2, w_stride, s_stride, N, K, gate_up, X, x_ld,
                                            row_index, r, A, (int)(rbs * A * ns), num_sms, part,
                                            h, ns, s);
    } else if (ntt == 1)
        w4_launch<1>(w4, s2, w_stride, s_stride, N, K, gate_up, X, x_ld, row_index, r, A,
                     max_units, num_sms, part, h, row_groups, flow, s);
    else if (ntt == 2)
        w4_launch<2>(w4, s2, w_stride, s_stride, N, K, gate_up, X, x_ld, row_index, r, A,
                     max_units, num_sms, part, h, row_groups, flow, s);
    else
        w4_launch<4>(w4, s2, w_stride, s_stride, N, K, gate_up, X, x_ld, row_index, r, A,
                     max_units, num_sms, part, h, row_groups, flow, s);
}

// ------------------------------------------------------------------------------------------
// BF16 experts (checkpoints without INT4): the same grouping, CUDA-core dot products
// ------------------------------------------------------------------------------------------

// Warp per output row n of the expert; all of the expert's slots.
__global__ void __launch_bounds__(256) bf16_grouped_kernel(
    const uint16_t *const *__restrict__ Wa, const uint16_t *const *__restrict__ Wb, int N, int K,
    int gate_up, const float *__restrict__ X, int x_ld, const int *__restrict__ row_index,
    k25k_moe_route r, float *__restrict__ part, int A) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const int i = blockIdx.y;
    if (i >= *r.n_active) return;
    const int e = r.active[i];
    const int M = r.counts[e], m0 = r.offsets[e];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + warp;
    if (n >= N) return;
    const int I = N / 2;
    const uint16_t *w = gate_up ? (n < I ? Wa[e] + (size_t)n * K : Wb[e] + (size_t)(n - I) * K)
                                : Wa[e] + (size_t)n * K;
    for (int j = 0; j < M; j++) {
        int slot = m0 + j;
        const float *x = X + (size_t)(row_index ? row_index[slot] : slot) * x_ld;
        float acc = 0.0f;
        for (int k = lane; k < K; k += 32) acc += k25_bf16f(w[k]) * x[k];
        acc = k25_warp_sum(acc);
        if (lane == 0) part[(size_t)slot * N + n] = acc;
    }
}

void k25k_moe_bf16_gemm(const uint16_t *const *Wa, const uint16_t *const *Wb, int N, int K,
                        int gate_up, const float *X, int x_ld, const int *row_index,
                        const k25k_moe_route *r, int max_active, int A, float *part,
                        cudaStream_t s) {
    if (A <= 0 || max_active <= 0) return;
    dim3 grid((unsigned)k25_cdiv(N, 8), (unsigned)max_active);
    k25_launch("bf16_grouped", bf16_grouped_kernel, grid, 256, 0, s, Wa, Wb, N, K, gate_up, X, x_ld,
               row_index, *r, part, A);
}

// ------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------

// Loads of the split partials are issued together (independent accumulators per group of 8
// splits), then summed in a fixed order.
__global__ void moe_gate_up_reduce_kernel(const float *__restrict__ part,
                                          const int *__restrict__ n_splits_dev, int A, int I,
                                          float *__restrict__ h) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const int n_splits = n_splits_dev ? *n_splits_dev : 1;
    size_t n = (size_t)A * I;
    for (size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x; id < n;
         id += (size_t)gridDim.x * blockDim.x) {
        size_t slot = id / I, i = id % I;
        h[id] = gate_up_sum(part + slot * 2 * I + i, (size_t)A * 2 * I, n_splits, I);
    }
}

// A choice's term of a token's sum: its weight times its expert's output y; NaN for a choice
// whose expert id was invalid (slot -1: never silent), nothing for one past top_k (slot -2).
template <int V>
__device__ __forceinline__ void combine_term(float (&acc)[V], int sl, float w,
                                             const float (&y)[V]) {
    if (sl == -1) {
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = __int_as_float(0x7fc00000);
    } else if (sl >= 0) {
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] += w * y[v];
    }
}

// out = acc + add (add NULL: acc), add's values loaded with the partials
template <int V>
__device__ __forceinline__ void combine_store(float *out, const float (&acc)[V],
                                              const float (&ad)[V], bool has_add) {
    float r[V];
#pragma unroll
    for (int v = 0; v < V; v++) r[v] = has_add ? acc[v] + ad[v] : acc[v];
    k25_stv<V>(out, r);
}

// One thread per V consecutive output elements of a token (V = 4 where D and the pointers allow:
// 16-byte loads); the top_k x n_splits partials it needs are loaded first. Each element's sum
// has the same order for either V.
template <int V>
__global__ void moe_combine_kernel(const float *__restrict__ part,
                                   const int *__restrict__ n_splits_dev, int A, int D,
                                   const int *__restrict__ slot_of, const float *__restrict__ wts,
                                   int T, int top_k, const float *__restrict__ add,
                                   float *__restrict__ out) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const int n_splits = n_splits_dev ? *n_splits_dev : 1;
    size_t n = (size_t)T * D;
    for (size_t id = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * V; id < n;
         id += (size_t)gridDim.x * blockDim.x * V) {
        int t = (int)(id / D), d = (int)(id % D);
        float acc[V], ad[V];
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = 0.0f;
        if (add) k25_ldv<V>(add + id, ad);
        for (int k0 = 0; k0 < top_k; k0 += 8) {
            // the loads of a round unpredicated, so that they are in flight together (a choice
            // past top_k, or without a slot, reads slot 0's row and its sum is not used):
            // predicated, each partial's load was waited for before the next one's
            float y[8][V], w[8];
            int sl[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int a = t * top_k + (k0 + u < top_k ? k0 + u : 0);
                sl[u] = k0 + u < top_k ? slot_of[a] : -2;
                w[u] = wts[a];
            }
            // the first split outside the loop: inside it, the loads were each waited for
            // before the next one's anyway (the scheduler's choice)
#pragma unroll
            for (int u = 0; u < 8; u++)
                k25_ldv<V>(part + (size_t)(sl[u] >= 0 ? sl[u] : 0) * D + d, y[u]);
#pragma unroll
            for (int u = 0; u < 8; u++)
#pragma unroll
                for (int v = 0; v < V; v++) y[u][v] = 0.0f + y[u][v];
            for (int ks = 1; ks < n_splits; ks++)
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    float p[V];
                    k25_ldv<V>(part + ((size_t)ks * A + (sl[u] >= 0 ? sl[u] : 0)) * D + d, p);
#pragma unroll
                    for (int v = 0; v < V; v++) y[u][v] += p[v];
                }
#pragma unroll
            for (int u = 0; u < 8; u++) combine_term<V>(acc, sl[u], w[u], y[u]);
        }
        combine_store<V>(out + id, acc, ad, add != nullptr);
    }
}

// One row (A = top_k <= 8 choices): the same sums, in the same order, without the chain of a
// choice's slot, then its partials: every slot's first partial is loaded with the choices' slots
// and weights (slot s of a one-row step holds one of the choices, whichever), and a choice then
// picks its slot's sum from registers. One L2 round trip after the wait, where the other kernel
// has two (the down GEMM's plan has one split at one row; more splits add one).
// p ? a : b as one selp: written in C, a chain of them over an array became an indexed load
// from the thread's stack
__device__ __forceinline__ float select_f32(bool p, float a, float b) {
    float r;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.s32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}"
        : "=f"(r)
        : "f"(a), "f"(b), "r"((int)p));
    return r;
}

template <int V>
__global__ void moe_combine_one_kernel(const float *__restrict__ part,
                                       const int *__restrict__ n_splits_dev, int A, int D,
                                       const int *__restrict__ slot_of,
                                       const float *__restrict__ wts,
                                       const float *__restrict__ add, float *__restrict__ out) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const int n_splits = n_splits_dev ? *n_splits_dev : 1;
    // one pass (the grid covers D): in a grid-stride loop the choices' slots were loaded and
    // compared ahead of the loop, and their round trip waited for before the partials' loads
    const int d = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (d < D) {
        // every load issued before the first use: unpredicated (slots past A read slot 0's row
        // and are never picked), predicated ones were each waited for before the next
        int sl[8];
        float w[8], y[8][V], ad[V];
#pragma unroll
        for (int u = 0; u < 8; u++) k25_ldv<V>(part + (size_t)(u < A ? u : 0) * D + d, y[u]);
        if (add) k25_ldv<V>(add + d, ad);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            sl[u] = slot_of[u < A ? u : 0];
            w[u] = wts[u < A ? u : 0];
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            sl[u] = u < A ? sl[u] : -2;
#pragma unroll
            for (int v = 0; v < V; v++) y[u][v] = 0.0f + y[u][v];
        }
        for (int ks = 1; ks < n_splits; ks++)
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (u < A) {
                    float p[V];
                    k25_ldv<V>(part + ((size_t)ks * A + u) * D + d, p);
#pragma unroll
                    for (int v = 0; v < V; v++) y[u][v] += p[v];
                }
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float ys[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                ys[v] = y[0][v];
#pragma unroll
                for (int u = 1; u < 8; u++) ys[v] = select_f32(sl[k] == u, y[u][v], ys[v]);
            }
            combine_term<V>(acc, sl[k], w[k], ys);
        }
        combine_store<V>(out + d, acc, ad, add != nullptr);
    }
}

static int grid_1d(size_t n) { // 128-thread blocks: small reductions spread over more SMs
    size_t b = (n + 127) / 128;
    return (int)(b > 32768 ? 32768 : (b ? b : 1));
}

void k25k_moe_gate_up_reduce(const float *part, const int *n_splits, int A, int I, float *h,
                             cudaStream_t s) {
    if (A <= 0) return;
    k25_launch("moe_gate_up_reduce", moe_gate_up_reduce_kernel, grid_1d((size_t)A * I), 128, 0, s,
               part, n_splits, A, I, h);
}

void k25k_moe_combine(const float *part, const int *n_splits, int A, int D, const int *slot_of,
                      const float *wts, int T, int top_k, const float *add, float *out,
                      cudaStream_t s) {
    if (T <= 0) return;
    const size_t n = (size_t)T * D;
    const bool v4 = k25_vec4((size_t)D, {part, out, add}); // a NULL add passes
    if (T == 1 && top_k <= 8) {
        if (v4)
            k25_launch("moe_combine", moe_combine_one_kernel<4>, (int)k25_cdiv(D / 4, 128), 128,
                       0, s, part, n_splits, A, D, slot_of, wts, add, out);
        else
            k25_launch("moe_combine", moe_combine_one_kernel<1>, (int)k25_cdiv(D, 128), 128, 0, s,
                       part, n_splits, A, D, slot_of, wts, add, out);
    } else if (v4)
        k25_launch("moe_combine", moe_combine_kernel<4>, grid_1d(n / 4), 128, 0, s, part,
                   n_splits, A, D, slot_of, wts, T, top_k, add, out);
    else
        k25_launch("moe_combine", moe_combine_kernel<1>, grid_1d(n), 128, 0, s, part, n_splits,
                   A, D, slot_of, wts, T, top_k, add, out);
}

// This file's phase stamps (kernels/phases.cu reads them)
K25_PHASES_READER(k25k_phases_read_moe)
