// MLA attention, absorbed decode form (../shared/KIMI_K25.md §4.5), over the paged bf16 latent
// cache: latent RMSNorm + YaRN RoPE + cache write, q absorption (q_abs = q_nope W_UK per head),
// split-sequence attention (flash-decoding: every block handles a chunk of the positions of one
// row for up to 8 heads, reading each cache row once for all of them), the merge of the chunks,
// and the output projection through W_UV.
//
// Shapes (local heads H): q [T][H][dn+dr], kv [T][L+dr] (raw kv_a output), out [T][H][dv];
// cache [n_blocks*kv_block][L+dr] per layer, bf16 (default) or f32 (K25_KV_F32=1: the exact
// latents, for bit-closeness to a float32 reference); kv_b [H*(dn+dv)][L] bf16.
#include "cuda_kernels.cuh"

#define MLA_HG 8   // heads per attention block (one warp each)
#define MLA_JT 32  // cache rows per tile (one lane each in the score phase)
#define MLA_OMAX 4 // latent dims per thread in the output phase: L <= 256 * MLA_OMAX

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

template <typename CT>
__global__ void mla_prep_kernel(k25k_mla_args a, CT *__restrict__ cache, float *q, float *kv) {
    __shared__ float scratch[32];
    const int t = blockIdx.x;
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

// ------------------------------------------------------------------------------------------
// 2. q absorption: q_abs[t][h][c] = sum_d q_nope[t][h][d] * kv_b[h*(dn+dv) + d][c]
// ------------------------------------------------------------------------------------------

// Block: 64 latent columns x 4 groups of nope dims (256 threads); the 4 partial sums of a
// column are added in shared memory in fixed order. Loads are unrolled so that many are in
// flight (one weight row per d is a coalesced 128-byte read across the block's columns).
#define ABS_C 64
#define ABS_G 4
__global__ void __launch_bounds__(ABS_C * ABS_G) mla_absorb_kernel(
    k25k_mla_args a, const float *__restrict__ q, const uint16_t *__restrict__ kvb,
    float *__restrict__ q_abs) {
    __shared__ float red[ABS_G][8][ABS_C];
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
#pragma unroll 8
        for (int d = d0; d < d1; d++) {
            float wv = k25_bf16f(__ldg(w + (size_t)d * L));
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (t0 + i < a.T) acc[i] += q[((size_t)(t0 + i) * a.H + h) * dq + d] * wv;
        }
    }
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
// 3. attention over one chunk of positions, up to MLA_HG heads
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
// 4. merge of the chunks: o_lat[t][h][L]
// ------------------------------------------------------------------------------------------

// Grid: (t*H + h, latent dims / 128). Each block recomputes the chunk weights (max, then the
// normalizer, in a fixed order) and sums its 128 dims over the non-empty chunks with eight
// independent accumulators, so that many loads are in flight.
__global__ void __launch_bounds__(128) mla_merge_kernel(k25k_mla_args a, int n_chunks,
                                                        const float *__restrict__ part_ml,
                                                        const float *__restrict__ part_o,
                                                        float *__restrict__ o_lat) {
    __shared__ int idx[256];
    __shared__ float wgt[256];
    __shared__ int n_act;
    __shared__ float scratch[32];
    const size_t th = blockIdx.x; // t * H + h
    const float *ml = part_ml + th * n_chunks * 2;
    float mloc = -INFINITY;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) mloc = fmaxf(mloc, ml[2 * c]);
    mloc = k25_warp_max(mloc);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = mloc;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) M = fmaxf(M, scratch[w]);
    __syncthreads();
    if (threadIdx.x == 0) { // compact list of non-empty chunks, in chunk order
        int n = 0;
        for (int c = 0; c < n_chunks; c++)
            if (ml[2 * c] != -INFINITY) idx[n++] = c;
        n_act = n;
    }
    __syncthreads();
    const int n = n_act;
    float dl = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        float w = expf(ml[2 * idx[k]] - M);
        wgt[k] = w;
        dl += w * ml[2 * idx[k] + 1];
    }
    const float den = k25_block_sum(dl, scratch); // fixed-order tree: deterministic
    const int d = blockIdx.y * 128 + threadIdx.x;
    if (d >= a.L) return;
    const float *po = part_o + th * n_chunks * a.L + d;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
    for (; k + 8 <= n; k += 8) {
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] += wgt[k + u] * po[(size_t)idx[k + u] * a.L];
    }
    for (; k < n; k++) acc[0] += wgt[k] * po[(size_t)idx[k] * a.L];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    o_lat[th * a.L + d] = sum / den;
}

// ------------------------------------------------------------------------------------------
// 5. out[t][h][d] = W_UV[h][d] . o_lat[t][h]
// ------------------------------------------------------------------------------------------

