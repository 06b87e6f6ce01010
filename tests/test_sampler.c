// Sampling: greedy ties, the support of top-k and top-p, the distribution of temperature
// sampling over many counters (against softmax computed here), and independence of the drawn
// token from how the vocabulary is split over ranks (simulated splits, uneven ones included).
#include <math.h>
#include <string.h>

#include "dist.h"
#include "sampler.h"

static int failures;
static uint64_t rng_state = 777;

static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void check(const char *what, int ok) {
    printf("%-60s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

// The token a tensor-parallel group of `ranks` ranks would draw, each rank holding a
// contiguous slice (sizes as even as possible, the first ones one larger), using the same
// per-rank pieces and merge rules as sampler_sample.
static int32_t sample_split(const float *logits, int V, int ranks, const k25_sampling *p) {
    int b0 = 0;
    k25_cand best = {-INFINITY, INT32_MAX};
    k25_cand *all = k25_malloc(sizeof(k25_cand) * (size_t)(ranks * K25_SAMPLE_CAND_MAX));
    int n_all = 0;
    k25_softmax_stats stats = {-INFINITY, 0};
    for (int r = 0; r < ranks; r++) {
        int n = V / ranks + (r < V % ranks);
        if (sampler_mode_of(p) != SAMPLER_CANDIDATES) {
            k25_cand c = sampler_local_best(logits + b0, n, b0, p);
            if (sampler_before(c, best)) best = c;
        } else {
            n_all += sampler_local_top(logits + b0, n, b0, p->temp, sampler_cand_count(p), all + n_all);
            stats = sampler_stats_merge(stats, sampler_local_stats(logits + b0, n, p->temp));
        }
        b0 += n;
    }
    int32_t tok = sampler_mode_of(p) != SAMPLER_CANDIDATES ? best.id : sampler_pick(all, n_all, p, stats);
    free(all);
    return tok;
}

// The real driver on a one-rank communicator.
static int32_t sample_mpi(const float *logits, int V, const k25_sampling *p) {
    int32_t tok;
    sampler_sample(MPI_COMM_SELF, logits, 1, V, 0, p, &tok);
    return tok;
}

static void softmax(const float *l, int V, double temp, double *p) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) m = fmax(m, l[i] / temp);
    for (int i = 0; i < V; i++) z += (p[i] = exp(l[i] / temp - m));
    for (int i = 0; i < V; i++) p[i] /= z;
}

