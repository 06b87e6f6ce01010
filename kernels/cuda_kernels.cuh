// The CUDA kernels of the backend, one launcher per operation (C++ linkage, used by
// backend_cuda.cu, the GPU tests and the micro benchmarks). Pointers are device memory unless a
// comment says host; every launcher runs on the given stream and checks its launch.
#pragma once
#include "cuda_common.cuh"

// ---- elementwise.cu ----
// x[T][D] = emb[tokens[t]] (bf16 rows widened); a token outside [0, V) gives NaN and *err = 1.
void k25k_embed(const int32_t *tokens, int T, const uint16_t *emb, int64_t V, int D, float *x,
                int *err, cudaStream_t s);
// out[T][n] = rmsnorm(x, row stride ld) * w. With hi non-NULL also the operand of the cuBLASLt
// products that read out next, as k25k_f32_to_bf16_split(out, T * n, hi, lo) would write it
// (lo NULL: hi only, for K25_BF16_ACTIVATIONS=1), saving that kernel and its read of out.
void k25k_rmsnorm(const float *x, int ld, const uint16_t *w, float eps, int T, int n, float *out,
                  uint16_t *hi, uint16_t *lo, cudaStream_t s);
// h[T][n] += d; out = rmsnorm(h) * w; hi and lo as k25k_rmsnorm.
void k25k_add_rmsnorm(float *h, const float *d, const uint16_t *w, float eps, int T, int n,
                      float *out, uint16_t *hi, uint16_t *lo, cudaStream_t s);
void k25k_silu_mul(const float *gate, const float *up, size_t n, float *out, cudaStream_t s);
void k25k_add(float *y, const float *x, size_t n, cudaStream_t s);
// out = a + b (out may be a or b)
void k25k_sum2(float *out, const float *a, const float *b, size_t n, cudaStream_t s);
// The same sums, also written as the next product's bf16 operand hi[n] (+ lo[n]), as
// k25k_f32_to_bf16_split(out, n, hi, lo) would write them (hi NULL: k25k_sum2).
void k25k_sum2_split(float *out, const float *a, const float *b, size_t n, uint16_t *hi,
                     uint16_t *lo, cudaStream_t s);
// y1[t][:] + y2[t][:] = p[t][:] + p[T + t][:] over p [2T][N1 + N2] (a pair's one GEMM)
void k25k_sum2_pair(float *y1, float *y2, const float *p, int T, int N1, int N2, cudaStream_t s);
void k25k_f32_to_bf16(const float *x, size_t n, uint16_t *y, cudaStream_t s);
// hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i])
void k25k_f32_to_bf16_split(const float *x, size_t n, uint16_t *hi, uint16_t *lo, cudaStream_t s);

// Activations entering bf16 tensor-core products (cuBLASLt, the W4A16 MMAs) are split into
// hi = bf16(x) and lo = bf16(x - hi) and both are multiplied (about f32 accuracy, twice the
// MMAs) unless K25_BF16_ACTIVATIONS=1 (one bf16 rounding, faster prefill).
int k25k_split_activations(void);

// ---- matmul.cu: y[T][N] = x[T][K] W^T, W bf16 [N][K] ----
typedef struct k25k_blas k25k_blas;
k25k_blas *k25k_blas_create(size_t workspace_bytes);
void k25k_blas_destroy(k25k_blas *b);
// Grows the bf16 activation workspace to elems (outside graph capture only).
void k25k_blas_reserve(k25k_blas *b, size_t elems);
size_t k25k_blas_capacity(const k25k_blas *b);
// Split activations up to k25k_lt_one_pass_rows() rows (K25_LT_ONE_PASS_T, default
// K25K_LT_ONE_PASS_T_DEFAULT): hi and lo are stacked as 2T rows of one GEMM (the weights read
// once, not twice) into an f32 products workspace [2T][N], and one kernel adds the halves.
// k25k_blas_reserve_products grows the workspace to floats (outside graph capture only);
// k25k_blas_products returns it for T rows of row_floats products each when T is within the
// one-pass rows and it holds [2T][row_floats], else NULL (then the two products run as before,
// the second accumulating into the first).
#define K25K_LT_ONE_PASS_T_DEFAULT 256
int k25k_lt_one_pass_rows(void);
void k25k_blas_reserve_products(k25k_blas *b, size_t floats);
float *k25k_blas_products(const k25k_blas *b, int T, size_t row_floats);
// f32 activations and accumulation; y[t][n] is bit-identical for every T (the K-slice plan
// depends on N and K only).
void k25k_gemv_bf16(const float *x, const uint16_t *W, int T, int N, int K, float *y,
                    cudaStream_t s);
