// Continuous batching against one-request-at-a-time decoding: requests with different prompts,
// lengths, sampling settings and arrival steps go through the engine with several batch sizes,
// small prefill chunks, row limits and a cache too small for all of them at once, and every
// request's tokens must equal what a plain loop over model_step produces for it alone (whole
// prompt in one step, then one token per step, contiguous cache blocks; no engine or cache
// allocator involved). Also checks the scheduling limits every step and the cache accounting.
//
// Model: config/tiny.ini, synthetic weights (seed 1), CPU backend (`--backend cuda` runs the
// same checks on the GPU backend, whose kernels must then be batch-invariant too). Runs on any
// rank count that tiny.ini divides over (tests/t_engine.sh runs it on 2 ranks); the ranks must
// also agree on every token.
#include "engine.h"
#include "instance.h"
#include "test_util.h"

#include <limits.h>
#include <string.h>


#define N_REQ 14
#define KV_BLOCK 4
#define MAX_SEQS 8
#define MAX_ROWS 64

typedef struct test_req {
    int32_t prompt[48];
    int n_prompt, max_new, arrival, ignore_eos;
    k25_sampling sp;
    int32_t ref[64];      // tokens of the request run alone
    int n_ref;
} test_req;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static int rnd(int n) { return test_rnd(&rng_state, n); }

// ------------------------------------------------------------------------------------------
// Reference: one request alone, straight on model_step
// ------------------------------------------------------------------------------------------

static void run_alone(k25_model *m, const k25_config *eos_cfg, test_req *r) {
    // Slot 3: any slot, the engine's choice must not matter.
    r->n_ref = test_decode_alone(m, eos_cfg, r->prompt, r->n_prompt, r->max_new, r->ignore_eos,
                                 r->sp, 3, MAX_SEQS, 512, KV_BLOCK, r->ref);
}

// ------------------------------------------------------------------------------------------
// The engine run
// ------------------------------------------------------------------------------------------

typedef struct run_opts {
    const char *name;
    int max_batch, prefill_chunk, max_rows, n_blocks;
    int expect_wait_for_blocks;  // the cache is small enough that requests wait for blocks
    int prefill_first;
} run_opts;

static void run_engine(k25_model *m, const k25_config *eos_cfg, test_req *reqs,
                       const run_opts *ro) {
    char err[K25_ERR_LEN] = "";
    k25_engine_opts o = {.max_batch = ro->max_batch, .max_seqs = MAX_SEQS,
                         .prefill_chunk = ro->prefill_chunk,
                         .max_rows = ro->max_rows, .kv_block = KV_BLOCK, .ctx_size = 512,
                         .n_blocks = ro->n_blocks, .prefill_first = ro->prefill_first};
    k25_engine *e = engine_create(m, eos_cfg, &o, err);
    CHECK(e != NULL, "%s: engine_create: %s", ro->name, err);
    if (!e) return;

    int id_of[N_REQ], submitted = 0, waited_for_blocks = 0, mixed = 0, max_running = 0;
    for (;;) {
        // Arrivals are counted in engine steps; an idle engine jumps to the next arrival.
        while (submitted < N_REQ &&
               (reqs[submitted].arrival <= engine_steps(e) || !engine_busy(e))) {
            test_req *r = &reqs[submitted];
            k25_request q = {.prompt = r->prompt, .n_prompt = r->n_prompt, .max_new = r->max_new,
                             .sampling = r->sp, .ignore_eos = r->ignore_eos};
            id_of[submitted] = engine_submit(e, &q, err);
            CHECK(id_of[submitted] == submitted, "%s: submit %d: %s", ro->name, submitted, err);
            submitted++;
        }
        if (!engine_step(e)) break;
        const k25_step_info *si = engine_last_step(e);
        CHECK(si->n_decode + si->n_prefill <= ro->max_rows, "%s: %d rows", ro->name,
              si->n_decode + si->n_prefill);
        CHECK(si->n_prefill <= ro->prefill_chunk, "%s: %d prefill rows", ro->name,
              si->n_prefill);
        CHECK(si->n_running <= ro->max_batch, "%s: %d running", ro->name, si->n_running);
        if (si->n_waiting > 0 && si->n_running < ro->max_batch) waited_for_blocks = 1;
        if (si->n_decode > 0 && si->n_prefill > 0) mixed = 1;
        if (si->n_running > max_running) max_running = si->n_running;
        if (kvcache_check(engine_cache(e), err) != 0) CHECK(0, "%s: %s", ro->name, err);
    }
    CHECK(submitted == N_REQ && !engine_busy(e), "%s: engine stopped with work left", ro->name);
    const k25_kvcache *kv = engine_cache(e);
    CHECK(kv->n_free == kv->n_blocks && kv->owed == 0, "%s: %d of %d blocks free at the end",
          ro->name, kv->n_free, kv->n_blocks);
    if (ro->max_batch > 1) CHECK(max_running > 1, "%s: never more than one sequence in flight",
                                 ro->name);
    if (ro->max_batch > 1 && !ro->prefill_first)
        CHECK(mixed, "%s: no step mixed decode and prefill rows", ro->name);
    if (ro->prefill_first) CHECK(!mixed, "%s: decode rows next to prefill rows", ro->name);
    if (ro->expect_wait_for_blocks)
        CHECK(waited_for_blocks, "%s: no request ever waited for cache blocks", ro->name);

    for (int i = 0; i < N_REQ; i++) {
        const k25_seq_record *rec = engine_record(e, i);
        test_req *r = &reqs[i];
        int k = 0;
        while (k < rec->n_tokens && k < r->n_ref && rec->tokens[k] == r->ref[k]) k++;
        CHECK(k == r->n_ref && k == rec->n_tokens,
              "%s: request %d (prompt %d, max_new %d, temp %g): %d tokens, alone %d; first "
              "difference at %d", ro->name, i, r->n_prompt, r->max_new, (double)r->sp.temp,
              rec->n_tokens, r->n_ref, k);
        k25_finish want = r->n_ref < r->max_new || (!r->ignore_eos &&
                                                    config_is_eos(eos_cfg, r->ref[r->n_ref - 1]))
                              ? K25_FINISH_EOS
                              : K25_FINISH_LENGTH;
        CHECK(rec->finish == want, "%s: request %d finished %d, expected %d", ro->name, i,
              rec->finish, want);
        for (int j = 1; j < rec->n_tokens; j++)
            CHECK(rec->t_token[j] >= rec->t_token[j - 1], "%s: request %d token times", ro->name,
                  i);
        CHECK(rec->t_admit >= rec->t_submit && rec->t_token[0] >= rec->t_admit,
              "%s: request %d submit/admit/first-token order", ro->name, i);
    }
    engine_free(e);
}

