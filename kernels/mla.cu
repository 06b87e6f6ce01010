// MLA attention, absorbed decode form (../shared/KIMI_K25.md §4.5), over the paged bf16 latent
// cache: latent RMSNorm + YaRN RoPE + cache write, q absorption (q_abs = q_nope W_UK per head),
// split-sequence attention (flash-decoding: every block handles a chunk of the positions of one
// row for a group of heads, reading each cache row once for all of them; bf16 cache on tensor
// cores, f32 cache on CUDA cores), the merge of the chunks, and the output projection through
// W_UV.
//
// Prefill (more rows than the GEMV limit): the absorption and the W_UV projection are per-head
// GEMMs on cuBLASLt instead (bf16 hi + lo split of the f32 activations, f32 accumulation).
//
// Shapes (local heads H): q [T][H][dn+dr], kv [T][L+dr] (raw kv_a output), out [T][H][dv];
// cache [n_blocks*kv_block][L+dr] per layer, bf16 (default) or f32 (K25_KV_F32=1: the exact
// latents, for bit-closeness to a float32 reference); kv_b [H*(dn+dv)][L] bf16.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <limits.h>
#include <stdlib.h>

#include "cuda_kernels.cuh"

#define MLA_HG 8   // heads per attention block (one warp each)
#define MLA_JT 32  // cache rows per tile (one lane each in the score phase)
#define MLA_OMAX 4 // latent dims per thread in the output phase: L <= 256 * MLA_OMAX
#define MLA_OUT_RG 4 // rows of the W_UV projection in flight together (mla_out_kernel)

template <typename CT>
__device__ __forceinline__ const CT *cache_row(const k25k_mla_args &a, const CT *cache, int s,
                                               int j) {
    int bi = j / a.kv_block;
    int blk = (bi < a.max_blocks) ? a.block_table[(size_t)s * a.max_blocks + bi] : -1;
    if (blk < 0 || blk >= a.n_blocks) {
        atomicExch(a.err, 2);
        blk = 0;
    }
    return cache + ((size_t)blk * a.kv_block + j % a.kv_block) * (a.L + a.dr);
}

__device__ __forceinline__ void cache_put(uint16_t *p, float v) { *p = k25_f2bf(v); }
__device__ __forceinline__ void cache_put(float *p, float v) { *p = v; }
__device__ __forceinline__ float cache_get(const uint16_t *p) { return k25_bf16f(*p); }
__device__ __forceinline__ float cache_get(const float *p) { return *p; }

// Rotates the interleaved pair (x0, x1) by pos * inv_freq (angle rounded to float as the
// reference does, then sin/cos in double).
__device__ __forceinline__ void rope_pair(float &x0, float &x1, int pos, float inv_freq) {
    float ang = (float)pos * inv_freq;
    double sn, cs;
    sincos((double)ang, &sn, &cs);
    double a = x0, b = x1;
    x0 = (float)(a * cs - b * sn);
    x1 = (float)(a * sn + b * cs);
}

// ------------------------------------------------------------------------------------------
// 1. latent norm, rope, cache write; q_pe rope
// ------------------------------------------------------------------------------------------

// One row t per call, by the whole block (blockDim.x threads; scratch: 32 floats of shared memory).
template <typename CT>
__device__ void mla_prep_row(const k25k_mla_args &a, CT *__restrict__ cache, float *q, float *kv,
                             int t, float *scratch) {
    const int L = a.L, dr = a.dr, W = L + dr, dq = a.dn + a.dr;
    const int pos = a.pos[t], s = a.seq[t];
    float *row = kv + (size_t)t * W;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < L; i += blockDim.x) ss += row[i] * row[i];
    ss = k25_block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)L + a.eps);
    bool ok = s >= 0 && s < a.max_seqs && pos >= 0 && pos / a.kv_block < a.max_blocks;
    CT *dst = nullptr;
    if (ok) {
        int blk = a.block_table[(size_t)s * a.max_blocks + pos / a.kv_block];
        if (blk >= 0 && blk < a.n_blocks)
            dst = cache + ((size_t)blk * a.kv_block + pos % a.kv_block) * W;
    }
    if (!dst && threadIdx.x == 0) atomicExch(a.err, 1);
    for (int i = threadIdx.x; i < L; i += blockDim.x) {
        float v = row[i] * r * k25_bf16f(a.norm_w[i]);
        row[i] = v;
        if (dst) cache_put(dst + i, v);
    }
    for (int i = threadIdx.x; i < dr / 2; i += blockDim.x) {
        float x0 = row[L + 2 * i], x1 = row[L + 2 * i + 1];
        rope_pair(x0, x1, pos, a.inv_freq[i]);
        row[L + 2 * i] = x0;
        row[L + 2 * i + 1] = x1;
        if (dst) {
            cache_put(dst + L + 2 * i, x0);
            cache_put(dst + L + 2 * i + 1, x1);
        }
    }
    float *qt = q + (size_t)t * a.H * dq;
    for (int i = threadIdx.x; i < a.H * (dr / 2); i += blockDim.x) {
        int h = i / (dr / 2), p = i % (dr / 2);
        float *x = qt + (size_t)h * dq + a.dn + 2 * p;
        float x0 = x[0], x1 = x[1];
        rope_pair(x0, x1, pos, a.inv_freq[p]);
        x[0] = x0;
        x[1] = x1;
    }
}

// Above the GEMV's rows: one block per row (at decode the rows ride along with the absorption
// kernel). With hi non-NULL the block also writes its row's q_nope as the absorption GEMM's bf16
// operand, packed [T][H][dn] (lo: the second half, NULL without it), as mla_split would: the
// rope touches only q_pe, so this needs no order against mla_prep_row.
template <typename CT>
__global__ void mla_prep_kernel(k25k_mla_args a, CT *__restrict__ cache, float *q, float *kv,
                                uint16_t *__restrict__ hi, uint16_t *__restrict__ lo) {
    __shared__ float scratch[32];
    k25_pdl_trigger();
    k25_pdl_wait();
    const int t = blockIdx.x;
    mla_prep_row(a, cache, q, kv, t, scratch);
    if (!hi) return;
    const int dq = a.dn + a.dr, n4 = a.H * (a.dn / 4); // dn % 4 == 0 (checked by the caller)
    const float *qt = q + (size_t)t * a.H * dq;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        const int h = i / (a.dn / 4), d = 4 * (i - h * (a.dn / 4));
        float v[4];
        k25_ldv<4>(qt + (size_t)h * dq + d, v);
        k25_st_split<4>(hi, lo, ((size_t)t * a.H + h) * a.dn + d, v);
    }
}

// ------------------------------------------------------------------------------------------
// 2. q absorption: q_abs[t][h][c] = sum_d q_nope[t][h][d] * kv_b[h*(dn+dv) + d][c]
// ------------------------------------------------------------------------------------------

// Block: 64 latent columns x 4 groups of nope dims (256 threads); the 4 partial sums of a
// column are added in shared memory in fixed order. Loads are unrolled so that many are in
// flight (one weight row per d is a coalesced 128-byte read across the block's columns).
// PDL: the first ABS_D weight rows are loaded before k25_pdl_wait(), q after it. Both pointers
// lack __restrict__ and the loads are plain: ptxas moves ld.global.nc (what a const __restrict__
// pointer or __ldg gives) across griddepcontrol.wait both ways, which sank the weight loads
// below the wait and could lift a q load above it (kernels/NOTES.md).
// The last column of blocks does mla_prep_row instead, for every row: it touches kv, the
// cache and q_pe, the absorption reads only q_nope, so the two run side by side in one launch
// (one dependent kernel boundary less per layer; the attention waits for both).
#define ABS_C 64
#define ABS_G 4
#define ABS_D 32
template <typename CT>
__global__ void __launch_bounds__(ABS_C * ABS_G) mla_absorb_kernel(
    k25k_mla_args a, float *q, const uint16_t *kvb, float *__restrict__ q_abs,
    CT *__restrict__ cache, float *kv) {
    __shared__ float red[ABS_G][8][ABS_C];
    k25_pdl_trigger();
    if (blockIdx.x == gridDim.x - 1) {
        k25_pdl_wait();
        for (int t = blockIdx.y + gridDim.y * blockIdx.z; t < a.T; t += gridDim.y * gridDim.z)
            mla_prep_row(a, cache, q, kv, t, &red[0][0][0]);
        return;
    }
    const int cl = threadIdx.x % ABS_C, grp = threadIdx.x / ABS_C;
    const int c = blockIdx.x * ABS_C + cl;
    const int h = blockIdx.y, t0 = blockIdx.z * 8;
    const int dq = a.dn + a.dr, L = a.L;
    const int per = (a.dn + ABS_G - 1) / ABS_G, d0 = grp * per, d1 = min(a.dn, d0 + per);
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;
    if (c < L) {
        const uint16_t *w = kvb + (size_t)h * (a.dn + a.dv) * L + c;
        // ABS_D weights per thread are loaded before any is used: one memory round trip per
        // ABS_D nope dims (32 at Kimi's shapes: all of them) instead of one per 8.
        for (int db = d0; db < d1; db += ABS_D) {
            float wv[ABS_D];
#pragma unroll
            for (int u = 0; u < ABS_D; u++)
                wv[u] = db + u < d1 ? k25_bf16f(w[(size_t)(db + u) * L]) : 0.0f;
            // W_UK is constant during a step: the first rows stream in while the q projection
            // finishes; q is read only after the wait.
            k25_pdl_wait();
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (t0 + i >= a.T) break;
                const float *qr = q + ((size_t)(t0 + i) * a.H + h) * dq;
#pragma unroll
                for (int u = 0; u < ABS_D; u++)
                    if (db + u < d1) acc[i] += qr[db + u] * wv[u];
            }
        }
    }
    k25_pdl_wait(); // threads without weight rows wait here (a no-op for the others)
