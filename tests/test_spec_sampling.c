// Speculative sampling keeps the target distribution.
//
// 1. spec_accept_or_resample driven directly: known target p and draft q over a small
//    vocabulary (q with mass where p has none and the reverse, a point-mass draft, a draft that
//    always proposes a token p never picks), draft tokens drawn from q, many draws; the
//    emitted tokens must follow p and the acceptance rate must be sum_i min(p_i, q_i).
// 2. spec_probs is the sampler's distribution: sampler_sample's draws (Gumbel-max with
//    temperature, top-k, top-p) against spec_probs of the same logits.
// 3. End to end on the tiny model: many requests with the same prompt and different seeds
//    through the engine with a draft model close to the target (its experts scaled otherwise)
//    under temperature and top-k; the first two generated tokens (the second one decided by
//    verification) must follow p(t0) p(t1 | t0) computed from the target's own logits.
//
// Each comparison is a chi-square goodness-of-fit test (cells with an expected count below 5
// merged); it passes when its p-value exceeds 0.001. The random streams are fixed, so the
// outcome is deterministic.
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "instance.h"
#include "sampler.h"
#include "spec.h"
#include "test_util.h"

#define ALPHA 0.001


// ------------------------------------------------------------------------------------------
// Chi-square
// ------------------------------------------------------------------------------------------

// Regularized upper incomplete gamma Q(a, x): series for P below a + 1, Lentz's continued
// fraction for Q above.
static double gamma_q(double a, double x) {
    if (x <= 0) return 1;
    double lg = lgamma(a);
    if (x < a + 1) {
        double term = 1 / a, sum = term;
        for (int n = 1; n < 10000 && fabs(term) > fabs(sum) * 1e-15; n++) {
            term *= x / (a + n);
            sum += term;
        }
        return 1 - sum * exp(-x + a * log(x) - lg);
    }
    double tiny = 1e-300, b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return exp(-x + a * log(x) - lg) * h;
}

// p-value of observed counts against expected probabilities (sum 1) over n cells; cells with
// an expected count below 5 are pooled into one. Observations in cells of probability 0 fail.
static double chi_square_p(const long *obs, const double *prob, int n, long total, char *why) {
    double chi = 0, pool_e = 0;
    long pool_o = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        if (prob[i] <= 0) {
            if (obs[i] > 0) {
                snprintf(why, 128, "%ld draws of cell %d, whose probability is 0", obs[i], i);
                return 0;
            }
            continue;
        }
        if (e < 5) {
            pool_e += e;
            pool_o += obs[i];
            continue;
        }
        chi += (obs[i] - e) * (obs[i] - e) / e;
        cells++;
    }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    snprintf(why, 128, "chi2 %.2f over %d cells", chi, cells);
    return cells < 2 ? 1 : gamma_q((cells - 1) / 2.0, chi / 2);
}

static double uniform(uint64_t stream, uint64_t i) { return sampler_uniform(0x1234, i, stream); }

// ------------------------------------------------------------------------------------------
// 1. The accept-or-resample step
// ------------------------------------------------------------------------------------------

