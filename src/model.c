// The forward pass of the Kimi-K2.5 text model over one batch of token rows, written once
// against the backend interface (../shared/KIMI_K25.md §4). model_step reads top to bottom:
// embed, the layers (attention then dense MLP or MoE, each ending in the tensor-parallel sum
// of partial outputs), final norm and lm_head on the rows to sample, sampling.
//
// Tensor parallelism (weights.h): q_a/kv_a are replicated, each rank owns a block of heads, so
// o_proj produces a partial sum; the dense MLP, the shared expert and every routed expert are
// split along their intermediate width, so down_proj produces a partial sum too (the shared
// expert is added into the routed partial before the one reduction). The lm_head is split by
// vocabulary and sampling is vocabulary-parallel (sampler.h).
//
// Pipeline parallelism (pipeline.h): a rank holds the layers of its stage only. A step's rows
// are cut into micro-batches (one per stage) that go through the stages in order: stage s
// receives micro-batch k's hidden states from stage s-1, runs its layers, passes them on to
// stage s+1 and takes micro-batch k+1, so while stage s works on k stage s+1 works on k-1. The
// last stage normalizes the rows to sample as their micro-batch finishes, then runs the
// lm_head and samples once for the whole step; the tokens (and requested logits) are broadcast
// from it to every rank, so every rank's caller stays in lockstep.
#include "model.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "pipeline.h"

#define MODEL_MAX_CAPTURE 3

struct k25_model {
    const k25_config *cfg;
    k25_weights *w;
    k25_backend *be;
    const k25_dist *dist;
    k25_model_opts opts;
    int n_blocks;

    // activations, backend memory, R = opts.max_rows
    float *h;          // [R][D] residual stream
    float *xn;         // [R][D] normalized input of a block
    float *cq;         // [R][q_lora] q_a output
    float *cqn;        // [R][q_lora] normalized
    float *q;          // [R][H_local*(nope+rope)]
    float *kv;         // [R][kv_lora+rope] kv_a output (raw)
    float *attn;       // [R][H_local*v]
    float *d;          // [R][D] partial output of a block (o_proj, FFN)
    float *d2;         // [R][D] shared expert output
    float *gate, *up;  // [R][I_max] FFN intermediate
    float *act;        // [R][I_max]
    int32_t *ridx;     // [R][top_k] chosen experts
    float *rwts;       // [R][top_k] their weights
    float *hf;         // [R][D] final-normed rows to sample
    float *logits;     // [R][V_local]

    // EAGLE-3 capture and finite checks (host)
    int cap_layers[MODEL_MAX_CAPTURE], n_cap;
    float *cap_host[MODEL_MAX_CAPTURE]; // [R][D]
    float *check_host;                  // [R][D]

    // sub-batch of the sampled rows
    int32_t *s_tokens, *s_pos, *s_seq;  // [R]

    // pipeline
    int n_stages;                       // stages the layers are split over (1: unsplit)
    int first_stage, last_stage;        // this rank embeds / samples
    int *stage_first;                   // [n_stages + 1] first layer of every stage
    int *mb_cut;                        // [n_stages + 1] micro-batch row boundaries of a step
    float *pp_host;                     // [R][D] host staging when the backend has no pp_send
};

// ------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------