#pragma unroll
    for (int i = 0; i < 8; i++) red[grp][i][cl] = acc[i];
    __syncthreads();
    if (grp == 0 && c < L) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (t0 + i >= a.T) break;
            float s2 = 0.0f;
            for (int g2 = 0; g2 < ABS_G; g2++) s2 += red[g2][i][cl];
            q_abs[((size_t)(t0 + i) * a.H + h) * L + c] = s2;
        }
    }
}

// ------------------------------------------------------------------------------------------
// 3a. attention over one chunk of positions, up to MLA_HG heads, on CUDA cores: the f32
//     cache (exact mode) and shapes the tensor-core kernel does not take
// ------------------------------------------------------------------------------------------

// Dynamic shared memory: qs [MLA_HG][W] f32 (q_abs then q_pe), cs [MLA_JT][W + 4] f32 cache
// rows (a row per lane in the score phase, read as float4: the +4 stride puts the 8 lanes of a
// quarter-warp in distinct 16-byte bank groups), P [MLA_HG][MLA_JT], corr [MLA_HG].
template <typename CT>
__global__ void __launch_bounds__(256) mla_attn_kernel(k25k_mla_args a, const CT *__restrict__ cache,
                                                       const float *__restrict__ q,
                                                       const float *__restrict__ q_abs,
                                                       int n_chunks, float *__restrict__ part_ml,
                                                       float *__restrict__ part_o) {
    extern __shared__ float smem[];
    const int L = a.L, dr = a.dr, W = L + dr, WP = W + 4, dq = a.dn + a.dr;
    float *qs = smem;
    float *cs = qs + MLA_HG * W;
    float *P = cs + MLA_JT * WP;
    float *corr = P + MLA_HG * MLA_JT;
    k25_pdl_trigger();
    k25_pdl_wait();

    const int chunk = blockIdx.x, h0 = blockIdx.y * MLA_HG, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = a.seq[t];
    const int len = a.pos[t] + 1;
    const int clen = (int)(((k25_cdiv(len, n_chunks) + MLA_JT - 1) / MLA_JT) * MLA_JT);
    const int j0 = chunk * clen, j1 = min(len, j0 + clen);
    const int nh = min(MLA_HG, a.H - h0);

    if (j0 >= j1) { // nothing here: an empty partial (the merge skips its o)
        if (threadIdx.x < nh) {
            float *ml = part_ml + (((size_t)t * a.H + h0 + threadIdx.x) * n_chunks + chunk) * 2;
            ml[0] = -INFINITY;
            ml[1] = 0.0f;
        }
        return;
    }

    for (int i = threadIdx.x; i < MLA_HG * W; i += blockDim.x) {
        int h = i / W, k = i % W;
        float v = 0.0f;
        if (h < nh) {
            size_t th = (size_t)t * a.H + h0 + h;
            v = k < L ? q_abs[th * L + k] : q[th * dq + a.dn + (k - L)];
        }
        qs[i] = v;
    }
    float o[MLA_HG][MLA_OMAX];
#pragma unroll
    for (int h = 0; h < MLA_HG; h++)
#pragma unroll
        for (int i = 0; i < MLA_OMAX; i++) o[h][i] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; // this warp's head
    __shared__ const CT *rows[MLA_JT];

    for (int jt = j0; jt < j1; jt += MLA_JT) {
        __syncthreads(); // previous tile fully consumed (and qs written, first time)
        if (threadIdx.x < MLA_JT)
            rows[threadIdx.x] = jt + threadIdx.x < j1 ? cache_row(a, cache, s, jt + threadIdx.x) : nullptr;
        __syncthreads();
        constexpr int VE = 8 / sizeof(CT); // elements per 8-byte load
        if ((W % VE) == 0) {
            const int vpr = W / VE;
            for (int id = threadIdx.x; id < MLA_JT * vpr; id += blockDim.x) {
                int jj = id / vpr, v = id - jj * vpr;
                float *dst = cs + jj * WP + v * VE;
                if (jt + jj < j1) {
                    uint2 raw = *reinterpret_cast<const uint2 *>(rows[jj] + v * VE);
                    const CT *e = reinterpret_cast<const CT *>(&raw);
#pragma unroll
                    for (int k = 0; k < VE; k++) dst[k] = cache_get(e + k);
                } else {
#pragma unroll
                    for (int k = 0; k < VE; k++) dst[k] = 0.0f;
                }
            }
        } else {
            for (int id = threadIdx.x; id < MLA_JT * W; id += blockDim.x) {
                int jj = id / W, k = id - jj * W;
                cs[jj * WP + k] = jt + jj < j1 ? cache_get(rows[jj] + k) : 0.0f;
            }
        }
        __syncthreads();
        // scores: warp = head, lane = row
        if (warp < nh) {
            float sc = -INFINITY;
            if (jt + lane < j1) {
                const float4 *qh = reinterpret_cast<const float4 *>(qs + warp * W);
                const float4 *cr = reinterpret_cast<const float4 *>(cs + lane * WP);
                float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 4
                for (int k = 0; k < W / 4; k++) {
                    float4 qv = qh[k], cv = cr[k];
                    acc0 += qv.x * cv.x + qv.y * cv.y;
                    acc1 += qv.z * cv.z + qv.w * cv.w;
                }
                sc = (acc0 + acc1) * a.scale;
            }
            float mt = k25_warp_max(sc);
            float m_new = fmaxf(m_run, mt);
            float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
            float cf = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
            l_run = l_run * cf + k25_warp_sum(p);
            m_run = m_new;
            P[warp * MLA_JT + lane] = p;
            if (lane == 0) corr[warp] = cf;
        }
        __syncthreads();
        // o[h][d] = o[h][d] * corr[h] + sum_jj P[h][jj] * c[jj][d]
#pragma unroll
        for (int i = 0; i < MLA_OMAX; i++) {
            const int d = threadIdx.x + 256 * i;
            if (d >= L) break;
#pragma unroll
            for (int h = 0; h < MLA_HG; h++) o[h][i] *= (h < nh ? corr[h] : 0.0f);
            const int jn = min(MLA_JT, j1 - jt);
            for (int jj = 0; jj < jn; jj++) {
                float cv = cs[jj * WP + d];
#pragma unroll
                for (int h = 0; h < MLA_HG; h++) o[h][i] += P[h * MLA_JT + jj] * cv;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MLA_OMAX; i++) {
        const int d = threadIdx.x + 256 * i;
        if (d >= L) break;
#pragma unroll
        for (int h = 0; h < MLA_HG; h++)
            if (h < nh) part_o[(((size_t)t * a.H + h0 + h) * n_chunks + chunk) * L + d] = o[h][i];
    }
    if (warp < nh && lane == 0) {
        float *ml = part_ml + (((size_t)t * a.H + h0 + warp) * n_chunks + chunk) * 2;
        ml[0] = m_run;
        ml[1] = l_run;
    }
}

// ------------------------------------------------------------------------------------------
// 3b. bf16 cache: attention on tensor cores
// ------------------------------------------------------------------------------------------

// Block: one row t, up to HM heads (HM = MMA_HM: the M dimension of m16n8k16, padded with zero
// heads; HM = 8: see mla_attn_mma_kernel), one chunk of positions, walked in tiles of MMA_JT
// cache rows. Each tile is copied ONCE into shared memory (a bulk copy per row, double
// buffered so the next tile streams in while this one is used) and serves every head of the
// block: S = Q C^T over the W = L + dr values of a row, then O += P C over the L latent values.
// Q and P are f32 split into bf16 hi + lo (two MMAs each), so the products keep about f32
// accuracy against the exact bf16 cache.
#define MMA_HM 16   // heads per block (the general kernel)
#define MMA_JT 64   // cache rows per tile
// 8 warps, two per scheduler: at batch 1 a block's work is a chain of dependent shared-memory
// loads and MMAs, and with one warp per scheduler nothing hid their latency (4 warps: 7.7 cycles
// per issued instruction, kernels/NOTES.md).
#define MMA_WARPS 8 // scores: warp w owns tile rows [8w, 8w+8); output: 16-dim slices w, w+8, ...
#define MMA_NT16 4  // output slices per warp at most: L <= 16 * MMA_NT16 * MMA_WARPS = 512
#define MMA_TPH 16  // softmax threads per head (MMA_JT / MMA_TPH tile rows each)
#define MMA_PS (MMA_JT + 8) // P row stride (elements): 144 B, an odd number of 16-byte units
#define MMA_QV 1 // float4 columns of Q per thread and head: KP <= 4 * 32 * MMA_WARPS * MMA_QV
#define MMA_QP 9 // HM = 8: Q fragment loads (two k-steps each) per K half: KP <= 64 * MMA_QP
// HM = 8 (W = 576, kv_block a multiple of 64): a cache tile is MMA_TB boxes of MMA_JT rows x
// MMA_BC values, one tensor-map copy each; a box's 144-byte rows are an odd number of 16-byte
// units, so ldmatrix reads them without bank conflicts and without a pad.
#define MMA_BC 72
#define MMA_TB 8
#define MMA_BOX (MMA_JT * MMA_BC) // elements of a box

__device__ __forceinline__ void mla_ldsm_x4(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(k25_smem_addr(p)));
}
__device__ __forceinline__ void mla_ldsm_x4_trans(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(k25_smem_addr(p)));
}
// d += a b (m16n8k16, bf16 in, f32 accumulate)
__device__ __forceinline__ void mla_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Score K extent (W padded to 32 with zeros: one ldmatrix of the tile feeds two k-steps of 16)
// and the row stride of the shared cache tile and Q: KP + 8 elements is an odd number of
// 16-byte units, so the 8 row addresses of an ldmatrix fall in distinct bank groups.
__host__ __device__ __forceinline__ int mla_mma_kp(int W) { return (W + 31) & ~31; }
__host__ __device__ __forceinline__ int mla_mma_ws(int W) { return mla_mma_kp(W) + 8; }

