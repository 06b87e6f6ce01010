// Pipeline parallelism (pipeline.h, model.c) against a one-rank reference, on the CPU backend
// with the tiny model (config/tiny.ini, 4 layers, synthetic weights seed 1).
//
// First the bookkeeping: stage layouts (even splits, run.pp_layers, the errors of a bad split)
// and micro-batch cuts. Then, for every tensor x pipeline split of the MPI world (this program
// runs on 1, 2 or 4 ranks; tests/t_pipeline.sh runs all three), against the same model built
// on each rank alone (tp = pp = 1 on MPI_COMM_SELF):
//   - each stage holds only its layers, the embedding only on the first stage, the final norm
//     and the lm_head only on the last;
//   - batched model_step over several sequences prefilling and decoding together (cut into
//     micro-batches that overlap across stages) gives every sampled row the reference's
//     logits within 1e-5 of the row's largest and the same greedy token, on every rank, with
//     the backend's hand-off (MPI from backend memory) and with the host-memory fallback; the
//     captured hidden states of layers held by other stages reach every rank;
//   - a model that every stage holds whole (a draft beside a pipelined target) runs unsplit
//     on each stage and matches too;
//   - the engine (continuous batching, chunked prefill, greedy and sampled requests) gives
//     every request the reference's tokens.
#include <math.h>
#include <string.h>

#include "engine.h"
#include "instance.h"
#include "pipeline.h"
#include "test_util.h"


enum { KV_BLOCK = 4, MAX_SEQS = 4, MAX_ROWS = 32, CTX = 64, MBPS = CTX / KV_BLOCK };

// ------------------------------------------------------------------------------------------
// Stage layouts and micro-batch cuts (every rank checks them alone)
// ------------------------------------------------------------------------------------------

static void check_layout(const k25_config *base, int n_layers, int pp, const char *pp_layers,
                         const int *want, const char *want_err) {
    k25_config c = *base;
    char err[K25_ERR_LEN] = "", set[128];
    c.n_layers = n_layers;
    snprintf(set, sizeof set, "run.pp_layers=%s", pp_layers);
    CHECK(config_set(&c, set, err) == 0, "%s", err);
    int first[16];
    int rc = pipeline_layout(&c, pp, first, err);
    if (want_err) {
        CHECK(rc == -1 && strstr(err, want_err), "%d layers, pp %d, pp_layers '%s': expected an "
              "error with '%s', got rc %d '%s'", n_layers, pp, pp_layers, want_err, rc, err);
        return;
    }
    CHECK(rc == 0, "%d layers, pp %d, pp_layers '%s': %s", n_layers, pp, pp_layers, err);
    for (int s = 0; rc == 0 && s <= pp; s++)
        CHECK(first[s] == want[s], "%d layers, pp %d, pp_layers '%s': stage %d starts at %d, "
              "want %d", n_layers, pp, pp_layers, s, first[s], want[s]);
}

static void check_layouts(const k25_config *c) {
    check_layout(c, 4, 1, "", (int[]){0, 4}, NULL);
    check_layout(c, 4, 2, "", (int[]){0, 2, 4}, NULL);
    check_layout(c, 4, 3, "", (int[]){0, 2, 3, 4}, NULL);
    check_layout(c, 4, 4, "", (int[]){0, 1, 2, 3, 4}, NULL);
    check_layout(c, 61, 4, "", (int[]){0, 16, 31, 46, 61}, NULL);
    check_layout(c, 61, 8, "", (int[]){0, 8, 16, 24, 32, 40, 47, 54, 61}, NULL);
    check_layout(c, 4, 2, "1,3", (int[]){0, 1, 4}, NULL);
    check_layout(c, 61, 4, "16,15,15,15", (int[]){0, 16, 31, 46, 61}, NULL);
    check_layout(c, 4, 5, "", NULL, "every stage needs at least one layer");
    check_layout(c, 4, 2, "2,1", NULL, "adds up to 3 layers");
    check_layout(c, 4, 2, "4", NULL, "lists 1 stage but run.pp is 2");
    check_layout(c, 4, 2, "0,4", NULL, "stage 0 gets 0 layers");
    check_layout(c, 4, 2, "4,1", NULL, "stages 0..1 get more than the 4 layers");
    // the sum would wrap around INT_MAX (to -2: "adds up to -2 layers")
    check_layout(c, 4, 2, "2147483647,2147483647", NULL, "stages 0..0 get more than the 4");
    check_layout(c, 4, 0, "", NULL, "at least one stage");

    char line[256];
    int first[] = {0, 1, 4};
    pipeline_describe_stage(c, 2, first, 1, 4, line, sizeof line);
    CHECK(!strcmp(line, "stage 1: layers 1-3 (3) + final norm, lm_head; ranks 2-3"), "'%s'", line);
    pipeline_describe_stage(c, 2, first, 0, 2, line, sizeof line);
    CHECK(!strcmp(line, "stage 0: layer 0 + embedding; rank 0"), "'%s'", line);
}