// Every rank learns every stage's layer range (captured hidden states come from the stage
// holding the layer) and checks that the stages cover the layers in order. A model that every
// stage holds whole (a draft next to a pipelined target) runs unsplit on each stage.
static void share_stage_layout(k25_model *m) {
    const k25_dist *d = m->dist;
    const int L = m->cfg->n_layers;
    int pp = d->pp_size > 1 ? d->pp_size : 1;
    int mine[2] = {m->w->layer_begin, m->w->layer_end};
    int *all = k25_malloc(sizeof(int) * 2 * (size_t)pp);
    if (pp > 1) MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, d->pp));
    else all[0] = mine[0], all[1] = mine[1];
    int whole = 1;
    for (int s = 0; s < pp; s++) whole &= all[2 * s] == 0 && all[2 * s + 1] == L;
    if (whole) pp = 1;
    m->n_stages = pp;
    m->stage_first = k25_malloc(sizeof(int) * (size_t)(pp + 1));
    m->mb_cut = k25_malloc(sizeof(int) * (size_t)(pp + 1));
    for (int s = 0; s < pp; s++) {
        int want = s ? all[2 * s - 1] : 0;
        if (all[2 * s] != want || all[2 * s + 1] <= all[2 * s] ||
            (s == pp - 1 && all[2 * s + 1] != L))
            K25_DIE("model: pipeline stage %d of %d holds layers [%d, %d): the stages must hold "
                    "layers 0..%d in order, each at least one", s, pp, all[2 * s], all[2 * s + 1],
                    L - 1);
        m->stage_first[s] = all[2 * s];
    }
    m->stage_first[pp] = L;
    free(all);
    m->first_stage = m->w->layer_begin == 0;
    m->last_stage = m->w->layer_end == L;
}

int64_t model_table_entries(const k25_config *cfg, const k25_model_opts *opts) {
    const int64_t seqs = opts->max_seqs > 0 ? opts->max_seqs : 1;
    const int64_t kv_block = opts->kv_block > 0 ? opts->kv_block : cfg->kv_block;
    return seqs * ((cfg->ctx_size + kv_block - 1) / kv_block);
}

k25_model *model_create(const k25_config *cfg, k25_weights *w, k25_backend *be,
                        const k25_dist *dist, const k25_model_opts *opts) {
    k25_model *m = k25_calloc(1, sizeof *m);
    m->cfg = cfg;
    m->w = w;
    m->be = be;
    m->dist = dist;
    m->opts = *opts;
    if (m->opts.max_seqs <= 0) m->opts.max_seqs = 1;
    if (m->opts.max_rows <= 0) m->opts.max_rows = cfg->prefill_chunk;
    if (m->opts.kv_block <= 0) m->opts.kv_block = cfg->kv_block;
    const int64_t entries = model_table_entries(cfg, &m->opts);
    if (entries > INT_MAX)
        K25_DIE("model: a block table of %lld entries exceeds %d", (long long)entries, INT_MAX);
    m->n_blocks = m->opts.n_blocks > 0 ? m->opts.n_blocks : (int)entries;
    if (m->opts.max_blocks > 0 && m->n_blocks > m->opts.max_blocks) {
        k25_log("model: %d cache blocks of %d tokens, capped from %d\n", m->opts.max_blocks,
                m->opts.kv_block, m->n_blocks);
        m->n_blocks = m->opts.max_blocks;
    }
    share_stage_layout(m);

    size_t R = (size_t)m->opts.max_rows, D = (size_t)cfg->hidden;
    size_t Hl = (size_t)w->n_heads_local;
    size_t I = (size_t)w->dense_inter_local;
    size_t Ish = (size_t)(cfg->n_shared * cfg->moe_inter / w->tp_size);
    if (Ish > I) I = Ish;
    size_t f = sizeof(float);
    // The step buffers come before the weights: their size is the settings' (a huge
    // run.prefill_chunk fails at once, naming them, not after minutes of loading)
    char rows_src[128], why[192];
    snprintf(why, sizeof why, "the step buffers of up to %zu rows (%s)", R,
             config_step_rows_source(cfg, (int64_t)R, rows_src, sizeof rows_src));
    const char *prev_why = k25_alloc_purpose(why);
    m->h = be->alloc(be, R * D * f);
    m->xn = be->alloc(be, R * D * f);
    m->cq = be->alloc(be, R * cfg->q_lora_rank * f);
    m->cqn = be->alloc(be, R * cfg->q_lora_rank * f);
    m->q = be->alloc(be, R * Hl * (cfg->qk_nope_dim + cfg->qk_rope_dim) * f);
    m->kv = be->alloc(be, R * (cfg->kv_lora_rank + cfg->qk_rope_dim) * f);
    m->attn = be->alloc(be, R * Hl * cfg->v_head_dim * f);
    m->d = be->alloc(be, R * D * f);
    m->d2 = be->alloc(be, R * D * f);
    m->gate = be->alloc(be, R * I * f);
    m->up = be->alloc(be, R * I * f);
    m->act = be->alloc(be, R * I * f);
    m->ridx = be->alloc(be, R * cfg->top_k * sizeof(int32_t));
    m->rwts = be->alloc(be, R * cfg->top_k * f);
    if (m->last_stage) {
        m->hf = be->alloc(be, R * D * f);
        m->logits = be->alloc(be, R * (size_t)w->vocab_local * f);
    }
    m->s_tokens = k25_malloc(R * sizeof(int32_t));
    m->s_pos = k25_malloc(R * sizeof(int32_t));
    m->s_seq = k25_malloc(R * sizeof(int32_t));
    if (opts->check_finite) m->check_host = k25_malloc(R * D * f);
    k25_alloc_purpose(prev_why);

    be->load_weights(be, w);
    be->kv_init(be, w->layer_end - w->layer_begin, m->n_blocks, m->opts.kv_block);
    return m;
}

