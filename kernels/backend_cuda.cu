// The CUDA backend: the operation table of src/backend.h on one GPU per MPI rank, NCCL for the
// tensor-parallel sums, weights uploaded once (routed experts repacked for the W4A16 kernel),
// the paged bf16 latent cache, and CUDA graphs of the whole step per batch size.
//
// One stream carries everything, so ops are ordered without events, except a fork's side branch
// (the shared expert beside the routed experts): a second stream that waits for an event of the
// main one and is joined by another event (inside a capture the two events fork and join the
// graph). K25_NO_OVERLAP=1 runs the branch on the main stream. Per-step inputs (tokens,
// positions, sequence slots, block tables) live in device buffers that set_batch fills; the
// kernels read them there, so a captured step replays correctly with new inputs. Workspaces
// are sized in set_batch for the step's row count, never inside a capture; when one grows,
// every captured graph is dropped first (they hold the old addresses).
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include "cuda_kernels.cuh" // first: gives weights.h C linkage
#include "backend.h"
#include "allreduce_oneshot.cuh"
#include "cuda_backend.h"
#include "progress.h"
#include "sampler.h"
#include "upload.cuh"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAX_GRAPHS 64
#define MAX_ALLOCS 4096

// ------------------------------------------------------------------------------------------
// State
// ------------------------------------------------------------------------------------------

// A layer's routed experts on the device.
typedef struct moe_dev {
    int int4;
    int E, I, D;                   // experts, local intermediate width, hidden
    uint32_t *gu_w, *dn_w;         // INT4 tiled: gate+up [E][2I x D], down [E][D x I]
    uint16_t *gu_s, *dn_s;         // their scales
    const uint16_t **gate, **up, **down; // bf16 experts: device arrays of [E] pointers
    void *bf16_block;              // one allocation holding the bf16 experts
} moe_dev;

typedef struct graph_entry {
    // Captured kernel arguments include the block-table shape, so it is part of the key.
    int key, T, max_seqs, max_blocks;
    cudaGraphExec_t exec;
} graph_entry;

typedef struct alloc_rec {
    void *p;
    size_t bytes;
} alloc_rec;

typedef struct cuda_impl {
    int device, num_sms;
    cudaStream_t stream;         // where ops go: the main stream, or the side one inside a fork
    cudaStream_t main_stream, side_stream;
    cudaEvent_t ev_fork, ev_join;
    int no_overlap, joined;      // joined: no side branch is waiting for join
    k25k_blas *blas;
    // the router's cuBLASLt path (prefill): its own conversion buffer and algorithm workspace,
    // because the shared expert may use blas at the same time on the side stream
    k25k_blas *blas_routed;
    ncclComm_t nccl;
    int tp, tp_rank;

    size_t mem_now, mem_peak;
    alloc_rec allocs[MAX_ALLOCS];
    int n_allocs;

    // batch
    int T, cap_rows, max_seqs, max_blocks, cap_table;
    int32_t *d_tokens, *d_pos, *d_seq, *d_table; // device
    int32_t *h_stage;                            // pinned: tokens, pos, seq, table
    size_t h_stage_cap;                          // int32 elements
    int32_t *h_pos, *h_seq;                      // host copies of the batch (tests, checks)

    // cache (bf16, or f32 with K25_KV_F32=1)
    void *cache;
    int kv_f32;
    int n_layers, n_blocks, kv_block;
    size_t layer_elems;
    float *d_inv_freq;
    float softmax_scale;
    int *d_err; // [4]: embed, mla write, mla read, moe
    // the attention's merge barrier (k25k_mla_args.merge_sync); NULL with K25_NO_MERGE_FOLD=1
    int *d_mla_sync;

    // workspaces (sized for ws_rows rows)
    int ws_rows;
    float *ws_mla;
    size_t ws_mla_floats;
    float *ws_logits;            // router logits [rows][E]
    int *ws_route;               // routing ints
    k25k_moe_route route;
    // idx whose routing sort the router's top-k already ran (into route) for the moe call that
    // follows; a host write of any device buffer clears it (tests feed their own choices)
    const int32_t *sorted_idx;
    float *ws_part1, *ws_h, *ws_part2;
    // The cuBLASLt operand [hi; lo] of staged_of[staged_n], written beside it by the norm (or the
    // attention) that produced it (stage_output), so that the projections reading it next skip
    // their conversion.
    // Any write overlapping staged_of clears the record (staged_clobber).
    uint16_t *staged;
    size_t staged_cap;           // bf16 elements
    const float *staged_of;
    size_t staged_n;
    int mla_chunks;

    // sampling
    k25_sampling *d_params;
    k25_cand *d_best, *d_best_all;
    k25_cand *d_cands, *d_cands_all;
    int *d_ncand, *d_ncand_all;
    k25_softmax_stats *d_stats, *d_stats_all;
    k25_cand *h_best, *h_cands;
    int *h_ncand;
    k25_softmax_stats *h_stats;
    int samp_rows;
    float *d_gather, *h_gather;
    size_t gather_cap;

    // graphs
    graph_entry graphs[MAX_GRAPHS];
    int n_graphs, no_graph, capturing;

    k25_oneshot *oneshot;          // NVLink one-shot all-reduce, NULL: NCCL only

    k25_weights *w;
} cuda_impl;

static cuda_impl *impl_of(k25_backend *be) { return (cuda_impl *)be->impl; }

// Staged operands. A norm whose output feeds the cuBLASLt products (T above the GEMV's row
// limit: q_a + kv_a, q_b and the router read the norms' outputs), and the attention for
// o_proj, write their bf16 operand beside the output, which saves a conversion kernel per
// product (and its read of the activations).
// The buffer is one, written and read on the main stream only, so stream order protects it. The
// shared expert's products on the side stream convert for themselves: reading the operand they
// started at once beside the router and slowed its top-k, which the routed experts wait for
// (16-256 rows 0.4-1.9% slower than converting there; `bench/NOTES.md`, eighteenth round).
static uint16_t *stage_output(cuda_impl *c, const float *out, int T, int n, uint16_t **lo) {
    const size_t tn = (size_t)T * n;
    c->staged_of = NULL;
    *lo = NULL;
    if (T <= k25k_blas_gemv_max_t(c->blas) || c->stream != c->main_stream ||
        2 * tn > c->staged_cap)
        return NULL;
    c->staged_of = out;
    c->staged_n = tn;
    if (k25k_split_activations()) *lo = c->staged + tn;
    return c->staged;
}

// The staged operand of x[T][K] for a product on the main stream, or NULL (the product
// converts x itself).
static const uint16_t *staged_operand(const cuda_impl *c, const float *x, int T, int64_t K) {
    if (c->stream != c->main_stream) return NULL;
    return c->staged_of && x == c->staged_of && (size_t)T * K == c->staged_n ? c->staged : NULL;
}

// Every op that writes memory calls this for each output: a write into the staged activations
// makes their operand stale.
static void staged_clobber(cuda_impl *c, const void *p, size_t bytes) {
    const char *a = (const char *)c->staged_of, *q = (const char *)p;
    if (a && q < a + c->staged_n * sizeof(float) && a < q + bytes) c->staged_of = NULL;
}

// ------------------------------------------------------------------------------------------
// Device memory with accounting
// ------------------------------------------------------------------------------------------

static void *dev_alloc(cuda_impl *c, size_t bytes, const char *what) {
    void *p = NULL;
    if (!bytes) bytes = 16;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        const char *why = k25_alloc_purpose_now();
        K25_DIE("GPU %d: cannot allocate %.3f GiB for %s%s%s (%s): %.3f GiB free of %.3f GiB, "
                "%.3f GiB held by this backend", c->device, bytes / GIB, what, why ? ", " : "",
                why ? why : "", cudaGetErrorString(e), fr / GIB, tot / GIB, c->mem_now / GIB);
    }
    if (c->n_allocs >= MAX_ALLOCS) K25_DIE("CUDA backend: more than %d allocations", MAX_ALLOCS);
    c->allocs[c->n_allocs++] = (alloc_rec){p, bytes};
    c->mem_now += bytes;
    if (c->mem_now > c->mem_peak) c->mem_peak = c->mem_now;
    return p;
}

