// Greedy speculative decoding inside continuous batching: requests with different prompts
// (some repetitive, so the n-gram draft finds matches), lengths and EOS handling go through the
// engine with every draft source and several batch sizes, draft lengths, prefill chunks and row
// limits, and every request's tokens and finish reason must equal what a plain loop over
// model_step produces for it alone (one token per step, no engine, no draft). Also: 256
// sequences at once against the plain engine, the cache accounting after every step (the
// draft's too, and with the draft's cache as small as the target's), and the acceptance
// counters (a draft equal to the target accepts everything).
//
// Draft sources: ngram, ngram:1, model:config/tiny_draft.ini@7 (a smaller model), the target
// itself as its draft (model:config/tiny.ini@1), and two synthetic EAGLE-3 heads (full and
// reduced draft vocabulary, norm-before-residual variant) written by
// spec_eagle3_write_synthetic. Model: config/tiny.ini, synthetic seed 1, CPU backend. Runs on 1
// rank (tests/run.sh) and 2 ranks (tests/t_spec_greedy.sh); the ranks must agree on every token.
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "instance.h"
#include "spec.h"
#include "test_util.h"


#define N_REQ 10
#define KV_BLOCK 4
#define CTX 512
#define MAX_SEQS 8
#define K_MAX 4
#define MAX_ROWS (MAX_SEQS * (K_MAX + 1) + 16)
#define BIG 256

typedef struct test_req {
    int32_t prompt[48];
    int n_prompt, max_new, ignore_eos;
    int32_t ref[40];      // tokens of the request run alone
    int n_ref;
} test_req;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int rnd(int n) { return test_rnd(&rng_state, n); }

// ------------------------------------------------------------------------------------------
// Reference: one request alone, greedy, straight on model_step
// ------------------------------------------------------------------------------------------

static void run_alone(k25_model *m, const k25_config *eos_cfg, test_req *r) {
    r->n_ref = test_decode_alone(m, eos_cfg, r->prompt, r->n_prompt, r->max_new, r->ignore_eos,
                                 (k25_sampling){.temp = 0, .top_p = 1}, 5, MAX_SEQS, CTX,
                                 KV_BLOCK, r->ref);
}

// ------------------------------------------------------------------------------------------
// Engine runs
// ------------------------------------------------------------------------------------------

typedef struct run_opts {
    int max_batch, prefill_chunk, max_rows;
    int n_blocks; // the engine's cache blocks (0: the model's)
} run_opts;

static k25_engine *new_engine(k25_model *m, const k25_config *cfg, const run_opts *ro) {
    char err[K25_ERR_LEN] = "";
    k25_engine_opts o = {.max_batch = ro->max_batch, .prefill_chunk = ro->prefill_chunk,
                         .max_rows = ro->max_rows, .kv_block = KV_BLOCK, .ctx_size = CTX,
                         .n_blocks = ro->n_blocks};
    k25_engine *e = engine_create(m, cfg, &o, err);
    if (!e) K25_DIE("engine_create: %s", err);
    return e;
}

