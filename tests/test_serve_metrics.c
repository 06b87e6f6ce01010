// Serving-benchmark metrics on hand-made request timelines, against values worked out by hand
// from the definitions (vllm bench serve's, ../shared/PERF.md §8) and numpy's percentiles.
#include "serve_metrics.h"

#include <math.h>
#include <string.h>

static int n_fail = 0;
#define NEAR(a, b)                                                                                 \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= 1e-9 * (1 + fabs(b_)))) {                                           \
            n_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: %s = %.12g, expected %.12g\n", __FILE__, __LINE__, #a,   \
                    a_, b_);                                                                       \
        }                                                                                          \
    } while (0)

static k25_seq_record rec(int n_prompt, const double *t, int n, k25_finish fin) {
    k25_seq_record r;
    memset(&r, 0, sizeof r);
    r.n_prompt = n_prompt;
    r.n_tokens = n;
    r.t_token = (double *)t;
    r.t_done = n ? t[n - 1] : 0;
    r.finish = fin;
    return r;
}

// The metrics of one request of 2 prompt tokens sent at t = 1000 ms, its tokens at t[0..n).
static void one_request(const double *t, int n, k25_serve_metrics *m) {
    k25_seq_record r = rec(2, t, n, K25_FINISH_LENGTH);
    const k25_seq_record *p = &r;
    serve_metrics(&p, 1, 1000, 1, m);
}

int main(void) {
    // numpy.percentile (linear): [1,2,3,4] -> p50 2.5, p99 3.97; 1..100 -> p99 99.01.
    double v4[] = {4, 1, 3, 2};
    NEAR(stat_percentile(v4, 4, 50), 2.5);
    NEAR(stat_percentile(v4, 4, 99), 3.97);
    NEAR(stat_percentile(v4, 4, 0), 1);
    NEAR(stat_percentile(v4, 4, 100), 4);
    double v100[100];
    for (int i = 0; i < 100; i++) v100[i] = 100 - i;
    NEAR(stat_percentile(v100, 100, 99), 99.01);
    double one[] = {7};
    k25_stat s1 = stat_of(one, 1);
    NEAR(s1.mean, 7);
    NEAR(s1.median, 7);
    NEAR(s1.p99, 7);
    NEAR(s1.std, 0);

    // Concurrency 2, start at 1000 ms. Requests 0 and 1 are sent at the start; request 2 when
    // the first completion frees a slot (request 0 at 1030), request 3 at the second (1035).
    // Request 4 never finished: left out of everything.
    double t0[] = {1010, 1020, 1030}, t1[] = {1015, 1035}, t2[] = {1040, 1050, 1060, 1070},
           t3[] = {1045, 1046}, t4[] = {1080};
    k25_seq_record r[5] = {rec(5, t0, 3, K25_FINISH_LENGTH), rec(3, t1, 2, K25_FINISH_EOS),
                           rec(4, t2, 4, K25_FINISH_LENGTH), rec(6, t3, 2, K25_FINISH_LENGTH),
                           rec(9, t4, 1, K25_FINISH_NONE)};
    const k25_seq_record *p[5] = {&r[0], &r[1], &r[2], &r[3], &r[4]};
    k25_serve_metrics m;
    serve_metrics(p, 5, 1000, 2, &m);
    NEAR(m.n_requests, 5);
    NEAR(m.n_completed, 4);
    NEAR(m.in_tokens, 18);
    NEAR(m.out_tokens, 11);
    NEAR(m.duration_s, 0.070);
    NEAR(m.req_per_s, 4 / 0.070);
    NEAR(m.out_tok_per_s, 11 / 0.070);
    NEAR(m.total_tok_per_s, 29 / 0.070);
    // TTFT: 10, 15, 1040-1030 = 10, 1045-1035 = 10.
    NEAR(m.ttft_ms.n, 4);
    NEAR(m.ttft_ms.mean, 11.25);
    NEAR(m.ttft_ms.median, 10);
    NEAR(m.ttft_ms.p99, 10 + 0.97 * 5);
    NEAR(m.ttft_ms.std, sqrt((3 * 1.25 * 1.25 + 3.75 * 3.75) / 4));
    // E2EL: 30, 35, 40, 11.
    NEAR(m.e2el_ms.mean, 29);
    NEAR(m.e2el_ms.median, 32.5);
    NEAR(m.e2el_ms.p99, 35 + 0.97 * 5);
    // TPOT: 20/2, 20/1, 30/3, 1/1.
    NEAR(m.tpot_ms.n, 4);
    NEAR(m.tpot_ms.mean, 10.25);
    NEAR(m.tpot_ms.median, 10);
    // ITL: 10 10 | 20 | 10 10 10 | 1.
    NEAR(m.itl_ms.n, 7);
    NEAR(m.itl_ms.mean, 71.0 / 7);
    NEAR(m.itl_ms.median, 10);
    NEAR(m.itl_ms.p99, 10 + 0.94 * 10);

    // A request with one output token has no TPOT and no ITL.
    double tx[] = {1005};
    one_request(tx, 1, &m);
    NEAR(m.tpot_ms.n, 0);
    NEAR(m.itl_ms.n, 0);
    NEAR(m.ttft_ms.mean, 5);
    NEAR(m.e2el_ms.mean, 5);

    // Speculative decoding hands out several tokens in one step, at one time: one chunk, so one
    // ITL entry (ITL is per chunk, not per token), while TPOT still divides by every token.
    double ts[] = {1010, 1020, 1020, 1020, 1030, 1030};
    one_request(ts, 6, &m);
    NEAR(m.itl_ms.n, 2);
    NEAR(m.itl_ms.mean, 10);
    NEAR(m.itl_ms.median, 10);
    NEAR(m.tpot_ms.mean, 20.0 / 5);

    if (n_fail) return 1;
    printf("test_serve_metrics: ok\n");
    return 0;
}