// The GEMV's plan for N x K: K slices (blocks of one cluster) and weight rows per block.
void k25k_gemv_plan(int N, int K, int *k_slices, int *rows_per_block);
// The cuBLASLt path alone (k25k_matmul picks among the paths). xs: x already as the bf16
// operand [hi; lo] (k25k_rmsnorm's hi and lo, lo = hi + T * K), or NULL: converted here from x.
void k25k_matmul_lt(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W, int T,
                    int N, int K, float *y, cudaStream_t s);
// The cuBLASLt call alone, activations already bf16 xb[T][K].
void k25k_matmul_lt_bf16(k25k_blas *b, const uint16_t *xb, const uint16_t *W, int T, int N, int K,
                         float *y, cudaStream_t s);
// matmul_wgmma.cu: y1 [T][N1] (and, N2 > 0, y2 [T][N2]) = x W^T for W [N1 + N2][K] bf16 from
// the split operand xs ([hi; lo], lo = hi + T K), on Hopper's warpgroup MMA, hi + lo summed in
// the kernel; up to 32 rows. 0 (nothing launched) where it does not apply (not sm_90, K % 8,
// pointers not 16-byte aligned, T out of range). k25k_wgmma_slices: its K slices for N x K.
int k25k_matmul_wgmma(const uint16_t *xs, const uint16_t *W, int T, int N1, int N2, int K,
                      float *y1, float *y2, cudaStream_t s);
int k25k_wgmma_slices(int N, int K);
// Whether the projections' dispatch takes k25k_matmul_wgmma for N x K: its K slices at most
// K25_WGMMA_SLICE_MAX steps of 64 (default 24), where it ran faster than cuBLASLt.
int k25k_wgmma_preferred(int N, int K);
// GEMV for T <= K25_GEMV_MAX_T (default K25K_GEMV_MAX_T_DEFAULT); above, with split activations,
// k25k_matmul_wgmma up to K25_WGMMA_MAX_T rows (default K25K_WGMMA_MAX_T_DEFAULT, 0: never) for
// the shapes it is preferred for; cuBLASLt for the rest.
#define K25K_GEMV_MAX_T_DEFAULT 4
#define K25K_WGMMA_MAX_T_DEFAULT 32
void k25k_matmul(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W, int T, int N,
                 int K, float *y, cudaStream_t s);
// k25k_matmul, except where the hi and lo products run as one GEMM: then y is not written and
// the products are returned, p[T][N] of hi and p + T N of lo, for the kernel that reads y to
// add (p[i] + p[T N + i], the sum k25k_matmul writes). NULL: y written.
const float *k25k_matmul_parts(k25k_blas *b, const float *x, const uint16_t *xs,
                               const uint16_t *W, int T, int N, int K, float *y, cudaStream_t s);
// Two projections of the same activations (same K) in one tile-GEMV launch over N1 + N2 rows:
// y1[T][N1] = x W1^T, y2[T][N2] = x W2^T. The K-slice plan comes from N1 + N2 and K, so a row
// differs from k25k_gemv_bf16 of its matrix alone in the last bits where the slice counts differ
// (at K = 7168 they never do), and is bit-identical for every T. k25k_gemv2_applies says from
// the shapes and pointers alone (never from T) whether the pair launch is possible (N1 a
// multiple of the rows per group, K % 8 == 0, 16-byte aligned x, W1, W2); k25k_gemv2_bf16
// returns 0 (nothing launched) where it is not.
int k25k_gemv2_applies(const float *x, const uint16_t *W1, const uint16_t *W2, int N1, int N2,
                       int K);
int k25k_gemv2_bf16(const float *x, const uint16_t *W1, const uint16_t *W2, int T, int N1,
                    int N2, int K, float *y1, float *y2, cudaStream_t s);