static void check_cuts(const char *what, int T, const int32_t *seq, const int32_t *pos, int n,
                       const int *want, int n_want) {
    int32_t tokens[64] = {0}, table[1] = {0};
    k25_batch b = {T, tokens, pos, seq, table, 8, 1};
    int cut[17];
    int k = pipeline_micro_batches(&b, n, cut);
    int ok = k == n_want;
    for (int i = 0; ok && i <= k; i++) ok = cut[i] == want[i];
    CHECK(ok, "%s: %d micro-batches (want %d), cuts %d %d %d ...", what, k, n_want, cut[0],
          cut[1], k > 1 ? cut[2] : -1);
}

static void check_micro_batches(void) {
    int32_t seq[64], pos[64];
    // Three prefilling sequences of 9, 5, 12 rows: cuts snap to the sequence boundaries 9 and
    // 14 when one is near an even split, else cut inside a sequence.
    for (int t = 0; t < 26; t++) {
        seq[t] = t < 9 ? 0 : t < 14 ? 2 : 1;
        pos[t] = t < 9 ? t : t < 14 ? t - 9 : t - 14;
    }
    check_cuts("3 prefills, 2 stages", 26, seq, pos, 2, (int[]){0, 14, 26}, 2);
    check_cuts("3 prefills, 4 stages", 26, seq, pos, 4, (int[]){0, 6, 14, 19, 26}, 4);
    check_cuts("3 prefills, 1 stage", 26, seq, pos, 1, (int[]){0, 26}, 1);
    // Decode rows: one per sequence.
    for (int t = 0; t < 8; t++) seq[t] = 7 - t, pos[t] = 30 + t;
    check_cuts("8 decode rows, 4 stages", 8, seq, pos, 4, (int[]){0, 2, 4, 6, 8}, 4);
    check_cuts("3 decode rows, 4 stages", 3, seq, pos, 4, (int[]){0, 1, 2, 3}, 3);
    // One sequence's prefill chunk is cut inside (its positions increase with the row).
    for (int t = 0; t < 10; t++) seq[t] = 5, pos[t] = 100 + t;
    check_cuts("one prefill, 4 stages", 10, seq, pos, 4, (int[]){0, 2, 5, 7, 10}, 4);
    // A sequence whose positions go back: cutting could make a row miss an earlier position.
    pos[6] = 101;
    check_cuts("positions going back", 10, seq, pos, 4, (int[]){0, 10}, 1);
    // A sequence split over two runs with increasing positions is fine.
    for (int t = 0; t < 8; t++) seq[t] = t % 2, pos[t] = t;
    check_cuts("interleaved sequences", 8, seq, pos, 2, (int[]){0, 4, 8}, 2);
}

// ------------------------------------------------------------------------------------------
// Batched steps against the reference
// ------------------------------------------------------------------------------------------

// Largest |a - b| over the largest |b|, per row of n.
static double worst_rel(const float *a, const float *b, int rows, int n) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double m = 1e-30, e = 0;
        for (int i = 0; i < n; i++) {
            m = fmax(m, fabs(b[(size_t)r * n + i]));
            e = fmax(e, fabs(a[(size_t)r * n + i] - b[(size_t)r * n + i]));
        }
        worst = fmax(worst, e / m);
    }
    return worst;
}

typedef struct step_rows {
    int T, n_sample;
    int32_t tok[MAX_ROWS], pos[MAX_ROWS], seq[MAX_ROWS], rows[MAX_ROWS];
} step_rows;

static void add_rows(step_rows *s, int seq, int pos0, int n, const int32_t *tok) {
    for (int i = 0; i < n; i++) {
        s->tok[s->T] = tok[i];
        s->pos[s->T] = pos0 + i;
        s->seq[s->T] = seq;
        s->T++;
    }
}

