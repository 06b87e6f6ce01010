// Serving-benchmark metrics of one run of requests through the engine, defined as
// `vllm bench serve` defines them (../shared/PERF.md §8):
//   TTFT  first token time - send time
//   TPOT  (E2EL - TTFT) / (output tokens - 1), per request with more than one output token
//   ITL   every gap between consecutive chunks of a request (one entry per chunk after the
//         first). A chunk is what one engine step hands a request: one token, or with
//         speculative decoding a verification's tokens, which share the step's time
//   E2EL  last token time - send time
//   output tok/s = sum of output tokens / duration, total tok/s adds the prompt tokens,
//   request/s = completed requests / duration; duration = last completion - start.
// Send time: the requests are all submitted at the start with at most `concurrency` in flight,
// like the benchmark client's semaphore: request k (in submission order) is sent at the start
// when k < concurrency, otherwise when the (k - concurrency + 1)-th request completes.
#pragma once
#include "engine.h"

typedef struct k25_stat {
    double mean, median, p99, std;
    int n;                   // samples
} k25_stat;

typedef struct k25_serve_metrics {
    int concurrency;
    int n_requests, n_completed;
    long in_tokens, out_tokens;
    double duration_s;
    double req_per_s, out_tok_per_s, total_tok_per_s;
    k25_stat ttft_ms, tpot_ms, itl_ms, e2el_ms;
} k25_serve_metrics;

#ifdef __cplusplus
extern "C" {
#endif

// Percentile p (0..100) of v[n] with linear interpolation between order statistics (numpy's
// default); sorts v in place. 0 when n == 0.
double stat_percentile(double *v, int n, double p);
// Mean, median, p99 and population std of v[n] (sorted in place).
k25_stat stat_of(double *v, int n);

// Metrics of requests recs[0 .. n-1] (submission order), started at t0_ms with at most
// `concurrency` in flight. Unfinished requests count as not completed and are left out of
// every latency.
void serve_metrics(const k25_seq_record *const *recs, int n, double t0_ms, int concurrency,
                   k25_serve_metrics *out);

#ifdef __cplusplus
}
#endif