static void dev_free(cuda_impl *c, void *p) {
    if (!p) return;
    for (int i = 0; i < c->n_allocs; i++)
        if (c->allocs[i].p == p) {
            c->mem_now -= c->allocs[i].bytes;
            c->allocs[i] = c->allocs[--c->n_allocs];
            CUDA_CHECK(cudaFree(p));
            return;
        }
    K25_DIE("CUDA backend: free of %p, which it did not allocate", p);
}

static int capturing(cuda_impl *c) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

static void no_capture(cuda_impl *c, const char *what) {
    if (capturing(c))
        K25_DIE("%s inside a captured step (CUDA graph): not allowed; run with K25_NO_GRAPH=1 or "
                "move it out of the step", what);
}

static void drop_graphs(cuda_impl *c) {
    if (!c->n_graphs) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < c->n_graphs; i++) CUDA_CHECK(cudaGraphExecDestroy(c->graphs[i].exec));
    c->n_graphs = 0;
}

// Device error flags set by kernels (bad token id, cache slot, expert id): checked at syncs.
static void check_errors(cuda_impl *c) {
    int err[4];
    CUDA_CHECK(cudaMemcpyAsync(err, c->d_err, sizeof err, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (err[0]) K25_DIE("embed: a token id outside the vocabulary");
    if (err[1] == 1) K25_DIE("mla: a row's (sequence, position) has no cache block in the block table");
    if (err[1]) K25_DIE("mla: a position read maps outside the cache");
    if (err[3]) K25_DIE("moe: an expert index outside [0, n_experts)");
}

static void *cuda_alloc(k25_backend *be, size_t bytes) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "alloc");
    void *p = dev_alloc(c, bytes, "a buffer");
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 16, c->stream));
    return p;
}

static void cuda_free_op(k25_backend *be, void *p) {
    cuda_impl *c = impl_of(be);
    if (!p) return;
    no_capture(c, "free");
    c->staged_of = NULL; // the address may come back from the next alloc
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    dev_free(c, p);
}

static void cuda_to_device(k25_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "to_device");
    c->sorted_idx = NULL;
    staged_clobber(c, dst, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_to_host(k25_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "to_host");
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_sync(k25_backend *be) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "sync");
    if (c->stream != c->side_stream) CUDA_CHECK(cudaStreamSynchronize(c->side_stream));
    check_errors(c);
}

static size_t cuda_mem_peak(k25_backend *be) { return impl_of(be)->mem_peak; }

// ------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------

typedef struct mem_plan {
    size_t embed, lm_head, attn, dense, experts, other;
} mem_plan;

static size_t tb(const k25_tensor *t) { return t->kind != K25_SRC_NONE ? tensor_bytes(t) : 0; }

static mem_plan plan_weights(const k25_weights *w) {
    mem_plan p = {0, 0, 0, 0, 0, 0};
    p.embed = tb(&w->embed);
    p.lm_head = tb(&w->lm_head);
    p.other = tb(&w->final_norm);
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        const k25_layer *L = &w->layers[l];
        p.attn += tb(&L->attn_norm) + tb(&L->q_a) + tb(&L->q_a_norm) + tb(&L->q_b) + tb(&L->kv_a) +
                  tb(&L->kv_a_norm) + tb(&L->kv_b) + tb(&L->o_proj);
        p.dense += tb(&L->ffn_norm) + tb(&L->ffn_gate) + tb(&L->ffn_up) + tb(&L->ffn_down) +
                   tb(&L->router) + tb(&L->router_bias);
        if (L->is_moe && L->exp_gate)
            for (int e = 0; e < w->cfg->n_experts; e++)
                p.experts += tb(&L->exp_gate[e].w) + tb(&L->exp_gate[e].scale) +
                             tb(&L->exp_up[e].w) + tb(&L->exp_up[e].scale) +
                             tb(&L->exp_down[e].w) + tb(&L->exp_down[e].scale);
    }
    return p;
}

static void upload_plain(cuda_impl *c, k25k_uploader *u, k25_tensor *t) {
    if (t->kind == K25_SRC_NONE || t->dev) return;
    t->dev_bytes = tensor_bytes(t);
    t->dev = dev_alloc(c, t->dev_bytes, t->name);
    k25k_upload_tensor(u, t, t->dev);
}

// Two projections of the same input (q_a + kv_a, gate + up) in one allocation, b right after a,
// where a's bytes keep b 256-byte aligned: above the GEMV's rows k25k_matmul2 then runs them as
// one GEMM of N1 + N2 rows (one weight stream, one launch). Otherwise two allocations.
static void upload_pair(cuda_impl *c, k25k_uploader *u, k25_tensor *a, k25_tensor *b) {
    if (a->kind == K25_SRC_NONE || b->kind == K25_SRC_NONE || a->dev || b->dev ||
        tensor_bytes(a) % 256 != 0) {
        upload_plain(c, u, a);
        upload_plain(c, u, b);
        return;
    }
    a->dev_bytes = tensor_bytes(a), b->dev_bytes = tensor_bytes(b);
    char *p = (char *)dev_alloc(c, a->dev_bytes + b->dev_bytes, a->name);
    a->dev = p, b->dev = p + a->dev_bytes;
    k25k_upload_tensor(u, a, a->dev);
    k25k_upload_tensor(u, b, b->dev);
}

static int dev_owned(const cuda_impl *c, const void *p) {
    for (int i = 0; i < c->n_allocs; i++)
        if (c->allocs[i].p == p) return 1;
    return 0;
}

// Frees a pair's memory: b has its own allocation unless upload_pair put it in a's.
static void free_pair(cuda_impl *c, k25_tensor *a, k25_tensor *b) {
    if (b->dev && !dev_owned(c, b->dev)) b->dev = NULL; // inside a's allocation
    if (a->dev) dev_free(c, a->dev), a->dev = NULL;
    if (b->dev) dev_free(c, b->dev), b->dev = NULL;
}