void model_free(k25_model *m) {
    if (!m) return;
    k25_backend *be = m->be;
    float *bufs[] = {m->h, m->xn, m->cq, m->cqn, m->q, m->kv, m->attn, m->d, m->d2,
                     m->gate, m->up, m->act, m->rwts, m->hf, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    be->free(be, m->ridx);
    for (int i = 0; i < m->n_cap; i++) free(m->cap_host[i]);
    free(m->check_host);
    free(m->s_tokens);
    free(m->s_pos);
    free(m->s_seq);
    free(m->stage_first);
    free(m->mb_cut);
    free(m->pp_host);
    free(m);
}

int model_n_blocks(const k25_model *m) { return m->n_blocks; }
const k25_model_opts *model_opts_of(const k25_model *m) { return &m->opts; }

void model_capture_layers(k25_model *m, const int *layers, int n) {
    if (n < 0 || n > MODEL_MAX_CAPTURE) K25_DIE("model: capture of %d layers (at most %d)", n,
                                                MODEL_MAX_CAPTURE);
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] > m->cfg->n_layers)
            K25_DIE("model: capture layer %d outside 0..%d", layers[i], m->cfg->n_layers);
        m->cap_layers[i] = layers[i];
        if (!m->cap_host[i])
            m->cap_host[i] = k25_malloc(sizeof(float) * (size_t)m->opts.max_rows * m->cfg->hidden);
    }
    for (int i = n; i < m->n_cap; i++) {
        free(m->cap_host[i]);
        m->cap_host[i] = NULL;
    }
    m->n_cap = n;
}

const float *model_captured(const k25_model *m, int i) {
    return i >= 0 && i < m->n_cap ? m->cap_host[i] : NULL;
}

// ------------------------------------------------------------------------------------------
// Slow-path hooks (hidden-state capture, NaN/Inf checks): host copies between layers, so they
// run outside any graph capture.
// ------------------------------------------------------------------------------------------

typedef struct step_ctx {
    k25_model *m;
    const k25_batch *b;  // the rows of this forward: the step's, or one micro-batch's
    int row0;            // where they start among the step's rows
} step_ctx;

static void capture_hidden(k25_model *m, int layer, int row0, int T) {
    size_t D = (size_t)m->cfg->hidden;
    for (int i = 0; i < m->n_cap; i++)
        if (m->cap_layers[i] == layer)
            m->be->to_host(m->be, m->cap_host[i] + (size_t)row0 * D, m->h,
                           sizeof(float) * (size_t)T * D);
}

static void check_finite(k25_model *m, const k25_batch *b, int row0, int layer) {
    size_t D = (size_t)m->cfg->hidden;
    m->be->to_host(m->be, m->check_host, m->h, sizeof(float) * b->T * D);
    for (int t = 0; t < b->T; t++)
        for (size_t i = 0; i < D; i++)
            if (!isfinite(m->check_host[t * D + i]))
                K25_DIE("non-finite hidden state (%g) after layer %d: row %d (sequence %d, "
                        "position %d, token %d), element %zu",
                        (double)m->check_host[t * D + i], layer, row0 + t, b->seq[t],
                        b->pos[t], b->tokens[t], i);
}

