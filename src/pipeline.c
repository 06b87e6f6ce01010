// Pipeline stages and micro-batches (see pipeline.h).
#include "pipeline.h"

#include <string.h>

// ------------------------------------------------------------------------------------------
// Stage layout
// ------------------------------------------------------------------------------------------

int pipeline_layout(const k25_config *cfg, int pp, int *first, char *err) {
    const int L = cfg->n_layers;
    if (pp < 1) return k25_err(err, "run.pp = %d: the pipeline needs at least one stage", pp);
    if (pp > L)
        return k25_err(err, "run.pp = %d stages but the model has %d layers "
                       "(model.num_hidden_layers): every stage needs at least one layer", pp, L);
    first[0] = 0;
    if (cfg->pp_layers_n > 0) {
        if (cfg->pp_layers_n != pp)
            return k25_err(err, "run.pp_layers lists %d stage%s but run.pp is %d (give one layer "
                           "count per stage, or leave pp_layers empty for an even split)",
                           cfg->pp_layers_n, cfg->pp_layers_n == 1 ? "" : "s", pp);
        for (int s = 0; s < pp; s++) {
            if (cfg->pp_layers[s] < 1)
                return k25_err(err, "run.pp_layers: stage %d gets %d layers (every stage needs "
                               "at least one)", s, cfg->pp_layers[s]);
            // Past the model's layers here (and in the sum, without overflow) already
            if (cfg->pp_layers[s] > L - first[s])
                return k25_err(err, "run.pp_layers: stages 0..%d get more than the %d layers "
                               "of the model (model.num_hidden_layers)", s, L);
            first[s + 1] = first[s] + cfg->pp_layers[s];
        }
        if (first[pp] != L)
            return k25_err(err, "run.pp_layers adds up to %d layers, the model has %d "
                           "(model.num_hidden_layers)", first[pp], L);
        return 0;
    }
    // The first stages also embed the tokens; the last one runs the lm_head: the remainder
    // goes to the front.
    int per = L / pp, extra = L % pp;
    for (int s = 0; s < pp; s++) first[s + 1] = first[s] + per + (s < extra);
    return 0;
}

void pipeline_describe_stage(const k25_config *cfg, int pp, const int *first, int s,
                             int world_size, char *buf, size_t cap) {
    int lb = first[s], le = first[s + 1];
    size_t n = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, __VA_ARGS__);                       \
    } while (0)
    if (le - lb == 1) PUT("stage %d: layer %d", s, lb);
    else PUT("stage %d: layers %d-%d (%d)", s, lb, le - 1, le - lb);
    if (lb == 0 && le == cfg->n_layers) PUT(" + embedding, final norm, lm_head");
    else if (lb == 0) PUT(" + embedding");
    else if (le == cfg->n_layers) PUT(" + final norm, lm_head");
    if (world_size > 0 && world_size % pp == 0) {
        int tp = world_size / pp;
        if (tp == 1) PUT("; rank %d", s);
        else PUT("; ranks %d-%d", s * tp, (s + 1) * tp - 1);
    }
#undef PUT
}

void pipeline_print(FILE *f, const char *prefix, const k25_config *cfg, int pp,
                    const int *first, int world_size) {
    char line[256];
    for (int s = 0; s < pp; s++) {
        pipeline_describe_stage(cfg, pp, first, s, world_size, line, sizeof line);
        fprintf(f, "%s%s\n", prefix, line);
    }
}

// ------------------------------------------------------------------------------------------
// Micro-batches
// ------------------------------------------------------------------------------------------

// Whether every sequence's positions increase with the row index (then any cut is safe).
static int positions_increase(const k25_batch *b) {
    if (b->max_seqs <= 0) return 0;
    int32_t *last = k25_malloc(sizeof(int32_t) * (size_t)b->max_seqs);
    for (int s = 0; s < b->max_seqs; s++) last[s] = -1;
    int ok = 1;
    for (int t = 0; t < b->T && ok; t++) {
        int s = b->seq[t];
        if (s < 0 || s >= b->max_seqs || b->pos[t] <= last[s]) ok = 0;
        else last[s] = b->pos[t];
    }
    free(last);
    return ok;
}

int pipeline_micro_batches(const k25_batch *b, int n, int *cut) {
    const int T = b->T;
    if (n > T) n = T;
    cut[0] = 0;
    if (n <= 1 || !positions_increase(b)) {
        cut[1] = T;
        return 1;
    }
    int k = 0;
    const int radius = T / (4 * n);
    for (int j = 1; j < n; j++) {
        int ideal = (int)((long)j * T / n), best = ideal;
        // The nearest sequence boundary within the radius (the lower one on a tie).
        for (int dist = 0; dist <= radius; dist++) {
            int lo = ideal - dist, hi = ideal + dist;
            if (lo >= 1 && lo < T && b->seq[lo] != b->seq[lo - 1]) { best = lo; break; }
            if (hi >= 1 && hi < T && b->seq[hi] != b->seq[hi - 1]) { best = hi; break; }
        }
        if (best > cut[k] && best < T) cut[++k] = best;
    }
    cut[++k] = T;
    return k;
}

// ------------------------------------------------------------------------------------------
// Host-memory hand-off
// ------------------------------------------------------------------------------------------

#define PP_TAG 25
// MPI counts are int: large hand-offs go in pieces (received in the same order).
#define PP_CHUNK ((size_t)1 << 30)

void pipeline_send_host(const k25_dist *d, const float *x, size_t n, int stage) {
    for (size_t off = 0; off < n; off += PP_CHUNK) {
        size_t m = n - off < PP_CHUNK ? n - off : PP_CHUNK;
        MPI_CHECK(MPI_Send(x + off, (int)m, MPI_FLOAT, stage, PP_TAG, d->pp));
    }
}

void pipeline_recv_host(const k25_dist *d, float *x, size_t n, int stage) {
    for (size_t off = 0; off < n; off += PP_CHUNK) {
        size_t m = n - off < PP_CHUNK ? n - off : PP_CHUNK;
        MPI_CHECK(MPI_Recv(x + off, (int)m, MPI_FLOAT, stage, PP_TAG, d->pp, MPI_STATUS_IGNORE));
    }
}
