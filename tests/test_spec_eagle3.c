// The EAGLE-3 MLA draft against an independent reference: a plain double-precision forward of
// the head (sglang's Eagle3DeepseekV2ForCausalLM: fc over the target's captured hidden states,
// input_layernorm / hidden_norm, MLA over concat(embedding, hidden) computed the naive way -
// keys and values per head from kv_b_proj, no absorption - dense MLP, final norm, lm_head, d2t)
// reading the synthetic checkpoint's tensors straight from its safetensors file.
//
// The target (config/tiny.ini, synthetic seed 1) prefills a prompt with the head attached;
// the head absorbs the prompt rows (spec_observe) and proposes K tokens (spec_propose):
//   - greedy: the proposed tokens must be the reference's argmax chain;
//   - temperature 1: the draft distributions q of every drafted position must equal the
//     reference's softmax (the reference fed the head's own sampled tokens), within 2e-4.
// Two heads: full vocabulary with explicit aux layers; reduced vocabulary (d2t) with its own
// embedding, another MLP width, the default aux layers and norm_before_residual. Then a head
// narrower than the target, which drafts, and the same without its own final norm, which is
// refused. Runs on any rank count tiny.ini divides over (t_spec_greedy.sh runs it on 2).
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "instance.h"
#include "safetensors.h"
#include "spec.h"
#include "test_util.h"


#define K 4
#define NP 9

// ------------------------------------------------------------------------------------------
// The reference head
// ------------------------------------------------------------------------------------------

typedef struct ref_head {
    const k25_config *c;
    int D, H, dn, dr, dv, ql, kl, I, V, Vd, norm_before;
    double *fc, *hidden_norm, *in_norm, *post_norm, *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm;
    double *kv_b, *o_proj, *gate, *up, *down, *norm, *lm_head, *embed; // embed NULL: target's
    int64_t *d2t;
    const k25_tensor *target_embed;
    // cache per position: k_nope [H][dn], v [H][dv], k_pe [dr]
    double *k_nope, *v, *k_pe;
    double eps;
    float *inv_freq;
    double scale;
} ref_head;

static double *load(const st_file *f, const char *name, int64_t n) {
    const st_tensor *t = st_find(f, name);
    if (!t) return NULL;
    K25_CHECK(t->dtype == ST_BF16 && t->numel == n, "%s: %lld elements", name,
              (long long)t->numel);
    double *out = k25_malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        out[i] = k25_bf16_to_f32(h);
    }
    return out;
}

// y[N] = W[N][K] x[K]
static void mv(const double *W, const double *x, int N, int Kd, double *y) {
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < Kd; k++) s += W[(size_t)n * Kd + k] * x[k];
        y[n] = s;
    }
}