// Runs every request through an engine (spec or NULL), checking the limits and the caches (the
// target's and the draft's) after every step; tokens and finish reasons must match the
// references. Returns the most requests left waiting after a step's admission.
static int run_engine(k25_model *m, const k25_config *eos_cfg, test_req *reqs, int n,
                      const run_opts *ro, k25_spec *sp, const char *name) {
    char err[K25_ERR_LEN] = "";
    k25_engine *e = new_engine(m, eos_cfg, ro);
    engine_set_spec(e, sp);
    const k25_kvcache *dkv = sp ? spec_draft_cache(sp) : NULL;
    int most_waiting = 0;
    for (int i = 0; i < n; i++) {
        k25_request q = {.prompt = reqs[i].prompt, .n_prompt = reqs[i].n_prompt,
                         .max_new = reqs[i].max_new, .sampling = {.temp = 0, .top_p = 1},
                         .ignore_eos = reqs[i].ignore_eos};
        CHECK(engine_submit(e, &q, err) == i, "%s: submit %d: %s", name, i, err);
    }
    while (engine_step(e)) {
        const k25_step_info *si = engine_last_step(e);
        CHECK(si->n_decode + si->n_prefill <= ro->max_rows, "%s: %d rows", name,
              si->n_decode + si->n_prefill);
        CHECK(si->n_prefill <= ro->prefill_chunk, "%s: %d prefill rows", name, si->n_prefill);
        if (kvcache_check(engine_cache(e), err) != 0) CHECK(0, "%s: %s", name, err);
        if (dkv && kvcache_check(dkv, err) != 0) CHECK(0, "%s: the draft's cache: %s", name, err);
        if (si->n_waiting > most_waiting) most_waiting = si->n_waiting;
    }
    const k25_kvcache *kv = engine_cache(e);
    CHECK(kv->n_free == kv->n_blocks && kv->owed == 0, "%s: %d of %d blocks free at the end",
          name, kv->n_free, kv->n_blocks);
    CHECK(!dkv || (dkv->n_free == dkv->n_blocks && dkv->owed == 0),
          "%s: %d of the draft's %d blocks free at the end", name, dkv->n_free, dkv->n_blocks);
    for (int i = 0; i < n; i++) {
        const k25_seq_record *rec = engine_record(e, i);
        test_req *r = &reqs[i];
        int k = 0;
        while (k < rec->n_tokens && k < r->n_ref && rec->tokens[k] == r->ref[k]) k++;
        CHECK(k == r->n_ref && k == rec->n_tokens,
              "%s: request %d (prompt %d, max_new %d): %d tokens, reference %d; first "
              "difference at %d", name, i, r->n_prompt, r->max_new, rec->n_tokens, r->n_ref, k);
        k25_finish want = r->n_ref < r->max_new || (!r->ignore_eos &&
                                                    config_is_eos(eos_cfg, r->ref[r->n_ref - 1]))
                              ? K25_FINISH_EOS : K25_FINISH_LENGTH;
        CHECK(rec->finish == want, "%s: request %d finished %d, expected %d", name, i,
              rec->finish, want);
    }
    engine_free(e);
    return most_waiting;
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

static int32_t oracle_ref(void *ctx, int id, int index) {
    const test_req *r = (const test_req *)ctx + id;
    return index < r->n_ref ? r->ref[index] : -1;
}

// The n-gram draft on hand-made histories: the longest suffix (3, 2, then 1 tokens) found
// earlier, its most recent occurrence, what followed it up to the end of the history.
static k25_spec *make_spec(const char *src, int k, int max_seqs, int max_rows, int n_blocks,
                           k25_instance *in, const k25_config *cfg, const k25_dist *d);

static void check_ngram(k25_instance *in, const k25_config *cfg, const k25_dist *d) {
    struct {
        const char *src;
        int32_t prompt[12];
        int n_prompt;
        int32_t gen[4];
        int n_gen, max_draft;
        int32_t want[4];
        int n_want;
    } cases[] = {
        // suffix 1 2 3 occurs at 0 (and 1 2 / 2 3 elsewhere): 4 9 1 follow it
        {"ngram", {1, 2, 3, 4, 9, 2, 3, 7, 1, 2}, 10, {3}, 1, 3, {4, 9, 2}, 3},
        // the most recent occurrence of 5 6 wins; the continuation stops at the history's end
        {"ngram", {5, 6, 1, 8, 5, 6, 2}, 7, {5, 6}, 2, 4, {2, 5, 6}, 3},
        // only a 1-gram matches
        {"ngram", {7, 30, 8, 9}, 4, {7}, 1, 2, {30, 8}, 2},
        // ngram:1 ignores longer matches: the most recent 3 is followed by 5
        {"ngram:1", {3, 4, 4, 1, 2, 3, 5, 0, 1, 2}, 10, {3}, 1, 2, {5, 0}, 2},
        // nothing repeats: no draft; max_draft 0: no draft
        {"ngram", {1, 2, 3}, 3, {4}, 1, 3, {0}, 0},
        {"ngram", {1, 2, 1}, 3, {2}, 1, 0, {0}, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        k25_spec *sp = make_spec(cases[c].src, 4, MAX_SEQS, MAX_ROWS, 0, in, cfg, d);
        k25_spec_seq s = {.slot = 0, .prompt = cases[c].prompt, .n_prompt = cases[c].n_prompt,
                          .gen = cases[c].gen, .n_gen = cases[c].n_gen,
                          .max_draft = cases[c].max_draft, .sampling = {.temp = 0, .top_p = 1}};
        spec_propose(sp, &s, 1);
        int same = s.n_draft == cases[c].n_want;
        for (int j = 0; same && j < s.n_draft; j++) same = s.draft[j] == cases[c].want[j];
        CHECK(same && s.q == NULL, "n-gram case %zu: %d tokens drafted (%d %d %d %d), wanted %d",
              c, s.n_draft, s.n_draft > 0 ? s.draft[0] : -1, s.n_draft > 1 ? s.draft[1] : -1,
              s.n_draft > 2 ? s.draft[2] : -1, s.n_draft > 3 ? s.draft[3] : -1, cases[c].n_want);
        spec_free(sp);
    }
}

static k25_spec *make_spec(const char *src, int k, int max_seqs, int max_rows, int n_blocks,
                           k25_instance *in, const k25_config *cfg, const k25_dist *d) {
    char err[K25_ERR_LEN] = "";
    k25_spec_opts so = {.k = k, .max_seqs = max_seqs, .max_rows = max_rows, .ctx_size = CTX,
                        .kv_block = KV_BLOCK, .n_blocks = n_blocks, .backend = "cpu",
                        .threads = 1};
    k25_spec *sp = spec_create(src, in->m, &in->w, cfg, d, &so, err);
    if (!sp) K25_DIE("spec_create %s: %s", src, err);
    return sp;
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN] = "";
    k25_config cfg;
    test_tiny_config(&cfg);
    k25_instance in;
    int big_rows = BIG * 3 + 16;
    test_open_instance(&in, &cfg, &d, "cpu",
                       (k25_model_opts){.max_seqs = BIG, .max_rows = big_rows,
                                        .kv_block = KV_BLOCK,
                                        .n_blocks = BIG * 16 > MAX_SEQS * CTX / KV_BLOCK
                                                        ? BIG * 16 : MAX_SEQS * CTX / KV_BLOCK});

    // Synthetic EAGLE-3 heads, written once by rank 0 into a directory every rank reads.
    char dir[256] = "/tmp/k25-spec-test-XXXXXX", eg1[300], eg2[300];
    test_shared_tmpdir(&d, dir);
    snprintf(eg1, sizeof eg1, "%s/eagle_full", dir);
    snprintf(eg2, sizeof eg2, "%s/eagle_d2t", dir);
    if (d.world_rank == 0) {
        k25_eagle3_synth o1 = {.seed = 11, .n_aux = 3, .aux_ids = {0, 1, 2}};
        k25_eagle3_synth o2 = {.seed = 12, .draft_vocab = 128, .own_embed = 1,
                               .intermediate = 192, .norm_before_residual = 1};
        if (spec_eagle3_write_synthetic(eg1, &cfg, &o1, err) ||
            spec_eagle3_write_synthetic(eg2, &cfg, &o2, err))
            K25_DIE("%s", err);
    }
    MPI_CHECK(MPI_Barrier(d.world));

    // Requests: prompts of 1..32 tokens (every other one a short pattern repeated), 1..24 new.
    static test_req reqs[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        test_req *r = &reqs[i];
        r->n_prompt = i == 0 ? 1 : 2 + rnd(31);
        r->max_new = i == 1 ? 1 : 2 + rnd(23);
        int period = 2 + rnd(4);
        for (int j = 0; j < r->n_prompt; j++)
            r->prompt[j] = i % 2 && j >= period ? r->prompt[j - period] : rnd(256);
        r->ignore_eos = 1;
    }
    // EOS: a middle token of a long greedy run becomes an end-of-sequence id for the requests
    // that honour EOS, so verification meets EOS inside a run of accepted tokens.
    k25_config eos_cfg = cfg;
    reqs[4].max_new = 24;
    run_alone(in.m, &eos_cfg, &reqs[4]);
    eos_cfg.eos_ids[eos_cfg.eos_ids_n++] = reqs[4].ref[9];
    for (int i = 4; i < N_REQ; i += 3) reqs[i].ignore_eos = 0;
    int n_eos = 0;
    for (int i = 0; i < N_REQ; i++) {
        run_alone(in.m, &eos_cfg, &reqs[i]);
        n_eos += reqs[i].n_ref < reqs[i].max_new;
    }
    CHECK(n_eos >= 1, "no request stops at EOS: the EOS path is not exercised");

    char src_eg1[320], src_eg2[320];
    snprintf(src_eg1, sizeof src_eg1, "eagle3:%s", eg1);
    snprintf(src_eg2, sizeof src_eg2, "eagle3:%s", eg2);
    struct { const char *src; int full_accept; } sources[] = {
        {"ngram", 0}, {"ngram:1", 0}, {"model:config/tiny_draft.ini@7", 0},
        {"model:config/tiny.ini@1", 1}, {src_eg1, 0}, {src_eg2, 0},
    };
    // (batch, prefill chunk, row limit, k): one at a time; small chunks; a row limit that
    // leaves little room for drafts; a full batch with every draft.
    struct { run_opts ro; int k; } runs[] = {
        {{1, 7, 8, 0}, 1},
        {{3, 5, 3 * 4 + 5, 0}, 3},
        {{8, 16, 11, 0}, 4},
        {{8, 16, MAX_ROWS, 0}, 4},
    };
    // "quick" (the 2-rank run of t_spec_greedy.sh): the full batch only, no 256-sequence run.
    int quick = argc > 1 && !strcmp(argv[1], "quick");
    for (size_t s = 0; s < sizeof sources / sizeof sources[0]; s++) {
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            if (quick && r != 3) continue;
            k25_spec *sp = make_spec(sources[s].src, runs[r].k, MAX_SEQS, MAX_ROWS, 0, &in,
                                     &cfg, &d);
            char name[400];
            snprintf(name, sizeof name, "%s, batch %d, chunk %d, rows %d, k %d", sources[s].src,
                     runs[r].ro.max_batch, runs[r].ro.prefill_chunk, runs[r].ro.max_rows,
                     runs[r].k);
            run_engine(in.m, &eos_cfg, reqs, N_REQ, &runs[r].ro, sp, name);
            const k25_spec_stats *st = spec_stats(sp);
            CHECK(st->emitted == st->rounds + st->accepted && st->accepted <= st->drafted,
                  "%s: counters: %ld rounds, %ld drafted, %ld accepted, %ld emitted", name,
                  st->rounds, st->drafted, st->accepted, st->emitted);
            if (sources[s].full_accept)
                CHECK(st->drafted > 0 && st->accepted == st->drafted,
                      "%s: the target as its own draft: %ld of %ld drafts accepted", name,
                      st->accepted, st->drafted);
            if (strncmp(sources[s].src, "ngram", 5))
                CHECK(st->drafted > 0, "%s: nothing drafted", name);
            if (d.world_rank == 0)
                printf("%-70s %4ld rounds %4ld drafted %4ld accepted\n", name, st->rounds,
                       st->drafted, st->accepted);
            fflush(stdout);
            spec_free(sp);
        }
    }
    // Controlled acceptance: the n-gram draft's tokens replaced by the reference's with
    // probability 0.6 (and by a wrong token otherwise): some accepted, some not, same output.
    {
        k25_spec *sp = make_spec("ngram", 3, MAX_SEQS, MAX_ROWS, 0, &in, &cfg, &d);
        spec_set_oracle(sp, 0.6, oracle_ref, reqs);
        run_opts ro = {5, 16, 5 * 4 + 16, 0};
        run_engine(in.m, &eos_cfg, reqs, N_REQ, &ro, sp, "ngram + oracle 0.6, batch 5");
        const k25_spec_stats *st = spec_stats(sp);
        CHECK(st->accepted > 0 && st->accepted < st->drafted,
              "oracle 0.6: %ld of %ld drafts accepted", st->accepted, st->drafted);
        if (d.world_rank == 0)
            printf("%-70s %4ld rounds %4ld drafted %4ld accepted\n", "ngram + oracle 0.6, batch 5",
                   st->rounds, st->drafted, st->accepted);
        spec_free(sp);
    }
    // A cache budget shared with the draft (run.kv_cache_mb): the engine's cache and the
    // draft's hold the same few blocks, so requests wait for them, and a draft promised what the
    // target promised each sequence never runs short (a draft promising the whole context could
    // not open a slot in 40 blocks).
    for (size_t s = 2; s < sizeof sources / sizeof sources[0]; s++) {
        const int few = 40; // 2-5 of the requests (up to 55 positions) at once
        k25_spec *sp = make_spec(sources[s].src, 3, MAX_SEQS, MAX_ROWS, few, &in, &cfg, &d);
        const k25_kvcache *dkv = spec_draft_cache(sp);
        CHECK(dkv && dkv->n_blocks == few, "%s: the draft's cache has %d blocks, asked %d",
              sources[s].src, dkv ? dkv->n_blocks : -1, few);
        char name[400];
        snprintf(name, sizeof name, "%s, %d cache blocks", sources[s].src, few);
        run_opts ro = {MAX_SEQS, 16, MAX_ROWS, few};
        int waited = run_engine(in.m, &eos_cfg, reqs, N_REQ, &ro, sp, name);
        CHECK(waited > 0, "%s: no request waited for cache blocks", name);
        CHECK(spec_stats(sp)->drafted > 0, "%s: nothing drafted", name);
        if (d.world_rank == 0) printf("%-70s %4ld drafted, up to %d waiting\n", name,
                                      spec_stats(sp)->drafted, waited);
        spec_free(sp);
    }
    // Before the load: a draft's cache values a position (what run.kv_cache_mb counts with the
    // target's; tiny_draft: 2 layers x (16 + 8)), and a row count past a setting's bound, which
    // the run derives (k25bench: concurrency x (k + 1) + run.prefill_chunk), is no setting of the
    // draft's to refuse.
    {
        k25_spec_opts so = {.k = 3, .max_seqs = MAX_SEQS, .max_rows = (1 << 24) + 32,
                            .ctx_size = CTX, .kv_block = KV_BLOCK, .backend = "cpu"};
        const struct { const char *src; int64_t values; } want[] = {
            {"ngram", 0}, {"model:config/tiny_draft.ini@7", 48}, {src_eg1, 40}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            int64_t values = -1;
            CHECK(spec_check(want[i].src, &cfg, &d, &so, &values, err) == 0, "spec_check %s: %s",
                  want[i].src, err);
            CHECK(values == want[i].values, "%s: %lld cache values a position, expected %lld",
                  want[i].src, (long long)values, (long long)want[i].values);
        }
    }
    check_ngram(&in, &cfg, &d);

    // 256 sequences at once: speculative against the plain engine.
    if (!quick) {
        static test_req big[BIG];
        for (int i = 0; i < BIG; i++) {
            big[i].n_prompt = 2 + rnd(4);
            big[i].max_new = 2 + rnd(5);
            big[i].ignore_eos = 1;
            for (int j = 0; j < big[i].n_prompt; j++) big[i].prompt[j] = rnd(256);
        }
        run_opts ro = {BIG, 64, big_rows, 0};
        k25_engine *e = new_engine(in.m, &cfg, &ro);
        for (int i = 0; i < BIG; i++) {
            k25_request q = {.prompt = big[i].prompt, .n_prompt = big[i].n_prompt,
                             .max_new = big[i].max_new, .sampling = {.temp = 0, .top_p = 1},
                             .ignore_eos = 1};
            if (engine_submit(e, &q, err) != i) K25_DIE("%s", err);
        }
        engine_run(e);
        for (int i = 0; i < BIG; i++) {
            const k25_seq_record *rec = engine_record(e, i);
            big[i].n_ref = rec->n_tokens;
            memcpy(big[i].ref, rec->tokens, sizeof(int32_t) * (size_t)rec->n_tokens);
        }
        engine_free(e);
        const char *srcs[] = {"ngram:1", "model:config/tiny.ini@1"};
        for (int s = 0; s < 2; s++) {
            k25_spec *sp = make_spec(srcs[s], 2, BIG, big_rows, 0, &in, &cfg, &d);
            char name[128];
            snprintf(name, sizeof name, "%s, %d sequences", srcs[s], BIG);
            run_engine(in.m, &cfg, big, BIG, &ro, sp, name);
            if (s == 1) CHECK(spec_stats(sp)->accepted > 0, "%s: nothing accepted", name);
            spec_free(sp);
        }
    }

    // Every rank saw the same tokens.
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < N_REQ; i++)
        for (int j = 0; j < reqs[i].n_ref; j++)
            h = (h ^ (uint64_t)reqs[i].ref[j]) * 1099511628211ull;
    uint64_t h0 = h;
    MPI_CHECK(MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, d.world));
    CHECK(h0 == h, "rank %d generated different tokens from rank 0", d.world_rank);

    int ok = dist_all_ok(&d, test_failures == 0);
    test_remove_tmpdir(&d, dir);
    if (d.world_rank == 0)
        printf("test_spec_engine (%d ranks): %s\n", d.world_size, ok ? "ok" : "FAILED");
    instance_close(&in);
    dist_finalize(&d);
    return ok ? 0 : 1;
}
