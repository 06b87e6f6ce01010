// Routed experts on the GPU: device-side routing (a counting sort of the T*top_k choices into
// per-expert slot lists), the grouped W4A16 GEMM over all active experts of a step in one
// launch (gate+up, then down), the SiLU*up reduction and the weighted per-token combine.
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
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.cuh"

// ------------------------------------------------------------------------------------------
// Routing: counting sort of the choices by expert
// ------------------------------------------------------------------------------------------


// One block. counts/offsets per expert, the active experts in ascending id, and for every
// choice a = t*top_k + k its slot (position in the expert-sorted list) and the slot's token.
// The order of slots inside an expert depends on atomics, which is harmless: every slot's
// result depends only on its own token and expert.
__global__ void __launch_bounds__(1024) moe_route_kernel(const int32_t *__restrict__ idx, int A,
                                                         int top_k, int E, k25k_moe_route r) {
    extern __shared__ int sm[];
    int *cnt = sm, *fill = sm + E;
    __shared__ int tot[32];
    __shared__ int run_slots, run_active, run_items;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    if (threadIdx.x == 0) run_slots = run_active = run_items = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < A; a += blockDim.x) {
        int e = idx[a];
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1);
        else
            atomicExch(r.err, 1);
    }
    __syncthreads();
    for (int base = 0; base < E; base += blockDim.x) {
        int e = base + threadIdx.x;
        int v = e < E ? cnt[e] : 0, f = v > 0, np = (v + K25K_MOE_PASS - 1) / K25K_MOE_PASS;
        int total_v, total_f, total_p;
        int iv = k25_block_incl_scan(v, tot, &total_v);
        int iff = k25_block_incl_scan(f, tot, &total_f);
        int ip = k25_block_incl_scan(np, tot, &total_p);
        if (e < E) {
            int off = run_slots + iv - v;
            r.offsets[e] = off;
            r.counts[e] = v;
            fill[e] = off;
            if (f) r.active[run_active + iff - 1] = e;
            for (int p = 0, it = run_items + ip - np; p < np; p++, it++) {
                r.item_expert[it] = e;
                r.item_p0[it] = p * K25K_MOE_PASS;
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
    __syncthreads();
    for (int a = threadIdx.x; a < A; a += blockDim.x) {
        int e = idx[a];
        if (e >= 0 && e < E) {
            int pos = atomicAdd(&fill[e], 1);
            r.slot_token[pos] = a / top_k;
            r.slot_of[a] = pos;
        } else {
            r.slot_of[a] = -1;
        }
    }
}

void k25k_moe_sort(const int32_t *idx, int T, int top_k, int E, const k25k_moe_route *r,
                    cudaStream_t s) {
    int A = T * top_k;
    if (A <= 0) return;
    size_t smem = sizeof(int) * 2 * (size_t)E;
    if (smem > 48 * 1024) K25_DIE("moe routing: %d experts exceed the shared-memory sort", E);
    moe_route_kernel<<<1, 1024, smem, s>>>(idx, A, top_k, E, *r);
    K25_LAUNCH_CHECK(s, "moe_route");
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

#define W4_NW 4          // warps per block, one 32-row tile each
#define W4_MP K25K_MOE_PASS // tokens per work item (at most 4 MMA n-tiles)
#define W4_KCB 8         // k-blocks (of 32) staged in shared memory at a time
#define W4_XS (W4_KCB * 16 + 4) // words per staged row: bf16 pairs + 16 bytes of padding
#define W4_PF 8          // weight loads in flight per lane

__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1, const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
}

// One packed word -> the four bf16x2 registers of an A fragment, exact signed values.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t r[4]) {
    const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16((unsigned short)0x4308),
                                                   __ushort_as_bfloat16((unsigned short)0x4308));
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t t = ((w >> (4 * j)) & 0x000f000fu) | 0x43004300u;
        __nv_bfloat162 v = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&t), bias);
        r[j] = *reinterpret_cast<uint32_t *>(&v);
    }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)k25_f2bf(lo) | ((uint32_t)k25_f2bf(hi) << 16);
}