// Draws N tokens (counters 0..N-1) and checks every frequency against want[] within 5 sigma
// (want[i] 0 or 1: never or always drawn).
static void check_distribution(const char *what, const float *logits, int V, k25_sampling p,
                               const double *want) {
    enum { N = 20000 };
    int *count = k25_calloc((size_t)V, sizeof(int));
    for (int i = 0; i < N; i++) {
        p.counter = (uint64_t)i;
        count[sample_mpi(logits, V, &p)]++;
    }
    int ok = 1;
    double worst = 0;
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / N, sd = sqrt(want[i] * (1 - want[i]) / N);
        if (want[i] == 0 || want[i] == 1) ok &= f == want[i];
        else {
            double z = fabs(f - want[i]) / sd;
            worst = fmax(worst, z);
            ok &= z < 5;
        }
    }
    char name[128];
    snprintf(name, sizeof name, "%s (worst %.1f sigma)", what, worst);
    check(name, ok);
    free(count);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);

    // ---- greedy: the highest logit, ties to the lowest id, on any split ----
    {
        enum { V = 600 };
        float l[V];
        for (int i = 0; i < V; i++) l[i] = (float)(urand() * 4 - 2);
        l[410] = 5, l[77] = 5, l[599] = 5;
        k25_sampling p = {0, 0, 1, 1, 0};
        int ok = sample_mpi(l, V, &p) == 77;
        for (int r = 1; r <= 8; r++) ok &= sample_split(l, V, r, &p) == 77;
        check("greedy: ties go to the lowest id on 1..8 ranks", ok);
        l[3] = NAN;
        check("greedy: a NaN logit never wins", sample_mpi(l, V, &p) == 77);
        p.top_k = 1, p.temp = 0.7f; // top-1 at any temperature is the argmax too
        check("top-k 1 equals greedy", sample_mpi(l, V, &p) == 77 && sample_split(l, V, 3, &p) == 77);
    }

    // ---- distributions ----
    {
        enum { V = 12 };
        float l[V];
        double want[V], pr[V];
        for (int i = 0; i < V; i++) l[i] = (float)(urand() * 3 - 1.5);
        k25_sampling p = {0.7f, 0, 1, 42, 0};
        softmax(l, V, 0.7, want);
        check_distribution("temperature 0.7 matches softmax(l/T)", l, V, p, want);

        p.temp = 1.3f;
        softmax(l, V, 1.3, want);
        check_distribution("temperature 1.3 matches softmax(l/T)", l, V, p, want);

        // top-k 4: softmax renormalized over the 4 best
        p.temp = 1.0f, p.top_k = 4;
        softmax(l, V, 1.0, pr);
        int order[V];
        for (int i = 0; i < V; i++) order[i] = i;
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++)
                if (l[order[j]] > l[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
        double z = 0;
        for (int i = 0; i < V; i++) want[i] = 0;
        for (int k = 0; k < 4; k++) z += pr[order[k]];
        for (int k = 0; k < 4; k++) want[order[k]] = pr[order[k]] / z;
        check_distribution("top-k 4: support = the 4 best, renormalized", l, V, p, want);
    }
    {
        // top-p: probabilities 0.4, 0.3, 0.2, 0.1 (+ tiny): top_p 0.65 keeps the first two,
        // top_p 0.75 the first three (a token is kept while the mass before it is < top_p)
        enum { V = 7 };
        float l[V] = {(float)log(0.2), (float)log(0.4), -30, (float)log(0.1), (float)log(0.3), -30, -31};
        double want[V] = {0};
        k25_sampling p = {1.0f, 0, 0.65f, 9, 0};
        want[1] = 0.4 / 0.7, want[4] = 0.3 / 0.7;
        check_distribution("top-p 0.65: support {0.4, 0.3}, renormalized", l, V, p, want);
        p.top_p = 0.75f;
        want[1] = 0.4 / 0.9, want[4] = 0.3 / 0.9, want[0] = 0.2 / 0.9;
        check_distribution("top-p 0.75: support {0.4, 0.3, 0.2}", l, V, p, want);
        // top-k 2 then top-p over the top-k set: 0.4/0.7 = 0.571 < 0.6 -> both kept
        p.top_k = 2, p.top_p = 0.6f;
        want[0] = 0, want[1] = 0.4 / 0.7, want[4] = 0.3 / 0.7;
        check_distribution("top-k 2 + top-p 0.6 (over the top-k set)", l, V, p, want);
        // top_p 0.5 over the top-k set keeps only the best
        p.top_p = 0.5f;
        want[1] = 1, want[4] = 0;
        check_distribution("top-k 2 + top-p 0.5 keeps one token", l, V, p, want);
    }

    // ---- rank-count invariance ----
    {
        enum { V = 3001 };
        float *l = k25_malloc(sizeof(float) * V);
        for (int i = 0; i < V; i++) l[i] = (float)(urand() * 6 - 3);
        for (int i = 0; i < 40; i++) l[(int)(urand() * V)] = l[(int)(urand() * V)]; // some ties
        k25_sampling modes[] = {
            {0, 0, 1, 5, 0},  {0.8f, 0, 1, 5, 0},    {0.8f, 20, 1, 5, 0},
            {1.0f, 0, 0.9f, 5, 0}, {0.6f, 50, 0.8f, 5, 0}, {2.0f, 2000, 1, 5, 0},
        };
        const char *names[] = {"greedy", "temperature", "top-k 20", "top-p 0.9", "top-k 50 + top-p 0.8",
                               "top-k 2000 (capped)"};
        int splits[] = {1, 2, 3, 4, 7, 16};
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            int ok = 1, distinct = 0, prev = -1;
            for (int c = 0; c < 60; c++) {
                k25_sampling p = modes[m];
                p.counter = (uint64_t)c;
                int32_t want = sample_mpi(l, V, &p);
                distinct += want != prev;
                prev = want;
                for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++)
                    ok &= sample_split(l, V, splits[s], &p) == want;
            }
            char name[128];
            snprintf(name, sizeof name, "same token on 1,2,3,4,7,16 ranks: %s", names[m]);
            check(name, ok && (m == 0 || distinct > 10));
        }
        free(l);
    }

    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    dist_finalize(&d);
    return failures ? 1 : 0;
}