// Routed experts of one layer: INT4 tiled (repacked through device staging) or bf16.
static void upload_experts(cuda_impl *c, k25k_uploader *u, const k25_config *cfg, k25_layer *L,
                           void *stage, size_t stage_bytes) {
    moe_dev *m = (moe_dev *)k25_calloc(1, sizeof *m);
    const int E = cfg->n_experts;
    m->E = E;
    m->I = (int)L->exp_gate[0].out;
    m->D = (int)L->exp_gate[0].in;
    m->int4 = L->exp_gate[0].scale.kind != K25_SRC_NONE;
    const int I = m->I, D = m->D;
    if (m->int4) {
        const int group = cfg->quant_group;
        if (I % 32 || D % 32 || group % 32)
            K25_DIE("layer %d: INT4 experts need the local width %d, hidden %d and group %d to "
                    "be multiples of 32", L->index, I, D, group);
        const size_t gu_w = (size_t)2 * I * D / 2, gu_s = (size_t)2 * I * (D / 32) * 2;
        const size_t dn_w = (size_t)D * I / 2, dn_s = (size_t)D * (I / 32) * 2;
        m->gu_w = (uint32_t *)dev_alloc(c, gu_w * E, "experts gate+up");
        m->gu_s = (uint16_t *)dev_alloc(c, gu_s * E, "experts gate+up scales");
        m->dn_w = (uint32_t *)dev_alloc(c, dn_w * E, "experts down");
        m->dn_s = (uint16_t *)dev_alloc(c, dn_s * E, "experts down scales");
        // staging: gate w | up w | gate s | up s  (checkpoint layout)
        const size_t wq = (size_t)I * D / 2, sq = (size_t)I * (D / group) * 2;
        if (2 * wq + 2 * sq > stage_bytes) K25_DIE("expert staging too small");
        char *st = (char *)stage;
        uint32_t *sg = (uint32_t *)st, *su = (uint32_t *)(st + wq);
        uint16_t *ssg = (uint16_t *)(st + 2 * wq), *ssu = (uint16_t *)(st + 2 * wq + sq);
        for (int e = 0; e < E; e++) {
            k25_expert_w *g = &L->exp_gate[e], *up = &L->exp_up[e], *dn = &L->exp_down[e];
            if (g->out != I || up->out != I || g->in != D || dn->out != D || dn->in != I)
                K25_DIE("layer %d expert %d: shapes differ from expert 0", L->index, e);
            k25k_upload_tensor(u, &g->w, sg);
            k25k_upload_tensor(u, &up->w, su);
            k25k_upload_tensor(u, &g->scale, ssg);
            k25k_upload_tensor(u, &up->scale, ssu);
            k25k_w4_repack(sg, su, ssg, ssu, 2 * I, D, group, 1,
                           (uint32_t *)((char *)m->gu_w + gu_w * e),
                           (uint16_t *)((char *)m->gu_s + gu_s * e), c->stream);
            k25k_upload_tensor(u, &dn->w, sg);
            k25k_upload_tensor(u, &dn->scale, ssg);
            k25k_w4_repack(sg, NULL, ssg, NULL, D, I, group, 0,
                           (uint32_t *)((char *)m->dn_w + dn_w * e),
                           (uint16_t *)((char *)m->dn_s + dn_s * e), c->stream);
        }
    } else {
        const size_t gsz = (size_t)I * D * 2;
        char *blk = (char *)dev_alloc(c, 3 * gsz * E, "bf16 experts");
        m->bf16_block = blk;
        const uint16_t **hp = (const uint16_t **)k25_malloc(sizeof(void *) * 3 * (size_t)E);
        for (int e = 0; e < E; e++) {
            char *base = blk + 3 * gsz * e;
            k25k_upload_tensor(u, &L->exp_gate[e].w, base);
            k25k_upload_tensor(u, &L->exp_up[e].w, base + gsz);
            k25k_upload_tensor(u, &L->exp_down[e].w, base + 2 * gsz);
            hp[e] = (const uint16_t *)base;
            hp[E + e] = (const uint16_t *)(base + gsz);
            hp[2 * E + e] = (const uint16_t *)(base + 2 * gsz);
        }
        const uint16_t **dp = (const uint16_t **)dev_alloc(c, sizeof(void *) * 3 * (size_t)E,
                                                           "expert pointer table");
        CUDA_CHECK(cudaMemcpyAsync(dp, hp, sizeof(void *) * 3 * (size_t)E, cudaMemcpyHostToDevice,
                                   c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        free(hp);
        m->gate = dp;
        m->up = dp + E;
        m->down = dp + 2 * E;
    }
    L->backend_data = m;
}

static void cuda_load_weights(k25_backend *be, k25_weights *w) {
    cuda_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    c->w = w;
    mem_plan p = plan_weights(w);
    size_t total = p.embed + p.lm_head + p.attn + p.dense + p.experts + p.other;
    size_t reserve = (size_t)1 << 30; // activations, workspaces, cuBLASLt, NCCL
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    k25_log("cuda: weights %.2f GiB per rank (embedding %.2f, lm_head %.2f, attention %.2f, "
            "dense/shared/router %.2f, routed experts %.2f), GPU %.2f GiB free of %.2f\n",
            total / GIB, p.embed / GIB, p.lm_head / GIB, p.attn / GIB, p.dense / GIB,
            p.experts / GIB, fr / GIB, tot / GIB);
    if (total + reserve > fr)
        K25_DIE("GPU %d cannot hold this rank's weights: need %.2f GiB (embedding %.2f, lm_head "
                "%.2f, attention %.2f, dense/shared/router %.2f, routed experts %.2f) + %.2f GiB "
                "for activations and workspaces, %.2f GiB free of %.2f GiB; use more ranks "
                "(tensor parallelism) or fewer layers",
                c->device, total / GIB, p.embed / GIB, p.lm_head / GIB, p.attn / GIB,
                p.dense / GIB, p.experts / GIB, reserve / GIB, fr / GIB, tot / GIB);

    int show = 1;
    progress_begin("loading weights", total);
    k25k_uploader *u = k25k_uploader_create(c->stream, (size_t)64 << 20, show);
    upload_plain(c, u, &w->embed);
    upload_plain(c, u, &w->final_norm);
    upload_plain(c, u, &w->lm_head);
    size_t stage_bytes = 0;
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        k25_layer *L = &w->layers[l];
        if (L->is_moe && L->exp_gate) {
            size_t I = (size_t)L->exp_gate[0].out, D = (size_t)L->exp_gate[0].in;
            size_t need = 2 * (I * D / 2) + 2 * (I * (D / 8) * 2) + 256;
            if (need > stage_bytes) stage_bytes = need;
        }
    }
    void *stage = stage_bytes ? dev_alloc(c, stage_bytes, "expert staging") : NULL;
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        k25_layer *L = &w->layers[l];
        upload_pair(c, u, &L->q_a, &L->kv_a);
        upload_pair(c, u, &L->ffn_gate, &L->ffn_up);
        k25_tensor *ts[] = {&L->attn_norm, &L->q_a_norm, &L->q_b,     &L->kv_a_norm,
                            &L->kv_b,      &L->o_proj,   &L->ffn_norm, &L->ffn_down,
                            &L->router,    &L->router_bias};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) upload_plain(c, u, ts[i]);
        if (L->is_moe && L->exp_gate) upload_experts(c, u, cfg, L, stage, stage_bytes);
    }
    k25k_uploader_destroy(u);
    progress_end();
    if (stage) dev_free(c, stage);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void free_weights(cuda_impl *c, k25_weights *w) {
    k25_tensor *top[] = {&w->embed, &w->final_norm, &w->lm_head};
    for (int i = 0; i < 3; i++)
        if (top[i]->dev) dev_free(c, top[i]->dev), top[i]->dev = NULL;
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        k25_layer *L = &w->layers[l];
        free_pair(c, &L->q_a, &L->kv_a);
        free_pair(c, &L->ffn_gate, &L->ffn_up);
        k25_tensor *ts[] = {&L->attn_norm, &L->q_a_norm, &L->q_b,     &L->kv_a_norm,
                            &L->kv_b,      &L->o_proj,   &L->ffn_norm, &L->ffn_down,
                            &L->router,    &L->router_bias};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if (ts[i]->dev) dev_free(c, ts[i]->dev), ts[i]->dev = NULL;
        moe_dev *m = (moe_dev *)L->backend_data;
        if (m) {
            dev_free(c, m->gu_w), dev_free(c, m->gu_s), dev_free(c, m->dn_w), dev_free(c, m->dn_s);
            dev_free(c, m->bf16_block);
            dev_free(c, (void *)m->gate);
            free(m);
            L->backend_data = NULL;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Cache and batch
// ------------------------------------------------------------------------------------------

static void cuda_kv_init(k25_backend *be, int n_layers, int n_blocks, int kv_block) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "kv_init");
    drop_graphs(c);
    if (c->cache) dev_free(c, c->cache);
    const int W = be->cfg->kv_lora_rank + be->cfg->qk_rope_dim;
    c->n_layers = n_layers, c->n_blocks = n_blocks, c->kv_block = kv_block;
    c->layer_elems = (size_t)n_blocks * kv_block * W;
    const size_t es = c->kv_f32 ? 4 : 2;
    size_t bytes = c->layer_elems * n_layers * es;
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    size_t reserve = (size_t)512 << 20;
    if (bytes + reserve > fr)
        K25_DIE("GPU %d cannot hold the latent cache: %d layers x %d blocks x %d tokens x %d "
                "values (%s) = %.2f GiB + %.2f GiB reserve, %.2f GiB free of %.2f GiB (weights "
                "and buffers of this backend hold %.2f GiB); lower run.ctx_size, the batch or "
                "run.kv_cache_mb", c->device, n_layers, n_blocks, kv_block, W, c->kv_f32 ? "f32" : "bf16", bytes / GIB,
                reserve / GIB, fr / GIB, tot / GIB, c->mem_now / GIB);
    c->cache = dev_alloc(c, bytes, "latent cache");
    CUDA_CHECK(cudaMemsetAsync(c->cache, 0, bytes, c->stream));
    k25_log("cuda: latent cache %.2f GiB (%d layers, %d blocks of %d tokens, %s)\n", bytes / GIB,
            n_layers, n_blocks, kv_block, c->kv_f32 ? "f32" : "bf16");
}