// The score rows' stride in floats: at HM = 8 the scores are stored by (head, row) from the
// C fragments of S^T, and a stride of 68 puts a warp's 32 stores in distinct banks.
__host__ __device__ constexpr int mla_mma_sfs(int HM) { return HM == 8 ? MMA_JT + 4 : MMA_JT; }

// Elements of a cache tile buffer.
__host__ __device__ constexpr int mla_mma_tile(int HM, int WS) {
    return HM == 8 ? MMA_TB * MMA_BOX : MMA_JT * WS;
}

static size_t mla_mma_smem(int W, int HM) {
    const size_t ws = (size_t)mla_mma_ws(W);
    // + 128: the tensor copies' destinations are 128-byte aligned (HM = 8)
    return 2 * (2 * (size_t)mla_mma_tile(HM, (int)ws) + 2 * (size_t)HM * ws +
                2 * (size_t)HM * MMA_PS) +
           4 * (16 * (size_t)mla_mma_sfs(HM) + HM) + (HM == 8 ? 128 : 0);
}

// The merge of one row's chunks inside the attention kernel (its MERGE form), for the n blocks
// of the row's non-empty chunks: a barrier among them, then block `chunk` merges its share of
// the row's nh x L outputs. At one row the merge kernel was a dependent launch, a round trip
// for the chunk statistics, two block reductions and a round trip for the partials, in 32
// blocks that read every chunk's partials in turn (~3.8 us a layer at 1K context, more at long
// contexts); here the barrier takes the launch's place and the work is spread over the chunks'
// blocks, already resident (a one-row step even at 1K context, 6% faster at 8K-32K). The n
// blocks are resident together: the grid is at most one block an SM (k25k_mla_chunks), and
// nothing that runs beside it waits for it. cnt[0] counts the arrivals, the last arrival
// resets it and bumps cnt[1], the generation the others poll. The arithmetic is the merge
// kernel's (max, weights, the normalizer, a sum over the chunks) in a per-thread order: the
// same values up to rounding.
__device__ __forceinline__ void mla_merge_slice(const k25k_mla_args &a, int n_chunks, int n,
                                                int chunk, int t, int nh, int *cnt,
                                                const float *part_ml, const float *part_o,
                                                float *o_lat, float *smem) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = a.L;
    __syncthreads(); // every thread's partials stored before thread 0 releases them
    if (tid == 0 && n > 1) {
        const int gen = k25_ld_acquire(cnt + 1);
        __threadfence();
        if (atomicAdd(cnt, 1) == n - 1) {
            cnt[0] = 0; // before the release below; the next launch reads it after its wait
            __threadfence();
            k25_red_release_add(cnt + 1, 1);
        } else {
            while (k25_ld_acquire(cnt + 1) == gen) {
            }
        }
    }
    __syncthreads();
    // weights of the chunks for each head, a warp per head: w[h][k] = exp(m_k - M_h), and the
    // normalizer den[h] = sum_k w[h][k] l_k
    float *w = smem, *den = smem + (size_t)nh * n;
    const size_t row0 = (size_t)t * a.H; // heads of this row; the block's group starts at 0
    for (int h = warp; h < nh; h += blockDim.x >> 5) {
        const float *ml = part_ml + (row0 + h) * n_chunks * 2;
        float m = -INFINITY;
        for (int k = lane; k < n; k += 32) m = fmaxf(m, __ldcg(ml + 2 * k));
        m = k25_warp_max(m);
        float dl = 0.0f;
        for (int k = lane; k < n; k += 32) {
            const float wk = expf(__ldcg(ml + 2 * k) - m);
            w[h * n + k] = wk;
            dl += wk * __ldcg(ml + 2 * k + 1);
        }
        dl = k25_warp_sum(dl);
        if (lane == 0) den[h] = dl;
    }
    __syncthreads();
    // The block's outputs [o0, o1), P at a time: S threads an output (S a power of two, where the
    // share is smaller than the block: long contexts, many chunks), each summing the chunks k =
    // part (mod S) with eight accumulators; the S partial sums are added in order by part 0.
    const int total = nh * L, per = (int)k25_cdiv(total, n);
    const int o0 = chunk * per, o1 = min(total, o0 + per);
    int S = 1;
    while (S < 8 && 2 * S * per <= (int)blockDim.x) S *= 2;
    const int P = blockDim.x / S, part = tid / P, ol = tid - part * P;
    float *red = den + nh; // [S][P]
    for (int ob = o0; ob < o1; ob += P) {
        const int o = ob + ol;
        const bool mine = o < o1;
        const int h = mine ? o / L : 0, d = mine ? o - h * L : 0;
        const float *po = part_o + (row0 + h) * n_chunks * L + d;
        const float *wh = w + h * n;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int k = part;
        if (mine) {
            for (; k + 7 * S < n; k += 8 * S) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) v[u] = __ldcg(po + (size_t)(k + u * S) * L);
#pragma unroll
                for (int u = 0; u < 8; u++) acc[u] += wh[k + u * S] * v[u];
            }
            for (; k < n; k += S) acc[0] += wh[k] * __ldcg(po + (size_t)k * L);
        }
        const float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                          ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (S == 1) {
            if (mine) o_lat[(row0 + h) * L + d] = sum / den[h];
            continue;
        }
        red[part * P + ol] = sum;
        __syncthreads();
        if (part == 0 && mine) {
            float r = red[ol];
            for (int i = 1; i < S; i++) r += red[i * P + ol];
            o_lat[(row0 + h) * L + d] = r / den[h];
        }
        __syncthreads(); // red is rewritten by the next pass
    }
}

