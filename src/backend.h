// The operation table every backend implements with the same contract: the CPU reference
// (backend_cpu.c, float32, obviously right) and the CUDA backend (kernels/, checked against it).
//
// Conventions
// - A step processes T token rows (one or several per sequence: prefill chunks, decode tokens,
//   speculative verification). Row t belongs to sequence batch->seq[t] at position
//   batch->pos[t]; set_batch() is called once per step before any op.
// - Activations are float32 buffers in backend memory (alloc), row-major [T][n]. What a
//   backend does inside (bf16 operands, fused kernels) is its own business.
// - Weights are k25_tensor slices, materialized by load_weights(); y = x W^T with W [N][K].
// - The MLA latent cache is paged: blocks of kv_block tokens, each token holding
//   kv_lora_rank normalized latent values then qk_rope_dim rotated key values (576 for
//   Kimi-K2.5), per layer. Token p of sequence s lives in physical block
//   block_table[s * max_blocks_per_seq + p / kv_block], slot p % kv_block.
// - Collectives: allreduce_sum sums over the tensor-parallel group (allreduce_add_rmsnorm too,
//   fused with the residual add and the next norm that follow it).
#pragma once
#include "common.h"
#include "config.h"
#include "dist.h"
#include "weights.h"

typedef struct k25_batch {
    int T;                       // rows
    const int32_t *tokens;       // [T] host
    const int32_t *pos;          // [T] host: position of the row in its sequence
    const int32_t *seq;          // [T] host: sequence slot in [0, max_seqs)
    const int32_t *block_table;  // [max_seqs * max_blocks_per_seq] host
    int max_seqs, max_blocks_per_seq;
} k25_batch;

// Sampling settings of one row. temp == 0: greedy (ties -> lowest id).
typedef struct k25_sampling {
    float temp;
    int top_k;                   // 0 = off
    float top_p;                 // 1 = off
    uint64_t seed;               // with counter: a counter-based RNG, so a sample does not
    uint64_t counter;            // depend on rank count or on the other rows of the batch
} k25_sampling;

typedef struct k25_backend k25_backend;
struct k25_backend {
    const char *name;
    void *impl;
    const k25_config *cfg;
    const k25_dist *dist;

    void (*destroy)(k25_backend *be);