// One step on both models; every result compared.
static void step_both(const char *what, k25_model *ref, k25_model *m, const k25_config *c,
                      const step_rows *s, const int32_t *table, int32_t *out) {
    const int V = c->vocab, D = c->hidden;
    k25_batch b = {s->T, s->tok, s->pos, s->seq, table, MAX_SEQS, MBPS};
    k25_sampling p[MAX_ROWS];
    for (int i = 0; i < s->n_sample; i++) p[i] = (k25_sampling){0, 0, 1, 0, 0};
    float *lr = k25_malloc(sizeof(float) * MAX_ROWS * V);
    float *lm = k25_malloc(sizeof(float) * MAX_ROWS * V);
    int32_t out_ref[MAX_ROWS];
    for (int i = 0; i < s->n_sample; i++) out[i] = -1;
    model_step(ref, &b, s->rows, s->n_sample, p, out_ref, lr);
    model_step(m, &b, s->rows, s->n_sample, p, out, lm);
    for (int i = 0; i < s->n_sample; i++)
        CHECK(out[i] == out_ref[i], "%s: sampled row %d (row %d): token %d, reference %d", what,
              i, s->rows[i], out[i], out_ref[i]);
    double wl = worst_rel(lm, lr, s->n_sample, V);
    CHECK(wl <= 1e-5, "%s: logits differ by %.3g of the row maximum", what, wl);
    for (int i = 0; i < 3; i++) {
        double wc = worst_rel(model_captured(m, i), model_captured(ref, i), s->T, D);
        CHECK(wc <= 1e-5, "%s: captured hidden state %d differs by %.3g", what, i, wc);
    }
    free(lr);
    free(lm);
}

// Three steps over four sequences: prefills of 9, 5 and 12 rows; then their decode rows next
// to a fourth sequence's prefill; then four decode rows sampled in a shuffled subset.
static void run_steps(const char *what, k25_model *ref, k25_model *m, const k25_config *c) {
    int32_t table[MAX_SEQS * MBPS];
    for (int i = 0; i < MAX_SEQS * MBPS; i++) table[i] = i;
    int32_t prompt[4][12];
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 12; i++) prompt[q][i] = (int32_t)((q * 97 + i * 31 + 7) % 256);
    const int len[4] = {9, 12, 5, 6};
    const int layers[3] = {1, 3, c->n_layers};
    model_capture_layers(ref, layers, 3);
    model_capture_layers(m, layers, 3);
    char name[160];

    step_rows s1 = {0};
    add_rows(&s1, 0, 0, len[0], prompt[0]);
    add_rows(&s1, 2, 0, len[2], prompt[2]);
    add_rows(&s1, 1, 0, len[1], prompt[1]);
    for (int i = 0; i < s1.T; i++) s1.rows[s1.n_sample++] = i;
    int32_t out1[MAX_ROWS], out2[MAX_ROWS], out3[MAX_ROWS];
    snprintf(name, sizeof name, "%s, step 1 (3 prefills)", what);
    step_both(name, ref, m, c, &s1, table, out1);

    step_rows s2 = {0};
    int32_t next[4] = {out1[len[0] - 1], out1[len[0] + len[2] + len[1] - 1],
                       out1[len[0] + len[2] - 1], 0};
    for (int q = 0; q < 3; q++) add_rows(&s2, q, len[q], 1, &next[q]);
    add_rows(&s2, 3, 0, len[3], prompt[3]);
    for (int i = 0; i < s2.T; i++) s2.rows[s2.n_sample++] = i;
    snprintf(name, sizeof name, "%s, step 2 (3 decodes + 1 prefill)", what);
    step_both(name, ref, m, c, &s2, table, out2);

    step_rows s3 = {0};
    int32_t fed[4] = {out2[0], out2[1], out2[2], out2[s2.T - 1]};
    for (int q = 0; q < 4; q++) add_rows(&s3, q, len[q] + (q < 3), 1, &fed[q]);
    const int pick[3] = {3, 0, 2};
    for (int i = 0; i < 3; i++) s3.rows[s3.n_sample++] = pick[i];
    snprintf(name, sizeof name, "%s, step 3 (4 decodes, rows 3, 0, 2 sampled)", what);
    step_both(name, ref, m, c, &s3, table, out3);

    model_capture_layers(ref, NULL, 0);
    model_capture_layers(m, NULL, 0);
}

// ------------------------------------------------------------------------------------------
// The engine against the reference
// ------------------------------------------------------------------------------------------

enum { N_REQ = 7 };