// Up to 8 heads (TP8: Kimi's 64 heads over 8 ranks), HM = 8 swaps the MMAs' operands: the cache
// rows are the M dimension (16 a fragment) and the heads the N dimension (n8), S^T = C Q^T and
// O^T = C^T P^T. With the heads as M, half of every A fragment was zero heads, and each warp
// re-read all of Q (hi and lo) from shared memory for every tile: ~465 KB of shared-memory reads
// and 1088 MMAs a tile and block. Swapped, the tile is read once for the scores and once for the
// output, Q's fragments stay in registers (a warp's half of the score K extent), and P's are
// loaded once per two k-steps: ~155 KB and 544 MMAs a tile.
//   scores: warp w takes tile rows [16 (w % 4), +16) over half the K extent (w / 4); the two
//     halves' partial scores are added by the softmax (sf holds [2][8 heads][rows]).
//   output: warp w takes the latent 16-dim slices w, w + 8, ... (as at HM = 16), all 8 heads.
// LO: q_abs and q_abs_lo are the absorption GEMM's two products (above the GEMV's rows; a
// template argument so that the decode kernel's Q staging keeps its code).
// MERGE (HM = 8, decode of up to K25K_MLA_MERGE_ROWS rows): the chunks' blocks of a row meet
// at a barrier (a.merge_sync) after writing their partials and each merges a slice of the
// row's o_lat, in place of the merge kernel and its launch (mla_merge_slice).
template <bool LO, int HM, bool MERGE>
__global__ void __launch_bounds__(MMA_WARPS * 32, 1) mla_attn_mma_kernel(
    k25k_mla_args a, const uint16_t *__restrict__ cache, const float *__restrict__ q,
    const float *__restrict__ q_abs, const float *__restrict__ q_abs_lo, int n_chunks,
    float *__restrict__ part_ml, float *__restrict__ part_o, float *__restrict__ o_lat,
    const __grid_constant__ CUtensorMap cache_map) {
    static_assert(HM == MMA_HM || HM == 8, "heads per block: 16 or 8");
    constexpr bool H8 = HM == 8;
    // softmax threads per head: a warp per head at HM = 8
    constexpr int TPH = H8 ? 32 : MMA_TPH, SFS = mla_mma_sfs(HM);
    static_assert(HM * TPH == MMA_WARPS * 32, "softmax: TPH threads per head");
    static_assert(TPH <= 32 && MMA_JT % TPH == 0, "softmax: a head's threads in one warp");
    static_assert(MMA_JT == 8 * MMA_WARPS, "scores: 8 tile rows per warp");
    static_assert(!H8 || MMA_JT == 64 && MMA_WARPS == 8, "HM = 8: 4 row tiles x 2 K halves");
    extern __shared__ __align__(16) unsigned char mla_smem[];
    const int L = a.L, W = L + a.dr, dq = a.dn + a.dr;
    const int KP = mla_mma_kp(W), WS = mla_mma_ws(W);
    const int TS = mla_mma_tile(HM, WS);
    // [2][TS] cache tiles: [MMA_JT][WS] rows, or (HM = 8) [MMA_TB][MMA_JT][MMA_BC] boxes
    uint16_t *cbuf = reinterpret_cast<uint16_t *>(
        H8 ? (reinterpret_cast<uintptr_t>(mla_smem) + 127) & ~(uintptr_t)127
           : reinterpret_cast<uintptr_t>(mla_smem));
    uint16_t *qhi = cbuf + 2 * TS;                             // [MMA_HM][WS]
    uint16_t *qlo = qhi + HM * WS;                             // [HM][WS]
    uint16_t *phi = qlo + HM * WS;                             // [HM][MMA_PS]
    uint16_t *plo = phi + HM * MMA_PS;                         // [HM][MMA_PS]
    float *sf = reinterpret_cast<float *>(plo + HM * MMA_PS); // [16][SFS] scores
    float *corr = sf + 16 * SFS;                              // [HM]
    k25_pdl_trigger();

    // pos, seq and the block table are the step's inputs, copied before its first kernel: read
    // before the wait
    const int chunk = blockIdx.x, h0 = blockIdx.y * HM, t = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int s = a.seq[t], len = a.pos[t] + 1;
    const int clen = (int)(k25_cdiv(k25_cdiv(len, n_chunks), MMA_JT) * MMA_JT);
    const int j0 = chunk * clen, j1 = min(len, j0 + clen);
    const int nh = min(HM, a.H - h0);
    const int n_tiles = j0 < j1 ? (int)k25_cdiv(j1 - j0, MMA_JT) : 0;

    // Tile rows -> cache rows through the block table, copied into the tile buffer, whose
    // mbarrier counts the bytes. HM = 16: warp w copies rows [8w, 8w + 8) of a tile, lane l < 8
    // row 8w + l, one bulk copy a row. HM = 8: the tile's 64 rows are consecutive in the cache (a
    // paged block holds a multiple of 64), and lane 0 of warp w copies box w of them through the
    // cache's tensor map: 8 copies a tile instead of 64 (a warp's lanes issue their copies one
    // after another, and at 8 x 32K warps spent 13% of their samples issuing row copies). Thread
    // 0 announces a tile's bytes before a barrier that precedes its copies: the first two at the
    // start, tile k + 2 at the end of tile k (its buffer's last reads).
    const unsigned row_bytes = 2u * (unsigned)W; // W % 8 == 0: 16-byte multiples (mla_run)
    const int vpr = W / 8;                       // 16-byte pieces per cache row
    __shared__ __align__(8) uint64_t tile_full[2]; // a cache buffer's bytes have landed
    auto expect = [&](int k) {
        const int rows = H8 ? MMA_JT : min(MMA_JT, j1 - j0 - k * MMA_JT); // boxes: whole
        k25_mbar_expect_tx(&tile_full[k & 1], (unsigned)rows * row_bytes);
    };
    if (tid == 0) {
        k25_mbar_init(&tile_full[0], 1);
        k25_mbar_init(&tile_full[1], 1);
        k25_mbar_init_fence();
        for (int k = 0; k < 2 && k < n_tiles; k++) expect(k);
    }
    __syncthreads();
    if (j0 >= j1) { // nothing here (the merge counts only the non-empty chunks)
        k25_pdl_wait();
        if (tid < nh) {
            float *ml = part_ml + (((size_t)t * a.H + h0 + tid) * n_chunks + chunk) * 2;
            ml[0] = -INFINITY;
            ml[1] = 0.0f;
        }
        return;
    }

    bool bad_block = false; // reported after the wait (no global write before it)
    const int r_copy = H8 ? 0 : 8 * warp + lane; // the tile row this lane copies (lane < 8)
    auto resolve = [&](int jt) {
        const int j = jt + r_copy;
        if ((H8 ? lane > 0 : lane >= 8) || j >= j1) return -1;
        const int bi = j / a.kv_block;
        int blk = bi < a.max_blocks && (unsigned)s < (unsigned)a.max_seqs
                      ? a.block_table[(size_t)s * a.max_blocks + bi]
                      : -1;
        if (blk < 0 || blk >= a.n_blocks) {
            bad_block = true;
            blk = 0;
        }
        return blk * a.kv_block + j % a.kv_block;
    };
    // Copies of the rows in [jlo, jhi) of tile jt into buffer b. The buffer was last read a
    // tile ago (ldmatrix, before a block barrier): the fence orders those reads before the
    // copies' writes.
    auto issue = [&](int jt, int rix, int b, int jlo, int jhi) {
        const int j = jt + r_copy;
        if (H8 && rix >= 0) { // the whole tile (jlo, jhi: the caller's)
            k25_fence_proxy_async();
            k25_tensor_copy_2d(k25_smem_addr(cbuf + b * TS + warp * MMA_BOX), &cache_map,
                               warp * MMA_BC, rix, k25_smem_addr(&tile_full[b]));
        } else if (!H8 && rix >= 0 && j >= jlo && j < jhi) {
            k25_fence_proxy_async();
            k25_bulk_g2s_nohint(cbuf + b * TS + r_copy * WS, cache + (size_t)rix * W, row_bytes,
                                &tile_full[b]);
        }
    };
    // P V reads a tile's rows up to a multiple of 16, with P = 0 past the chunk: zeros there
    // (the last tile's), as stale shared memory or cache rows could hold NaN patterns (0 * NaN =
    // NaN). The rows after them are read only by the scores, which the softmax masks. HM = 16:
    // each warp its rows, which are not copied; HM = 8: every thread, over the copied boxes,
    // after they landed.
    auto zero_tail = [&](int jt, int b) {
        const int kmax = min(MMA_JT, j1 - jt), k16 = (kmax + 15) & ~15;
        if constexpr (H8) {
            constexpr int U = MMA_TB * MMA_BC / 8; // 16-byte units of a row, over the boxes
            for (int i = tid; i < (k16 - kmax) * U; i += blockDim.x) {
                const int r = kmax + i / U, u = i % U;
                *reinterpret_cast<uint4 *>(cbuf + b * TS + (u / (MMA_BC / 8)) * MMA_BOX +
                                           r * MMA_BC + (u % (MMA_BC / 8)) * 8) =
                    make_uint4(0, 0, 0, 0);
            }
        } else {
            const int r0 = max(kmax, 8 * warp), r1 = min(k16, 8 * warp + 8);
            for (int i = lane; i < (r1 - r0) * vpr; i += 32)
                *reinterpret_cast<uint4 *>(cbuf + b * TS + (r0 + i / vpr) * WS + (i % vpr) * 8) =
                    make_uint4(0, 0, 0, 0);
        }
    };

    // The step writes the cache rows of its own tokens (the absorption kernel before this one):
    // a sequence's rows of the step are consecutive positions, so those of row t's sequence
    // are at pos[t] - (T - 1) or later. The first tile's rows before that were written by
    // earlier steps, and their copies, the block's first DRAM round trip, overlap the kernel
    // before this one; the rest of the tile follows the wait (HM = 8: the whole tile, unless
    // all its rows are older).
    const int j_old = len - a.T; // rows [0, j_old) of the sequence are older than the step
    const int rix0 = resolve(j0);
    const bool old0 = j0 + MMA_JT <= j_old;
    if (!H8 || old0) issue(j0, rix0, 0, 0, j_old);
    if (!H8) zero_tail(j0, 0);
    k25_pdl_wait();
    if (!H8 || !old0) issue(j0, rix0, 0, j_old, INT_MAX);

    // Q (f32 q_abs then roped q_pe) -> bf16 hi + lo; zero heads past nh and columns past W.
    // Four columns per thread and step (L, dn and dr are multiples of 4: float4 loads), heads
    // in the outer loop (no index division), and the loads of 8 heads are issued before any is
    // converted: this prologue runs in every block, at batch 1 most of the kernel's time while
    // it was a division-heavy scalar loop (kernels/NOTES.md). LO: q_abs is the absorption
    // GEMM's hi-operand products and q_abs_lo its lo-operand ones, added here as the sum kernel
    // after the GEMM would have (hi + lo, then the split).
    static_assert(HM % 8 == 0, "Q staging: 8 heads per round");
    for (int hb = 0; hb < HM; hb += 8) {
        float4 v[8][MMA_QV], vl[8][MMA_QV];
#pragma unroll
        for (int hh = 0; hh < 8; hh++)
#pragma unroll
            for (int j = 0; j < MMA_QV; j++) {
                const int h = hb + hh, k = 4 * (tid + j * MMA_WARPS * 32);
                v[hh][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                vl[hh][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (h < nh && k < W) {
                    const size_t th = (size_t)t * a.H + h0 + h;
                    const float *src = k < L ? q_abs + th * L + k : q + th * dq + a.dn + (k - L);
                    v[hh][j] = *reinterpret_cast<const float4 *>(src);
                    if (LO && k < L)
                        vl[hh][j] = *reinterpret_cast<const float4 *>(q_abs_lo + th * L + k);
                }
            }
#pragma unroll
        for (int hh = 0; hh < 8; hh++)
#pragma unroll
            for (int j = 0; j < MMA_QV; j++) {
                const int k = 4 * (tid + j * MMA_WARPS * 32);
                if (k >= KP) continue;
                float4 q4 = v[hh][j];
                if (LO && k < L) {
                    q4.x += vl[hh][j].x;
                    q4.y += vl[hh][j].y;
                    q4.z += vl[hh][j].z;
                    q4.w += vl[hh][j].w;
                }
                const uint2 hi = make_uint2(k25_pack_bf16x2(q4.x, q4.y), k25_pack_bf16x2(q4.z, q4.w));
                const uint2 lo =
                    make_uint2(k25_pack_bf16x2(q4.x - k25_bf16_lo(hi.x), q4.y - k25_bf16_hi(hi.x)),
                               k25_pack_bf16x2(q4.z - k25_bf16_lo(hi.y), q4.w - k25_bf16_hi(hi.y)));
                const int off = (hb + hh) * WS + k; // 8-byte aligned: WS and k multiples of 4
                *reinterpret_cast<uint2 *>(qhi + off) = hi;
                *reinterpret_cast<uint2 *>(qlo + off) = lo;
            }
    }
    if (KP > W) // the zero padding of both cache buffers (the copies fill [0, W) only)
        for (int i = tid; i < 2 * MMA_JT * (KP - W); i += blockDim.x)
            cbuf[(i / (KP - W)) * WS + W + i % (KP - W)] = 0;

    // HM = 8: this warp's half of Q^T as B fragments, hi and lo, held over all tiles. One
    // ldmatrix.x4 of Q [head][k] gives b0, b1 of two k-steps (matrices k0, k0 + 8, k0 + 16,
    // k0 + 24); KP / 64 <= MMA_QP of them per half (the driver checks).
    constexpr int QP = H8 ? MMA_QP : 1;
    uint32_t qf[QP][2][4];
    const int kh = warp >> 2, np = KP / 64;
    if constexpr (H8) {
        __syncthreads(); // Q staged
        const int off = (lane & 7) * WS + kh * (KP / 2) + (lane >> 3) * 8;
#pragma unroll
        for (int i = 0; i < QP; i++)
            if (i < np) {
                mla_ldsm_x4(qf[i][0], qhi + off + 32 * i);
                mla_ldsm_x4(qf[i][1], qlo + off + 32 * i);
            }
    }

    float o[MMA_NT16][2][4];
#pragma unroll
    for (int i = 0; i < MMA_NT16; i++)
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[i][n][e] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; // head tid / TPH (the softmax thread group)
    // HM = 8, P V: this lane's 16-byte unit of output slice i (dims 16 (warp + 8 i) + 8 (lane
    // >> 3 & 1)) in the boxes
    int colo[MMA_NT16];
#pragma unroll
    for (int i = 0; i < MMA_NT16; i++) {
        const int u = 2 * (warp + MMA_WARPS * i) + ((lane >> 3) & 1);
        colo[i] = (u / (MMA_BC / 8)) * MMA_BOX + (u % (MMA_BC / 8)) * 8;
    }

    for (int it = 0; it < n_tiles; it++) {
        const int jt = j0 + it * MMA_JT;
        const uint16_t *cb = cbuf + (it & 1) * TS;
        if (it + 1 < n_tiles) {
            issue(jt + MMA_JT, resolve(jt + MMA_JT), (it + 1) & 1, 0, INT_MAX);
            if (!H8) zero_tail(jt + MMA_JT, (it + 1) & 1);
        }
        k25_mbar_wait(&tile_full[it & 1], (it >> 1) & 1); // its k-th use completes phase k
        // the last tile, never refilled: generic stores after the copies, no proxy fence
        if (H8 && j1 - jt < MMA_JT) zero_tail(jt, it & 1);
        __syncthreads(); // this tile's zeros (and Q, first time) visible to every warp

        if constexpr (H8) {
            // S^T[16 rows of row tile w % 4][8 heads] over K half w / 4: one ldmatrix.x4 of the
            // tile per k-step (rows 0-7 / 8-15 x k 0-7 / 8-15), four accumulator chains.
            float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0}, s2[4] = {0, 0, 0, 0},
                  s3[4] = {0, 0, 0, 0};
            // 16-byte unit u = 4 i (+ 2) of the warp's K half (36 units: 4 boxes), + lane >> 4:
            // box u / 9, unit u % 9 in it, where a lane with lane >> 4 = 1 at unit 8 reads unit
            // 0 of the next box; two bases, so that each address is a base plus a constant
            const int mt = warp & 3, rr = (mt * 16 + (lane & 15)) * MMA_BC, hh = lane >> 4;
            const uint16_t *ba = cb + kh * 4 * MMA_BOX + rr + hh * 8;
            const uint16_t *bb = cb + kh * 4 * MMA_BOX + rr + hh * (MMA_BOX - 64);
            auto unit = [&](int u) {
                return (u % 9 == 8 ? bb : ba) + (u / 9) * MMA_BOX + (u % 9) * 8;
            };
            static_assert(MMA_BC == 72 && MMA_QP * 4 == 36, "HM = 8: a K half is 4 boxes");
#pragma unroll
            for (int i = 0; i < QP; i++) {
                uint32_t c0[4], c1[4];
                mla_ldsm_x4(c0, unit(4 * i));
                mla_ldsm_x4(c1, unit(4 * i + 2));
                mla_mma(s0, c0, qf[i][0][0], qf[i][0][1]);
                mla_mma(s1, c0, qf[i][1][0], qf[i][1][1]);
                mla_mma(s2, c1, qf[i][0][2], qf[i][0][3]);
                mla_mma(s3, c1, qf[i][1][2], qf[i][1][3]);
            }
            // C fragment: rows g, g + 8 of the row tile, heads 2c, 2c + 1
            float *sp = sf + kh * 8 * SFS;
            const int r = mt * 16 + (lane >> 2), hc = (lane & 3) * 2;
            sp[hc * SFS + r] = (s0[0] + s2[0]) + (s1[0] + s3[0]);
            sp[(hc + 1) * SFS + r] = (s0[1] + s2[1]) + (s1[1] + s3[1]);
            sp[hc * SFS + r + 8] = (s0[2] + s2[2]) + (s1[2] + s3[2]);
            sp[(hc + 1) * SFS + r + 8] = (s0[3] + s2[3]) + (s1[3] + s3[3]);
        } else {
            // S[16 heads][8 rows of this warp] = Q C^T. One ldmatrix.x4 of the tile gives this
            // warp's 8 rows for two k-steps (matrices: k0, k0 + 8, k0 + 16, k0 + 24). The four
            // products of a step go to four accumulators, summed at the end: a warp's scores
            // were one chain of KP / 8 dependent MMAs (72 at Kimi's 576); four chains of a
            // quarter of it overlap (the whole op 0.5-2% faster, kernels/NOTES.md).
            float sc[4] = {0, 0, 0, 0};
            float s1[4] = {0, 0, 0, 0}, s2[4] = {0, 0, 0, 0}, s3[4] = {0, 0, 0, 0};
            const uint16_t *qa = qhi + (lane & 15) * WS + (lane >> 4) * 8;
            const uint16_t *qb = qlo + (lane & 15) * WS + (lane >> 4) * 8;
            const uint16_t *cr = cb + (warp * 8 + (lane & 7)) * WS + (lane >> 3) * 8;
#pragma unroll 2
            for (int k0 = 0; k0 < KP; k0 += 32) {
                uint32_t ah[4], al[4], ah2[4], al2[4], b[4];
                mla_ldsm_x4(b, cr + k0);
                mla_ldsm_x4(ah, qa + k0);
                mla_ldsm_x4(al, qb + k0);
                mla_ldsm_x4(ah2, qa + k0 + 16);
                mla_ldsm_x4(al2, qb + k0 + 16);
                mla_mma(sc, ah, b[0], b[1]);
                mla_mma(s1, al, b[0], b[1]);
                mla_mma(s2, ah2, b[2], b[3]);
                mla_mma(s3, al2, b[2], b[3]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) sc[i] = (sc[i] + s2[i]) + (s1[i] + s3[i]);
            const int c = warp * 8 + (lane & 3) * 2, r = lane >> 2;
            sf[r * SFS + c] = sc[0] * a.scale;
            sf[r * SFS + c + 1] = sc[1] * a.scale;
            sf[(r + 8) * SFS + c] = sc[2] * a.scale;
            sf[(r + 8) * SFS + c + 1] = sc[3] * a.scale;
        }
        __syncthreads();

        // online softmax: TPH threads per head, RPT tile rows each
        {
            constexpr int RPT = MMA_JT / TPH;
            const int h = tid / TPH, c0 = (tid % TPH) * RPT;
            float v[RPT], mt = -INFINITY;
#pragma unroll
            for (int u = 0; u < RPT; u++) {
                const int cc = c0 + u;
                const float sv = H8 ? (sf[h * SFS + cc] + sf[(8 + h) * SFS + cc]) * a.scale
                                    : sf[h * SFS + cc];
                v[u] = jt + cc < j1 ? sv : -INFINITY;
                mt = fmaxf(mt, v[u]);
            }
#pragma unroll
            for (int off = 1; off < TPH; off <<= 1)
                mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            const float m_new = fmaxf(m_run, mt); // finite: the tile has a valid row
            const float cf = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
            float ps = 0.0f;
#pragma unroll
            for (int u = 0; u < RPT; u++) {
                const float p = v[u] == -INFINITY ? 0.0f : expf(v[u] - m_new);
                ps += p;
                const uint16_t hi = k25_f2bf(p);
                phi[h * MMA_PS + c0 + u] = hi;
                plo[h * MMA_PS + c0 + u] = k25_f2bf(p - k25_bf16f(hi));
            }
#pragma unroll
            for (int off = 1; off < TPH; off <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l_run = l_run * cf + ps;
            m_run = m_new;
            if (tid % TPH == 0) corr[h] = cf;
        }
        __syncthreads();

        const int kmax = min(MMA_JT, j1 - jt); // rows past it have P = 0
        if constexpr (H8) {
            // O^T[this warp's 16-dim slices][8 heads] = O^T corr + C^T P^T. A: the tile through
            // ldmatrix.trans (matrices: rows 0-7 / 8-15 x dims 0-7 / 8-15, in fragment order);
            // B: P [head][row], one ldmatrix.x4 per two k-steps (rows k0, +8, +16, +24).
            const int hc = (lane & 3) * 2;
            const float c_a = corr[hc], c_b = corr[hc + 1];
#pragma unroll
            for (int i = 0; i < MMA_NT16; i++) {
                o[i][0][0] *= c_a;
                o[i][0][1] *= c_b;
                o[i][0][2] *= c_a;
                o[i][0][3] *= c_b;
            }
            const int poff = (lane & 7) * MMA_PS + (lane >> 3) * 8;
            const uint16_t *vr = cb + ((lane & 7) + ((lane >> 4) << 3)) * MMA_BC;
            for (int k0 = 0; k0 < kmax; k0 += 32) {
                uint32_t bh[4], bl[4];
                mla_ldsm_x4(bh, phi + poff + k0);
                mla_ldsm_x4(bl, plo + poff + k0);
                const bool two = k0 + 16 < kmax; // warp-uniform
#pragma unroll
                for (int i = 0; i < MMA_NT16; i++) {
                    const int n16 = warp + MMA_WARPS * i;
                    if (n16 * 16 >= L) break;
                    uint32_t c0[4];
                    mla_ldsm_x4_trans(c0, vr + k0 * MMA_BC + colo[i]);
                    mla_mma(o[i][0], c0, bh[0], bh[1]);
                    mla_mma(o[i][0], c0, bl[0], bl[1]);
                    if (two) {
                        uint32_t c1[4];
                        mla_ldsm_x4_trans(c1, vr + (k0 + 16) * MMA_BC + colo[i]);
                        mla_mma(o[i][0], c1, bh[2], bh[3]);
                        mla_mma(o[i][0], c1, bl[2], bl[3]);
                    }
                }
            }
        } else {
            // O[16 heads][this warp's latent slices] = O * corr + P C
            const float c_a = corr[lane >> 2], c_b = corr[(lane >> 2) + 8];
#pragma unroll
            for (int i = 0; i < MMA_NT16; i++)
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    o[i][n][0] *= c_a;
                    o[i][n][1] *= c_a;
                    o[i][n][2] *= c_b;
                    o[i][n][3] *= c_b;
                }
            const uint16_t *pa = phi + (lane & 15) * MMA_PS + (lane >> 4) * 8;
            const uint16_t *pb = plo + (lane & 15) * MMA_PS + (lane >> 4) * 8;
            for (int k0 = 0; k0 < kmax; k0 += 16) {
                uint32_t ah[4], al[4];
                mla_ldsm_x4(ah, pa + k0);
                mla_ldsm_x4(al, pb + k0);
                const uint16_t *vr = cb + (k0 + (lane & 15)) * WS + (lane >> 4) * 8;
#pragma unroll
                for (int i = 0; i < MMA_NT16; i++) {
                    const int n16 = warp + MMA_WARPS * i;
                    if (n16 * 16 >= L) break;
                    uint32_t b[4];
                    mla_ldsm_x4_trans(b, vr + n16 * 16);
                    mla_mma(o[i][0], ah, b[0], b[1]);
                    mla_mma(o[i][0], al, b[0], b[1]);
                    mla_mma(o[i][1], ah, b[2], b[3]);
                    mla_mma(o[i][1], al, b[2], b[3]);
                }
            }
        }
        if (tid == 0 && it + 2 < n_tiles) expect(it + 2); // this buffer's next tile
        __syncthreads(); // the buffer is refilled by the next iteration's prefetch
    }
    if (bad_block) atomicExch(a.err, 2);

#pragma unroll
    for (int i = 0; i < MMA_NT16; i++) {
        const int n16 = warp + MMA_WARPS * i;
        if (n16 * 16 >= L) break;
        if constexpr (H8) { // O^T: dims g, g + 8 of the slice, heads 2c, 2c + 1
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = (lane & 3) * 2 + (e & 1), d = n16 * 16 + (lane >> 2) + 8 * (e >> 1);
                if (h < nh)
                    part_o[(((size_t)t * a.H + h0 + h) * n_chunks + chunk) * L + d] = o[i][0][e];
            }
        } else {
#pragma unroll
            for (int n = 0; n < 2; n++) {
                const int d = n16 * 16 + n * 8 + (lane & 3) * 2;
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int h = (lane >> 2) + 8 * half;
                    if (h >= nh) continue;
                    float *po = part_o + (((size_t)t * a.H + h0 + h) * n_chunks + chunk) * L;
                    if (d < L) po[d] = o[i][n][2 * half];
                    if (d + 1 < L) po[d + 1] = o[i][n][2 * half + 1];
                }
            }
        }
    }
    if (tid % TPH == 0 && tid / TPH < nh) {
        float *ml = part_ml + (((size_t)t * a.H + h0 + tid / TPH) * n_chunks + chunk) * 2;
        ml[0] = m_run;
        ml[1] = l_run;
    }
    if constexpr (MERGE) {
        static_assert(H8 && !LO, "the merge in the attention: decode at 8 heads a block");
        const int n = (int)k25_cdiv(len, clen); // the row's non-empty chunks: this one's peers
        int *cnt = a.merge_sync + 2 * t;
        // the tile buffers are dead (the last tile was read before the loop's last barrier)
        mla_merge_slice(a, n_chunks, n, chunk, t, nh, cnt, part_ml, part_o, o_lat,
                        reinterpret_cast<float *>(cbuf));
    }
}

