// Vocabulary-parallel sampling (see sampler.h for the rules): the local scans each rank runs on
// its slice of the logits, the merge of the slices' results, and the MPI driver.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

// ------------------------------------------------------------------------------------------
// Local scans
// ------------------------------------------------------------------------------------------

sampler_mode sampler_mode_of(const k25_sampling *p) {
    if (!(p->temp > 0)) return SAMPLER_GREEDY;
    if (p->top_k <= 0 && !(p->top_p < 1)) return SAMPLER_GUMBEL;
    return SAMPLER_CANDIDATES;
}

int sampler_cand_count(const k25_sampling *p) {
    return p->top_k > 0 && p->top_k < K25_SAMPLE_CAND_MAX ? p->top_k : K25_SAMPLE_CAND_MAX;
}

k25_cand sampler_local_best(const float *logits, int n, int vocab_begin, const k25_sampling *p) {
    k25_cand best = {-INFINITY, INT32_MAX};
    int gumbel = sampler_mode_of(p) == SAMPLER_GUMBEL;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i])) continue;
        int32_t id = vocab_begin + i;
        double s = logits[i];
        if (gumbel) s = s / p->temp + sampler_gumbel(p->seed, p->counter, (uint64_t)id);
        k25_cand c = {s, id};
        if (best.id == INT32_MAX || sampler_before(c, best)) best = c;
    }
    return best;
}

// Min-heap on sampler_before order: the root is the worst kept candidate.
static void heap_sift_down(k25_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && sampler_before(h[m], h[l])) m = l;
        if (r < n && sampler_before(h[m], h[r])) m = r;
        if (m == i) return;
        k25_cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int cand_cmp(const void *a, const void *b) {
    k25_cand x = *(const k25_cand *)a, y = *(const k25_cand *)b;
    return sampler_before(x, y) ? -1 : sampler_before(y, x) ? 1 : 0;
}

int sampler_local_top(const float *logits, int n, int vocab_begin, float temp, int c,
                      k25_cand *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i])) continue;
        k25_cand x = {(double)logits[i] / temp, vocab_begin + i};
        if (m < c) {
            out[m++] = x;
            if (m == c)
                for (int j = m / 2 - 1; j >= 0; j--) heap_sift_down(out, m, j);
        } else if (sampler_before(x, out[0])) {
            out[0] = x;
            heap_sift_down(out, m, 0);
        }
    }
    qsort(out, (size_t)m, sizeof *out, cand_cmp);
    return m;
}

k25_softmax_stats sampler_local_stats(const float *logits, int n, float temp) {
    k25_softmax_stats s = {-INFINITY, 0};
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i]) && (double)logits[i] / temp > s.zmax) s.zmax = (double)logits[i] / temp;
    if (s.zmax == -INFINITY) return s;
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i])) s.sum += exp((double)logits[i] / temp - s.zmax);
    return s;
}

k25_softmax_stats sampler_stats_merge(k25_softmax_stats a, k25_softmax_stats b) {
    if (a.zmax == -INFINITY) return b;
    if (b.zmax == -INFINITY) return a;
    double m = a.zmax > b.zmax ? a.zmax : b.zmax;
    k25_softmax_stats r = {m, a.sum * exp(a.zmax - m) + b.sum * exp(b.zmax - m)};
    return r;
}

// ------------------------------------------------------------------------------------------
// The choice among gathered candidates
// ------------------------------------------------------------------------------------------

