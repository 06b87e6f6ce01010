// MLA attention, absorbed decode form (../shared/KIMI_K25.md §4.5), over the paged bf16 latent
// cache: latent RMSNorm + YaRN RoPE + cache write, q absorption (q_abs = q_nope W_UK per head),
// split-sequence attention (flash-decoding: every block handles a chunk of the positions of one
// row for up to 8 heads, reading each cache row once for all of them), the merge of the chunks,
// and the output projection through W_UV.
//
// Shapes (local heads H): q [T][H][dn+dr], kv [T][L+dr] (raw kv_a output), out [T][H][dv];
// cache [n_blocks*kv_block][L+dr] bf16 per layer; kv_b [H*(dn+dv)][L] bf16.
#include "cuda_kernels.cuh"

#define MLA_HG 8   // heads per attention block (one warp each)
#define MLA_JT 32  // cache rows per tile (one lane each in the score phase)
#define MLA_OMAX 4 // latent dims per thread in the output phase: L <= 256 * MLA_OMAX

__device__ __forceinline__ const uint16_t *cache_row(const k25k_mla_args &a, const uint16_t *cache,
                                                     int s, int j) {
    int bi = j / a.kv_block;
    int blk = (bi < a.max_blocks) ? a.block_table[(size_t)s * a.max_blocks + bi] : -1;
    if (blk < 0 || blk >= a.n_blocks) {
        atomicExch(a.err, 2);
        blk = 0;
    }
    return cache + ((size_t)blk * a.kv_block + j % a.kv_block) * (a.L + a.dr);
}

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