static void check_accept(const char *name, const float *p, const float *q, int V, int fixed_x,
                         long N) {
    long counts[16] = {0}, accepted = 0;
    for (long i = 0; i < N; i++) {
        int32_t x = q ? spec_draw(q, V, uniform(1, (uint64_t)i)) : fixed_x;
        int acc;
        int32_t t = spec_accept_or_resample(p, q, V, x, uniform(2, (uint64_t)i),
                                            uniform(3, (uint64_t)i), &acc);
        CHECK(t >= 0 && t < V, "%s: token %d", name, t);
        if (t >= 0 && t < V) counts[t]++;
        accepted += acc;
        CHECK(!acc || t == x, "%s: accepted but returned %d for draft %d", name, t, x);
    }
    double prob[16];
    for (int i = 0; i < V; i++) prob[i] = p[i];
    char why[128];
    double pv = chi_square_p(counts, prob, V, N, why);
    printf("%-44s tokens: %s, p-value %.4f\n", name, why, pv);
    CHECK(pv > ALPHA, "%s: emitted tokens do not follow p (%s, p-value %g)", name, why, pv);

    // Acceptance rate: sum_i min(p_i, q_i) (q a point mass: p[x]).
    double a = 0;
    for (int i = 0; i < V; i++) a += q ? fmin(p[i], q[i]) : (i == fixed_x ? p[i] : 0);
    long obs[2] = {accepted, N - accepted};
    double pr[2] = {a, 1 - a};
    pv = chi_square_p(obs, pr, 2, N, why);
    printf("%-44s acceptance %.4f (expected %.4f), p-value %.4f\n", name,
           (double)accepted / N, a, pv);
    CHECK(pv > ALPHA, "%s: acceptance %.4f, expected %.4f (%s)", name, (double)accepted / N, a,
          why);
}

static void test_accept(void) {
    const long N = 200000;
    float p[8] = {0.30f, 0.20f, 0.15f, 0.12f, 0.10f, 0.08f, 0.05f, 0.00f};
    float q1[8] = {0.05f, 0.40f, 0.05f, 0.20f, 0.00f, 0.10f, 0.05f, 0.15f};
    float q2[8] = {0.30f, 0.20f, 0.15f, 0.12f, 0.10f, 0.08f, 0.05f, 0.00f};
    float q3[8] = {0, 0, 0, 0, 0, 0, 0, 1.0f};
    check_accept("q differs from p", p, q1, 8, 0, N);
    check_accept("q equals p", p, q2, 8, 0, N);
    check_accept("q proposes only a token p never picks", p, q3, 8, 0, N);
    check_accept("point mass on a likely token (n-gram)", p, NULL, 8, 0, N);
    check_accept("point mass on an unlikely token (n-gram)", p, NULL, 8, 6, N);
    check_accept("point mass on an impossible token (n-gram)", p, NULL, 8, 7, N);
}

// ------------------------------------------------------------------------------------------
// 2. spec_probs against the sampler's draws
// ------------------------------------------------------------------------------------------

static void check_probs(const char *name, const float *logits, int V, k25_sampling sp, long N) {
    float probs[64];
    spec_probs(logits, V, &sp, probs);
    double sum = 0, prob[64];
    for (int i = 0; i < V; i++) sum += probs[i], prob[i] = probs[i];
    CHECK(fabs(sum - 1) < 1e-5, "%s: probabilities sum to %g", name, sum);
    long counts[64] = {0};
    for (long i = 0; i < N; i++) {
        sp.counter = (uint64_t)i;
        int32_t t;
        sampler_sample(MPI_COMM_SELF, logits, 1, V, 0, &sp, &t);
        counts[t]++;
    }
    char why[128];
    double pv = chi_square_p(counts, prob, V, N, why);
    printf("%-44s sampler draws: %s, p-value %.4f\n", name, why, pv);
    CHECK(pv > ALPHA, "%s: the sampler does not draw from spec_probs (%s, p-value %g)", name, why,
          pv);
}

static void test_probs(void) {
    float logits[24];
    for (int i = 0; i < 24; i++) logits[i] = (float)(3.0 * sin(1.7 * i + 0.3));
    logits[5] = logits[9]; // a tie
    const long N = 40000;
    check_probs("temperature 0.8", logits, 24,
                (k25_sampling){.temp = 0.8f, .top_p = 1, .seed = 5}, N);
    check_probs("temperature 1.3, top-k 5", logits, 24,
                (k25_sampling){.temp = 1.3f, .top_k = 5, .top_p = 1, .seed = 6}, N);
    check_probs("temperature 1, top-p 0.7", logits, 24,
                (k25_sampling){.temp = 1.0f, .top_p = 0.7f, .seed = 7}, N);
    check_probs("temperature 2, top-k 8, top-p 0.8", logits, 24,
                (k25_sampling){.temp = 2.0f, .top_k = 8, .top_p = 0.8f, .seed = 8}, N);
    float greedy[24];
    spec_probs(logits, 24, &(k25_sampling){.temp = 0, .top_p = 1}, greedy);
    int best = 0;
    for (int i = 1; i < 24; i++) if (logits[i] > logits[best]) best = i;
    CHECK(greedy[best] == 1, "temperature 0: no point mass on the argmax %d", best);
}

