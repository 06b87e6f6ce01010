// The sampling rules of speculative decoding (see spec.h): the distribution a row is sampled
// from under the sampler's settings, inversion sampling, and the accept-or-resample step of
// speculative sampling (Leviathan, Kalman & Matias 2023; Chen et al. 2023).
#include <math.h>
#include <string.h>

#include "sampler.h"
#include "spec.h"

// ------------------------------------------------------------------------------------------
// The sampler's distribution
// ------------------------------------------------------------------------------------------

// The kept candidates and their probabilities follow sampler.h exactly: temperature first,
// then the top-k set (or the K25_SAMPLE_CAND_MAX best when only top-p is on), then the
// shortest prefix reaching top_p, whose tokens are drawn with probability proportional to
// exp(z) (the Gumbel-max among them).
void spec_probs(const float *logits, int V, const k25_sampling *p, float *probs) {
    memset(probs, 0, sizeof(float) * (size_t)V);
    sampler_mode mode = sampler_mode_of(p);
    if (mode == SAMPLER_GREEDY) {
        k25_cand best = sampler_local_best(logits, V, 0, p);
        K25_CHECK(best.id >= 0 && best.id < V, "spec: every logit is NaN");
        probs[best.id] = 1;
        return;
    }
    if (mode == SAMPLER_GUMBEL) {
        k25_softmax_stats s = sampler_local_stats(logits, V, p->temp);
        K25_CHECK(s.sum > 0, "spec: every logit is NaN");
        for (int i = 0; i < V; i++)
            if (!isnan(logits[i]))
                probs[i] = (float)(exp((double)logits[i] / p->temp - s.zmax) / s.sum);
        return;
    }
    int c = sampler_cand_count(p);
    k25_cand *cands = k25_malloc(sizeof *cands * (size_t)c);
    int keep = sampler_local_top(logits, V, 0, p->temp, c, cands); // sorted, best first
    K25_CHECK(keep > 0, "spec: every logit is NaN");
    double zmax = cands[0].score;
    if (p->top_p < 1) {
        double nz = zmax, sum = 0;
        if (p->top_k > 0) {
            for (int i = 0; i < keep; i++) sum += exp(cands[i].score - nz);
        } else {
            k25_softmax_stats s = sampler_local_stats(logits, V, p->temp);
            nz = s.zmax;
            sum = s.sum;
        }
        double cum = 0;
        int nucleus = 0;
        while (nucleus < keep && (nucleus == 0 || cum < p->top_p)) {
            cum += exp(cands[nucleus].score - nz) / sum;
            nucleus++;
        }
        keep = nucleus;
    }
    double sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(cands[i].score - zmax);
    for (int i = 0; i < keep; i++) probs[cands[i].id] = (float)(exp(cands[i].score - zmax) / sum);
    free(cands);
}

// ------------------------------------------------------------------------------------------
// Draws
// ------------------------------------------------------------------------------------------

int32_t spec_draw(const float *probs, int V, double u) {
    double total = 0;
    for (int i = 0; i < V; i++) total += probs[i];
    K25_CHECK(total > 0, "spec: drawing from an empty distribution");
    double target = u * total, cum = 0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        cum += probs[i];
        last = i;
        if (cum > target) return i;
    }
    return last; // rounding at the very end
}

int32_t spec_accept_or_resample(const float *p, const float *q, int V, int32_t x, double u_acc,
                                double u_res, int *accepted) {
    K25_CHECK(x >= 0 && x < V, "spec: draft token %d outside the vocabulary", x);
    double px = p[x], qx = q ? q[x] : 1.0;
    // u < p/q without the division (q[x] = 0 cannot come from a draw; it accepts when p > 0).
    if (u_acc * qx < px) {
        *accepted = 1;
        return x;
    }
    *accepted = 0;
    // The residual max(0, p - q): what p has that the accepted draws did not supply.
    double total = 0;
    for (int i = 0; i < V; i++) {
        double r = (double)p[i] - (q ? (double)q[i] : (i == x ? 1.0 : 0.0));
        if (r > 0) total += r;
    }
    if (!(total > 0)) return spec_draw(p, V, u_res); // p == q up to rounding
    double target = u_res * total, cum = 0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        double r = (double)p[i] - (q ? (double)q[i] : (i == x ? 1.0 : 0.0));
        if (r <= 0) continue;
        cum += r;
        last = i;
        if (cum > target) return i;
    }
    return last;
}