// ------------------------------------------------------------------------------------------
// 4. merge of the chunks: o_lat[t][h][L]
// ------------------------------------------------------------------------------------------

// Grid: (t*H + h, latent dims / (128 V)). The non-empty chunks are the first cdiv(len, clen),
// with clen computed as the attention kernel did (tile = its rows per tile). Each block computes
// the chunk weights (max, then the normalizer, in a fixed order) and sums its 128 V dims over
// those chunks with eight independent accumulators, so that many loads are in flight. V = 4
// dims a thread (one chunk a row, 16-byte aligned partials: mla_run decides): a block per
// (row, head) at Kimi's L = 512, where blocks of 128 dims spent most of their time on the
// weights (256 rows: 8192 blocks, ~15 us a layer for 8 MB): the step 0.6% shorter at 128 rows
// and 0.9% at 256. Where a row has several chunks (8-16 rows at TP8: th of 64-128 blocks) it
// cost 0.5-1.6%, so V = 1 there (bench/NOTES.md). Each dim's sum is the same whatever V.
// STAGE: the result goes out as the W_UV GEMM's bf16 operand (hi, lo: packed [T][H][L], lo NULL
// without it) instead of o_lat, as mla_split would have converted it.
template <bool STAGE, int V>
__global__ void __launch_bounds__(128) mla_merge_kernel(k25k_mla_args a, int n_chunks, int tile,
                                                        const float *__restrict__ part_ml,
                                                        const float *__restrict__ part_o,
                                                        float *__restrict__ o_lat,
                                                        uint16_t *__restrict__ hi,
                                                        uint16_t *__restrict__ lo) {
    __shared__ float wgt[256];
    __shared__ float scratch[32];
    k25_pdl_trigger();
    k25_pdl_wait();
    const size_t th = blockIdx.x; // t * H + h
    const int len = a.pos[th / a.H] + 1;
    const int clen = (int)(k25_cdiv(k25_cdiv(len, n_chunks), tile) * tile);
    const int n = len > 0 ? min(n_chunks, (int)k25_cdiv(len, clen)) : 0;
    const float *ml = part_ml + th * n_chunks * 2;
    float mloc = -INFINITY;
    for (int c = threadIdx.x; c < n; c += blockDim.x) mloc = fmaxf(mloc, ml[2 * c]);
    mloc = k25_warp_max(mloc);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = mloc;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) M = fmaxf(M, scratch[w]);
    __syncthreads();
    float dl = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        float w = expf(ml[2 * k] - M);
        wgt[k] = w;
        dl += w * ml[2 * k + 1];
    }
    const float den = k25_block_sum(dl, scratch); // fixed-order tree: deterministic
    const int d = (blockIdx.y * 128 + threadIdx.x) * V;
    if (d >= a.L) return;
    const float *po = part_o + th * n_chunks * a.L + d;
    float acc[8][V], v[V];