// The pair for T <= K25_GEMV_MAX_T when it applies; otherwise two k25k_matmul calls (above the
// GEMV limit: one bf16 conversion of x for both cuBLASLt products, and one GEMM of N1 + N2 rows
// when W2 directly follows W1 in memory, as the backend allocates such pairs).
void k25k_matmul2(k25k_blas *b, const float *x, const uint16_t *xs, const uint16_t *W1,
                  const uint16_t *W2, int T, int N1, int N2, int K, float *y1, float *y2,
                  cudaStream_t s);

// ---- moe_w4a16.cu ----
// Routing metadata of one MoE call (device arrays; A = T * top_k choices).
typedef struct k25k_moe_route {
    int *counts;     // [E]   choices per expert
    int *offsets;    // [E+1] first slot of each expert
    int *active;     // [E]   experts with choices, ascending
    int *n_active;   // [1]
    int *slot_token; // [A]   token of each slot
    int *slot_of;    // [A]   slot of choice t*top_k + k (-1: invalid expert id)
    int *err;        // [1]   set to 1 on an invalid expert id
    // work items of the grouped GEMM, one for every K25K_MOE_PASS (or K25K_MOE_PASS_MIN) slots
    // of an expert: its expert and (first slot in the sorted list) << 6 | (slot count), so that
    // the GEMM's first weight loads need no counts/offsets look-up
    int *item_expert, *item_p0; // [k25k_moe_max_items]
    int *n_items;               // [1]
    // split-K plans written by the routing kernel for the step's item count: n_splits and
    // kb_per_split of the gate+up GEMM [0], [1] and of the down GEMM [2], [3]
    int *plan; // [4]
    // finished splits per (item, gate+up row-block) of the fused SiLU*up reduction; zero before
    // the first call (each count returns to 0 when its last split finishes)
    int *tile_done; // [k25k_moe_max_items x k25k_moe_row_blocks(2I)]
    // unit tickets of the gate+up [0] and down [1] GEMMs; zero before the first call (each
    // launch returns its counter to 0)
    int *unit_next; // [2]
    // finished gate+up row-blocks of each item (their SiLU*up written to h), which the down
    // GEMM's units wait for instead of gate+up's end; the routing sort zeroes the step's items.
    // Read only by the GEMMs' FLOW instantiation (steps of K25_MOE_FLOW_ROWS rows or more);
    // NULL: the down GEMM waits for the whole of gate+up there too
    int *item_ready; // [k25k_moe_max_items]
} k25k_moe_route;
#define K25K_MOE_PASS 32
// Items above 16 rows (unless K25_MOE_PASS=32): the grouped GEMM's 2-tile instantiation (128
// registers, 4 blocks per SM) instead of the 4-tile one (168, 3 per SM)
#define K25K_MOE_PASS_MIN 16
// Most work items a step of T rows can produce: min(E, A) + ceil(A / K25K_MOE_PASS_MIN).
int k25k_moe_max_items(int T, int top_k, int E);
// Row-blocks of the grouped GEMM over N output rows.
int k25k_moe_row_blocks(int N);

// Routing sort of idx [T][top_k] and the split-K plans (r->plan) of the gate+up (2I x D) and
// down (D x I) GEMMs from the step's work-item count, for the GEMM blocks resident on num_sms
// SMs.
void k25k_moe_sort(const int32_t *idx, int T, int top_k, int E, int I, int D, int num_sms,
                   const k25k_moe_route *r, cudaStream_t s);
// Shared memory of the routing sort of A choices over E experts (dies on what it cannot sort)
// and the resident GEMM blocks its plans are made for (k25k_router_topk's fused sort).
size_t k25k_moe_route_smem(int A, int E);
int k25k_moe_route_target(int T, int num_sms);
// Repacks one expert matrix from the checkpoint layout (packed [rows][K/8] int32, scales
// [rows][K/group] bf16) into the tiled layout (moe_w4a16.cu). gate_up: wa/sa are the gate rows,
// wb/sb the up rows, N = 2 * I; otherwise N rows of wa/sa.
void k25k_w4_repack(const uint32_t *wa, const uint32_t *wb, const uint16_t *sa,
                    const uint16_t *sb, int N, int K, int group, int gate_up, uint32_t *dst_w,
                    uint16_t *dst_s, cudaStream_t s);