__global__ void mla_prep_kernel(k25k_mla_args a, uint16_t *__restrict__ cache, float *q,
                                float *kv) {
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
    uint16_t *dst = nullptr;
    if (ok) {
        int blk = a.block_table[(size_t)s * a.max_blocks + pos / a.kv_block];
        if (blk >= 0 && blk < a.n_blocks)
            dst = cache + ((size_t)blk * a.kv_block + pos % a.kv_block) * W;
    }
    if (!dst && threadIdx.x == 0) atomicExch(a.err, 1);
    for (int i = threadIdx.x; i < L; i += blockDim.x) {
        float v = row[i] * r * k25_bf16f(a.norm_w[i]);
        row[i] = v;
        if (dst) dst[i] = k25_f2bf(v);
    }
    for (int i = threadIdx.x; i < dr / 2; i += blockDim.x) {
        float x0 = row[L + 2 * i], x1 = row[L + 2 * i + 1];
        rope_pair(x0, x1, pos, a.inv_freq[i]);
        row[L + 2 * i] = x0;
        row[L + 2 * i + 1] = x1;
        if (dst) {
            dst[L + 2 * i] = k25_f2bf(x0);
            dst[L + 2 * i + 1] = k25_f2bf(x1);
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

__global__ void mla_absorb_kernel(k25k_mla_args a, const float *__restrict__ q,
                                  const uint16_t *__restrict__ kvb, float *__restrict__ q_abs) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, t0 = blockIdx.z * 8;
    const int dq = a.dn + a.dr, L = a.L;
    if (c >= L) return;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;
    const uint16_t *w = kvb + (size_t)h * (a.dn + a.dv) * L + c;
    for (int d = 0; d < a.dn; d++) {
        float wv = k25_bf16f(w[(size_t)d * L]);
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (t0 + i < a.T) acc[i] += q[((size_t)(t0 + i) * a.H + h) * dq + d] * wv;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (t0 + i < a.T) q_abs[((size_t)(t0 + i) * a.H + h) * L + c] = acc[i];
}

// ------------------------------------------------------------------------------------------
// 3. attention over one chunk of positions, up to MLA_HG heads
// ------------------------------------------------------------------------------------------

// Dynamic shared memory: qs [MLA_HG][W] f32 (q_abs then q_pe), cs [MLA_JT][W/2 + 1] bf16 pairs
// (odd stride: conflict-free score reads), P [MLA_HG][MLA_JT], corr [MLA_HG].
__global__ void __launch_bounds__(256) mla_attn_kernel(k25k_mla_args a,
                                                       const uint16_t *__restrict__ cache,
                                                       const float *__restrict__ q,
                                                       const float *__restrict__ q_abs,
                                                       int n_chunks, float *__restrict__ part_ml,
                                                       float *__restrict__ part_o) {
    extern __shared__ float smem[];
    const int L = a.L, dr = a.dr, W = L + dr, WP = W / 2 + 1, dq = a.dn + a.dr;
    float *qs = smem;
    uint32_t *cs = reinterpret_cast<uint32_t *>(qs + MLA_HG * W);
    float *P = reinterpret_cast<float *>(cs + MLA_JT * WP);
    float *corr = P + MLA_HG * MLA_JT;

    const int chunk = blockIdx.x, h0 = blockIdx.y * MLA_HG, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = a.seq[t];
    const int len = a.pos[t] + 1;
    const int clen = (int)(((k25_cdiv(len, n_chunks) + MLA_JT - 1) / MLA_JT) * MLA_JT);
    const int j0 = chunk * clen, j1 = min(len, j0 + clen);
    const int nh = min(MLA_HG, a.H - h0);

    if (j0 >= j1) { // nothing here: an empty partial
        for (int i = threadIdx.x; i < nh * L; i += blockDim.x) {
            int h = i / L, d = i % L;
            part_o[(((size_t)t * a.H + h0 + h) * n_chunks + chunk) * L + d] = 0.0f;
        }
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

    for (int jt = j0; jt < j1; jt += MLA_JT) {
        __syncthreads(); // previous tile fully consumed (and qs written, first time)
        if ((W & 7) == 0) {
            const int vpr = W / 8;
            for (int id = threadIdx.x; id < MLA_JT * vpr; id += blockDim.x) {
                int jj = id / vpr, v = id % vpr;
                uint4 val = make_uint4(0, 0, 0, 0);
                if (jt + jj < j1)
                    val = *reinterpret_cast<const uint4 *>(cache_row(a, cache, s, jt + jj) + 8 * v);
                uint32_t *d = cs + jj * WP + 4 * v;
                d[0] = val.x, d[1] = val.y, d[2] = val.z, d[3] = val.w;
            }
        } else {
            for (int id = threadIdx.x; id < MLA_JT * (W / 2); id += blockDim.x) {
                int jj = id / (W / 2), v = id % (W / 2);
                uint32_t val = 0;
                if (jt + jj < j1)
                    val = *reinterpret_cast<const uint32_t *>(cache_row(a, cache, s, jt + jj) + 2 * v);
                cs[jj * WP + v] = val;
            }
        }
        __syncthreads();
        // scores: warp = head, lane = row
        if (warp < nh) {
            float sc = -INFINITY;
            if (jt + lane < j1) {
                const float *qh = qs + warp * W;
                const uint32_t *cr = cs + lane * WP;
                float acc = 0.0f;
                for (int p = 0; p < W / 2; p++) {
                    uint32_t v = cr[p];
                    acc += qh[2 * p] * k25_bf16_lo(v) + qh[2 * p + 1] * k25_bf16_hi(v);
                }
                sc = acc * a.scale;
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
                uint32_t v = cs[jj * WP + (d >> 1)];
                float cv = (d & 1) ? k25_bf16_hi(v) : k25_bf16_lo(v);
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

__global__ void mla_merge_kernel(k25k_mla_args a, int n_chunks, const float *__restrict__ part_ml,
                                 const float *__restrict__ part_o, float *__restrict__ o_lat) {
    const size_t th = blockIdx.x; // t * H + h
    const float *ml = part_ml + th * n_chunks * 2;
    float M = -INFINITY;
    for (int c = 0; c < n_chunks; c++) M = fmaxf(M, ml[2 * c]);
    float den = 0.0f;
    for (int c = 0; c < n_chunks; c++)
        if (ml[2 * c] != -INFINITY) den += expf(ml[2 * c] - M) * ml[2 * c + 1];
    const float inv = 1.0f / den;
    for (int d = threadIdx.x; d < a.L; d += blockDim.x) {
        float acc = 0.0f;
        for (int c = 0; c < n_chunks; c++)
            if (ml[2 * c] != -INFINITY)
                acc += expf(ml[2 * c] - M) * part_o[(th * n_chunks + c) * a.L + d];
        o_lat[th * a.L + d] = acc * inv;
    }
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
    for (int t = 0; t < a.T; t++) {
        const float *ol = o_lat + ((size_t)t * a.H + h) * L;
        float acc = 0.0f;
        for (int c = lane; c < L; c += 32) acc += k25_bf16f(w[c]) * ol[c];
        acc = k25_warp_sum(acc);
        if (lane == 0) out[(size_t)t * a.H * a.dv + row] = acc;
    }
}

// ------------------------------------------------------------------------------------------
// Driver
// ------------------------------------------------------------------------------------------

int k25k_mla_chunks(int T, int H, int num_sms) {
    int hg = (int)k25_cdiv(H, MLA_HG);
    int n = (int)k25_cdiv(2 * num_sms, (int64_t)T * hg);
    return n < 1 ? 1 : (n > 64 ? 64 : n);
}

size_t k25k_mla_workspace_floats(int T, int H, int L, int n_chunks) {
    size_t th = (size_t)T * H;
    return th * L /* q_abs */ + th * n_chunks * 2 + th * n_chunks * L + th * L /* o_lat */;
}

void k25k_mla_attention(const k25k_mla_args *a, uint16_t *cache, const uint16_t *kvb, float *q,
                        float *kv, float *out, float *ws, int n_chunks, cudaStream_t s) {
    const int T = a->T, H = a->H, L = a->L, W = a->L + a->dr;
    if (T <= 0) return;
    if (W % 2 || L > 256 * MLA_OMAX)
        K25_DIE("mla: kv_lora_rank %d + rope %d not supported (even width, latent <= %d)", L,
                a->dr, 256 * MLA_OMAX);
    size_t th = (size_t)T * H;
    float *q_abs = ws;
    float *part_ml = q_abs + th * L;
    float *part_o = part_ml + th * n_chunks * 2;
    float *o_lat = part_o + th * n_chunks * L;

    mla_prep_kernel<<<T, 256, 0, s>>>(*a, cache, q, kv);
    K25_LAUNCH_CHECK(s, "mla_prep");

    dim3 g2((unsigned)k25_cdiv(L, 128), (unsigned)H, (unsigned)k25_cdiv(T, 8));
    mla_absorb_kernel<<<g2, 128, 0, s>>>(*a, q, kvb, q_abs);
    K25_LAUNCH_CHECK(s, "mla_absorb");

    size_t smem = sizeof(float) * (MLA_HG * (size_t)W + MLA_HG * MLA_JT + MLA_HG) +
                  sizeof(uint32_t) * MLA_JT * (size_t)(W / 2 + 1);
    static size_t smem_set = 0;
    if (smem > 48 * 1024 && smem > smem_set) {
        CUDA_CHECK(cudaFuncSetAttribute(mla_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        smem_set = smem;
    }
    dim3 g3((unsigned)n_chunks, (unsigned)k25_cdiv(H, MLA_HG), (unsigned)T);
    mla_attn_kernel<<<g3, 256, smem, s>>>(*a, cache, q, q_abs, n_chunks, part_ml, part_o);
    K25_LAUNCH_CHECK(s, "mla_attn");

    mla_merge_kernel<<<(unsigned)th, 256, 0, s>>>(*a, n_chunks, part_ml, part_o, o_lat);
    K25_LAUNCH_CHECK(s, "mla_merge");

    mla_out_kernel<<<(unsigned)k25_cdiv((int64_t)H * a->dv, 8), 256, 0, s>>>(*a, o_lat, kvb, out);
    K25_LAUNCH_CHECK(s, "mla_out");
}