#pragma unroll
    for (int u = 0; u < 8; u++)
#pragma unroll
        for (int e = 0; e < V; e++) acc[u][e] = 0.0f;
    int k = 0;
    for (; k + 8 <= n; k += 8) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            k25_ldv<V>(po + (size_t)(k + u) * a.L, v);
#pragma unroll
            for (int e = 0; e < V; e++) acc[u][e] += wgt[k + u] * v[e];
        }
    }
    for (; k < n; k++) {
        k25_ldv<V>(po + (size_t)k * a.L, v);
#pragma unroll
        for (int e = 0; e < V; e++) acc[0][e] += wgt[k] * v[e];
    }
    float o[V];
#pragma unroll
    for (int e = 0; e < V; e++)
        o[e] = (((acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e])) +
                ((acc[4][e] + acc[5][e]) + (acc[6][e] + acc[7][e]))) /
               den;
    if constexpr (STAGE)
        k25_st_split<V>(hi, lo, th * a.L + d, o);
    else
        k25_stv<V>(o_lat + th * a.L + d, o);
}

// ------------------------------------------------------------------------------------------
// 5. out[t][h][d] = W_UV[h][d] . o_lat[t][h]
// ------------------------------------------------------------------------------------------

// PDL: the W_UV rows are loaded before k25_pdl_wait(), o_lat after it, with plain loads through
// pointers without __restrict__, as in mla_absorb_kernel (ld.global.nc moves across the wait).
__global__ void mla_out_kernel(k25k_mla_args a, const float *o_lat, const uint16_t *kvb,
                               float *__restrict__ out) {
    k25_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + warp; // h * dv + d
    if (row >= a.H * a.dv) return; // touches nothing; warp 0 of every block has a row and waits
    const int h = row / a.dv, d = row % a.dv, L = a.L;
    const uint16_t *w = kvb + ((size_t)h * (a.dn + a.dv) + a.dn + d) * L;
    // this lane's weights in registers once (L <= 32 * 8 * MLA_OMAX), reused for every row t
    float wr[8 * MLA_OMAX];
#pragma unroll
    for (int i = 0; i < 8 * MLA_OMAX; i++) {
        int c = lane + 32 * i;
        wr[i] = c < L ? k25_bf16f(w[c]) : 0.0f;
    }
    // W_UV is constant during a step: the loads above overlap the end of the merge
    k25_pdl_wait();
    // MLA_OUT_RG rows at a time, their o_lat loads issued together: one L2 round trip per group
    // instead of one per row. Each row's sum is the same chain of fmaf and shuffles as alone.
    for (int t0 = 0; t0 < a.T; t0 += MLA_OUT_RG) {
        float acc[MLA_OUT_RG];
#pragma unroll
        for (int r = 0; r < MLA_OUT_RG; r++) {
            acc[r] = 0.0f;
            if (t0 + r >= a.T) continue;
            const float *ol = o_lat + ((size_t)(t0 + r) * a.H + h) * L;
#pragma unroll
            for (int i = 0; i < 8 * MLA_OMAX; i++) {
                int c = lane + 32 * i;
                if (c < L) acc[r] += wr[i] * ol[c];
            }
        }
#pragma unroll
        for (int r = 0; r < MLA_OUT_RG; r++) {
            if (t0 + r >= a.T) break; // warp-uniform
            acc[r] = k25_warp_sum(acc[r]);
            if (lane == 0) out[(size_t)(t0 + r) * a.H * a.dv + row] = acc[r];
        }
    }
}

