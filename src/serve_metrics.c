// Serving-benchmark metrics from the engine's per-request records (see serve_metrics.h).
#include "serve_metrics.h"

#include <math.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double stat_percentile(double *v, int n, double p) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double r = p / 100.0 * (n - 1);
    int lo = (int)floor(r);
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (r - lo) * (v[lo + 1] - v[lo]);
}

k25_stat stat_of(double *v, int n) {
    k25_stat s = {0};
    s.n = n;
    if (n == 0) return s;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = sum / n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = sqrt(ss / n);
    s.median = stat_percentile(v, n, 50);
    s.p99 = stat_percentile(v, n, 99);
    return s;
}

void serve_metrics(const k25_seq_record *const *recs, int n, double t0_ms, int concurrency,
                   k25_serve_metrics *out) {
    memset(out, 0, sizeof *out);
    out->concurrency = concurrency;
    out->n_requests = n;

    // Completion times in order: the k-th one frees the slot request k + concurrency takes.
    double *done = k25_calloc(n + 1, sizeof(double));
    int n_done = 0;
    long itl_cap = 0;
    for (int i = 0; i < n; i++)
        if (recs[i]->finish != K25_FINISH_NONE) {
            done[n_done++] = recs[i]->t_done;
            itl_cap += recs[i]->n_tokens;
        }
    qsort(done, (size_t)n_done, sizeof(double), cmp_double);

    double *ttft = k25_calloc(n + 1, sizeof(double)), *tpot = k25_calloc(n + 1, sizeof(double));
    double *e2el = k25_calloc(n + 1, sizeof(double));
    double *itl = k25_calloc(itl_cap + 1, sizeof(double));
    int n_ttft = 0, n_tpot = 0, n_itl = 0;
    double t_end = t0_ms;
    for (int k = 0; k < n; k++) {
        const k25_seq_record *r = recs[k];
        if (r->finish == K25_FINISH_NONE || r->n_tokens == 0) continue;
        int j = k - concurrency;
        double sent = j < 0 ? t0_ms : (j < n_done ? done[j] : t0_ms);
        double first = r->t_token[0], last = r->t_token[r->n_tokens - 1];
        out->n_completed++;
        out->in_tokens += r->n_prompt;
        out->out_tokens += r->n_tokens;
        ttft[n_ttft++] = first - sent;
        e2el[n_ttft - 1] = last - sent;
        if (r->n_tokens > 1) tpot[n_tpot++] = (last - first) / (r->n_tokens - 1);
        // Tokens of one step carry the same time: gaps of 0 within a chunk are no ITL entry
        for (int i = 1; i < r->n_tokens; i++)
            if (r->t_token[i] != r->t_token[i - 1])
                itl[n_itl++] = r->t_token[i] - r->t_token[i - 1];
        if (r->t_done > t_end) t_end = r->t_done;
    }
    out->duration_s = (t_end - t0_ms) / 1000.0;
    if (out->duration_s > 0) {
        out->req_per_s = out->n_completed / out->duration_s;
        out->out_tok_per_s = out->out_tokens / out->duration_s;
        out->total_tok_per_s = (out->in_tokens + out->out_tokens) / out->duration_s;
    }
    out->ttft_ms = stat_of(ttft, n_ttft);
    out->tpot_ms = stat_of(tpot, n_tpot);
    out->itl_ms = stat_of(itl, n_itl);
    out->e2el_ms = stat_of(e2el, n_ttft);
    free(done);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
}