// Workspaces for steps of up to `rows` rows; grows (dropping graphs) only outside captures.
static void ensure_workspaces(cuda_impl *c, const k25_config *cfg, int rows) {
    if (rows <= c->ws_rows) return;
    no_capture(c, "workspace growth");
    drop_graphs(c);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    const int tp = c->w ? c->w->tp_size : c->tp; // the weights' split (run.sim_tp included)
    const int H = cfg->n_heads / tp, L = cfg->kv_lora_rank, E = cfg->n_experts;
    const int D = cfg->hidden, I = cfg->moe_inter / tp, top_k = cfg->top_k;
    int R = rows;
    char rows_src[128], why[192];
    snprintf(why, sizeof why, "the workspaces of %d-row steps (%s)", R,
             config_step_rows_source(cfg, R, rows_src, sizeof rows_src));
    const char *prev_why = k25_alloc_purpose(why);
    // bf16 activations for cuBLASLt: the widest K of any projection
    size_t Kmax = (size_t)D;
    int ks[] = {cfg->q_lora_rank, H * cfg->v_head_dim, cfg->dense_inter / tp,
                cfg->n_shared * cfg->moe_inter / tp, L, I};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if ((size_t)ks[i] > Kmax) Kmax = ks[i];
    k25k_blas_reserve(c->blas, Kmax * R * 2); // hi and lo halves
    k25k_blas_reserve(c->blas_routed, (size_t)D * R * 2);
    // products of the stacked halves (up to k25k_lt_one_pass_rows()): the widest N of the
    // layers' projections (a pair of them counts as one) and of MLA's per-head GEMMs (all
    // heads); the lm_head is wider and keeps the two products
    size_t Nmax = (size_t)D;
    int ns[] = {cfg->q_lora_rank + L + cfg->qk_rope_dim, // q_a + kv_a as one GEMM
                H * (cfg->qk_nope_dim + cfg->qk_rope_dim), 2 * (cfg->dense_inter / tp),
                2 * (cfg->n_shared * cfg->moe_inter / tp), E, H * L, H * cfg->v_head_dim};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        if ((size_t)ns[i] > Nmax) Nmax = ns[i];
    if (k25k_split_activations()) {
        const int one = k25k_lt_one_pass_rows();
        const size_t r2 = 2 * (size_t)(R < one ? R : one);
        k25k_blas_reserve_products(c->blas, r2 * Nmax);
        k25k_blas_reserve_products(c->blas_routed, r2 * E); // the router (its own buffers)
    }

    dev_free(c, c->staged);
    c->staged_of = NULL;
    // the norms' outputs (D, q_lora_rank wide) and the attention's (H v_head_dim)
    size_t widest = (size_t)(D > cfg->q_lora_rank ? D : cfg->q_lora_rank);
    if ((size_t)H * cfg->v_head_dim > widest) widest = (size_t)H * cfg->v_head_dim;
    c->staged_cap = 2 * (size_t)R * widest;
    c->staged = (uint16_t *)dev_alloc(c, c->staged_cap * 2, "staged bf16 activations");

    dev_free(c, c->ws_mla);
    size_t mla = 0;
    for (int t = 1; t <= R; t++) { // the largest need over T <= R (chunks depend on T)
        size_t f = k25k_mla_workspace_floats(t, H, L, k25k_mla_chunks(t, H, c->num_sms));
        if (f > mla) mla = f;
    }
    c->ws_mla_floats = mla;
    c->ws_mla = (float *)dev_alloc(c, mla * sizeof(float), "attention workspace");

    dev_free(c, c->ws_logits);
    c->ws_logits = (float *)dev_alloc(c, sizeof(float) * (size_t)R * E, "router logits");

    if (cfg->n_layers > cfg->first_dense) {
        const int A = R * top_k;
        dev_free(c, c->ws_route);
        const int MI = k25k_moe_max_items(R, top_k, E);
        const size_t n_done = (size_t)MI * k25k_moe_row_blocks(2 * I);
        size_t ints =
            (size_t)E + (E + 1) + E + 1 + A + A + 2 * (size_t)MI + 1 + 4 + n_done + 2 + MI;
        c->ws_route = (int *)dev_alloc(c, sizeof(int) * ints, "routing");
        int *p = c->ws_route;
        c->route.counts = p, p += E;
        c->route.offsets = p, p += E + 1;
        c->route.active = p, p += E;
        c->route.n_active = p, p += 1;
        c->route.slot_token = p, p += A;
        c->route.slot_of = p, p += A;
        c->route.item_expert = p, p += MI;
        c->route.item_p0 = p, p += MI;
        c->route.n_items = p, p += 1;
        c->route.plan = p, p += 4;
        c->route.tile_done = p, p += n_done;
        c->route.unit_next = p, p += 2;
        c->route.item_ready = p, p += MI;
        CUDA_CHECK(cudaMemsetAsync(c->route.tile_done, 0, sizeof(int) * (n_done + 2), c->stream));
        c->route.err = c->d_err + 3;
        // split plans depend on the routing (chosen on the device): the worst over T <= R
        size_t p1 = 0, p2 = 0;
        for (int t = 1; t <= R; t++) {
            size_t f1 = k25k_moe_part_floats(2 * I, D, t * top_k, c->num_sms);
            size_t f2 = k25k_moe_part_floats(D, I, t * top_k, c->num_sms);
            if (f1 > p1) p1 = f1;
            if (f2 > p2) p2 = f2;
        }
        dev_free(c, c->ws_part1);
        dev_free(c, c->ws_h);
        dev_free(c, c->ws_part2);
        c->ws_part1 = (float *)dev_alloc(c, sizeof(float) * p1, "moe partials");
        c->ws_h = (float *)dev_alloc(c, sizeof(float) * (size_t)A * I, "moe intermediate");
        c->ws_part2 = (float *)dev_alloc(c, sizeof(float) * p2, "moe partials");
    }
    c->ws_rows = rows;
    k25_alloc_purpose(prev_why);
}

static void cuda_set_batch(k25_backend *be, const k25_batch *b) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "set_batch");
    c->staged_of = NULL;
    const int table = b->max_seqs * b->max_blocks_per_seq;
    if (b->T > c->cap_rows || table > c->cap_table) {
        drop_graphs(c);
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (b->T > c->cap_rows) {
            int cap = b->T > 256 ? b->T : 256;
            dev_free(c, c->d_tokens), dev_free(c, c->d_pos), dev_free(c, c->d_seq);
            c->d_tokens = (int32_t *)dev_alloc(c, sizeof(int32_t) * cap, "batch tokens");
            c->d_pos = (int32_t *)dev_alloc(c, sizeof(int32_t) * cap, "batch positions");
            c->d_seq = (int32_t *)dev_alloc(c, sizeof(int32_t) * cap, "batch sequences");
            free(c->h_pos), free(c->h_seq);
            c->h_pos = (int32_t *)k25_malloc(sizeof(int32_t) * cap);
            c->h_seq = (int32_t *)k25_malloc(sizeof(int32_t) * cap);
            c->cap_rows = cap;
        }
        if (table > c->cap_table) {
            dev_free(c, c->d_table);
            c->d_table = (int32_t *)dev_alloc(c, sizeof(int32_t) * (table ? table : 1),
                                              "block table");
            c->cap_table = table;
        }
        size_t need = 3 * (size_t)c->cap_rows + c->cap_table;
        if (need > c->h_stage_cap) {
            if (c->h_stage) CUDA_CHECK(cudaFreeHost(c->h_stage));
            CUDA_CHECK(cudaMallocHost(&c->h_stage, need * sizeof(int32_t)));
            c->h_stage_cap = need;
        }
    }
    ensure_workspaces(c, be->cfg, b->T);
    // the pinned stage may still feed the previous step's copies
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    int32_t *st = c->h_stage;
    memcpy(st, b->tokens, sizeof(int32_t) * b->T);
    memcpy(st + c->cap_rows, b->pos, sizeof(int32_t) * b->T);
    memcpy(st + 2 * c->cap_rows, b->seq, sizeof(int32_t) * b->T);
    if (table) memcpy(st + 3 * c->cap_rows, b->block_table, sizeof(int32_t) * table);
    CUDA_CHECK(cudaMemcpyAsync(c->d_tokens, st, sizeof(int32_t) * b->T, cudaMemcpyHostToDevice,
                               c->stream));
    CUDA_CHECK(cudaMemcpyAsync(c->d_pos, st + c->cap_rows, sizeof(int32_t) * b->T,
                               cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaMemcpyAsync(c->d_seq, st + 2 * c->cap_rows, sizeof(int32_t) * b->T,
                               cudaMemcpyHostToDevice, c->stream));
    if (table)
        CUDA_CHECK(cudaMemcpyAsync(c->d_table, st + 3 * c->cap_rows, sizeof(int32_t) * table,
                                   cudaMemcpyHostToDevice, c->stream));
    memcpy(c->h_pos, b->pos, sizeof(int32_t) * b->T);
    memcpy(c->h_seq, b->seq, sizeof(int32_t) * b->T);
    c->T = b->T;
    c->max_seqs = b->max_seqs;
    c->max_blocks = b->max_blocks_per_seq;
}