    // ---- memory ----
    void *(*alloc)(k25_backend *be, size_t bytes);           // zero-filled
    void (*free)(k25_backend *be, void *p);
    void (*to_device)(k25_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(k25_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(k25_backend *be);
    // Peak bytes of backend memory in use (device memory on GPUs).
    size_t (*mem_peak)(k25_backend *be);

    // ---- weights and cache ----
    void (*load_weights)(k25_backend *be, k25_weights *w);
    // n_layers local layers, n_blocks * kv_block tokens each.
    void (*kv_init)(k25_backend *be, int n_layers, int n_blocks, int kv_block);
    int kv_value_bytes;          // bytes of one cached value: run.kv_cache_mb counts in them
    void (*set_batch)(k25_backend *be, const k25_batch *b);

    // ---- operations (T = rows of the current batch unless stated) ----
    // x[T][D] = embed rows of batch tokens
    void (*embed)(k25_backend *be, const k25_tensor *emb, float *x);
    // out[T][n] = rmsnorm(x[T][n] with row stride ld) * w; out has row stride n
    void (*rmsnorm)(k25_backend *be, const float *x, int ld, const k25_tensor *w, float eps,
                    int T, int n, float *out);
    // h[T][n] += d[T][n]; out = rmsnorm(h) * w
    void (*add_rmsnorm)(k25_backend *be, float *h, const float *d, const k25_tensor *w,
                        float eps, int T, int n, float *out);
    // y[T][N] = x[T][K] W^T, W a bf16 tensor [N][K]
    void (*matmul)(k25_backend *be, const float *x, const k25_tensor *W, int T, float *y);
    // Two projections of the same input (q_a and kv_a; gate and up), W1 and W2 with the same
    // K: y1[T][N1] = x W1^T, y2[T][N2] = x W2^T. Equal to two matmul calls; a backend may run
    // them as one pass (at batch 1 each alone is too small to fill the GPU).
    void (*matmul2)(k25_backend *be, const float *x, const k25_tensor *W1, const k25_tensor *W2,
                    int T, float *y1, float *y2);
    // out[T][n] = silu(gu[T][0:n]) * gu[T][n:2n] when gate and up are separate buffers:
    void (*silu_mul)(k25_backend *be, const float *gate, const float *up, int T, int n,
                     float *out);
    // y[i] += x[i]
    void (*add)(k25_backend *be, float *y, const float *x, size_t n);
    // MLA for local layer slot `layer` (cache index): q[T][H_local*(nope+rope)] from q_b,
    // kv[T][kv_lora+rope] from kv_a (raw). Normalizes the latent (kv_a_norm), applies YaRN
    // RoPE to q_pe and k_pe at batch positions, writes the cache, then absorbed attention over
    // positions 0..pos[t] of the row's sequence. out[T][H_local*v_head_dim].
    void (*mla_attention)(k25_backend *be, int layer, const k25_layer *L, float *q, float *kv,
                          float *out);
    // Router: scores = sigmoid(x W_r^T) in f32; choose top_k by score + bias with group
    // limiting; weights = chosen scores normalized (norm_topk_prob) * routed_scale.
    // idx[T][top_k] (int32), wts[T][top_k] in backend memory.
    void (*router)(k25_backend *be, const float *x, const k25_layer *L, int32_t *idx,
                   float *wts);
    // out[T][D] = sum_k wts[t][k] * Expert_idx[t][k](x[t]) over this rank's expert slices
    // (a partial sum across TP ranks), plus add[T][D] when add is non-NULL (the shared expert's
    // partial: one pass over out fewer). A side branch still open (fork) is joined before add
    // is read, so add may be the branch's output.
    void (*moe)(k25_backend *be, const float *x, const k25_layer *L, const int32_t *idx,
                const float *wts, const float *add, float *out);
    // Sum over the tensor-parallel group, in place.
    void (*allreduce_sum)(k25_backend *be, float *x, size_t n);
    // Vocabulary-parallel sampling: logits[T][V_local] of this rank's vocabulary slice
    // [vocab_begin, vocab_begin+V_local). Every rank gets the same tokens (host out[T]).
    void (*sample)(k25_backend *be, const float *logits, int vocab_begin, int V_local,
                   const k25_sampling *params, int32_t *out);
    // Runs fn(ctx), the device work of one step between set_batch and sample, possibly
    // captured once per key (a batch-size bucket) as a CUDA graph and replayed afterwards. All
    // per-step inputs must then come from buffers set_batch fills (never host values baked
    // into kernel arguments). CPU: calls fn(ctx).
    void (*run_graph)(k25_backend *be, int key, void (*fn)(void *ctx), void *ctx);
    // Full logits of row t on host (all ranks gather; out[V] on every rank), for dumps/tests.
    void (*gather_logits)(k25_backend *be, const float *logits, int V_local, int t,
                          float *out);

    // ---- pipeline hand-off (optional) ----
    // x[n] of backend memory to / from the rank of pipeline stage `stage` (a rank of dist->pp)
    // with the same TP rank; blocking: x may be reused when the call returns. NULL: model.c
    // copies through host memory (to_host / to_device) and MPI on dist->pp.
    void (*pp_send)(k25_backend *be, const float *x, size_t n, int stage);
    void (*pp_recv)(k25_backend *be, float *x, size_t n, int stage);

    // ---- fused block end and concurrent branches ----
    // The end of a block: d[T][n] summed over the tensor-parallel group, h += that sum; then
    // out = rmsnorm(h) * w (the next block's input norm) when w is non-NULL, nothing more when
    // w is NULL. d's contents afterwards are unspecified (summed in place, or left as they were).
    // Equal to allreduce_sum(d) then add_rmsnorm (or add), which backends may fuse.
    void (*allreduce_add_rmsnorm)(k25_backend *be, float *h, float *d, const k25_tensor *w,
                                  float eps, int T, int n, float *out);
    // fork issues fn(ctx)'s ops as a side branch: it starts after every op issued before fork and
    // may run concurrently with the ops issued after fork returns, up to join; the ops issued
    // after join run after the branch. The branch must not touch memory that those concurrent
    // ops use, and must not fork again. CPU: fork calls fn(ctx), join does nothing.
    void (*fork)(k25_backend *be, void (*fn)(void *ctx), void *ctx);
    void (*join)(k25_backend *be);
};

#ifdef __cplusplus
extern "C" {
#endif

k25_backend *backend_cpu_create(const k25_config *cfg, const k25_dist *dist, int threads);
// NULL when the binary was built without CUDA; dies with a message when no GPU is usable.
k25_backend *backend_cuda_create(const k25_config *cfg, const k25_dist *dist);

#ifdef __cplusplus
}
#endif