// ------------------------------------------------------------------------------------------
// 6. prefill: absorption and W_UV projection as per-head GEMMs on tensor cores
// ------------------------------------------------------------------------------------------

// hi[r][c] = bf16(src[r][c]), lo[r][c] = bf16(src[r][c] - hi) (lo NULL: hi alone) for a
// [rows][width] slice of rows ld floats apart (q_nope inside q, or o_lat), packed. V values per
// thread and iteration (4 where width, ld and the pointers allow: 16-byte loads).
template <int V>
__global__ void mla_split_kernel(const float *src, int rows, int width, int ld,
                                 uint16_t *__restrict__ hi, uint16_t *__restrict__ lo) {
    k25_pdl_trigger();
    k25_pdl_wait();
    const size_t n = (size_t)rows * width;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V; i < n;
         i += (size_t)gridDim.x * blockDim.x * V) {
        const size_t r = i / width, c = i - r * width;
        float v[V];
        uint16_t h[V], l[V];
        k25_ldv<V>(src + r * ld + c, v);
#pragma unroll
        for (int u = 0; u < V; u++) {
            h[u] = k25_f2bf(v[u]);
            l[u] = k25_f2bf(v[u] - k25_bf16f(h[u]));
        }
        k25_stv<V>(hi + i, h);
        if (lo) k25_stv<V>(lo + i, l);
    }
}

static void mla_split(const float *src, int rows, int width, int ld, uint16_t *hi, uint16_t *lo,
                      cudaStream_t s) {
    const bool v4 = ld % 4 == 0 && k25_vec4((size_t)width, {src}, {hi, lo});
    const size_t n = (size_t)rows * width / (v4 ? 4 : 1);
    const unsigned blocks = (unsigned)(n < (size_t)1 << 20 ? k25_cdiv((int64_t)n, 256) : 4096);
    if (v4)
        k25_launch("mla_split", mla_split_kernel<4>, blocks, 256, 0, s, src, rows, width, ld, hi,
                   lo);
    else
        k25_launch("mla_split", mla_split_kernel<1>, blocks, 256, 0, s, src, rows, width, ld, hi,
                   lo);
}

// bf16 elements of one staged half of n values, a multiple of 256 bytes (lo starts there); the
// two halves together take as many floats.
static size_t mla_half_elems(size_t n) { return (n + 127) / 128 * 128; }
static uint16_t *mla_lo_half(uint16_t *hi, size_t n) {
    return k25k_split_activations() ? hi + mla_half_elems(n) : nullptr;
}

// Y_h[T][N] = X_h[T][K] op(W_h) for every head h, X f32 split into hi (+ lo, a second product
// accumulating). x_ld: floats between rows t of one head in x; the staged copy is packed [T][H][K]
// at stage (x_staged: the kernel before wrote it already; x is not read).
// When hi and lo run as one GEMM (below) the halves' products are summed into y, and also split
// into y_hi and y_lo when given (the next product's operand; returns 1); with parts given
// nothing is written to y: *parts = the hi products, the lo ones right after them (T H N
// floats on), for the kernel that reads y to add. Otherwise y as before, *parts = NULL.
static int mla_gemm(k25k_blas *blas, int w_nk, int T, int H, int N, int K, const float *x,
                    int x_ld, uint16_t *stage, bool x_staged, const uint16_t *w, int64_t w_stride,
                    float *y, uint16_t *y_hi, uint16_t *y_lo, const float **parts,
                    cudaStream_t s) {
    const size_t n = (size_t)T * H * K, ny = (size_t)T * H * N;
    uint16_t *hi = stage, *lo = mla_lo_half(stage, n);
    if (!x_staged) mla_split(x, T * H, K, x_ld, hi, lo, s);
    const int64_t ldx = (int64_t)H * K, ldy = (int64_t)H * N;
    if (parts) *parts = nullptr;
    // lo directly after hi (n a whole number of the halves' 128-element alignment): [hi; lo]
    // is one 2T-row operand per head, one GEMM into the products workspace and one sum, as
    // matmul.cu's lt_products does
    float *y2 = lo && lo == hi + n ? k25k_blas_products(blas, T, (size_t)H * N) : nullptr;
    if (y2) {
        k25k_gemm_bf16_strided(blas, w_nk, 2 * T, N, K, H, hi, ldx, K, w, w_nk ? K : N, w_stride,
                               y2, ldy, N, 0.0f, s);
        if (parts) {
            *parts = y2;
            return 0;
        }
        k25k_sum2_split(y, y2, y2 + ny, ny, y_hi, y_lo, s);
        return y_hi != nullptr;
    }
    k25k_gemm_bf16_strided(blas, w_nk, T, N, K, H, hi, ldx, K, w, w_nk ? K : N, w_stride, y, ldy,
                           N, 0.0f, s);
    if (lo)
        k25k_gemm_bf16_strided(blas, w_nk, T, N, K, H, lo, ldx, K, w, w_nk ? K : N, w_stride, y,
                               ldy, N, 1.0f, s);
    return 0;
}

// ------------------------------------------------------------------------------------------
// Driver
// ------------------------------------------------------------------------------------------

// Chunks per (row, head group) so that the tensor-core attention's blocks (one per SM: ~195 KB
// of shared memory each at Kimi's shapes) fill at most one wave: rounded up, 8 rows at 1K
// context made 136 working blocks for 132 SMs, and the last four ran a second block's life
// after the others (the kernel twice as long). Fewer chunks give some blocks one more tile,
// which costs less than a second wave. The kernels round a chunk up to whole tiles, so short
// contexts use fewer chunks.
int k25k_mla_chunks(int T, int H, int num_sms) {
    int hg = (int)k25_cdiv(H, MMA_HM);
    int64_t n = num_sms / ((int64_t)T * hg);
    return n < 1 ? 1 : (n > 256 ? 256 : (int)n);
}

// q_abs's region is rounded up to whole staged halves: the merge writes the W_UV operand
// [hi; lo] there (mla_half_elems(T H L) floats), clear of the partials it reads.
size_t k25k_mla_workspace_floats(int T, int H, int L, int n_chunks) {
    size_t th = (size_t)T * H;
    return mla_half_elems(th * L) /* q_abs */ + th * n_chunks * 2 + th * n_chunks * L +
           th * L /* o_lat */;
}

// A 2-D tensor map of a layer's bf16 cache [rows][W] for boxes of MMA_JT rows x MMA_BC values,
// encoded once per cache through the driver's entry point (nothing links libcuda).
static CUtensorMap mla_cache_map(const void *cache, int64_t rows, int W) {
    static struct {
        const void *p;
        int64_t rows;
        int W;
        CUtensorMap map;
    } maps[256];
    static int n_maps = 0;
    for (int i = 0; i < n_maps; i++)
        if (maps[i].p == cache && maps[i].rows == rows && maps[i].W == W) return maps[i].map;
    PFN_cuTensorMapEncodeTiled_v12000 encode = k25_tensor_map_encoder();
    CUtensorMap map;
    const cuuint64_t dim[2] = {(cuuint64_t)W, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)W * 2};
    const cuuint32_t box[2] = {MMA_BC, MMA_JT}, step[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(cache),
                              dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        K25_DIE("MLA: cuTensorMapEncodeTiled failed (CUresult %d) for a cache of %lld rows",
                (int)r, (long long)rows);
    if (n_maps < 256)
        maps[n_maps].p = cache, maps[n_maps].rows = rows, maps[n_maps].W = W,
        maps[n_maps++].map = map;
    return map;
}