// ------------------------------------------------------------------------------------------
// Operations
// ------------------------------------------------------------------------------------------

static const uint16_t *bf16_dev(const k25_tensor *t, int64_t n_elems) {
    if (!t->dev) K25_DIE("%s: not loaded on the GPU", t->name);
    if (t->dtype != K25_BF16) K25_DIE("%s: dtype %s, expected BF16", t->name, k25_dtype_name(t->dtype));
    if (n_elems >= 0 && t->rows * t->cols != n_elems)
        K25_DIE("%s: %lld elements, expected %lld", t->name, (long long)(t->rows * t->cols),
                (long long)n_elems);
    return (const uint16_t *)t->dev;
}

extern "C" void k25_cuda_wrote(k25_backend *be, const void *p, size_t bytes) {
    staged_clobber(impl_of(be), p, bytes);
}

static void cuda_embed(k25_backend *be, const k25_tensor *emb, float *x) {
    cuda_impl *c = impl_of(be);
    staged_clobber(c, x, sizeof(float) * c->T * emb->cols);
    k25k_embed(c->d_tokens, c->T, bf16_dev(emb, -1), emb->rows, (int)emb->cols, x, c->d_err + 0,
               c->stream);
}

static void cuda_rmsnorm(k25_backend *be, const float *x, int ld, const k25_tensor *w, float eps,
                         int T, int n, float *out) {
    cuda_impl *c = impl_of(be);
    uint16_t *lo, *hi = stage_output(c, out, T, n, &lo);
    k25k_rmsnorm(x, ld, bf16_dev(w, n), eps, T, n, out, hi, lo, c->stream);
}

static void cuda_add_rmsnorm(k25_backend *be, float *h, const float *d, const k25_tensor *w,
                             float eps, int T, int n, float *out) {
    cuda_impl *c = impl_of(be);
    staged_clobber(c, h, sizeof(float) * T * n);
    uint16_t *lo, *hi = stage_output(c, out, T, n, &lo);
    k25k_add_rmsnorm(h, d, bf16_dev(w, n), eps, T, n, out, hi, lo, c->stream);
}

// The cuBLASLt path (T above the GEMV's row limit) converts x[T][K] into the workspace: grown
// outside any graph capture, and the graphs that hold the old workspace dropped.
static void blas_reserve(cuda_impl *c, k25k_blas *b, int T, int64_t K) {
    if (T > 0 && (size_t)T * K * 2 > k25k_blas_capacity(b)) {
        no_capture(c, "matmul workspace growth");
        drop_graphs(c);
        k25k_blas_reserve(b, (size_t)T * K * 2);
    }
}

static void cuda_matmul(k25_backend *be, const float *x, const k25_tensor *W, int T, float *y) {
    cuda_impl *c = impl_of(be);
    const uint16_t *wd = bf16_dev(W, -1);
    blas_reserve(c, c->blas, T, W->cols);
    const uint16_t *xs = staged_operand(c, x, T, W->cols);
    staged_clobber(c, y, sizeof(float) * T * W->rows);
    k25k_matmul(c->blas, x, xs, wd, T, (int)W->rows, (int)W->cols, y, c->stream);
}

static void cuda_matmul2(k25_backend *be, const float *x, const k25_tensor *W1,
                         const k25_tensor *W2, int T, float *y1, float *y2) {
    cuda_impl *c = impl_of(be);
    const uint16_t *w1 = bf16_dev(W1, -1), *w2 = bf16_dev(W2, -1);
    if (W1->cols != W2->cols)
        K25_DIE("matmul2: %s has %lld columns, %s %lld (one input for both)", W1->name,
                (long long)W1->cols, W2->name, (long long)W2->cols);
    blas_reserve(c, c->blas, T, W1->cols); // the cuBLASLt path converts x once for both
    const uint16_t *xs = staged_operand(c, x, T, W1->cols);
    staged_clobber(c, y1, sizeof(float) * T * W1->rows);
    staged_clobber(c, y2, sizeof(float) * T * W2->rows);
    k25k_matmul2(c->blas, x, xs, w1, w2, T, (int)W1->rows, (int)W2->rows, (int)W1->cols, y1, y2,
                 c->stream);
}

static void cuda_silu_mul(k25_backend *be, const float *gate, const float *up, int T, int n,
                          float *out) {
    cuda_impl *c = impl_of(be);
    staged_clobber(c, out, sizeof(float) * T * n);
    k25k_silu_mul(gate, up, (size_t)T * n, out, c->stream);
}

static void cuda_add(k25_backend *be, float *y, const float *x, size_t n) {
    cuda_impl *c = impl_of(be);
    staged_clobber(c, y, sizeof(float) * n);
    k25k_add(y, x, n, c->stream);
}

static void cuda_mla_attention(k25_backend *be, int layer, const k25_layer *L, float *q,
                               float *kv, float *out) {
    cuda_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    if (layer < 0 || layer >= c->n_layers) K25_DIE("mla: cache layer %d of %d", layer, c->n_layers);
    const int dq = cfg->qk_nope_dim + cfg->qk_rope_dim;
    k25k_mla_args a;
    a.T = c->T;
    a.H = (int)(L->q_b.rows / dq);
    a.L = cfg->kv_lora_rank;
    a.dr = cfg->qk_rope_dim;
    a.dn = cfg->qk_nope_dim;
    a.dv = cfg->v_head_dim;
    a.kv_block = c->kv_block;
    a.max_blocks = c->max_blocks;
    a.max_seqs = c->max_seqs;
    a.n_blocks = c->n_blocks;
    a.eps = cfg->latent_norm_eps;
    a.scale = c->softmax_scale;
    a.pos = c->d_pos;
    a.seq = c->d_seq;
    a.block_table = c->d_table;
    a.norm_w = bf16_dev(&L->kv_a_norm, a.L);
    a.inv_freq = c->d_inv_freq;
    a.err = c->d_err + 1;
    a.merge_sync = c->d_mla_sync;
    const uint16_t *kvb = bf16_dev(&L->kv_b, (int64_t)a.H * (a.dn + a.dv) * a.L);
    int chunks = k25k_mla_chunks(a.T, a.H, c->num_sms);
    if (k25k_mla_workspace_floats(a.T, a.H, a.L, chunks) > c->ws_mla_floats)
        K25_DIE("mla: workspace sized for %d rows, step has %d", c->ws_rows, a.T);
    staged_clobber(c, q, sizeof(float) * a.T * a.H * dq); // normalized and rotated in place
    staged_clobber(c, kv, sizeof(float) * a.T * (a.L + a.dr));
    staged_clobber(c, out, sizeof(float) * a.T * a.H * a.dv);
    char *cl = (char *)c->cache + c->layer_elems * layer * (c->kv_f32 ? 4 : 2);
    // c->blas for the projections above the GEMV's rows (absorb, output): attention runs on the
    // main stream outside the shared-expert branch, which is the other user of c->blas. Its
    // output's sum kernel stages the o_proj product's operand, as a norm does.
    uint16_t *lo, *hi = stage_output(c, out, a.T, a.H * a.dv, &lo);
    if (!k25k_mla_attention_blas(&a, cl, c->kv_f32, kvb, q, kv, out, hi, lo, c->ws_mla, chunks,
                                 c->blas, c->stream))
        c->staged_of = NULL;
}