__global__ void mla_out_kernel(k25k_mla_args a, const float *__restrict__ o_lat,
                               const uint16_t *__restrict__ kvb, float *__restrict__ out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + warp; // h * dv + d
    if (row >= a.H * a.dv) return;
    const int h = row / a.dv, d = row % a.dv, L = a.L;
    const uint16_t *w = kvb + ((size_t)h * (a.dn + a.dv) + a.dn + d) * L;
    // this lane's weights in registers once (L <= 32 * 8 * MLA_OMAX), reused for every row t
    float wr[8 * MLA_OMAX];
#pragma unroll
    for (int i = 0; i < 8 * MLA_OMAX; i++) {
        int c = lane + 32 * i;
        wr[i] = c < L ? k25_bf16f(__ldg(w + c)) : 0.0f;
    }
    for (int t = 0; t < a.T; t++) {
        const float *ol = o_lat + ((size_t)t * a.H + h) * L;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 8 * MLA_OMAX; i++) {
            int c = lane + 32 * i;
            if (c < L) acc += wr[i] * ol[c];
        }
        acc = k25_warp_sum(acc);
        if (lane == 0) out[(size_t)t * a.H * a.dv + row] = acc;
    }
}

// ------------------------------------------------------------------------------------------
// Driver
// ------------------------------------------------------------------------------------------

int k25k_mla_chunks(int T, int H, int num_sms) {
    int hg = (int)k25_cdiv(H, MLA_HG);
    int n = (int)k25_cdiv(4 * num_sms, (int64_t)T * hg);
    return n < 1 ? 1 : (n > 256 ? 256 : n);
}

size_t k25k_mla_workspace_floats(int T, int H, int L, int n_chunks) {
    size_t th = (size_t)T * H;
    return th * L /* q_abs */ + th * n_chunks * 2 + th * n_chunks * L + th * L /* o_lat */;
}

template <typename CT>
static void mla_run(const k25k_mla_args *a, CT *cache, const uint16_t *kvb, float *q, float *kv,
                    float *out, float *ws, int n_chunks, cudaStream_t s) {
    const int T = a->T, H = a->H, L = a->L, W = a->L + a->dr;
    size_t th = (size_t)T * H;
    float *q_abs = ws;
    float *part_ml = q_abs + th * L;
    float *part_o = part_ml + th * n_chunks * 2;
    float *o_lat = part_o + th * n_chunks * L;

    mla_prep_kernel<CT><<<T, 256, 0, s>>>(*a, cache, q, kv);
    K25_LAUNCH_CHECK(s, "mla_prep");

    dim3 g2((unsigned)k25_cdiv(L, ABS_C), (unsigned)H, (unsigned)k25_cdiv(T, 8));
    mla_absorb_kernel<<<g2, ABS_C * ABS_G, 0, s>>>(*a, q, kvb, q_abs);
    K25_LAUNCH_CHECK(s, "mla_absorb");

    size_t smem = sizeof(float) * (MLA_HG * (size_t)W + MLA_JT * (size_t)(W + 4) + MLA_HG * MLA_JT +
                                   MLA_HG);
    static size_t smem_set = 0; // per instantiation
    if (smem > 48 * 1024 && smem > smem_set) {
        CUDA_CHECK(cudaFuncSetAttribute(mla_attn_kernel<CT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    dim3 g3((unsigned)n_chunks, (unsigned)k25_cdiv(H, MLA_HG), (unsigned)T);
    mla_attn_kernel<CT><<<g3, 256, smem, s>>>(*a, cache, q, q_abs, n_chunks, part_ml, part_o);
    K25_LAUNCH_CHECK(s, "mla_attn");

    mla_merge_kernel<<<dim3((unsigned)th, (unsigned)k25_cdiv(L, 128)), 128, 0, s>>>(*a, n_chunks, part_ml,
                                                                              part_o, o_lat);
    K25_LAUNCH_CHECK(s, "mla_merge");

    mla_out_kernel<<<(unsigned)k25_cdiv((int64_t)H * a->dv, 8), 256, 0, s>>>(*a, o_lat, kvb, out);
    K25_LAUNCH_CHECK(s, "mla_out");
}

void k25k_mla_attention(const k25k_mla_args *a, void *cache, int cache_f32, const uint16_t *kvb,
                        float *q, float *kv, float *out, float *ws, int n_chunks, cudaStream_t s) {
    if (a->T <= 0) return;
    if (a->L > 256 * MLA_OMAX || (a->L + a->dr) % 4)
        K25_DIE("mla: kv_lora_rank %d + rope %d not supported (latent at most %d, width a "
                "multiple of 4)", a->L, a->dr, 256 * MLA_OMAX);
    if (cache_f32)
        mla_run(a, (float *)cache, kvb, q, kv, out, ws, n_chunks, s);
    else
        mla_run(a, (uint16_t *)cache, kvb, q, kv, out, ws, n_chunks, s);
}
