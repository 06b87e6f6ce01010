// model_step semantics the engine relies on, on the CPU backend with synthetic weights:
// a sequence gives the same logits alone or interleaved with another one in the same steps
// (other slot, other cache blocks, prefill and decode rows mixed); sampling a subset of rows in
// any order returns those rows' logits and argmax tokens; captured hidden states are the
// embedding rows (layer 0) and the final hidden state, whose norm and lm_head (computed here)
// give the logits.
#include <math.h>
#include <string.h>

#include "backend.h"
#include "dist.h"
#include "model.h"

static int failures;

static void check(const char *what, int ok) {
    printf("%-64s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 1e-30, e = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(b[i])), e = fmax(e, fabs(a[i] - b[i]));
    return e / m;
}

enum { MAXB = 16, KB = 4 };

typedef struct step_rows {
    int T;
    int32_t tok[16], pos[16], seq[16];
} step_rows;

// One step, every row sampled greedily; logits[T][V].
static void step_all(k25_model *m, const step_rows *s, const int32_t *table, int V, float *logits,
                     int32_t *out) {
    k25_batch b = {s->T, s->tok, s->pos, s->seq, table, 2, MAXB};
    int32_t rows[16];
    k25_sampling p[16];
    for (int i = 0; i < s->T; i++) rows[i] = i, p[i] = (k25_sampling){0, 0, 1, 0, 0};
    model_step(m, &b, rows, s->T, p, out, logits);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN];
    k25_config c;
    config_init_defaults(&c);
    if (config_load_ini(&c, "config/tiny_group.ini", err)) K25_DIE("%s", err);
    c.ctx_size = MAXB * KB;
    c.kv_block = KB;
    k25_weights w;
    k25_tensor_source src = synth_source(5);
    if (weights_plan(&w, &c, 0, 1, 0, c.n_layers, &src, err)) K25_DIE("%s", err);
    k25_backend *be = backend_cpu_create(&c, &d, 2);
    k25_model_opts mo = {.max_seqs = 2, .max_rows = 16, .kv_block = KB, .check_finite = 1};
    k25_model *m = model_create(&c, &w, be, &d, &mo);
    int V = c.vocab, D = c.hidden;
    float *ref = k25_malloc(sizeof(float) * 16 * V), *got = k25_malloc(sizeof(float) * 16 * V);
    int32_t out_ref[16], out[16];

    // ---- sequence A alone: slot 0, blocks 0, 1; prompt of 6 then one decode row ----
    int32_t table_a[2 * MAXB] = {0, 1};
    int32_t a_tok[7] = {17, 300, 4, 99, 256, 8, 0};
    step_rows s1 = {6, {0}, {0}, {0}};
    for (int i = 0; i < 6; i++) s1.tok[i] = a_tok[i], s1.pos[i] = i;
    step_all(m, &s1, table_a, V, ref, out_ref);
    a_tok[6] = out_ref[5];
    step_rows s2 = {1, {a_tok[6]}, {6}, {0}};
    step_all(m, &s2, table_a, V, ref + 6 * V, out_ref + 6);

    // ---- A again in slot 1 (blocks 7, 3) interleaved with B in slot 0 (blocks 2, 5) ----
    int32_t table_ab[2 * MAXB] = {2, 5};
    table_ab[MAXB] = 7, table_ab[MAXB + 1] = 3;
    step_rows m1 = {7, {a_tok[0], 40, a_tok[1], a_tok[2], 41, a_tok[3], 42},
                    {0, 0, 1, 2, 1, 3, 2}, {1, 0, 1, 1, 0, 1, 0}};
    step_all(m, &m1, table_ab, V, got, out);
    int ok = 1;
    int a_rows1[4] = {0, 2, 3, 5};
    for (int i = 0; i < 4; i++)
        ok &= max_rel(got + a_rows1[i] * V, ref + i * V, V) < 1e-6 && out[a_rows1[i]] == out_ref[i];
    step_rows m2 = {4, {43, a_tok[4], a_tok[5], 44}, {3, 4, 5, 4}, {0, 1, 1, 0}};
    step_all(m, &m2, table_ab, V, got, out);
    ok &= max_rel(got + 1 * V, ref + 4 * V, V) < 1e-6 && max_rel(got + 2 * V, ref + 5 * V, V) < 1e-6;
    step_rows m3 = {2, {45, a_tok[6]}, {5, 6}, {0, 1}};
    step_all(m, &m3, table_ab, V, got, out);
    ok &= max_rel(got + 1 * V, ref + 6 * V, V) < 1e-6 && out[1] == out_ref[6];
    check("a sequence alone == interleaved with another (slots, blocks)", ok);

    // ---- a subset of rows, out of order; hidden-state capture ----
    int layers[3] = {0, 2, c.n_layers};
    model_capture_layers(m, layers, 3);
    int32_t rows[2] = {4, 1};
    k25_sampling p[2] = {{0, 0, 1, 0, 0}, {0, 0, 1, 0, 0}};
    k25_batch b = {s1.T, s1.tok, s1.pos, s1.seq, table_a, 2, MAXB};
    model_step(m, &b, rows, 2, p, out, got);
    check("sampled rows {4, 1}: their logits and tokens",
          max_rel(got, ref + 4 * V, V) < 1e-6 && max_rel(got + V, ref + 1 * V, V) < 1e-6 &&
              out[0] == out_ref[4] && out[1] == out_ref[1]);
    {
        // greedy = argmax with the lowest id on ties
        int best = 0;
        for (int i = 1; i < V; i++) if (ref[4 * V + i] > ref[4 * V + best]) best = i;
        check("greedy token is the argmax of its logits", out_ref[4] == best);
    }

    const float *h0 = model_captured(m, 0), *hl = model_captured(m, 2);
    double e0 = 0;
    for (int t = 0; t < s1.T; t++)
        for (int i = 0; i < D; i++) e0 = fmax(e0, fabs(h0[t * D + i] - tensor_get_f32(&w.embed, s1.tok[t], i)));
    check("captured layer 0 == embedding rows", e0 == 0);
    check("captured layer 2 is there", model_captured(m, 1) != NULL && model_captured(m, 3) == NULL);
    // logits of row 4 from the captured final hidden state
    double ss = 0, lerr = 0, lmax = 0;
    const float *h = hl + 4 * D;
    for (int i = 0; i < D; i++) ss += (double)h[i] * h[i];
    double r = 1 / sqrt(ss / D + c.norm_eps);
    for (int v = 0; v < V; v++) {
        double acc = 0;
        for (int i = 0; i < D; i++) acc += h[i] * r * tensor_get_f32(&w.final_norm, 0, i) * tensor_get_f32(&w.lm_head, v, i);
        lerr = fmax(lerr, fabs(acc - ref[4 * V + v]));
        lmax = fmax(lmax, fabs(acc));
    }
    check("final hidden -> norm -> lm_head == logits", lerr < 1e-5 * lmax);

    model_free(m);
    be->destroy(be);
    weights_free(&w);
    free(ref), free(got);
    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    dist_finalize(&d);
    return failures ? 1 : 0;
}