static void cuda_router(k25_backend *be, const float *x, const k25_layer *L, int32_t *idx,
                        float *wts) {
    cuda_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    const int E = cfg->n_experts, D = cfg->hidden;
    if (L->router_bias.dtype != K25_F32 || !L->router_bias.dev)
        K25_DIE("%s: expected a loaded F32 bias", L->router_bias.name);
    // Up to the GEMV's row limit (decode, verification) f32 activations and accumulation, as
    // every projection there: the choices flip on small errors, and a row's logits do not depend
    // on the step's row count. Above it (prefill) the two-bf16-product cuBLASLt path of the
    // other projections (the f32 tile GEMV at 512 rows took ~300 us per layer), with the routed
    // side's own cuBLASLt buffers.
    blas_reserve(c, c->blas_routed, c->T, D);
    staged_clobber(c, idx, sizeof(int32_t) * c->T * cfg->top_k);
    staged_clobber(c, wts, sizeof(float) * c->T * cfg->top_k);
    // above the GEMV's rows the top-k adds the GEMM's hi and lo products itself (no sum kernel
    // between the two on the routed experts' path)
    const float *parts = k25k_matmul_parts(c->blas_routed, x, staged_operand(c, x, c->T, D),
                                           bf16_dev(&L->router, (int64_t)E * D), c->T, E, D,
                                           c->ws_logits, c->stream);
    // the routing sort of the moe call that follows in the same launch where one block holds
    // every row (up to 16 rows: decode batches, verification steps): one launch fewer per layer
    const moe_dev *m = (const moe_dev *)L->backend_data;
    const k25k_route_sort sort = {&c->route, m ? m->I : 0, m ? m->D : 0, c->num_sms};
    const k25k_uniform uni = {c->d_pos, c->d_seq, L->index};
    const int sorted = k25k_router_topk(
        parts ? parts : c->ws_logits, parts ? parts + (size_t)c->T * E : NULL,
        (const float *)L->router_bias.dev, c->T, E, cfg->n_group, cfg->topk_group,
        cfg->top_k, cfg->norm_topk_prob, cfg->routed_scale, idx, wts,
        m && m->E == E && c->T <= c->ws_rows ? &sort : NULL,
        cfg->uniform_routing ? &uni : NULL, c->stream);
    c->sorted_idx = sorted ? idx : NULL;
}

static void cuda_join(k25_backend *be);

static void cuda_moe(k25_backend *be, const float *x, const k25_layer *L, const int32_t *idx,
                     const float *wts, const float *add, float *out) {
    cuda_impl *c = impl_of(be);
    const k25_config *cfg = be->cfg;
    const moe_dev *m = (const moe_dev *)L->backend_data;
    if (!m) K25_DIE("moe: layer %d has no experts on the GPU", L->index);
    const int T = c->T, K = cfg->top_k, A = T * K, E = m->E, I = m->I, D = m->D;
    const int max_active = A < E ? A : E;
    if (T > c->ws_rows) K25_DIE("moe: workspaces sized for %d rows, step has %d", c->ws_rows, T);
    staged_clobber(c, out, sizeof(float) * T * D);
    // the routing kernel also picks the split plans (r.plan) from the actual item count; the
    // router's launch may have run it already
    if (c->sorted_idx != idx) k25k_moe_sort(idx, T, K, E, I, D, c->num_sms, &c->route, c->stream);
    c->sorted_idx = NULL;
    const int *down_splits = NULL; // the down GEMM's split count on the device, NULL for one
    if (m->int4) {
        // gate+up with the split reduction and SiLU*up fused (ws_h), then down
        k25k_moe_w4a16_gemm(m->gu_w, m->gu_s, E, 2 * I, D, 1, x, D, c->route.slot_token, &c->route,
                            T, K, c->num_sms, c->ws_part1, c->ws_h, c->stream);
        k25k_moe_w4a16_gemm(m->dn_w, m->dn_s, E, D, I, 0, c->ws_h, I, NULL, &c->route, T, K,
                            c->num_sms, c->ws_part2, NULL, c->stream);
        down_splits = c->route.plan + 2;
    } else {
        k25k_moe_bf16_gemm(m->gate, m->up, 2 * I, D, 1, x, D, c->route.slot_token, &c->route,
                           max_active, A, c->ws_part1, c->stream);
        k25k_moe_gate_up_reduce(c->ws_part1, NULL, A, I, c->ws_h, c->stream);
        k25k_moe_bf16_gemm(m->down, NULL, D, I, 0, c->ws_h, I, NULL, &c->route, max_active, A,
                           c->ws_part2, c->stream);
    }
    if (add) cuda_join(be); // the shared expert's branch: only the combine reads its output
    k25k_moe_combine(c->ws_part2, down_splits, A, D, c->route.slot_of, wts, T, K, add, out,
                     c->stream);
}

static void cuda_allreduce_sum(k25_backend *be, float *x, size_t n) {
    cuda_impl *c = impl_of(be);
    if (c->tp <= 1 || !n) return;
    staged_clobber(c, x, sizeof(float) * n);
    // f32 on the wire: partial sums stay exact to f32 (a bf16 wire halves the bytes but rounds
    // every rank's partial, which the golden comparisons would feel). Small messages go through
    // the one-shot NVLink all-reduce when every peer is reachable (it declines above its
    // measured crossover with NCCL, and the decision is the same on every rank).
    if (c->oneshot && oneshot_allreduce_f32(c->oneshot, x, n, c->stream) == 0) return;
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->nccl, c->stream));
}

// Below the one-shot crossover a single kernel sums, adds and norms (it leaves d as it was);
// otherwise the sum (one-shot or NCCL) and the add / add_rmsnorm kernels, on the same stream.
static void cuda_allreduce_add_rmsnorm(k25_backend *be, float *h, float *d, const k25_tensor *w,
                                       float eps, int T, int n, float *out) {
    cuda_impl *c = impl_of(be);
    const size_t tn = (size_t)T * n;
    if (T <= 0) return;
    staged_clobber(c, h, sizeof(float) * tn);
    if (c->tp > 1 && c->oneshot) {
        uint16_t *lo = NULL, *hi = w ? stage_output(c, out, T, n, &lo) : NULL;
        int rc = w ? oneshot_allreduce_add_rmsnorm(c->oneshot, d, h, bf16_dev(w, n), eps, T, n, out,
                                                   hi, lo, c->stream)
                   : oneshot_allreduce_add(c->oneshot, d, h, tn, c->stream);
        if (rc == 0) return;
    }
    cuda_allreduce_sum(be, d, tn);
    if (w)
        cuda_add_rmsnorm(be, h, d, w, eps, T, n, out);
    else
        cuda_add(be, h, d, tn);
}

// The branch's ops go to the side stream, which first waits for everything issued so far on
// the main one; the event recorded after them is what join makes the main stream wait for.
static void cuda_fork(k25_backend *be, void (*fn)(void *ctx), void *ctx) {
    cuda_impl *c = impl_of(be);
    if (c->no_overlap) {
        fn(ctx);
        return;
    }
    if (c->stream != c->main_stream || !c->joined) K25_DIE("fork: a side branch is already open");
    CUDA_CHECK(cudaEventRecord(c->ev_fork, c->main_stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->side_stream, c->ev_fork, 0));
    c->stream = c->side_stream;
    fn(ctx);
    c->stream = c->main_stream;
    CUDA_CHECK(cudaEventRecord(c->ev_join, c->side_stream));
    c->joined = 0;
}