// Floats of part [n_splits][A][N] for A choices under any routing (the largest plan).
size_t k25k_moe_part_floats(int N, int K, int A, int num_sms);
// part[n_splits][A][N] = per-slot partial products (tiled INT4 weights of all E experts), the
// plan from r->plan (gate_up: [0], [1]; down: [2], [3]); a persistent grid over num_sms SMs.
// gate_up with h != NULL also writes h[A][I] = silu(gate) * up summed over the splits (the
// last split of each tile reduces, r->tile_done), replacing k25k_moe_gate_up_reduce. From
// K25_MOE_FLOW_ROWS rows the down GEMM reads h as that fused reduction counts it done
// (r->item_ready): its call must follow gate_up's with h on the same stream, nothing between.
void k25k_moe_w4a16_gemm(const uint32_t *Wt, const uint16_t *St, int E, int N, int K,
                         int gate_up, const float *X, int x_ld, const int *row_index,
                         const k25k_moe_route *r, int T, int top_k, int num_sms, float *part,
                         float *h, cudaStream_t s);
// Same for bf16 experts (device arrays of per-expert row-major [rows][K] pointers); one split.
void k25k_moe_bf16_gemm(const uint16_t *const *Wa, const uint16_t *const *Wb, int N, int K,
                        int gate_up, const float *X, int x_ld, const int *row_index,
                        const k25k_moe_route *r, int max_active, int A, float *part,
                        cudaStream_t s);
// h[A][I] = silu(sum gate) * (sum up) over the splits of part [n_splits][A][2I]; n_splits is
// a device int (r->plan + 0), NULL for one split.
void k25k_moe_gate_up_reduce(const float *part, const int *n_splits, int A, int I, float *h,
                             cudaStream_t s);
// out[T][D] = sum_k wts[t][k] * sum_splits part[split][slot_of[t][k]][D] (+ add[T][D] when add
// is non-NULL); n_splits a device int (r->plan + 2), NULL for one split.
void k25k_moe_combine(const float *part, const int *n_splits, int A, int D, const int *slot_of,
                      const float *wts, int T, int top_k, const float *add, float *out,
                      cudaStream_t s);

// ---- router.cu ----
// Top-k of the router's logits into idx / wts. With sort != NULL and every row in one block of
// the warp kernel (T <= 16), the same launch ends with the routing sort of the choices
// (k25k_moe_sort's work, into sort->r for experts of sort->I x sort->D); returns 1 then, 0 when
// the caller still has to sort.
typedef struct k25k_route_sort {
    const k25k_moe_route *r;
    int I, D, num_sms;
} k25k_route_sort;
// run.uniform_routing (benchmarks), when uni is not NULL: each row's ids are replaced by the
// experts k25_uniform_experts draws for its (layer, seq[t], pos[t]) (src/bench_routing.h), in the
// top-k's own launch (before the warp kernel's routing sort); the weights stay the router's.
typedef struct k25k_uniform {
    const int32_t *pos, *seq;
    int layer;
} k25k_uniform;
// logits_lo non-NULL: the logits are logits[i] + logits_lo[i] (k25k_matmul_parts' products).
int k25k_router_topk(const float *logits, const float *logits_lo, const float *bias, int T,
                     int E, int n_group, int topk_group, int top_k, int norm_topk, float scale,
                     int32_t *idx, float *wts, const k25k_route_sort *sort,
                     const k25k_uniform *uni, cudaStream_t s);