// pp_async: with pipeline stages, one sequence group per stage in flight at once.
static void run_engine(k25_model *m, const k25_config *c, int pp_async, int32_t out[N_REQ][16],
                       int *n_out) {
    char err[K25_ERR_LEN] = "";
    k25_engine_opts o = {.max_batch = MAX_SEQS, .prefill_chunk = 7, .max_rows = 11,
                         .kv_block = KV_BLOCK, .ctx_size = CTX, .pp_async = pp_async};
    k25_engine *e = engine_create(m, c, &o, err);
    CHECK(e != NULL, "engine_create: %s", err);
    if (!e) return;
    for (int i = 0; i < N_REQ; i++) {
        int32_t prompt[24];
        int n_prompt = 1 + (i * 7) % 20;
        for (int j = 0; j < n_prompt; j++) prompt[j] = (int32_t)((i * 53 + j * 11 + 3) % 256);
        k25_request r = {.prompt = prompt, .n_prompt = n_prompt, .max_new = 3 + (i * 5) % 12,
                         .sampling = {.temp = i % 3 == 2 ? 0.9f : 0, .top_k = 0, .top_p = 1,
                                      .seed = 100 + (uint64_t)i},
                         .ignore_eos = 1};
        CHECK(engine_submit(e, &r, err) == i, "submit %d: %s", i, err);
    }
    int stages = model_n_stages(m);
    CHECK(engine_groups(e) == (pp_async && stages > 1 ? stages : 1),
          "engine: %d sequence groups with pp_async %d and %d stages", engine_groups(e), pp_async,
          stages);
    // engine_step's contract, which a driver feeding arrivals between steps relies on: 0 means
    // nothing was done, so no token was handed out (the last tokens of a pipelined group once
    // came out of a call that returned 0).
    for (;;) {
        long before = 0, after = 0;
        for (int i = 0; i < N_REQ; i++) before += engine_record(e, i)->n_tokens;
        int stepped = engine_step(e);
        for (int i = 0; i < N_REQ; i++) after += engine_record(e, i)->n_tokens;
        CHECK(stepped || after == before, "engine_step returned 0 but handed out %ld tokens",
              after - before);
        if (!stepped) break;
    }
    CHECK(!engine_busy(e), "engine_step returned 0 with requests left");
    for (int i = 0; i < N_REQ; i++) {
        const k25_seq_record *rec = engine_record(e, i);
        n_out[i] = rec->n_tokens;
        memcpy(out[i], rec->tokens, sizeof(int32_t) * (size_t)rec->n_tokens);
    }
    engine_free(e);
}

// ------------------------------------------------------------------------------------------
// One split of the world
// ------------------------------------------------------------------------------------------