static void cuda_join(k25_backend *be) {
    cuda_impl *c = impl_of(be);
    if (c->joined) return;
    CUDA_CHECK(cudaStreamWaitEvent(c->main_stream, c->ev_join, 0));
    c->joined = 1;
}

// ------------------------------------------------------------------------------------------
// Sampling and logits
// ------------------------------------------------------------------------------------------

static void ensure_sampling(cuda_impl *c, int T) {
    if (T <= c->samp_rows) return;
    const int tp = c->tp, C = K25_SAMPLE_CAND_MAX;
    void *dp[] = {c->d_params, c->d_best, c->d_best_all, c->d_cands, c->d_cands_all,
                  c->d_ncand, c->d_ncand_all, c->d_stats, c->d_stats_all};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) dev_free(c, dp[i]);
    if (c->h_best) CUDA_CHECK(cudaFreeHost(c->h_best));
    if (c->h_cands) CUDA_CHECK(cudaFreeHost(c->h_cands));
    if (c->h_ncand) CUDA_CHECK(cudaFreeHost(c->h_ncand));
    if (c->h_stats) CUDA_CHECK(cudaFreeHost(c->h_stats));
    c->d_params = (k25_sampling *)dev_alloc(c, sizeof(k25_sampling) * T, "sampling params");
    c->d_best = (k25_cand *)dev_alloc(c, sizeof(k25_cand) * T, "sampling");
    c->d_best_all = (k25_cand *)dev_alloc(c, sizeof(k25_cand) * T * tp, "sampling");
    c->d_cands = (k25_cand *)dev_alloc(c, sizeof(k25_cand) * (size_t)T * C, "sampling candidates");
    c->d_cands_all = (k25_cand *)dev_alloc(c, sizeof(k25_cand) * (size_t)T * C * tp, "sampling");
    c->d_ncand = (int *)dev_alloc(c, sizeof(int) * T, "sampling");
    c->d_ncand_all = (int *)dev_alloc(c, sizeof(int) * T * tp, "sampling");
    c->d_stats = (k25_softmax_stats *)dev_alloc(c, sizeof(k25_softmax_stats) * T, "sampling");
    c->d_stats_all = (k25_softmax_stats *)dev_alloc(c, sizeof(k25_softmax_stats) * T * tp, "sampling");
    CUDA_CHECK(cudaMallocHost(&c->h_best, sizeof(k25_cand) * T * tp));
    CUDA_CHECK(cudaMallocHost(&c->h_cands, sizeof(k25_cand) * (size_t)T * C * tp));
    CUDA_CHECK(cudaMallocHost(&c->h_ncand, sizeof(int) * T * tp));
    CUDA_CHECK(cudaMallocHost(&c->h_stats, sizeof(k25_softmax_stats) * T * tp));
    c->samp_rows = T;
}

// Gathers n bytes from every rank of the TP group: dst[rank][n].
static void gather_bytes(cuda_impl *c, const void *src, void *dst, size_t n) {
    if (c->tp <= 1) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
        return;
    }
    NCCL_CHECK(ncclAllGather(src, dst, n, ncclUint8, c->nccl, c->stream));
}