static void rmsnorm(const double *x, const double *w, int n, double eps, double *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

static void rope(double *x, const float *inv_freq, int dim, int pos) {
    for (int i = 0; i < dim / 2; i++) {
        double ang = (double)((float)pos * inv_freq[i]);
        double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * cos(ang) - b * sin(ang);
        x[2 * i + 1] = a * sin(ang) + b * cos(ang);
    }
}

// One row at position pos: token tok, incoming hidden g[D] -> g := pre-norm output hidden.
static void ref_row(ref_head *r, int tok, int pos, double *g) {
    int D = r->D, H = r->H, dn = r->dn, dr = r->dr, dv = r->dv;
    double *x = k25_calloc((size_t)2 * D, sizeof(double)), *emb = k25_malloc(sizeof(double) * D);
    if (r->embed) {
        memcpy(emb, r->embed + (size_t)tok * D, sizeof(double) * D);
    } else {
        uint16_t *row = k25_malloc(sizeof(uint16_t) * D);
        tensor_read_rows(r->target_embed, tok, 1, row);
        for (int i = 0; i < D; i++) emb[i] = k25_bf16_to_f32(row[i]);
        free(row);
    }
    rmsnorm(emb, r->in_norm, D, r->eps, x);
    rmsnorm(g, r->hidden_norm, D, r->eps, x + D);
    double *res = k25_malloc(sizeof(double) * D);
    memcpy(res, r->norm_before ? x + D : g, sizeof(double) * D);

    double *cq = k25_malloc(sizeof(double) * r->ql), *cqn = k25_malloc(sizeof(double) * r->ql);
    double *q = k25_malloc(sizeof(double) * H * (dn + dr));
    mv(r->q_a, x, r->ql, 2 * D, cq);
    rmsnorm(cq, r->q_a_norm, r->ql, r->eps, cqn);
    mv(r->q_b, cqn, H * (dn + dr), r->ql, q);
    double *ckv = k25_malloc(sizeof(double) * (r->kl + dr));
    double *c = k25_malloc(sizeof(double) * r->kl);
    double *kv = k25_malloc(sizeof(double) * H * (dn + dv));
    mv(r->kv_a, x, r->kl + dr, 2 * D, ckv);
    rmsnorm(ckv, r->kv_a_norm, r->kl, r->eps, c);
    mv(r->kv_b, c, H * (dn + dv), r->kl, kv);
    double *kpe = r->k_pe + (size_t)pos * dr;
    memcpy(kpe, ckv + r->kl, sizeof(double) * dr);
    rope(kpe, r->inv_freq, dr, pos);
    for (int h = 0; h < H; h++) {
        const double *kvh = kv + (size_t)h * (dn + dv);
        memcpy(r->k_nope + ((size_t)pos * H + h) * dn, kvh, sizeof(double) * dn);
        memcpy(r->v + ((size_t)pos * H + h) * dv, kvh + dn, sizeof(double) * dv);
        rope(q + (size_t)h * (dn + dr) + dn, r->inv_freq, dr, pos);
    }
    double *o = k25_calloc((size_t)H * dv, sizeof(double));
    double *s = k25_malloc(sizeof(double) * (pos + 1));
    for (int h = 0; h < H; h++) {
        const double *qh = q + (size_t)h * (dn + dr);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= pos; j++) {
            double a = 0;
            for (int i = 0; i < dn; i++) a += qh[i] * r->k_nope[((size_t)j * H + h) * dn + i];
            for (int i = 0; i < dr; i++) a += qh[dn + i] * r->k_pe[(size_t)j * dr + i];
            s[j] = a * r->scale;
            if (s[j] > mx) mx = s[j];
        }
        for (int j = 0; j <= pos; j++) sum += (s[j] = exp(s[j] - mx));
        for (int j = 0; j <= pos; j++)
            for (int i = 0; i < dv; i++)
                o[(size_t)h * dv + i] += s[j] / sum * r->v[((size_t)j * H + h) * dv + i];
    }
    double *a = k25_malloc(sizeof(double) * D), *xn = k25_malloc(sizeof(double) * D);
    mv(r->o_proj, o, D, H * dv, a);
    for (int i = 0; i < D; i++) res[i] += a[i];
    rmsnorm(res, r->post_norm, D, r->eps, xn);
    double *gt = k25_malloc(sizeof(double) * r->I), *up = k25_malloc(sizeof(double) * r->I);
    mv(r->gate, xn, r->I, D, gt);
    mv(r->up, xn, r->I, D, up);
    for (int i = 0; i < r->I; i++) gt[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
    mv(r->down, gt, D, r->I, a);
    for (int i = 0; i < D; i++) g[i] = res[i] + a[i];
    free(x), free(emb), free(res), free(cq), free(cqn), free(q), free(ckv), free(c), free(kv);
    free(o), free(s), free(a), free(xn), free(gt), free(up);
}

// Target-vocabulary logits of hidden g (-inf where no draft token maps).
static void ref_logits(ref_head *r, const double *g, double *logits) {
    double *hn = k25_malloc(sizeof(double) * r->D), *dl = k25_malloc(sizeof(double) * r->Vd);
    rmsnorm(g, r->norm, r->D, r->eps, hn);
    mv(r->lm_head, hn, r->Vd, r->D, dl);
    for (int i = 0; i < r->V; i++) logits[i] = -INFINITY;
    for (int i = 0; i < r->Vd; i++) logits[i + (r->d2t ? r->d2t[i] : 0)] = dl[i];
    free(hn);
    free(dl);
}

static void ref_open(ref_head *r, const char *dir, const k25_config *c, const k25_tensor *emb,
                     int Vd, int I, int norm_before, int n_aux) {
    char path[512], err[K25_ERR_LEN];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file f;
    if (st_open(&f, path, err)) K25_DIE("%s", err);
    memset(r, 0, sizeof *r);
    r->c = c;
    r->D = c->hidden, r->H = c->n_heads, r->dn = c->qk_nope_dim, r->dr = c->qk_rope_dim;
    r->dv = c->v_head_dim, r->ql = c->q_lora_rank, r->kl = c->kv_lora_rank, r->I = I;
    r->V = c->vocab, r->Vd = Vd, r->norm_before = norm_before;
    r->eps = c->norm_eps; // the head's q_a / kv_a norms use rms_norm_eps (sglang, vLLM)
    int D = r->D, H = r->H;
    r->fc = load(&f, "fc.weight", (int64_t)D * n_aux * D);
    r->hidden_norm = load(&f, "layers.0.hidden_norm.weight", D);
    r->in_norm = load(&f, "layers.0.input_layernorm.weight", D);
    r->post_norm = load(&f, "layers.0.post_attention_layernorm.weight", D);
    r->q_a = load(&f, "layers.0.self_attn.q_a_proj.weight", (int64_t)r->ql * 2 * D);
    r->q_a_norm = load(&f, "layers.0.self_attn.q_a_layernorm.weight", r->ql);
    r->q_b = load(&f, "layers.0.self_attn.q_b_proj.weight", (int64_t)H * (r->dn + r->dr) * r->ql);
    r->kv_a = load(&f, "layers.0.self_attn.kv_a_proj_with_mqa.weight",
                   (int64_t)(r->kl + r->dr) * 2 * D);
    r->kv_a_norm = load(&f, "layers.0.self_attn.kv_a_layernorm.weight", r->kl);
    r->kv_b = load(&f, "layers.0.self_attn.kv_b_proj.weight", (int64_t)H * (r->dn + r->dv) * r->kl);
    r->o_proj = load(&f, "layers.0.self_attn.o_proj.weight", (int64_t)D * H * r->dv);
    r->gate = load(&f, "layers.0.mlp.gate_proj.weight", (int64_t)I * D);
    r->up = load(&f, "layers.0.mlp.up_proj.weight", (int64_t)I * D);
    r->down = load(&f, "layers.0.mlp.down_proj.weight", (int64_t)D * I);
    r->norm = load(&f, "norm.weight", D);
    r->lm_head = load(&f, "lm_head.weight", (int64_t)Vd * D);
    r->embed = load(&f, "embed_tokens.weight", (int64_t)r->V * D);
    K25_CHECK(r->fc && r->q_a && r->kv_b && r->lm_head && r->norm, "reference: tensors missing");
    const st_tensor *d2t = st_find(&f, "d2t");
    if (d2t) {
        r->d2t = k25_malloc(sizeof(int64_t) * (size_t)Vd);
        memcpy(r->d2t, d2t->data, sizeof(int64_t) * (size_t)Vd);
    }
    st_close(&f);
    r->target_embed = emb;
    int cap = 64;
    r->k_nope = k25_calloc((size_t)cap * H * r->dn, sizeof(double));
    r->v = k25_calloc((size_t)cap * H * r->dv, sizeof(double));
    r->k_pe = k25_calloc((size_t)cap * r->dr, sizeof(double));
    r->inv_freq = k25_malloc(sizeof(float) * (size_t)(r->dr / 2 + 1));
    config_rope_inv_freq(c, r->inv_freq);
    r->scale = config_softmax_scale(c);
}

static void ref_close(ref_head *r) {
    double *all[] = {r->fc, r->hidden_norm, r->in_norm, r->post_norm, r->q_a, r->q_a_norm, r->q_b,
                     r->kv_a, r->kv_a_norm, r->kv_b, r->o_proj, r->gate, r->up, r->down, r->norm,
                     r->lm_head, r->embed, r->k_nope, r->v, r->k_pe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(r->d2t);
    free(r->inv_freq);
}

// ------------------------------------------------------------------------------------------
// One head, greedy and sampled
// ------------------------------------------------------------------------------------------

static void check_head(const char *name, const char *dir, k25_instance *in, const k25_config *c,
                       const k25_dist *d, int Vd, int I, int norm_before, float temp) {
    char err[K25_ERR_LEN], src[300];
    snprintf(src, sizeof src, "eagle3:%s", dir);
    k25_spec_opts so = {.k = K, .max_seqs = 2, .max_rows = 32, .ctx_size = 64, .kv_block = 4,
                        .backend = "cpu", .threads = 1};
    k25_spec *sp = spec_create(src, in->m, &in->w, c, d, &so, err);
    if (!sp) K25_DIE("%s", err);
    spec_attach(sp);

    // The target prefills the prompt in slot 1 and samples the first token greedily.
    int32_t prompt[NP] = {7, 201, 45, 45, 98, 3, 160, 22, 91};
    int32_t pos[NP], seq[NP], table[2 * 16], row = NP - 1, t0;
    for (int i = 0; i < NP; i++) pos[i] = i, seq[i] = 1;
    for (int i = 0; i < 32; i++) table[i] = i;
    k25_batch b = {.T = NP, .tokens = prompt, .pos = pos, .seq = seq, .block_table = table,
                   .max_seqs = 2, .max_blocks_per_seq = 16};
    k25_sampling greedy = {.temp = 0, .top_p = 1};
    model_step(in->m, &b, &row, 1, &greedy, &t0, NULL);
    int D = c->hidden, n_aux = 0;
    double *aux = k25_malloc(sizeof(double) * NP * 3 * D);
    for (int a = 0; a < 3 && model_captured(in->m, a); a++, n_aux++)
        for (int t = 0; t < NP; t++)
            for (int i = 0; i < D; i++)
                aux[((size_t)t * 3 + a) * D + i] = model_captured(in->m, a)[(size_t)t * D + i];
    CHECK(n_aux == 3, "%s: %d hidden states captured", name, n_aux);
    k25_spec_obs ob = {.slot = 1, .row0 = 0, .pos0 = 0, .n_rows = NP, .prompt = prompt,
                       .n_prompt = NP, .gen = &t0, .n_gen = 1};
    spec_observe(sp, &ob, 1);
    k25_spec_seq s = {.slot = 1, .prompt = prompt, .n_prompt = NP, .gen = &t0, .n_gen = 1,
                      .max_draft = K, .sampling = {.temp = temp, .top_p = 1, .seed = 99}};
    spec_propose(sp, &s, 1);
    CHECK(s.n_draft == K, "%s: %d tokens drafted, wanted %d", name, s.n_draft, K);

    // The reference: rows 0..NP-1 (token at p + 1, fc of the hidden states at p), then the
    // chain over the drafted tokens.
    ref_head r;
    ref_open(&r, dir, c, &in->w.embed, Vd, I, norm_before, 3);
    double *g = k25_malloc(sizeof(double) * D), *lg = k25_malloc(sizeof(double) * c->vocab);
    for (int p = 0; p < NP; p++) {
        mv(r.fc, aux + (size_t)p * 3 * D, D, 3 * D, g);
        ref_row(&r, p + 1 < NP ? prompt[p + 1] : t0, p, g);
    }
    double max_dq = 0;
    int agree = 1;
    for (int j = 0; j < s.n_draft; j++) {
        if (j > 0) ref_row(&r, s.draft[j - 1], NP - 1 + j, g);
        ref_logits(&r, g, lg);
        int best = 0;
        for (int i = 1; i < c->vocab; i++) if (lg[i] > lg[best]) best = i;
        if (temp == 0) {
            agree &= s.draft[j] == best;
            CHECK(s.draft[j] == best, "%s: draft %d is %d, the reference's argmax %d", name, j,
                  s.draft[j], best);
            continue;
        }
        double mx = lg[best], sum = 0;
        for (int i = 0; i < c->vocab; i++) sum += exp((lg[i] - mx) / temp);
        for (int i = 0; i < c->vocab; i++) {
            double dq = fabs(exp((lg[i] - mx) / temp) / sum - s.q[(size_t)j * c->vocab + i]);
            if (dq > max_dq) max_dq = dq;
        }
        CHECK(s.q[(size_t)j * c->vocab + s.draft[j]] > 0, "%s: draft %d has q = 0", name, j);
    }
    if (temp > 0) CHECK(max_dq < 2e-4, "%s: q differs from the reference by %g", name, max_dq);
    if (d->world_rank == 0)
        printf("%-48s drafts %d %d %d %d: %s\n", name, s.draft[0], s.draft[1], s.draft[2],
               s.draft[3], temp == 0 ? (agree ? "the reference's argmax chain" : "DIFFER")
                                      : (max_dq < 2e-4 ? "q matches the reference" : "q DIFFERS"));
    free(g);
    free(lg);
    free(aux);
    ref_close(&r);
    spec_free(sp);
}

// A head narrower than the target (its own embedding, fc from the target's width to its own)
// runs; without its own final norm it is refused at creation, naming the tensor: the target's
// norm has the target's width (it used to be taken anyway, and the first draft step stopped
// the run with a message about the target's model.norm.weight).
static void check_narrow_heads(const char *dir, k25_instance *in, const k25_config *c,
                               const k25_dist *d) {
    char path[300], src[320], err[K25_ERR_LEN] = "";
    k25_spec_opts so = {.k = K, .max_seqs = 2, .max_rows = 32, .ctx_size = 64, .kv_block = 4,
                        .backend = "cpu", .threads = 1};
    for (int no_norm = 0; no_norm < 2; no_norm++) {
        snprintf(path, sizeof path, "%s/narrow%d", dir, no_norm);
        if (d->world_rank == 0) {
            k25_eagle3_synth o = {.seed = 23, .n_aux = 3, .aux_ids = {0, 1, 2}, .own_embed = 1,
                                  .hidden = c->hidden / 2, .no_norm = no_norm};
            if (spec_eagle3_write_synthetic(path, c, &o, err)) K25_DIE("%s", err);
        }
        MPI_CHECK(MPI_Barrier(d->world));
        snprintf(src, sizeof src, "eagle3:%s", path);
        k25_spec *sp = spec_create(src, in->m, &in->w, c, d, &so, err);
        if (!no_norm) {
            CHECK(sp, "narrow head: %s", err);
            if (!sp) continue;
            spec_attach(sp);
            int32_t prompt[NP] = {7, 201, 45, 45, 98, 3, 160, 22, 91};
            int32_t pos[NP], seq[NP], table[2 * 16], row = NP - 1, t0;
            for (int i = 0; i < NP; i++) pos[i] = i, seq[i] = 1;
            for (int i = 0; i < 32; i++) table[i] = i;
            k25_batch b = {.T = NP, .tokens = prompt, .pos = pos, .seq = seq,
                           .block_table = table, .max_seqs = 2, .max_blocks_per_seq = 16};
            k25_sampling greedy = {.temp = 0, .top_p = 1};
            model_step(in->m, &b, &row, 1, &greedy, &t0, NULL);
            k25_spec_obs ob = {.slot = 1, .row0 = 0, .pos0 = 0, .n_rows = NP, .prompt = prompt,
                               .n_prompt = NP, .gen = &t0, .n_gen = 1};
            spec_observe(sp, &ob, 1);
            k25_spec_seq s = {.slot = 1, .prompt = prompt, .n_prompt = NP, .gen = &t0,
                              .n_gen = 1, .max_draft = K, .sampling = greedy};
            spec_propose(sp, &s, 1);
            CHECK(s.n_draft == K, "narrow head: %d tokens drafted, wanted %d", s.n_draft, K);
            if (d->world_rank == 0)
                printf("narrow head (hidden %d): %d tokens drafted\n", c->hidden / 2, s.n_draft);
        } else {
            CHECK(!sp && strstr(err, path) && strstr(err, "norm.weight"),
                  "narrow head without norm.weight: %s (message '%s')",
                  sp ? "accepted" : "refused", err);
            if (d->world_rank == 0) printf("narrow head without norm.weight: %s\n", err);
        }
        spec_free(sp);
    }
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN] = "";
    k25_config cfg;
    test_tiny_config(&cfg);
    k25_instance in;
    test_open_instance(&in, &cfg, &d, "cpu",
                       (k25_model_opts){.max_seqs = 2, .max_rows = 32, .kv_block = 4,
                                        .n_blocks = 32});

    char dir[256] = "/tmp/k25-eagle-test-XXXXXX", eg1[300], eg2[300];
    test_shared_tmpdir(&d, dir);
    snprintf(eg1, sizeof eg1, "%s/full", dir);
    snprintf(eg2, sizeof eg2, "%s/d2t", dir);
    if (d.world_rank == 0) {
        k25_eagle3_synth o1 = {.seed = 21, .n_aux = 3, .aux_ids = {2, 0, 1}};
        k25_eagle3_synth o2 = {.seed = 22, .draft_vocab = 96, .own_embed = 1, .intermediate = 160,
                               .norm_before_residual = 1};
        if (spec_eagle3_write_synthetic(eg1, &cfg, &o1, err) ||
            spec_eagle3_write_synthetic(eg2, &cfg, &o2, err))
            K25_DIE("%s", err);
    }
    MPI_CHECK(MPI_Barrier(d.world));

    int V = cfg.vocab, I = cfg.dense_inter;
    check_head("full vocabulary, greedy", eg1, &in, &cfg, &d, V, I, 0, 0);
    check_head("full vocabulary, temperature 1", eg1, &in, &cfg, &d, V, I, 0, 1);
    check_head("d2t, own embedding, norm before residual", eg2, &in, &cfg, &d, 96, 160, 1, 0);
    check_head("d2t, ..., temperature 0.7", eg2, &in, &cfg, &d, 96, 160, 1, 0.7f);
    check_narrow_heads(dir, &in, &cfg, &d);

    int ok = dist_all_ok(&d, test_failures == 0);
    MPI_CHECK(MPI_Barrier(d.world));
    test_remove_tmpdir(&d, dir);
    if (d.world_rank == 0)
        printf("test_spec_eagle3 (%d ranks): %s\n", d.world_size, ok ? "ok" : "FAILED");
    instance_close(&in);
    dist_finalize(&d);
    return ok ? 0 : 1;
}