// ------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------

// out[T][D] = down(silu(gate(xn)) * up(xn)): the dense MLP of the first layers, or the shared
// expert of a MoE layer (a partial sum over the rank's slice of the intermediate width). Uses
// gate, up and act, which nothing else of a MoE layer touches, so the shared expert can run
// beside the router and the routed experts (those use backend workspaces, ridx, rwts and d).
static void swiglu(k25_model *m, const k25_layer *L, int T, float *out) {
    k25_backend *be = m->be;
    be->matmul2(be, m->xn, &L->ffn_gate, &L->ffn_up, T, m->gate, m->up);
    be->silu_mul(be, m->gate, m->up, T, (int)L->ffn_gate.rows, m->act);
    be->matmul(be, m->act, &L->ffn_down, T, out);
}

typedef struct shared_ctx {
    k25_model *m;
    const k25_layer *L;
    int T;
} shared_ctx;

// d2 = the shared expert: the side branch of a MoE layer.
static void shared_expert(void *arg) {
    shared_ctx *s = arg;
    swiglu(s->m, s->L, s->T, s->m->d2);
}

// Embedding (first stage) and this stage's layers, for the T rows set by set_batch. Leaves the
// residual stream in h (on later stages h arrives holding the previous stage's output). Every
// block ends with the tensor-parallel sum of its partial output d, the residual add and the
// norm of the block that follows (one fused op); the stage's first layer norms h on its own,
// and its last one only adds (the final norm runs on the sampled rows, run_micro_batch).
static void forward_layers(void *arg) {
    step_ctx *ctx = arg;
    k25_model *m = ctx->m;
    const k25_config *c = m->cfg;
    k25_backend *be = m->be;
    k25_weights *w = m->w;
    int T = ctx->b->T, D = c->hidden;

    if (m->first_stage) be->embed(be, &w->embed, m->h);
    if (w->layer_begin < w->layer_end)
        be->rmsnorm(be, m->h, D, &w->layers[w->layer_begin].attn_norm, c->norm_eps, T, D, m->xn);
    for (int l = w->layer_begin; l < w->layer_end; l++) {
        const k25_layer *L = &w->layers[l];
        const k25_tensor *next_norm = l + 1 < w->layer_end ? &w->layers[l + 1].attn_norm : NULL;
        if (m->n_cap) capture_hidden(m, l, ctx->row0, T); // h: the input of layer l

        // ---- attention: h += o_proj(MLA(xn)), xn = rmsnorm(h) for the FFN ----
        be->matmul2(be, m->xn, &L->q_a, &L->kv_a, T, m->cq, m->kv);
        be->rmsnorm(be, m->cq, c->q_lora_rank, &L->q_a_norm, c->latent_norm_eps, T,
                    c->q_lora_rank, m->cqn);
        be->matmul(be, m->cqn, &L->q_b, T, m->q);
        be->mla_attention(be, l - w->layer_begin, L, m->q, m->kv, m->attn);
        be->matmul(be, m->attn, &L->o_proj, T, m->d);
        be->allreduce_add_rmsnorm(be, m->h, m->d, &L->ffn_norm, c->norm_eps, T, D, m->xn);

        // ---- FFN: dense SwiGLU, or routed experts + the shared expert beside them ----
        if (!L->is_moe) {
            swiglu(m, L, T, m->d);
        } else {
            int has_shared = L->ffn_gate.kind != K25_SRC_NONE;
            shared_ctx sc = {m, L, T};
            if (has_shared) be->fork(be, shared_expert, &sc); // d2, concurrent with the next two
            be->router(be, m->xn, L, m->ridx, m->rwts);
            // d = routed experts + d2 (the branch is joined inside, before the sum reads d2)
            be->moe(be, m->xn, L, m->ridx, m->rwts, has_shared ? m->d2 : NULL, m->d);
        }
        // ---- h += FFN, xn = rmsnorm(h) for the next layer's attention ----
        be->allreduce_add_rmsnorm(be, m->h, m->d, next_norm, c->norm_eps, T, D, m->xn);

        if (m->opts.check_finite) check_finite(m, ctx->b, ctx->row0, l);
    }
    if (m->n_cap) capture_hidden(m, w->layer_end, ctx->row0, T);
}