static void cuda_sample(k25_backend *be, const float *logits, int vocab_begin, int V_local,
                        const k25_sampling *params, int32_t *out) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "sample");
    const int T = c->T, tp = c->tp, C = K25_SAMPLE_CAND_MAX;
    if (T <= 0) return;
    ensure_sampling(c, T);
    int any_cand = 0, any_best = 0;
    for (int t = 0; t < T; t++) {
        if (sampler_mode_of(&params[t]) == SAMPLER_CANDIDATES)
            any_cand = 1;
        else
            any_best = 1;
    }
    CUDA_CHECK(cudaMemcpyAsync(c->d_params, params, sizeof(k25_sampling) * T,
                               cudaMemcpyHostToDevice, c->stream));
    if (any_best) {
        k25k_sample_best(logits, T, V_local, vocab_begin, c->d_params, c->d_best, c->stream);
        gather_bytes(c, c->d_best, c->d_best_all, sizeof(k25_cand) * T);
        CUDA_CHECK(cudaMemcpyAsync(c->h_best, c->d_best_all, sizeof(k25_cand) * T * tp,
                                   cudaMemcpyDeviceToHost, c->stream));
    }
    if (any_cand) {
        k25k_sample_candidates(logits, T, V_local, vocab_begin, c->d_params, C, c->d_cands,
                               c->d_ncand, c->d_stats, c->stream);
        gather_bytes(c, c->d_cands, c->d_cands_all, sizeof(k25_cand) * (size_t)T * C);
        gather_bytes(c, c->d_ncand, c->d_ncand_all, sizeof(int) * T);
        gather_bytes(c, c->d_stats, c->d_stats_all, sizeof(k25_softmax_stats) * T);
        CUDA_CHECK(cudaMemcpyAsync(c->h_cands, c->d_cands_all, sizeof(k25_cand) * (size_t)T * C * tp,
                                   cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(cudaMemcpyAsync(c->h_ncand, c->d_ncand_all, sizeof(int) * T * tp,
                                   cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(cudaMemcpyAsync(c->h_stats, c->d_stats_all, sizeof(k25_softmax_stats) * T * tp,
                                   cudaMemcpyDeviceToHost, c->stream));
    }
    check_errors(c); // synchronizes
    k25_cand *merged = any_cand ? (k25_cand *)k25_malloc(sizeof(k25_cand) * (size_t)C * tp) : NULL;
    for (int t = 0; t < T; t++) {
        if (sampler_mode_of(&params[t]) != SAMPLER_CANDIDATES) {
            k25_cand best = c->h_best[t];
            for (int r = 1; r < tp; r++) {
                k25_cand x = c->h_best[(size_t)r * T + t];
                if (x.id != INT32_MAX && (best.id == INT32_MAX || sampler_before(x, best))) best = x;
            }
            out[t] = best.id;
        } else {
            int n = 0;
            k25_softmax_stats st = {-INFINITY, 0};
            for (int r = 0; r < tp; r++) {
                int nr = c->h_ncand[(size_t)r * T + t];
                memcpy(merged + n, c->h_cands + ((size_t)r * T + t) * C, sizeof(k25_cand) * nr);
                n += nr;
                st = sampler_stats_merge(st, c->h_stats[(size_t)r * T + t]);
            }
            out[t] = sampler_pick(merged, n, &params[t], st);
        }
        if (out[t] < 0 || out[t] == INT32_MAX)
            K25_DIE("sampling row %d: every logit is NaN (no token to choose)", t);
    }
    free(merged);
}

static void cuda_gather_logits(k25_backend *be, const float *logits, int V_local, int t,
                               float *out) {
    cuda_impl *c = impl_of(be);
    no_capture(c, "gather_logits");
    const float *row = logits + (size_t)t * V_local;
    if (c->tp <= 1) {
        CUDA_CHECK(cudaMemcpyAsync(out, row, sizeof(float) * V_local, cudaMemcpyDeviceToHost,
                                   c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        return;
    }
    size_t need = (size_t)V_local * c->tp;
    if (need > c->gather_cap) {
        dev_free(c, c->d_gather);
        c->d_gather = (float *)dev_alloc(c, sizeof(float) * need, "logit gather");
        c->gather_cap = need;
    }
    NCCL_CHECK(ncclAllGather(row, c->d_gather, V_local, ncclFloat32, c->nccl, c->stream));
    CUDA_CHECK(cudaMemcpyAsync(out, c->d_gather, sizeof(float) * need, cudaMemcpyDeviceToHost,
                               c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

// ------------------------------------------------------------------------------------------
// Graphs
// ------------------------------------------------------------------------------------------

static void run_step(cuda_impl *c, int key, void (*fn)(void *ctx), void *ctx) {
    if (c->no_graph) {
        fn(ctx);
        return;
    }
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key && c->graphs[i].T == c->T &&
            c->graphs[i].max_seqs == c->max_seqs && c->graphs[i].max_blocks == c->max_blocks) {
            CUDA_CHECK(cudaGraphLaunch(c->graphs[i].exec, c->stream));
            K25_LAUNCH_CHECK(c->stream, "graph replay");
            return;
        }
    if (c->n_graphs >= MAX_GRAPHS) drop_graphs(c);
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    fn(ctx);
    c->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        k25_log("cuda: capturing the step for %d rows failed (%s); graphs are off from now on\n",
                c->T, cudaGetErrorString(e));
        c->no_graph = 1;
        c->staged_of = NULL; // the failed capture's host side ran
        fn(ctx);
        return;
    }
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    c->graphs[c->n_graphs++] = (graph_entry){key, c->T, c->max_seqs, c->max_blocks, exec};
    CUDA_CHECK(cudaGraphLaunch(exec, c->stream));
    K25_LAUNCH_CHECK(c->stream, "graph launch");
}

// A replay runs the step's kernels without its host side, so the staged record is cleared on
// either side of every step, captured or not (the capture holds what its norms staged).
static void cuda_run_graph(k25_backend *be, int key, void (*fn)(void *ctx), void *ctx) {
    cuda_impl *c = impl_of(be);
    c->staged_of = NULL;
    run_step(c, key, fn, ctx);
    c->staged_of = NULL;
}

// ------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------

static void cuda_destroy(k25_backend *be) {
    cuda_impl *c = impl_of(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    drop_graphs(c);
    if (c->w) free_weights(c, c->w);
    while (c->n_allocs) dev_free(c, c->allocs[c->n_allocs - 1].p);
    if (c->h_stage) CUDA_CHECK(cudaFreeHost(c->h_stage));
    if (c->h_best) CUDA_CHECK(cudaFreeHost(c->h_best));
    if (c->h_cands) CUDA_CHECK(cudaFreeHost(c->h_cands));
    if (c->h_ncand) CUDA_CHECK(cudaFreeHost(c->h_ncand));
    if (c->h_stats) CUDA_CHECK(cudaFreeHost(c->h_stats));
    free(c->h_pos);
    free(c->h_seq);
    k25k_blas_destroy(c->blas);
    k25k_blas_destroy(c->blas_routed);
    if (c->oneshot) oneshot_destroy(c->oneshot);
    if (c->nccl) ncclCommDestroy(c->nccl);
    CUDA_CHECK(cudaStreamSynchronize(c->side_stream));
    CUDA_CHECK(cudaEventDestroy(c->ev_fork));
    CUDA_CHECK(cudaEventDestroy(c->ev_join));
    CUDA_CHECK(cudaStreamDestroy(c->side_stream));
    CUDA_CHECK(cudaStreamDestroy(c->main_stream));
    free(c);
    free(be);
}

int k25_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" k25_backend *backend_cuda_create(const k25_config *cfg, const k25_dist *dist) {
    int ndev = k25_cuda_device_count();
    if (ndev <= 0) K25_DIE("--backend cuda: no CUDA device is visible to rank %d",
                           dist ? dist->world_rank : 0);
    cuda_impl *c = (cuda_impl *)k25_calloc(1, sizeof *c);
    int local = dist ? dist->local_rank : 0;
    c->device = local % ndev;
    CUDA_CHECK(cudaSetDevice(c->device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c->device));
    c->num_sms = prop.multiProcessorCount;
    char bus[32] = "?", host[64] = "?";
    cudaDeviceGetPCIBusId(bus, sizeof bus, c->device);
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    fprintf(stderr, "# Rank %d on %s device %d [%s] %s (%d SMs, %.1f GiB)\n",
            dist ? dist->world_rank : 0, host, c->device, bus, prop.name, prop.multiProcessorCount,
            prop.totalGlobalMem / GIB);
    if (!dist || dist->world_rank == 0)
        fprintf(stderr, "# CUDA-aware MPI: %s (MPI only ever sees host memory here)\n",
                dist && dist->cuda_aware_mpi ? "yes" : "no");
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->main_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->side_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_join, cudaEventDisableTiming));
    c->stream = c->main_stream;
    c->joined = 1;
    c->blas = k25k_blas_create((size_t)32 << 20);
    c->blas_routed = k25k_blas_create((size_t)32 << 20);
    c->tp = dist && dist->tp_size > 0 ? dist->tp_size : 1;
    c->tp_rank = dist ? dist->tp_rank : 0;
    if (c->tp > 1) {
        ncclUniqueId id;
        if (c->tp_rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, dist->tp));
        NCCL_CHECK(ncclCommInitRank(&c->nccl, c->tp, id, c->tp_rank));
        char oerr[K25_ERR_LEN] = "";
        c->oneshot = oneshot_create(dist->tp, (size_t)4 << 20, oerr);
        if (c->tp_rank == 0)
            k25_log(c->oneshot ? "cuda: one-shot NVLink all-reduce on for small messages\n"
                               : "cuda: one-shot all-reduce off (%s); NCCL for every sum\n",
                    oerr);
    }
    c->no_overlap = k25_env_flag("K25_NO_OVERLAP");
    c->no_graph = k25_env_flag("K25_NO_GRAPH");
    c->kv_f32 = strcmp(cfg->kv_cache_dtype, "f32") == 0 || k25_env_flag("K25_KV_F32");

    c->d_err = (int *)dev_alloc(c, sizeof(int) * 4, "error flags");
    CUDA_CHECK(cudaMemsetAsync(c->d_err, 0, sizeof(int) * 4, c->stream));
    if (!k25_env_flag("K25_NO_MERGE_FOLD")) {
        c->d_mla_sync = (int *)dev_alloc(c, K25K_MLA_MERGE_SYNC_BYTES, "attention merge barrier");
        CUDA_CHECK(cudaMemsetAsync(c->d_mla_sync, 0, K25K_MLA_MERGE_SYNC_BYTES, c->stream));
    }
    const int nf = cfg->qk_rope_dim / 2;
    float *inv = (float *)k25_malloc(sizeof(float) * (nf + 1));
    config_rope_inv_freq(cfg, inv);
    c->d_inv_freq = (float *)dev_alloc(c, sizeof(float) * (nf + 1), "rope frequencies");
    CUDA_CHECK(cudaMemcpyAsync(c->d_inv_freq, inv, sizeof(float) * nf, cudaMemcpyHostToDevice,
                               c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(inv);
    c->softmax_scale = config_softmax_scale(cfg);

    k25_backend *be = (k25_backend *)k25_calloc(1, sizeof *be);
    be->name = "cuda";
    be->impl = c;
    be->cfg = cfg;
    be->dist = dist;
    be->destroy = cuda_destroy;
    be->alloc = cuda_alloc;
    be->free = cuda_free_op;
    be->to_device = cuda_to_device;
    be->to_host = cuda_to_host;
    be->sync = cuda_sync;
    be->mem_peak = cuda_mem_peak;
    be->load_weights = cuda_load_weights;
    be->kv_init = cuda_kv_init;
    be->kv_value_bytes = c->kv_f32 ? 4 : 2;
    be->set_batch = cuda_set_batch;
    be->embed = cuda_embed;
    be->rmsnorm = cuda_rmsnorm;
    be->add_rmsnorm = cuda_add_rmsnorm;
    be->matmul = cuda_matmul;
    be->matmul2 = cuda_matmul2;
    be->silu_mul = cuda_silu_mul;
    be->add = cuda_add;
    be->mla_attention = cuda_mla_attention;
    be->router = cuda_router;
    be->moe = cuda_moe;
    be->allreduce_sum = cuda_allreduce_sum;
    be->sample = cuda_sample;
    be->run_graph = cuda_run_graph;
    be->gather_logits = cuda_gather_logits;
    be->allreduce_add_rmsnorm = cuda_allreduce_add_rmsnorm;
    be->fork = cuda_fork;
    be->join = cuda_join;
    return be;
}