template <typename CT>
static int mla_run(const k25k_mla_args *a, CT *cache, const uint16_t *kvb, float *q, float *kv,
                   float *out, uint16_t *out_hi, uint16_t *out_lo, float *ws, int n_chunks,
                   k25k_blas *blas, cudaStream_t s) {
    const int T = a->T, H = a->H, L = a->L, W = a->L + a->dr;
    const int dn = a->dn, dv = a->dv, dq = dn + a->dr;
    size_t th = (size_t)T * H;
    float *q_abs = ws;
    float *part_ml = q_abs + mla_half_elems(th * L);
    float *part_o = part_ml + th * n_chunks * 2;
    float *o_lat = part_o + th * n_chunks * L;
    // The GEMM path stages its bf16 activations in workspace that is dead at that point: q_nope
    // after q_abs (over the not yet written partials and o_lat), o_lat's copy over q_abs (read
    // by then). The first is checked rather than assumed (it fits whenever dn <= L).
    const size_t abs_stage = mla_half_elems(th * L); // floats: 512-byte aligned, after q_abs
    const size_t ws_floats = k25k_mla_workspace_floats(T, H, L, n_chunks);
    const bool gemm = blas && T > k25k_blas_gemv_max_t(blas) &&
                      abs_stage + mla_half_elems(th * dn) <= ws_floats;
    const int64_t w_head = (int64_t)(dn + dv) * L; // kv_b elements per head

    static int smem_optin_cache = -1;
    const int smem_optin =
        k25_device_attr(&smem_optin_cache, cudaDevAttrMaxSharedMemoryPerBlockOptin);
    // K25_MLA_CUDA_CORES=1 keeps the bf16 cache on the CUDA-core kernel (A/B checks)
    static const int cores_only =
        getenv("K25_MLA_CUDA_CORES") && atoi(getenv("K25_MLA_CUDA_CORES"));
    // up to 8 heads, the kernel with the operands swapped (Kimi at TP8)
    const int KP = mla_mma_kp(W);
    const int hm = H <= 8 && W == MMA_TB * MMA_BC && KP <= 64 * MMA_QP && L % 16 == 0 &&
                           a->kv_block % MMA_JT == 0
                       ? 8
                       : MMA_HM;
    const size_t smem_mma = mla_mma_smem(W, hm);
    const bool mma = sizeof(CT) == 2 && !cores_only && L <= 16 * MMA_NT16 * MMA_WARPS &&
                     W % 8 == 0 && L % 4 == 0 && dn % 4 == 0 &&
                     KP <= 4 * 32 * MMA_WARPS * MMA_QV && smem_mma <= (size_t)smem_optin;

    // Above the GEMV's rows every conversion and sum between the kernels rides in a kernel that
    // runs anyway: the prep kernel splits q_nope for the absorption GEMM, the attention adds
    // the GEMM's two products, the merge writes W_UV's operand, and W_UV's sum writes o_proj's
    // (out_hi), each the same bits as the separate kernel.
    const float *qa_parts = nullptr;
    if (gemm) {
        uint16_t *qs = (uint16_t *)(ws + abs_stage);
        const bool prep_split = dn % 4 == 0 && dq % 4 == 0 && k25_vec4(0, {q});
        k25_launch("mla_prep", mla_prep_kernel<CT>, T, 256, 0, s, *a, cache, q, kv,
                   prep_split ? qs : nullptr, prep_split ? mla_lo_half(qs, th * dn) : nullptr);
        // q_abs[t][h][:] = q_nope[t][h][:] kv_b[h (dn+dv) + d][:], d < dn: W_UK stored [dn][L]
        mla_gemm(blas, 0, T, H, L, dn, q, dq, qs, prep_split, kvb, w_head, q_abs, nullptr,
                 nullptr, mma ? &qa_parts : nullptr, s);
    } else { // + one column of blocks for the latent norm, rope and cache write
        dim3 g2((unsigned)k25_cdiv(L, ABS_C) + 1, (unsigned)H, (unsigned)k25_cdiv(T, 8));
        k25_launch("mla_absorb", mla_absorb_kernel<CT>, g2, ABS_C * ABS_G, 0, s, *a, q, kvb, q_abs,
                   cache, kv);
    }

    // the merge inside the attention kernel: one-row decode at 8 heads a block
    const bool fold = mma && hm == 8 && !gemm && a->merge_sync && T <= K25K_MLA_MERGE_ROWS;
    int tile = MLA_JT;
    if (mma) {
        static size_t mma_set[5] = {0, 0, 0, 0, 0}; // per instantiation
        const int inst = fold ? 4 : (qa_parts != nullptr) + 2 * (hm == 8);
        auto *kernel = fold      ? mla_attn_mma_kernel<false, 8, true>
                       : hm == 8 ? (qa_parts ? mla_attn_mma_kernel<true, 8, false>
                                             : mla_attn_mma_kernel<false, 8, false>)
                                 : (qa_parts ? mla_attn_mma_kernel<true, MMA_HM, false>
                                             : mla_attn_mma_kernel<false, MMA_HM, false>);
        if (smem_mma > 48 * 1024 && smem_mma > mma_set[inst]) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem_mma));
            mma_set[inst] = smem_mma;
        }
        dim3 g3((unsigned)n_chunks, (unsigned)k25_cdiv(H, hm), (unsigned)T);
        const CUtensorMap map =
            hm == 8 ? mla_cache_map(cache, (int64_t)a->n_blocks * a->kv_block, W) : CUtensorMap{};
        k25_launch("mla_attn_mma", kernel, g3, MMA_WARPS * 32, smem_mma, s, *a,
                   reinterpret_cast<const uint16_t *>(cache), q, qa_parts ? qa_parts : q_abs,
                   qa_parts ? qa_parts + th * L : nullptr, n_chunks, part_ml, part_o, o_lat,
                   map);
        tile = MMA_JT;
    } else {
        size_t smem = sizeof(float) * (MLA_HG * (size_t)W + MLA_JT * (size_t)(W + 4) +
                                       MLA_HG * MLA_JT + MLA_HG);
        static size_t smem_set = 0; // per instantiation
        if (smem > 48 * 1024 && smem > smem_set) {
            CUDA_CHECK(cudaFuncSetAttribute(mla_attn_kernel<CT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            smem_set = smem;
        }
        dim3 g3((unsigned)n_chunks, (unsigned)k25_cdiv(H, MLA_HG), (unsigned)T);
        k25_launch("mla_attn", mla_attn_kernel<CT>, g3, 256, smem, s, *a, cache, q, q_abs, n_chunks,
                   part_ml, part_o);
    }

    uint16_t *os = gemm ? (uint16_t *)ws : nullptr; // W_UV's operand, over q_abs
    // 4 dims a thread at one chunk a row (67 rows and more at TP8: 1-2 blocks per SM), a thread
    // per dim below it, where the merge's blocks are fewer than the SMs otherwise. The partials
    // are read 16 bytes at a time: aligned only when the 2 T H weights before them are (T H even).
    if (!fold) {
        const bool v4 = n_chunks == 1 && k25_vec4((size_t)L, {part_o, o_lat});
        const dim3 g4((unsigned)th, (unsigned)k25_cdiv(L, v4 ? 512 : 128));
        auto *merge = os ? (v4 ? mla_merge_kernel<true, 4> : mla_merge_kernel<true, 1>)
                         : (v4 ? mla_merge_kernel<false, 4> : mla_merge_kernel<false, 1>);
        k25_launch("mla_merge", merge, g4, 128, 0, s, *a, n_chunks, tile, part_ml, part_o, o_lat,
                   os, os ? mla_lo_half(os, th * L) : nullptr);
    }

    // out[t][h][:] = o_lat[t][h][:] W_UV^T, W_UV = kv_b rows h (dn+dv) + dn .. + dv, [dv][L]
    if (gemm)
        return mla_gemm(blas, 1, T, H, dv, L, o_lat, L, os, true, kvb + (size_t)dn * L, w_head,
                        out, out_hi, out_lo, nullptr, s);
    k25_launch("mla_out", mla_out_kernel, (unsigned)k25_cdiv((int64_t)H * a->dv, 8), 256, 0, s,
               *a, o_lat, kvb, out);
    return 0;
}

int k25k_mla_attention_blas(const k25k_mla_args *a, void *cache, int cache_f32,
                            const uint16_t *kvb, float *q, float *kv, float *out,
                            uint16_t *out_hi, uint16_t *out_lo, float *ws, int n_chunks,
                            k25k_blas *blas, cudaStream_t s) {
    if (a->T <= 0) return 0;
    if (a->L > 256 * MLA_OMAX || (a->L + a->dr) % 4)
        K25_DIE("mla: kv_lora_rank %d + rope %d not supported (latent at most %d, width a "
                "multiple of 4)", a->L, a->dr, 256 * MLA_OMAX);
    if (cache_f32)
        return mla_run(a, (float *)cache, kvb, q, kv, out, out_hi, out_lo, ws, n_chunks, blas, s);
    return mla_run(a, (uint16_t *)cache, kvb, q, kv, out, out_hi, out_lo, ws, n_chunks, blas, s);
}

void k25k_mla_attention(const k25k_mla_args *a, void *cache, int cache_f32, const uint16_t *kvb,
                        float *q, float *kv, float *out, float *ws, int n_chunks, cudaStream_t s) {
    k25k_mla_attention_blas(a, cache, cache_f32, kvb, q, kv, out, nullptr, nullptr, ws, n_chunks,
                            nullptr, s);
}