static void check_split(k25_dist *d, const k25_config *base, k25_instance *ref, int tp, int pp,
                        const char *pp_layers) {
    char err[K25_ERR_LEN] = "", what[96], set[64];
    snprintf(what, sizeof what, "tp %d x pp %d%s%s", tp, pp, *pp_layers ? ", layers " : "",
             pp_layers);
    static k25_config c; // kept by pointer by the instance
    c = *base;
    c.tp = tp;
    c.pp = pp;
    snprintf(set, sizeof set, "run.pp_layers=%s", pp_layers);
    if (config_set(&c, set, err) != 0) K25_DIE("%s", err);
    if (instance_setup_dist(d, &c, err) != 0) K25_DIE("%s: %s", what, err);
    k25_instance in;
    k25_instance_opts io = {.synth_seed = 1, .backend = "cpu",
                            .model = {.max_seqs = MAX_SEQS, .max_rows = MAX_ROWS,
                                      .kv_block = KV_BLOCK}};
    if (instance_open(&in, &c, d, &io, err) != 0) K25_DIE("%s: %s", what, err);

    // ---- this rank's share of the weights ----
    int first[8];
    CHECK(pipeline_layout(&c, pp, first, err) == 0, "%s", err);
    const k25_weights *w = &in.w;
    CHECK(w->layer_begin == first[d->pp_rank] && w->layer_end == first[d->pp_rank + 1],
          "%s: stage %d holds layers [%d, %d)", what, d->pp_rank, w->layer_begin, w->layer_end);
    CHECK((w->embed.kind != K25_SRC_NONE) == (d->pp_rank == 0), "%s: stage %d embedding %d",
          what, d->pp_rank, w->embed.kind);
    int last = d->pp_rank == pp - 1;
    CHECK((w->lm_head.kind != K25_SRC_NONE) == last && (w->final_norm.kind != K25_SRC_NONE) == last,
          "%s: stage %d lm_head %d final norm %d", what, d->pp_rank, w->lm_head.kind,
          w->final_norm.kind);
    for (int l = 0; l < c.n_layers; l++) {
        int mine = l >= w->layer_begin && l < w->layer_end;
        CHECK((w->layers[l].q_a.kind != K25_SRC_NONE) == mine, "%s: layer %d planned: %d", what,
              l, !mine);
    }

    // ---- steps: the backend's hand-off, then the host-memory fallback ----
    run_steps(what, ref->m, in.m, &c);
    if (pp > 1) {
        CHECK(in.be->pp_send && in.be->pp_recv, "%s: the CPU backend has no hand-off", what);
        in.be->pp_send = NULL;
        in.be->pp_recv = NULL;
        char what2[128];
        snprintf(what2, sizeof what2, "%s, host fallback", what);
        run_steps(what2, ref->m, in.m, &c);
    }

    // ---- a model configured unsplit (run.pp = 1) on a pipelined world: whole on every stage
    // (a draft beside the target) ----
    if (pp > 1) {
        static k25_config c1;
        c1 = c;
        c1.pp = 1;
        c1.pp_layers_n = 0;
        k25_instance whole;
        if (instance_open(&whole, &c1, d, &io, err) != 0) K25_DIE("%s: %s", what, err);
        CHECK(whole.w.layer_begin == 0 && whole.w.layer_end == c1.n_layers &&
                  whole.w.embed.kind != K25_SRC_NONE && whole.w.lm_head.kind != K25_SRC_NONE,
              "%s: an unsplit model holds layers [%d, %d)", what, whole.w.layer_begin,
              whole.w.layer_end);
        char what3[128];
        snprintf(what3, sizeof what3, "%s, unsplit model on every stage", what);
        run_steps(what3, ref->m, whole.m, &c1);
        instance_close(&whole);
    }

    // ---- the engine, with the stages running one step at a time and pipelined ----
    static int32_t want[N_REQ][16], got[N_REQ][16];
    int n_want[N_REQ], n_got[N_REQ];
    run_engine(ref->m, &c, 0, want, n_want);
    for (int pp_async = 0; pp_async <= (pp > 1); pp_async++) {
        const char *mode = pp_async ? " (pipelined steps)" : "";
        run_engine(in.m, &c, pp_async, got, n_got);
        for (int i = 0; i < N_REQ; i++) {
            int k = 0;
            while (k < n_got[i] && k < n_want[i] && got[i][k] == want[i][k]) k++;
            CHECK(k == n_want[i] && k == n_got[i], "%s%s: engine request %d: %d tokens, "
                  "reference %d, first difference at %d", what, mode, i, n_got[i], n_want[i], k);
        }
        // Every rank holds the same tokens.
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < N_REQ; i++)
            for (int j = 0; j < n_got[i]; j++) h = (h ^ (uint64_t)got[i][j]) * 1099511628211ull;
        uint64_t h0 = h;
        MPI_CHECK(MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, d->world));
        CHECK(h0 == h, "%s%s: rank %d's engine tokens differ from rank 0's", what, mode,
              d->world_rank);
    }

    instance_close(&in);
    if (d->world_rank == 0) printf("  %s: ok so far (%d failures)\n", what, test_failures);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN] = "";
    k25_config cfg;
    test_tiny_config(&cfg);
    cfg.ctx_size = CTX;
    cfg.kv_block = KV_BLOCK;

    check_layouts(&cfg);
    check_micro_batches();

    // The reference: the whole model on this rank alone.
    k25_dist self = d;
    self.world = self.tp = self.pp = MPI_COMM_SELF;
    self.world_rank = self.tp_rank = self.pp_rank = 0;
    self.world_size = self.tp_size = self.pp_size = 1;
    k25_instance ref;
    k25_instance_opts io = {.synth_seed = 1, .backend = "cpu",
                            .model = {.max_seqs = MAX_SEQS, .max_rows = MAX_ROWS,
                                      .kv_block = KV_BLOCK}};
    if (instance_open(&ref, &cfg, &self, &io, err) != 0) K25_DIE("%s", err);

    // Every split of the world into tp x pp that tiny.ini allows, plus uneven layer counts.
    struct { int tp, pp; const char *layers; } splits[] = {
        {1, 1, ""}, {2, 1, ""}, {1, 2, ""}, {1, 2, "1,3"}, {4, 1, ""}, {2, 2, ""}, {2, 2, "3,1"},
        {1, 4, ""},
    };
    int n_run = 0;
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        if (splits[i].tp * splits[i].pp != d.world_size) continue;
        check_split(&d, &cfg, &ref, splits[i].tp, splits[i].pp, splits[i].layers);
        n_run++;
    }
    CHECK(n_run > 0, "no split for %d ranks", d.world_size);

    int ok = dist_all_ok(&d, test_failures == 0);
    instance_close(&ref);
    if (d.world_rank == 0)
        printf("test_pipeline on %d rank%s: %s\n", d.world_size, d.world_size > 1 ? "s" : "",
               ok ? "ok" : "FAILED");
    dist_finalize(&d);
    return ok ? 0 : 1;
}