// ------------------------------------------------------------------------------------------
// Pipeline hand-off and broadcasts
// ------------------------------------------------------------------------------------------

static float *host_staging(k25_model *m) {
    if (!m->pp_host)
        m->pp_host = k25_malloc(sizeof(float) * (size_t)m->opts.max_rows * m->cfg->hidden);
    return m->pp_host;
}

// Hidden states [n] of h to the next stage / from the previous one: the backend's own hand-off
// (NCCL, or MPI on host memory), else a copy through host memory and MPI.
static void hand_on(k25_model *m, size_t n) {
    k25_backend *be = m->be;
    int to = m->dist->pp_rank + 1;
    if (be->pp_send) {
        be->pp_send(be, m->h, n, to);
        return;
    }
    be->to_host(be, host_staging(m), m->h, sizeof(float) * n);
    pipeline_send_host(m->dist, m->pp_host, n, to);
}

static void take_over(k25_model *m, size_t n) {
    k25_backend *be = m->be;
    int from = m->dist->pp_rank - 1;
    if (be->pp_recv) {
        be->pp_recv(be, m->h, n, from);
        return;
    }
    pipeline_recv_host(m->dist, host_staging(m), n, from);
    be->to_device(be, m->h, m->pp_host, sizeof(float) * n);
}

// Host floats from pipeline stage `root` to every stage (int counts: in pieces).
static void bcast_stages(const k25_dist *d, float *x, size_t n, int root) {
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < n; off += chunk) {
        size_t c = n - off < chunk ? n - off : chunk;
        MPI_CHECK(MPI_Bcast(x + off, (int)c, MPI_FLOAT, root, d->pp));
    }
}

// Captured hidden states come from the stage holding the layer (the model's output, layer
// n_layers, from the last stage).
static void share_captures(k25_model *m, int T) {
    int pp = m->n_stages;
    for (int i = 0; i < m->n_cap; i++) {
        int l = m->cap_layers[i], owner = pp - 1;
        for (int s = 0; s < pp; s++)
            if (l >= m->stage_first[s] && l < m->stage_first[s + 1]) owner = s;
        bcast_stages(m->dist, m->cap_host[i], (size_t)T * m->cfg->hidden, owner);
    }
}

// ------------------------------------------------------------------------------------------
// The step
// ------------------------------------------------------------------------------------------

// Rows [r0, r1) of b through this stage: take the hidden states over from the previous stage
// (or embed), run the layers, hand them on; on the last stage, final-norm the rows to sample
// among them into hf (sampled row i -> hf row i).
static void run_micro_batch(k25_model *m, const k25_batch *b, int r0, int r1,
                            const int32_t *sample_rows, int n_sample) {
    const k25_config *c = m->cfg;
    k25_backend *be = m->be;
    int D = c->hidden;
    k25_batch mb = *b;
    mb.T = r1 - r0;
    mb.tokens = b->tokens + r0;
    mb.pos = b->pos + r0;
    mb.seq = b->seq + r0;
    size_t n = (size_t)mb.T * D;

    be->set_batch(be, &mb);
    if (!m->first_stage) take_over(m, n);
    step_ctx ctx = {m, &mb, r0};
    if (m->n_cap || m->opts.check_finite)
        forward_layers(&ctx); // host copies between layers: no graph
    else
        be->run_graph(be, mb.T, forward_layers, &ctx);
    if (!m->last_stage) {
        hand_on(m, n);
        return;
    }
    // ---- final norm of the sampled rows in [r0, r1) (runs of consecutive rows at once) ----
    for (int i = 0; i < n_sample;) {
        int r = sample_rows[i], k = 1;
        if (r < r0 || r >= r1) {
            i++;
            continue;
        }
        while (i + k < n_sample && sample_rows[i + k] == r + k && r + k < r1) k++;
        be->rmsnorm(be, m->h + (size_t)(r - r0) * D, D, &m->w->final_norm, c->norm_eps, k, D,
                    m->hf + (size_t)i * D);
        i += k;
    }
}

