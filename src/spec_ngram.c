// N-gram prompt lookup draft: no model. The last n tokens of a sequence (n = max .. 1, longest
// first) are looked for earlier in its own history (prompt and generated tokens), the most
// recent occurrence wins, and the tokens that followed it are proposed. Deterministic, so its
// draft distribution is a point mass (spec.h).
#include <errno.h>
#include <stdlib.h>

#include "spec_internal.h"

#define NGRAM_DEFAULT_MAX 3
#define NGRAM_LIMIT 16

typedef struct ngram {
    int n_max, n_min;
} ngram;

static int32_t hist_at(const k25_spec_seq *s, int i) {
    return spec_hist(s->prompt, s->n_prompt, s->gen, i);
}

// Start of the most recent earlier occurrence of the last n tokens, or -1.
static int find_suffix(const k25_spec_seq *s, int L, int n) {
    for (int st = L - n - 1; st >= 0; st--) {
        int j = 0;
        while (j < n && hist_at(s, st + j) == hist_at(s, L - n + j)) j++;
        if (j == n) return st;
    }
    return -1;
}

static void ngram_propose(spec_draft *d, k25_spec_seq *seqs, int n) {
    const ngram *g = d->impl;
    for (int i = 0; i < n; i++) {
        k25_spec_seq *s = &seqs[i];
        int want = s->n_draft, got = 0, L = s->n_prompt + s->n_gen;
        s->q = NULL;
        for (int m = g->n_max; m >= g->n_min && want > 0 && !got; m--) {
            if (L < m + 1) continue;
            int st = find_suffix(s, L, m);
            if (st < 0) continue;
            // What followed the occurrence, up to the end of the known history.
            for (int p = st + m; p < L && got < want; p++) s->draft[got++] = hist_at(s, p);
        }
        s->n_draft = got;
    }
}

static void ngram_destroy(spec_draft *d) { free(d->impl); }

int spec_ngram_create(const spec_env *env, const char *arg, spec_draft *d, char *err) {
    (void)env;
    ngram g = {NGRAM_DEFAULT_MAX, 1};
    if (*arg) {
        char *end;
        errno = 0;
        long v = strtol(arg, &end, 10);
        if (errno || *end || v < 1 || v > NGRAM_LIMIT)
            return k25_err(err, "--spec-draft ngram:%s: the n-gram length must be 1..%d", arg,
                           NGRAM_LIMIT);
        g.n_max = (int)v;
    }
    d->kind = "ngram";
    d->impl = k25_malloc(sizeof g);
    *(ngram *)d->impl = g;
    d->propose = ngram_propose;
    d->destroy = ngram_destroy;
    return 0;
}