int32_t sampler_pick(k25_cand *cands, int n, const k25_sampling *p, k25_softmax_stats stats) {
    qsort(cands, (size_t)n, sizeof *cands, cand_cmp);
    int keep = n < sampler_cand_count(p) ? n : sampler_cand_count(p);
    if (keep == 0) return -1;
    if (p->top_p < 1) {
        // The normalizer: the top-k set itself, or the whole vocabulary.
        double zmax = cands[0].score, sum = 0;
        if (p->top_k > 0) {
            for (int i = 0; i < keep; i++) sum += exp(cands[i].score - zmax);
        } else {
            zmax = stats.zmax;
            sum = stats.sum;
        }
        double cum = 0;
        int nucleus = 0;
        while (nucleus < keep && (nucleus == 0 || cum < p->top_p)) {
            cum += exp(cands[nucleus].score - zmax) / sum;
            nucleus++;
        }
        keep = nucleus;
    }
    k25_cand best = {-INFINITY, -1};
    for (int i = 0; i < keep; i++) {
        k25_cand c = {cands[i].score + sampler_gumbel(p->seed, p->counter, (uint64_t)cands[i].id),
                      cands[i].id};
        if (best.id < 0 || sampler_before(c, best)) best = c;
    }
    return best.id;
}

// ------------------------------------------------------------------------------------------
// MPI driver
// ------------------------------------------------------------------------------------------

static int32_t sample_candidates(MPI_Comm comm, int nranks, const float *row, int V_local,
                                 int vocab_begin, const k25_sampling *p) {
    int c = sampler_cand_count(p);
    k25_cand *local = k25_malloc(sizeof *local * (size_t)c);
    int n_local = sampler_local_top(row, V_local, vocab_begin, p->temp, c, local);

    int *counts = k25_malloc(sizeof *counts * (size_t)nranks);
    int *displs = k25_malloc(sizeof *displs * (size_t)nranks);
    int bytes = n_local * (int)sizeof(k25_cand);
    MPI_CHECK(MPI_Allgather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, comm));
    int total = 0;
    for (int r = 0; r < nranks; r++) {
        displs[r] = total;
        total += counts[r];
    }
    k25_cand *all = k25_malloc((size_t)total + 1);
    MPI_CHECK(MPI_Allgatherv(local, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, comm));

    k25_softmax_stats stats = {-INFINITY, 0};
    if (p->top_p < 1 && p->top_k <= 0) {
        // Sum of exp(z - zmax) over the whole vocabulary: max first, then rescaled sums.
        k25_softmax_stats s = sampler_local_stats(row, V_local, p->temp);
        double zmax = s.zmax;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &zmax, 1, MPI_DOUBLE, MPI_MAX, comm));
        double sum = s.zmax == -INFINITY ? 0 : s.sum * exp(s.zmax - zmax);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, comm));
        stats.zmax = zmax;
        stats.sum = sum;
    }
    int32_t tok = sampler_pick(all, total / (int)sizeof(k25_cand), p, stats);
    free(all);
    free(displs);
    free(counts);
    free(local);
    return tok;
}

void sampler_sample(MPI_Comm comm, const float *logits, int n_rows, int V_local,
                    int vocab_begin, const k25_sampling *params, int32_t *out) {
    int nranks = 1;
    MPI_CHECK(MPI_Comm_size(comm, &nranks));
    // Greedy and temperature-only rows: one MAXLOC over all of them (MPI_DOUBLE_INT has the
    // layout of k25_cand; MAXLOC breaks ties by the lower id, as sampler_before does).
    k25_cand *best = k25_malloc(sizeof *best * (size_t)(n_rows + 1));
    int n_best = 0;
    for (int t = 0; t < n_rows; t++)
        if (sampler_mode_of(&params[t]) != SAMPLER_CANDIDATES)
            best[n_best++] = sampler_local_best(logits + (size_t)t * V_local, V_local,
                                                vocab_begin, &params[t]);
    if (n_best && nranks > 1)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, best, n_best, MPI_DOUBLE_INT, MPI_MAXLOC, comm));
    for (int t = 0, b = 0; t < n_rows; t++) {
        if (sampler_mode_of(&params[t]) != SAMPLER_CANDIDATES)
            out[t] = best[b++].id;
        else
            out[t] = sample_candidates(comm, nranks, logits + (size_t)t * V_local, V_local,
                                       vocab_begin, &params[t]);
        if (out[t] < 0 || out[t] == INT32_MAX)
            K25_DIE("sampling row %d: every logit is NaN (no token to choose)", t);
    }
    free(best);
}