// ---- mla.cu ----
typedef struct k25k_mla_args {
    int T, H, L, dr, dn, dv;        // rows, local heads, kv_lora, rope, nope, v dims
    int kv_block, max_blocks, max_seqs, n_blocks;
    float eps, scale;               // latent norm eps, softmax scale
    const int32_t *pos, *seq;       // [T]
    const int32_t *block_table;     // [max_seqs * max_blocks]
    const uint16_t *norm_w;         // kv_a_norm [L] bf16
    const float *inv_freq;          // [dr/2]
    int *err;                       // 1: bad cache slot on write, 2: on read
    int *merge_sync;                // [2 K25K_MLA_MERGE_ROWS] zeros, or NULL: the merge kernel
} k25k_mla_args;
// Decode rows up to which the attention kernel merges its chunks itself (a.merge_sync: a
// count and a generation a row, the count left at zero by every launch). One: at 2 and 4 rows
// it measured even or slower than the merge kernel (kernels/NOTES.md).
#define K25K_MLA_MERGE_ROWS 1
#define K25K_MLA_MERGE_SYNC_BYTES (sizeof(int) * 2 * K25K_MLA_MERGE_ROWS)
// Chunks of positions per (row, 16-head group) of the split attention (one wave of blocks at
// batch 1), and the workspace (q_abs, per-chunk max/sum and partial outputs, o_lat) it needs.
int k25k_mla_chunks(int T, int H, int num_sms);
size_t k25k_mla_workspace_floats(int T, int H, int L, int n_chunks);
// cache: this layer's [n_blocks*kv_block][L+dr], bf16 or (cache_f32) f32; kvb: kv_b
// [H*(dn+dv)][L] bf16. The bf16 cache runs on tensor cores (L <= 512, L+dr a multiple of 8;
// K25_MLA_CUDA_CORES=1 forces the CUDA-core kernel that the f32 cache uses).
void k25k_mla_attention(const k25k_mla_args *a, void *cache, int cache_f32, const uint16_t *kvb,
                        float *q, float *kv, float *out, float *ws, int n_chunks, cudaStream_t s);

// ---- sampling.cu (k25_cand, k25_softmax_stats from sampler.h) ----
struct k25_cand;
struct k25_softmax_stats;
struct k25_sampling;
void k25k_sample_best(const float *logits, int T, int V_local, int vocab_begin,
                      const struct k25_sampling *params_dev, struct k25_cand *out_dev,
                      cudaStream_t s);
void k25k_sample_candidates(const float *logits, int T, int V_local, int vocab_begin,
                            const struct k25_sampling *params_dev, int c_max,
                            struct k25_cand *out_dev, int *n_dev,
                            struct k25_softmax_stats *stats_dev, cudaStream_t s);

// ---- weights_upload.cu ----
// dst[rows][cols] = the stored bits of a synthetic tensor slice (synth.h), elem_size 2 or 4.
void k25k_synth_fill(void *dst, int elem_size, int kind, int exp, uint64_t seed, uint64_t id,
                     int64_t rows, int64_t cols, int64_t g_cols, int64_t row0, int64_t col0,
                     cudaStream_t s);

// ---- matmul.cu: strided batches on cuBLASLt, and the GEMV row limit ----
// For i < batch, row-major: Y_i[M][N] = beta Y_i + X_i[M][K] op(W_i), X_i = x + i sx (bf16, row
// stride ldx), W_i = w + i sw (bf16, row stride ldw; w_nk: stored [N][K], op = transpose; else
// stored [K][N]), Y_i = y + i sy (f32, row stride ldy); f32 accumulation. Strides in elements.
void k25k_gemm_bf16_strided(k25k_blas *b, int w_nk, int M, int N, int K, int batch,
                            const uint16_t *x, int64_t ldx, int64_t sx, const uint16_t *w,
                            int64_t ldw, int64_t sw, float *y, int64_t ldy, int64_t sy,
                            float beta, cudaStream_t s);
// Rows up to which k25k_matmul runs the GEMV (K25_GEMV_MAX_T, default K25K_GEMV_MAX_T_DEFAULT).
int k25k_blas_gemv_max_t(const k25k_blas *b);

// ---- mla.cu: k25k_mla_attention with the backend's cuBLASLt handle ----
// Above k25k_blas_gemv_max_t(blas) rows the q absorption and the W_UV projection run as
// per-head bf16 GEMMs (activations split hi + lo unless K25_BF16_ACTIVATIONS=1); at or below
// it, or with blas NULL, exactly as k25k_mla_attention (the CUDA-core kernels).
// out_hi non-NULL: where those GEMMs run, out is also written as the o_proj product's bf16
// operand (out_hi, out_lo: [T][H dv] each, lo NULL with bf16 activations), as
// k25k_f32_to_bf16_split(out) would; returns 1 when it was.
int k25k_mla_attention_blas(const k25k_mla_args *a, void *cache, int cache_f32,
                            const uint16_t *kvb, float *q, float *kv, float *out,
                            uint16_t *out_hi, uint16_t *out_lo, float *ws, int n_chunks,
                            k25k_blas *blas, cudaStream_t s);