// Requests that can never run are refused at submission.
static void check_refusals(k25_model *m, const k25_config *cfg) {
    char err[K25_ERR_LEN] = "";
    k25_engine_opts o = {.max_batch = 2, .prefill_chunk = 8, .max_rows = 16,
                         .kv_block = KV_BLOCK, .ctx_size = 512, .n_blocks = 10};
    k25_engine *e = engine_create(m, cfg, &o, err);
    CHECK(e != NULL, "engine_create: %s", err);
    if (!e) return;
    int32_t p[2] = {1, 2}, bad[1] = {cfg->vocab};
    k25_request q = {.prompt = p, .n_prompt = 0, .max_new = 4};
    CHECK(engine_submit(e, &q, err) == -1, "empty prompt accepted");
    q.n_prompt = 2;
    q.max_new = 0;
    CHECK(engine_submit(e, &q, err) == -1, "max_new 0 accepted");
    q.max_new = 512; // 513 positions
    CHECK(engine_submit(e, &q, err) == -1, "longer than ctx_size accepted");
    q.max_new = INT_MAX; // the positions needed overflowed an int (and the message with it)
    CHECK(engine_submit(e, &q, err) == -1 && strstr(err, "need 2147483648 positions, more than "
                                                         "ctx_size 512"),
          "max_new INT_MAX: %s", err);
    q.max_new = 40; // 41 positions: 11 blocks of 4, the cache has 10
    CHECK(engine_submit(e, &q, err) == -1, "longer than the whole cache accepted");
    q.max_new = 38;
    CHECK(engine_submit(e, &q, err) == 0, "a request that fits exactly: %s", err);
    q.prompt = bad;
    q.n_prompt = 1;
    CHECK(engine_submit(e, &q, err) == -1, "out-of-vocabulary token accepted");
    CHECK(engine_create(m, cfg, &(k25_engine_opts){.max_batch = 4, .prefill_chunk = 4,
                                                   .max_rows = 3, .kv_block = KV_BLOCK,
                                                   .ctx_size = 512},
                        err) == NULL,
          "max_rows below max_batch accepted");
    CHECK(engine_create(m, cfg, &(k25_engine_opts){.max_batch = 4, .prefill_chunk = 4,
                                                   .max_rows = 4, .kv_block = KV_BLOCK * 2,
                                                   .ctx_size = 512},
                        err) == NULL && strstr(err, "the model's cache has blocks of"),
          "a kv_block other than the model's accepted: %s", err);
    CHECK(engine_create(m, cfg, &(k25_engine_opts){.max_batch = 4, .prefill_chunk = 4,
                                                   .max_rows = MAX_ROWS + 1, .kv_block = KV_BLOCK,
                                                   .ctx_size = 512},
                        err) == NULL && strstr(err, "steps of at most"),
          "more rows than the model holds accepted: %s", err);
    engine_free(e);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    k25_config cfg;
    test_tiny_config(&cfg);
    k25_instance in;
    const char *backend = argc > 2 && !strcmp(argv[1], "--backend") ? argv[2] : "cpu";
    test_open_instance(&in, &cfg, &d, backend,
                       (k25_model_opts){.max_seqs = MAX_SEQS, .max_rows = MAX_ROWS,
                                        .kv_block = KV_BLOCK});

    // The requests: prompts of 1..40 tokens, 1..24 new tokens, greedy and sampled.
    static test_req reqs[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        test_req *r = &reqs[i];
        r->n_prompt = i == 0 ? 1 : 1 + rnd(40);
        r->max_new = i == 1 ? 1 : 1 + rnd(24);
        for (int j = 0; j < r->n_prompt; j++) r->prompt[j] = rnd(256);
        r->arrival = i < 4 ? 0 : rnd(30);
        r->ignore_eos = 1;
        r->sp = (k25_sampling){.temp = 0, .top_k = 0, .top_p = 1};
        if (i % 4 == 2) r->sp = (k25_sampling){.temp = 0.9f, .top_k = 20, .top_p = 1};
        if (i % 4 == 3) r->sp = (k25_sampling){.temp = 1.1f, .top_k = 0, .top_p = 0.9f};
        r->sp.seed = 1000 + (uint64_t)i;
    }
    for (int i = 1; i < N_REQ; i++) // arrivals in submission order
        if (reqs[i].arrival < reqs[i - 1].arrival) reqs[i].arrival = reqs[i - 1].arrival;

    // EOS: first find what a long greedy request generates, then make one of its middle tokens
    // an end-of-sequence id for the requests that honour EOS.
    k25_config eos_cfg = cfg;
    reqs[5].max_new = 24;
    reqs[5].sp = (k25_sampling){.temp = 0, .top_p = 1};
    run_alone(in.m, &eos_cfg, &reqs[5]);
    eos_cfg.eos_ids[eos_cfg.eos_ids_n++] = reqs[5].ref[6];
    for (int i = 5; i < N_REQ; i += 3) reqs[i].ignore_eos = 0;

    for (int i = 0; i < N_REQ; i++) run_alone(in.m, &eos_cfg, &reqs[i]);
    int n_eos = 0;
    for (int i = 0; i < N_REQ; i++) n_eos += reqs[i].n_ref < reqs[i].max_new;
    CHECK(n_eos >= 1, "no request stops at EOS: the EOS path is not exercised");

    // Blocks a request needs: ceil((prompt + max_new - 1) / 4); the largest is at most 16.
    run_opts runs[] = {
        {"batch 1", 1, 7, 8, 0, 0, 0},
        {"batch 8, small cache", 8, 5, 13, 24, 1, 0},
        {"batch 8, row limit", 8, 16, 9, 0, 0, 0},
        {"batch 3, big chunks", 3, 64, 64, 40, 0, 0},
        {"batch 6, prefill first", 6, 8, 12, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        run_engine(in.m, &eos_cfg, reqs, &runs[i]);
    check_refusals(in.m, &cfg);

    // Every rank saw the same tokens.
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < N_REQ; i++)
        for (int j = 0; j < reqs[i].n_ref; j++) h = (h ^ (uint64_t)reqs[i].ref[j]) * 1099511628211ull;
    uint64_t h0 = h;
    MPI_CHECK(MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, d.world));
    CHECK(h0 == h, "rank %d generated different tokens from rank 0", d.world_rank);

    int ok = dist_all_ok(&d, test_failures == 0);
    instance_close(&in);
    if (d.world_rank == 0)
        printf("test_engine (%d ranks, %s): %s\n", d.world_size, backend, ok ? "ok" : "FAILED");
    dist_finalize(&d);
    return ok ? 0 : 1;
}