// Grid: x = row-blocks (W4_NW tiles each) x n_splits, y = the most work items a step can have
// (an item: one expert and up to W4_MP of its slots; blocks past the device-side count exit at
// once). Each block streams its tiles' weights over its K range once.
//   X: activation rows [*][x_ld] f32; row of slot j is row_index[j] (gate_up: the slot's token)
//      or j itself (down: the slot's intermediate row).
//   part: [n_splits][A][N] f32 (gate_up: gate at [0, I), up at [I, 2I)).
// NTT: MMA n-tiles of 8 tokens kept in registers (1 when no expert can have more than 8 slots).
// split: activations as two bf16 operands, hi = bf16(x) and lo = bf16(x - hi), each multiplied
// by the exact INT4 weights (twice the MMAs, about f32 accuracy); otherwise hi only.
template <int NTT>
__global__ void __launch_bounds__(W4_NW * 32) w4a16_grouped_kernel(
    const uint4 *__restrict__ Wt, const uint2 *__restrict__ St, size_t w_stride, size_t s_stride,
    int N, int K, int gate_up, const float *__restrict__ X, int x_ld,
    const int *__restrict__ row_index, k25k_moe_route r, int n_splits, int kb_per_split,
    float *__restrict__ part, int A, int split) {
    __shared__ uint32_t xs[NTT * 8 * W4_XS];
    __shared__ uint32_t xl[NTT * 8 * W4_XS];
    const int item = blockIdx.y;
    if (item >= *r.n_items) return;
    const int e = r.item_expert[item], p0 = r.item_p0[item];
    const int M = r.counts[e], m0 = r.offsets[e];
    const int mp = min(NTT * 8, M - p0);
    const int NT = N / 32, KB = K / 32;
    const int rb = blockIdx.x / n_splits, ks = blockIdx.x % n_splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int nt = rb * W4_NW + warp;
    const int kb0 = ks * kb_per_split;
    const int kb1 = min(KB, kb0 + kb_per_split);
    const uint4 *wt = Wt + (size_t)e * w_stride + (size_t)nt * KB * 32 + lane;
    const uint2 *st = St + (size_t)e * s_stride + (size_t)nt * KB * 8 + g;
    const int I = N / 2;

    float acc[NTT][2][4];
#pragma unroll
    for (int j = 0; j < NTT; j++)
#pragma unroll
        for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[j][s2][q] = 0.0f;

    for (int kc0 = kb0; kc0 < kb1; kc0 += W4_KCB) {
        const int nk = min(kb1 - kc0, W4_KCB);
        const int pairs = nk * 16;
        // the first weight loads go out before the activations are staged (independent)
        uint4 wbuf[W4_PF];
        uint2 sbuf[W4_PF];
        if (nt < NT) {
#pragma unroll
            for (int u = 0; u < W4_PF; u++)
                if (u < nk) {
                    wbuf[u] = __ldcs(wt + (size_t)(kc0 + u) * 32);
                    sbuf[u] = __ldcs(st + (size_t)(kc0 + u) * 8);
                }
        }
        __syncthreads(); // the previous chunk's readers are done with xs
        for (int id = threadIdx.x; id < mp * pairs; id += blockDim.x) {
            int m = id / pairs, cp = id - m * pairs;
            int slot = m0 + p0 + m;
            int row = row_index ? row_index[slot] : slot;
            float2 v = *reinterpret_cast<const float2 *>(X + (size_t)row * x_ld +
                                                         (size_t)kc0 * 32 + 2 * cp);
            uint32_t hi = pack_bf16x2(v.x, v.y);
            xs[m * W4_XS + cp] = hi;
            if (split) xl[m * W4_XS + cp] = pack_bf16x2(v.x - k25_bf16_lo(hi), v.y - k25_bf16_hi(hi));
        }
        __syncthreads();
        if (nt < NT) {
            for (int kb = 0; kb < nk; kb += W4_PF) {
#pragma unroll
                for (int u = 0; u < W4_PF; u++) {
                    if (kb + u < nk) {
                        const uint4 w = wbuf[u];
                        const uint2 sc = sbuf[u];
                        if (kb + u + W4_PF < nk) {
                            wbuf[u] = __ldcs(wt + (size_t)(kc0 + kb + u + W4_PF) * 32);
                            sbuf[u] = __ldcs(st + (size_t)(kc0 + kb + u + W4_PF) * 8);
                        }
                        uint32_t a[2][2][4];
                        dequant_word(w.x, a[0][0]);
                        dequant_word(w.y, a[0][1]);
                        dequant_word(w.z, a[1][0]);
                        dequant_word(w.w, a[1][1]);
                        const float sv[4] = {k25_bf16_lo(sc.x), k25_bf16_hi(sc.x),
                                             k25_bf16_lo(sc.y), k25_bf16_hi(sc.y)};
                        const int pl = (kb + u) * 16; // pair offset of this k-block in xs
#pragma unroll
                        for (int j = 0; j < NTT; j++) {
                            if (j * 8 < mp) {
                                const uint32_t *xr = xs + (j * 8 + g) * W4_XS + pl + c;
                                const uint32_t b00 = xr[0], b01 = xr[4];
                                const uint32_t b10 = xr[8], b11 = xr[12];
                                uint32_t l00 = 0, l01 = 0, l10 = 0, l11 = 0;
                                if (split) {
                                    const uint32_t *lr = xl + (j * 8 + g) * W4_XS + pl + c;
                                    l00 = lr[0], l01 = lr[4], l10 = lr[8], l11 = lr[12];
                                }
#pragma unroll
                                for (int s2 = 0; s2 < 2; s2++) {
                                    const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                    float tmp[4];
                                    mma_bf16_16816(tmp, a[s2][0], b00, b01, z);
                                    mma_bf16_16816(tmp, a[s2][1], b10, b11, tmp);
                                    if (split) {
                                        mma_bf16_16816(tmp, a[s2][0], l00, l01, tmp);
                                        mma_bf16_16816(tmp, a[s2][1], l10, l11, tmp);
                                    }
                                    acc[j][s2][0] += tmp[0] * sv[2 * s2];
                                    acc[j][s2][1] += tmp[1] * sv[2 * s2];
                                    acc[j][s2][2] += tmp[2] * sv[2 * s2 + 1];
                                    acc[j][s2][3] += tmp[3] * sv[2 * s2 + 1];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if (nt < NT) {
#pragma unroll
        for (int j = 0; j < NTT; j++)
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int tok = j * 8 + 2 * c + (q & 1);
                    if (tok >= mp) continue;
                    int rl = g + (q >= 2 ? 8 : 0); // row within the 16-row half
                    int n = gate_up ? (s2 == 0 ? nt * 16 + rl : I + nt * 16 + rl)
                                    : nt * 32 + s2 * 16 + rl;
                    part[((size_t)ks * A + m0 + p0 + tok) * N + n] = acc[j][s2][q];
                }
    }
}

void k25k_moe_splits(int N, int K, int max_active, int num_sms, int *n_splits,
                     int *kb_per_split) {
    int KB = K / 32;
    int rbs = (int)k25_cdiv(N / 32, W4_NW);
    int64_t base = (int64_t)rbs * (max_active > 0 ? max_active : 1);
    int64_t want = (int64_t)4 * num_sms;
    int ns = (int)(base >= want ? 1 : k25_cdiv(want, base));
    if (ns > KB / 2) ns = KB / 2 > 0 ? KB / 2 : 1; // keep >= 2 k-blocks per split
    if (ns < 1) ns = 1;
    int per = (int)k25_cdiv(KB, ns);
    *kb_per_split = per;
    *n_splits = (int)k25_cdiv(KB, per); // no empty split: every split writes its partials
}

int k25k_split_activations(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("K25_BF16_ACTIVATIONS");
        v = !(e && *e && strcmp(e, "0") != 0);
    }
    return v;
}

int k25k_moe_max_items(int T, int top_k, int E) {
    int A = T * top_k;
    return (A < E ? A : E) + (int)k25_cdiv(A, K25K_MOE_PASS);
}

void k25k_moe_w4a16_gemm(const uint32_t *Wt, const uint16_t *St, int E, int N, int K,
                         int gate_up, const float *X, int x_ld, const int *row_index,
                         const k25k_moe_route *r, int T, int top_k, int n_splits,
                         int kb_per_split, float *part, cudaStream_t s) {
    const int A = T * top_k;
    if (A <= 0) return;
    size_t w_stride = (size_t)(N / 32) * (K / 32) * 32; // uint4 per expert
    size_t s_stride = (size_t)(N / 32) * (K / 32) * 8;  // uint2 per expert
    int rbs = (int)k25_cdiv(N / 32, W4_NW);
    dim3 grid((unsigned)(rbs * n_splits), (unsigned)k25k_moe_max_items(T, top_k, E));
    const int split = k25k_split_activations();
    const uint4 *w4 = reinterpret_cast<const uint4 *>(Wt);
    const uint2 *s2 = reinterpret_cast<const uint2 *>(St);
    // an expert holds at most T slots (a token chooses an expert once)
    if (T <= 8)
        w4a16_grouped_kernel<1><<<grid, W4_NW * 32, 0, s>>>(w4, s2, w_stride, s_stride, N, K,
                                                            gate_up, X, x_ld, row_index, *r,
                                                            n_splits, kb_per_split, part, A, split);
    else if (T <= 16)
        w4a16_grouped_kernel<2><<<grid, W4_NW * 32, 0, s>>>(w4, s2, w_stride, s_stride, N, K,
                                                            gate_up, X, x_ld, row_index, *r,
                                                            n_splits, kb_per_split, part, A, split);
    else
        w4a16_grouped_kernel<4><<<grid, W4_NW * 32, 0, s>>>(w4, s2, w_stride, s_stride, N, K,
                                                            gate_up, X, x_ld, row_index, *r,
                                                            n_splits, kb_per_split, part, A, split);
    K25_LAUNCH_CHECK(s, "w4a16_grouped");
}

// ------------------------------------------------------------------------------------------
// BF16 experts (checkpoints without INT4): the same grouping, CUDA-core dot products
// ------------------------------------------------------------------------------------------

// Warp per output row n of the expert; all of the expert's slots.
__global__ void __launch_bounds__(256) bf16_grouped_kernel(
    const uint16_t *const *__restrict__ Wa, const uint16_t *const *__restrict__ Wb, int N, int K,
    int gate_up, const float *__restrict__ X, int x_ld, const int *__restrict__ row_index,
    k25k_moe_route r, float *__restrict__ part, int A) {
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
    bf16_grouped_kernel<<<grid, 256, 0, s>>>(Wa, Wb, N, K, gate_up, X, x_ld, row_index, *r, part,
                                             A);
    K25_LAUNCH_CHECK(s, "bf16_grouped");
}

// ------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------

// Loads of the split partials are issued together (independent accumulators per group of 8
// splits), then summed in a fixed order.
__global__ void moe_gate_up_reduce_kernel(const float *__restrict__ part, int n_splits, int A,
                                          int I, float *__restrict__ h) {
    size_t n = (size_t)A * I;
    for (size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x; id < n;
         id += (size_t)gridDim.x * blockDim.x) {
        size_t slot = id / I, i = id % I;
        const float *p = part + slot * 2 * I + i;
        const size_t stride = (size_t)A * 2 * I;
        float g8[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int ks = 0;
        for (; ks + 8 <= n_splits; ks += 8) {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                g8[u] += p[(ks + u) * stride];
                u8[u] += p[(ks + u) * stride + I];
            }
        }
        for (; ks < n_splits; ks++) g8[0] += p[ks * stride], u8[0] += p[ks * stride + I];
        float gs = ((g8[0] + g8[1]) + (g8[2] + g8[3])) + ((g8[4] + g8[5]) + (g8[6] + g8[7]));
        float us = ((u8[0] + u8[1]) + (u8[2] + u8[3])) + ((u8[4] + u8[5]) + (u8[6] + u8[7]));
        h[id] = gs / (1.0f + expf(-gs)) * us;
    }
}

// One thread per output element; the top_k x n_splits partials it needs are loaded first.
__global__ void moe_combine_kernel(const float *__restrict__ part, int n_splits, int A, int D,
                                   const int *__restrict__ slot_of, const float *__restrict__ wts,
                                   int T, int top_k, float *__restrict__ out) {
    size_t n = (size_t)T * D;
    for (size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x; id < n;
         id += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(id / D), d = (int)(id % D);
        float acc = 0.0f;
        for (int k0 = 0; k0 < top_k; k0 += 8) {
            float y[8];
            int sl[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                sl[u] = k0 + u < top_k ? slot_of[t * top_k + k0 + u] : -2;
                y[u] = 0.0f;
            }
            for (int ks = 0; ks < n_splits; ks++) {
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (sl[u] >= 0) y[u] += part[((size_t)ks * A + sl[u]) * D + d];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (sl[u] == -1) acc = __int_as_float(0x7fc00000); // bad expert id: never silent
                else if (sl[u] >= 0) acc += wts[t * top_k + k0 + u] * y[u];
            }
        }
        out[id] = acc;
    }
}

static int grid_1d(size_t n) { // 128-thread blocks: small reductions spread over more SMs
    size_t b = (n + 127) / 128;
    return (int)(b > 32768 ? 32768 : (b ? b : 1));
}

void k25k_moe_gate_up_reduce(const float *part, int n_splits, int A, int I, float *h,
                             cudaStream_t s) {
    if (A <= 0) return;
    moe_gate_up_reduce_kernel<<<grid_1d((size_t)A * I), 128, 0, s>>>(part, n_splits, A, I, h);
    K25_LAUNCH_CHECK(s, "moe_gate_up_reduce");
}

void k25k_moe_combine(const float *part, int n_splits, int A, int D, const int *slot_of,
                      const float *wts, int T, int top_k, float *out, cudaStream_t s) {
    if (T <= 0) return;
    moe_combine_kernel<<<grid_1d((size_t)T * D), 128, 0, s>>>(part, n_splits, A, D, slot_of, wts,
                                                             T, top_k, out);
    K25_LAUNCH_CHECK(s, "moe_combine");
}
