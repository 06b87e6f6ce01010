// Per-operation-group timing by interposition on the backend table (see op_profile.h).
#include "op_profile.h"

#include <string.h>

const char *const k25_op_group_names[K25_OPG_N] = {
    "attention", "router", "experts", "shared", "dense", "norms", "allreduce", "lm_head",
    "other",
};

static k25_backend orig;          // the backend's own table while installed
static k25_backend *target;
static double acc[K25_OPG_N];
static k25_op_group ffn_group = K25_OPG_OTHER;

k25_op_group op_profile_group_of(const char *name) {
    if (strstr(name, "self_attn")) return K25_OPG_ATTN;
    if (strstr(name, "shared_experts")) return K25_OPG_SHARED;
    if (strstr(name, "lm_head")) return K25_OPG_LMHEAD;
    if (strstr(name, ".mlp.")) return K25_OPG_DENSE;
    return K25_OPG_OTHER;
}

// Times one call: the previous operation was synced, so the clock starts with this one.
#define TIMED(group, call)                                                                         \
    do {                                                                                           \
        double t_ = k25_now_ms();                                                                  \
        call;                                                                                      \
        orig.sync(be);                                                                             \
        acc[group] += k25_now_ms() - t_;                                                           \
    } while (0)

static void p_set_batch(k25_backend *be, const k25_batch *b) {
    TIMED(K25_OPG_OTHER, orig.set_batch(be, b));
}
static void p_embed(k25_backend *be, const k25_tensor *emb, float *x) {
    TIMED(K25_OPG_OTHER, orig.embed(be, emb, x));
}
static void p_rmsnorm(k25_backend *be, const float *x, int ld, const k25_tensor *w, float eps,
                      int T, int n, float *out) {
    TIMED(K25_OPG_NORM, orig.rmsnorm(be, x, ld, w, eps, T, n, out));
}
static void p_add_rmsnorm(k25_backend *be, float *h, const float *d, const k25_tensor *w,
                          float eps, int T, int n, float *out) {
    TIMED(K25_OPG_NORM, orig.add_rmsnorm(be, h, d, w, eps, T, n, out));
}
// The group of a projection by its weight's name; a shared-expert or dense-MLP projection also
// sets the group of the SiLU*up and add that follow it.
static k25_op_group matmul_group(const k25_tensor *W) {
    k25_op_group g = op_profile_group_of(W->name);
    if (g == K25_OPG_SHARED || g == K25_OPG_DENSE) ffn_group = g;
    return g;
}
static void p_matmul(k25_backend *be, const float *x, const k25_tensor *W, int T, float *y) {
    const k25_op_group g = matmul_group(W);
    TIMED(g, orig.matmul(be, x, W, T, y));
}
static void p_matmul2(k25_backend *be, const float *x, const k25_tensor *W1, const k25_tensor *W2,
                      int T, float *y1, float *y2) {
    const k25_op_group g = matmul_group(W1);
    TIMED(g, orig.matmul2(be, x, W1, W2, T, y1, y2));
}
static void p_silu_mul(k25_backend *be, const float *gate, const float *up, int T, int n,
                       float *out) {
    TIMED(ffn_group, orig.silu_mul(be, gate, up, T, n, out));
}
static void p_add(k25_backend *be, float *y, const float *x, size_t n) {
    TIMED(ffn_group, orig.add(be, y, x, n));
}
static void p_mla_attention(k25_backend *be, int layer, const k25_layer *L, float *q, float *kv,
                            float *out) {
    TIMED(K25_OPG_ATTN, orig.mla_attention(be, layer, L, q, kv, out));
}
static void p_router(k25_backend *be, const float *x, const k25_layer *L, int32_t *idx,
                     float *wts) {
    TIMED(K25_OPG_ROUTER, orig.router(be, x, L, idx, wts));
}
static void p_moe(k25_backend *be, const float *x, const k25_layer *L, const int32_t *idx,
                  const float *wts, const float *add, float *out) {
    TIMED(K25_OPG_EXPERTS, orig.moe(be, x, L, idx, wts, add, out));
}
static void p_allreduce_sum(k25_backend *be, float *x, size_t n) {
    TIMED(K25_OPG_ALLREDUCE, orig.allreduce_sum(be, x, n));
}
static void p_sample(k25_backend *be, const float *logits, int vocab_begin, int V_local,
                     const k25_sampling *params, int32_t *out) {
    TIMED(K25_OPG_LMHEAD, orig.sample(be, logits, vocab_begin, V_local, params, out));
}
static void p_gather_logits(k25_backend *be, const float *logits, int V_local, int t,
                            float *out) {
    TIMED(K25_OPG_LMHEAD, orig.gather_logits(be, logits, V_local, t, out));
}
// The norm fused into the sum is counted with the all-reduce.
static void p_allreduce_add_rmsnorm(k25_backend *be, float *h, float *d, const k25_tensor *w,
                                    float eps, int T, int n, float *out) {
    TIMED(K25_OPG_ALLREDUCE, orig.allreduce_add_rmsnorm(be, h, d, w, eps, T, n, out));
}
// Each operation is timed alone anyway: a side branch runs inline.
static void p_fork(k25_backend *be, void (*fn)(void *ctx), void *ctx) {
    (void)be;
    fn(ctx);
}
static void p_join(k25_backend *be) { (void)be; }
// Graph replay would hide the per-operation calls: run the step function directly.
static void p_run_graph(k25_backend *be, int key, void (*fn)(void *ctx), void *ctx) {
    (void)be;
    (void)key;
    fn(ctx);
}

void op_profile_install(k25_backend *be) {
    K25_CHECK(!target, "op profile: already installed");
    orig = *be;
    target = be;
    memset(acc, 0, sizeof acc);
    be->set_batch = p_set_batch;
    be->embed = p_embed;
    be->rmsnorm = p_rmsnorm;
    be->add_rmsnorm = p_add_rmsnorm;
    be->matmul = p_matmul;
    be->matmul2 = p_matmul2;
    be->silu_mul = p_silu_mul;
    be->add = p_add;
    be->mla_attention = p_mla_attention;
    be->router = p_router;
    be->moe = p_moe;
    be->allreduce_sum = p_allreduce_sum;
    be->allreduce_add_rmsnorm = p_allreduce_add_rmsnorm;
    be->fork = p_fork;
    be->join = p_join;
    be->sample = p_sample;
    be->gather_logits = p_gather_logits;
    be->run_graph = p_run_graph;
}

void op_profile_remove(k25_backend *be) {
    if (target != be) return;
    be->set_batch = orig.set_batch;
    be->embed = orig.embed;
    be->rmsnorm = orig.rmsnorm;
    be->add_rmsnorm = orig.add_rmsnorm;
    be->matmul = orig.matmul;
    be->matmul2 = orig.matmul2;
    be->silu_mul = orig.silu_mul;
    be->add = orig.add;
    be->mla_attention = orig.mla_attention;
    be->router = orig.router;
    be->moe = orig.moe;
    be->allreduce_sum = orig.allreduce_sum;
    be->allreduce_add_rmsnorm = orig.allreduce_add_rmsnorm;
    be->fork = orig.fork;
    be->join = orig.join;
    be->sample = orig.sample;
    be->gather_logits = orig.gather_logits;
    be->run_graph = orig.run_graph;
    target = NULL;
}

void op_profile_take(double ms[K25_OPG_N]) {
    memcpy(ms, acc, sizeof acc);
    memset(acc, 0, sizeof acc);
}