static void check_step(const k25_model *m, const k25_batch *b, const int32_t *sample_rows,
                       int n_sample) {
    if (b->T <= 0 || b->T > m->opts.max_rows)
        K25_DIE("model_step: %d rows (this model was created for at most %d)", b->T,
                m->opts.max_rows);
    if (n_sample < 0 || n_sample > b->T)
        K25_DIE("model_step: %d rows to sample of %d", n_sample, b->T);
    for (int i = 0; i < n_sample; i++)
        if (sample_rows[i] < 0 || sample_rows[i] >= b->T)
            K25_DIE("model_step: sample row %d of %d", sample_rows[i], b->T);
}

// lm_head and sampling on the last stage: the sampled rows (final-normed into hf) become the
// batch.
static void sample_last_stage(k25_model *m, const k25_batch *b, const int32_t *sample_rows,
                              int n_sample, const k25_sampling *params, int32_t *out,
                              float *logits_out) {
    k25_backend *be = m->be;
    k25_weights *w = m->w;
    be->matmul(be, m->hf, &w->lm_head, n_sample, m->logits);
    for (int i = 0; i < n_sample; i++) {
        m->s_tokens[i] = b->tokens[sample_rows[i]];
        m->s_pos[i] = b->pos[sample_rows[i]];
        m->s_seq[i] = b->seq[sample_rows[i]];
    }
    k25_batch sb = *b;
    sb.T = n_sample;
    sb.tokens = m->s_tokens;
    sb.pos = m->s_pos;
    sb.seq = m->s_seq;
    be->set_batch(be, &sb);
    be->sample(be, m->logits, w->vocab_begin, w->vocab_local, params, out);
    if (logits_out)
        for (int i = 0; i < n_sample; i++)
            be->gather_logits(be, m->logits, w->vocab_local, i,
                              logits_out + (size_t)i * m->cfg->vocab);
}

void model_step(k25_model *m, const k25_batch *b, const int32_t *sample_rows, int n_sample,
                const k25_sampling *params, int32_t *out, float *logits_out) {
    const k25_dist *d = m->dist;
    int pp = m->n_stages;
    check_step(m, b, sample_rows, n_sample);

    // ---- the layers: one micro-batch per stage, in order (one in all without a pipeline) ----
    int n_mb = 1;
    m->mb_cut[0] = 0;
    m->mb_cut[1] = b->T;
    if (pp > 1) n_mb = pipeline_micro_batches(b, pp, m->mb_cut);
    for (int k = 0; k < n_mb; k++)
        run_micro_batch(m, b, m->mb_cut[k], m->mb_cut[k + 1], sample_rows, n_sample);
    if (pp > 1 && m->n_cap) share_captures(m, b->T);
    if (n_sample == 0) return;

    if (m->last_stage) sample_last_stage(m, b, sample_rows, n_sample, params, out, logits_out);
    // ---- every stage gets the tokens (and the logits) of the last one ----
    if (pp > 1) {
        MPI_CHECK(MPI_Bcast(out, n_sample, MPI_INT32_T, pp - 1, d->pp));
        if (logits_out) bcast_stages(d, logits_out, (size_t)n_sample * m->cfg->vocab, pp - 1);
    }
}

void model_step_issue(k25_model *m, const k25_batch *b, const int32_t *sample_rows,
                      int n_sample, const k25_sampling *params, int32_t *out,
                      MPI_Request *tokens) {
    check_step(m, b, sample_rows, n_sample);
    K25_CHECK(!m->n_cap, "model_step_issue: hidden-state captures need model_step");
    *tokens = MPI_REQUEST_NULL;
    run_micro_batch(m, b, 0, b->T, sample_rows, n_sample);
    if (n_sample == 0) return;
    if (m->last_stage) sample_last_stage(m, b, sample_rows, n_sample, params, out, NULL);
    if (m->n_stages > 1)
        MPI_CHECK(MPI_Ibcast(out, n_sample, MPI_INT32_T, m->n_stages - 1, m->dist->pp, tokens));
}

int model_n_stages(const k25_model *m) { return m->n_stages; }