// ------------------------------------------------------------------------------------------
// 3. End to end
// ------------------------------------------------------------------------------------------

#define E2E_N 1200
#define E2E_TOPK 3

// Full logits of the last row after feeding tokens[0..n) on a fresh cache slot.
static void target_logits(k25_model *m, const int32_t *tokens, int n, float *out) {
    int32_t table[4] = {0, 1, 2, 3}, pos[16], seq[16] = {0}, row = n - 1, tok;
    for (int i = 0; i < n; i++) pos[i] = i;
    k25_batch b = {.T = n, .tokens = tokens, .pos = pos, .seq = seq, .block_table = table,
                   .max_seqs = 1, .max_blocks_per_seq = 4};
    k25_sampling sp = {.temp = 0, .top_p = 1};
    model_step(m, &b, &row, 1, &sp, &tok, out);
}

static void test_end_to_end(const k25_dist *d) {
    char err[K25_ERR_LEN] = "";
    k25_config cfg;
    config_init_defaults(&cfg);
    if (config_load_ini(&cfg, "config/tiny.ini", err) != 0) K25_DIE("%s", err);
    cfg.threads = 1;
    int conc = 64, K = 2, V = cfg.vocab;
    k25_instance in;
    k25_instance_opts io = {.synth_seed = 1, .backend = "cpu",
                            .model = {.max_seqs = conc, .max_rows = conc * (K + 1) + 64,
                                      .kv_block = 16, .n_blocks = conc + 8}};
    if (instance_open(&in, &cfg, d, &io, err) != 0) K25_DIE("%s", err);
    const float temp = 1.5f;
    k25_sampling base = {.temp = temp, .top_k = E2E_TOPK, .top_p = 1};

    // The reference: p(t0) after the prompt, p(t1 | t0) for each t0 in its support.
    int32_t prompt[5] = {17, 99, 3, 250, 41};
    float *lg = k25_malloc(sizeof(float) * (size_t)V), *p0 = k25_malloc(sizeof(float) * (size_t)V);
    float *p1 = k25_malloc(sizeof(float) * (size_t)V * V);
    target_logits(in.m, prompt, 5, lg);
    spec_probs(lg, V, &base, p0);
    for (int t0 = 0; t0 < V; t0++) {
        if (p0[t0] <= 0) continue;
        int32_t seq6[6];
        memcpy(seq6, prompt, sizeof prompt);
        seq6[5] = t0;
        target_logits(in.m, seq6, 6, lg);
        spec_probs(lg, V, &base, p1 + (size_t)t0 * V);
    }

    // The engine with a smaller draft: t1 is the first token verification decides.
    k25_engine_opts eo = {.max_batch = conc, .prefill_chunk = 64, .max_rows = conc * (K + 1) + 64,
                          .kv_block = 16, .ctx_size = 32};
    k25_engine *e = engine_create(in.m, &cfg, &eo, err);
    if (!e) K25_DIE("%s", err);
    k25_spec_opts so = {.k = K, .max_seqs = conc, .max_rows = eo.max_rows, .ctx_size = 32,
                        .kv_block = 16, .backend = "cpu", .threads = 1};
    // The draft: the target's weights with the routed experts scaled otherwise, so that q is
    // close to p but not equal (both accepting and resampling happen).
    char ini[64] = "/tmp/k25-spec-draft-XXXXXX.ini", src[96];
    int fd = mkstemps(ini, 4);
    FILE *in_f = fopen("config/tiny.ini", "r"), *out_f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!in_f || !out_f) K25_DIE("cannot write the draft configuration %s", ini);
    char line[256];
    while (fgets(line, sizeof line, in_f))
        fputs(strncmp(line, "routed_scaling_factor", 21) ? line : "routed_scaling_factor = 1.6\n",
              out_f);
    fclose(in_f);
    fclose(out_f);
    snprintf(src, sizeof src, "model:%s@1", ini);
    k25_spec *sp = spec_create(src, in.m, &in.w, &cfg, d, &so, err);
    unlink(ini);
    if (!sp) K25_DIE("%s", err);
    engine_set_spec(e, sp);
    for (int i = 0; i < E2E_N; i++) {
        k25_request r = {.prompt = prompt, .n_prompt = 5, .max_new = K + 2, .sampling = base,
                         .ignore_eos = 1};
        r.sampling.seed = 777 + (uint64_t)i;
        if (engine_submit(e, &r, err) != i) K25_DIE("%s", err);
    }
    engine_run(e);
    // Joint (t0, t1) over the top-k x top-k cells that can occur.
    int cell_of[E2E_TOPK], n0 = 0;
    for (int t = 0; t < V && n0 < E2E_TOPK; t++)
        if (p0[t] > 0) cell_of[n0++] = t;
    int n_cells = n0 * V;
    long *obs = k25_calloc((size_t)n_cells, sizeof(long));
    double *prob = k25_malloc(sizeof(double) * (size_t)n_cells);
    for (int a = 0; a < n0; a++)
        for (int t1 = 0; t1 < V; t1++)
            prob[a * V + t1] = (double)p0[cell_of[a]] * p1[(size_t)cell_of[a] * V + t1];
    long bad = 0;
    for (int i = 0; i < E2E_N; i++) {
        const k25_seq_record *rec = engine_record(e, i);
        int a = -1;
        for (int c = 0; c < n0; c++)
            if (cell_of[c] == rec->tokens[0]) a = c;
        if (a < 0 || rec->n_tokens < 2) {
            bad++;
            continue;
        }
        obs[a * V + rec->tokens[1]]++;
    }
    CHECK(bad == 0, "%ld requests generated a first token outside the top-%d set", bad, E2E_TOPK);
    char why[128];
    double pv = chi_square_p(obs, prob, n_cells, E2E_N - bad, why);
    const k25_spec_stats *st = spec_stats(sp);
    printf("%-44s (t0, t1): %s, p-value %.4f; %ld drafted, %ld accepted\n",
           "end to end, tiny model + perturbed draft", why, pv, st->drafted, st->accepted);
    CHECK(pv > ALPHA, "end to end: (t0, t1) do not follow the target (%s, p-value %g)", why, pv);
    CHECK(st->accepted > 0 && st->accepted < st->drafted,
          "end to end: %ld of %ld drafts accepted: both paths should occur", st->accepted,
          st->drafted);
    engine_free(e);
    spec_free(sp);
    free(obs);
    free(prob);
    free(lg);
    free(p0);
    free(p1);
    instance_close(&in);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN];
    k25_config cfg;
    config_init_defaults(&cfg);
    if (config_load_ini(&cfg, "config/tiny.ini", err) != 0) K25_DIE("%s", err);
    cfg.tp = 1;
    if (d.world_size != 1) K25_DIE("test_spec_sampling runs on one rank");
    if (instance_setup_dist(&d, &cfg, err) != 0) K25_DIE("%s", err);
    printf("significance: each chi-square test passes when its p-value exceeds %g\n", ALPHA);
    test_accept();
    test_probs();
    test_end_to_end(&d);
    printf("test_spec_sampling: %s\n", test_failures ? "FAILED" : "ok");
    dist_finalize(&d);
    return test_failures ? 1 : 0;
}
