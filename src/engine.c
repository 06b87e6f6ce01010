// Continuous batching (see engine.h): FIFO admission under a slot and cache-block budget,
// chunked prefill interleaved with batched decode rows, retirement on EOS or length.
#include "engine.h"

#include <string.h>

#include "spec.h"

// A request's private state next to its public record.
typedef struct req_state {
    k25_seq_record rec;
    int32_t *prompt;         // [n_prompt], freed when the request finishes
    k25_sampling sampling;
    int ignore_eos;
    int slot;                // sequence slot while running, -1 otherwise
    int n_fed;               // prompt tokens already through the model
    int group;               // its sequence group while running (pipelined steps)
} req_state;

// A group's step whose sampled tokens are still on their way from the last stage.
typedef struct pending_step {
    int ns;                  // sampled rows (0: nothing in flight)
    MPI_Request req;
    int32_t *out, *req_id;   // [max_rows] tokens, and the request each one is for
} pending_step;

struct k25_engine {
    k25_model *m;
    const k25_config *cfg;
    k25_engine_opts o;
    k25_kvcache kv;

    req_state **req;         // [n_req] in submission order (= id)
    int n_req, cap_req;
    int next_admit;          // requests next_admit .. n_req-1 are waiting (FIFO)
    int *run;                // [max_batch] running request ids, in admission order
    int n_run;
    uint8_t *slot_busy;      // [max_batch]

    // One step's batch, host side.
    int32_t *tokens, *pos, *seq;          // [max_rows]
    int32_t *sample_rows, *sample_req;    // [max_rows]: row, and the request it samples for
    k25_sampling *params;                 // [max_rows]
    int32_t *out;                         // [max_rows]

    k25_token_fn token_fn;
    void *token_ctx;
    k25_step_info last;
    long steps;

    // Speculative decoding (spec.h; NULL: off). The decoding sequences of a step in run order;
    // each one's rows (its last token, then its drafts) are consecutive sample entries.
    k25_spec *spec;
    k25_spec_seq *sseq;                   // [max_batch]
    int32_t *sseq_entry;                  // [max_batch] its first sample entry
    k25_spec_obs *sobs;                   // [max_batch]

    // Pipelined steps (run.pp_async with pipeline stages): the running sequences form one group
    // per stage and step n runs group n % n_groups, first collecting the tokens of that group's
    // previous step. A stage thus starts the next group while the later stages finish this one
    // (a group's own steps cannot overlap: each decode step feeds the token the previous one
    // sampled).
    int n_groups;                         // 1: every step runs every sequence
    int *group_n;                         // [n_groups] running sequences per group
    pending_step *pend;                   // [n_groups]
};

// ------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------

void engine_opts_from_config(const k25_config *cfg, k25_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_batch = cfg->max_batch;
    o->prefill_chunk = cfg->prefill_chunk;
    o->max_rows = cfg->max_batch + cfg->prefill_chunk;
    o->kv_block = cfg->kv_block;
    o->ctx_size = cfg->ctx_size;
    o->n_blocks = 0;
    o->pp_async = cfg->pp_async;
}

void engine_model_opts(const k25_engine_opts *o, k25_model_opts *mo) {
    memset(mo, 0, sizeof *mo);
    mo->max_seqs = o->max_seqs > o->max_batch ? o->max_seqs : o->max_batch;
    mo->max_rows = o->max_rows;
    mo->kv_block = o->kv_block;
    mo->n_blocks = o->n_blocks;
}

// ------------------------------------------------------------------------------------------
// Life cycle
// ------------------------------------------------------------------------------------------

k25_engine *engine_create(k25_model *m, const k25_config *cfg, const k25_engine_opts *o,
                          char *err) {
    if (o->max_batch < 1 || o->max_batch > 256) {
        k25_err(err, "engine: max_batch %d outside 1..256", o->max_batch);
        return NULL;
    }
    if (o->max_seqs != 0 && o->max_seqs < o->max_batch) {
        k25_err(err, "engine: max_seqs %d below max_batch %d", o->max_seqs, o->max_batch);
        return NULL;
    }
    if (o->prefill_chunk < 1) {
        k25_err(err, "engine: prefill_chunk %d must be positive", o->prefill_chunk);
        return NULL;
    }
    // With max_rows >= max_batch a prefilling sequence always gets at least one row: the
    // others decode at most max_batch - 1 rows.
    if (o->max_rows < o->max_batch) {
        k25_err(err, "engine: max_rows %d below max_batch %d", o->max_rows, o->max_batch);
        return NULL;
    }
    if (o->kv_block < 1 || o->ctx_size < 1) {
        k25_err(err, "engine: kv_block %d / ctx_size %d out of range", o->kv_block, o->ctx_size);
        return NULL;
    }
    // Block numbers address the model's cache in its own block size, and a step of more rows
    // than its activations hold stops the model mid-run: both are refused here, up front.
    const k25_model_opts *mo = model_opts_of(m);
    if (o->kv_block != mo->kv_block) {
        k25_err(err, "engine: kv_block %d, the model's cache has blocks of %d", o->kv_block,
                mo->kv_block);
        return NULL;
    }
    if (o->max_rows > mo->max_rows) {
        k25_err(err, "engine: max_rows %d, the model was made for steps of at most %d rows",
                o->max_rows, mo->max_rows);
        return NULL;
    }
    int n_blocks = model_n_blocks(m);
    if (o->n_blocks > n_blocks) {
        k25_err(err, "engine: %d cache blocks asked, the model has %d", o->n_blocks, n_blocks);
        return NULL;
    }
    if (o->n_blocks > 0) n_blocks = o->n_blocks;

    k25_engine *e = k25_calloc(1, sizeof *e);
    e->m = m;
    e->cfg = cfg;
    e->o = *o;
    e->o.n_blocks = n_blocks;
    int mbps = (o->ctx_size + o->kv_block - 1) / o->kv_block;
    int table_rows = o->max_seqs > 0 ? o->max_seqs : o->max_batch;
    if (kvcache_init(&e->kv, n_blocks, o->kv_block, table_rows, mbps, err) != 0) {
        free(e);
        return NULL;
    }
    e->run = k25_calloc(o->max_batch, sizeof(int));
    e->slot_busy = k25_calloc(o->max_batch, 1);
    int R = o->max_rows;
    e->tokens = k25_calloc(R, sizeof(int32_t));
    e->pos = k25_calloc(R, sizeof(int32_t));
    e->seq = k25_calloc(R, sizeof(int32_t));
    e->sample_rows = k25_calloc(R, sizeof(int32_t));
    e->sample_req = k25_calloc(R, sizeof(int32_t));
    e->params = k25_calloc(R, sizeof(k25_sampling));
    e->out = k25_calloc(R, sizeof(int32_t));
    int stages = model_n_stages(m);
    e->n_groups = o->pp_async && stages > 1 ? stages : 1;
    e->group_n = k25_calloc(e->n_groups, sizeof(int));
    e->pend = k25_calloc(e->n_groups, sizeof(pending_step));
    for (int g = 0; g < e->n_groups; g++) {
        e->pend[g].req = MPI_REQUEST_NULL;
        e->pend[g].out = k25_calloc(R, sizeof(int32_t));
        e->pend[g].req_id = k25_calloc(R, sizeof(int32_t));
    }
    return e;
}

void engine_free(k25_engine *e) {
    if (!e) return;
    for (int g = 0; g < e->n_groups; g++) { // tokens still in flight: let the broadcast finish
        if (e->pend[g].ns) MPI_CHECK(MPI_Wait(&e->pend[g].req, MPI_STATUS_IGNORE));
        free(e->pend[g].out);
        free(e->pend[g].req_id);
    }
    free(e->pend);
    free(e->group_n);
    for (int i = 0; i < e->n_req; i++) {
        free(e->req[i]->prompt);
        free(e->req[i]->rec.tokens);
        free(e->req[i]->rec.t_token);
        free(e->req[i]);
    }
    free(e->req);
    kvcache_destroy(&e->kv);
    free(e->run);
    free(e->slot_busy);
    free(e->tokens);
    free(e->pos);
    free(e->seq);
    free(e->sample_rows);
    free(e->sample_req);
    free(e->params);
    free(e->out);
    if (e->spec) spec_detach(e->spec);
    free(e->sseq);
    free(e->sseq_entry);
    free(e->sobs);
    free(e);
}

void engine_set_token_fn(k25_engine *e, k25_token_fn fn, void *ctx) {
    e->token_fn = fn;
    e->token_ctx = ctx;
}

// ------------------------------------------------------------------------------------------
// Requests
// ------------------------------------------------------------------------------------------

// Positions a request writes into the cache: the prompt, then every generated token but the
// last (which is never fed back).
static int cache_len(int n_prompt, int max_new) { return n_prompt + max_new - 1; }

int engine_submit(k25_engine *e, const k25_request *r, char *err) {
    if (r->n_prompt < 1 || !r->prompt)
        return k25_err(err, "request %d: empty prompt", e->n_req);
    if (r->max_new < 1)
        return k25_err(err, "request %d: max_new %d must be positive", e->n_req, r->max_new);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->cfg->vocab)
            return k25_err(err, "request %d: prompt token %d is %d, outside the vocabulary "
                                "0..%d", e->n_req, i, r->prompt[i], e->cfg->vocab - 1);
    // in 64 bits: max_new may be as large as INT_MAX
    long long need = (long long)r->n_prompt + r->max_new - 1;
    if (need > e->o.ctx_size)
        return k25_err(err, "request %d: %d prompt + %d new tokens need %lld positions, more "
                            "than ctx_size %d", e->n_req, r->n_prompt, r->max_new, need,
                       e->o.ctx_size);
    int len = cache_len(r->n_prompt, r->max_new);
    if (!kvcache_fits(&e->kv, len))
        return k25_err(err, "request %d: %d cache positions need %d blocks, the cache has %d",
                       e->n_req, len, kvcache_blocks_for(&e->kv, len), e->kv.n_blocks);

    req_state *s = k25_calloc(1, sizeof *s);
    s->prompt = k25_malloc((size_t)r->n_prompt * sizeof(int32_t));
    memcpy(s->prompt, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    s->sampling = r->sampling;
    s->ignore_eos = r->ignore_eos;
    s->slot = -1;
    s->rec.id = e->n_req;
    s->rec.n_prompt = r->n_prompt;
    s->rec.max_new = r->max_new;
    s->rec.tokens = k25_malloc((size_t)r->max_new * sizeof(int32_t));
    s->rec.t_token = k25_malloc((size_t)r->max_new * sizeof(double));
    s->rec.t_submit = k25_now_ms();
    s->rec.admit_step = s->rec.done_step = -1;
    if (e->n_req == e->cap_req) {
        e->cap_req = e->cap_req ? 2 * e->cap_req : 64;
        e->req = realloc(e->req, (size_t)e->cap_req * sizeof *e->req);
        K25_CHECK(e->req, "out of host memory for %d requests", e->cap_req);
    }
    e->req[e->n_req] = s;
    return e->n_req++;
}

int engine_busy(const k25_engine *e) { return e->n_run > 0 || e->next_admit < e->n_req; }
int engine_n_requests(const k25_engine *e) { return e->n_req; }
long engine_steps(const k25_engine *e) { return e->steps; }
int engine_groups(const k25_engine *e) { return e->n_groups; }
const k25_step_info *engine_last_step(const k25_engine *e) { return &e->last; }
const k25_kvcache *engine_cache(const k25_engine *e) { return &e->kv; }

const k25_seq_record *engine_record(const k25_engine *e, int id) {
    return id >= 0 && id < e->n_req ? &e->req[id]->rec : NULL;
}

// ------------------------------------------------------------------------------------------
// The step
// ------------------------------------------------------------------------------------------

// FIFO admission: the head waits until a slot and blocks for its whole length are free, and
// nobody overtakes it (a long request is never starved by short ones).
static void admit(k25_engine *e, double now) {
    while (e->next_admit < e->n_req && e->n_run < e->o.max_batch) {
        req_state *s = e->req[e->next_admit];
        int slot = 0;
        while (e->slot_busy[slot]) slot++;
        if (kvcache_open(&e->kv, slot, cache_len(s->rec.n_prompt, s->rec.max_new)) != 0) break;
        e->slot_busy[slot] = 1;
        s->slot = slot;
        s->n_fed = 0;
        s->group = 0; // the group with the fewest running sequences
        for (int g = 1; g < e->n_groups; g++)
            if (e->group_n[g] < e->group_n[s->group]) s->group = g;
        e->group_n[s->group]++;
        s->rec.t_admit = now;
        s->rec.admit_step = e->steps;
        e->run[e->n_run++] = e->next_admit++;
    }
}

static void add_row(k25_engine *e, int *T, req_state *s, int32_t token, int pos) {
    e->tokens[*T] = token;
    e->pos[*T] = pos;
    e->seq[*T] = s->slot;
    (*T)++;
}

static void add_sample(k25_engine *e, int *ns, int row, req_state *s) {
    e->sample_rows[*ns] = row;
    e->sample_req[*ns] = s->rec.id;
    e->params[*ns] = s->sampling;
    e->params[*ns].counter = (uint64_t)s->rec.n_tokens;
    (*ns)++;
}

static void grow(k25_engine *e, req_state *s, int n_tokens) {
    // Cannot fail: the blocks were promised at admission.
    K25_CHECK(kvcache_grow(&e->kv, s->slot, n_tokens) == 0,
              "engine: cache slot %d cannot grow to %d positions (request %d)", s->slot,
              n_tokens, s->rec.id);
}

static void finish(k25_engine *e, req_state *s, k25_finish why, double now) {
    s->rec.finish = why;
    s->rec.t_done = now;
    s->rec.done_step = e->steps;
    if (e->spec) spec_release(e->spec, s->slot);
    kvcache_close(&e->kv, s->slot);
    e->slot_busy[s->slot] = 0;
    s->slot = -1;
    free(s->prompt);
    s->prompt = NULL;
}

// A sampled token goes to its request: recorded, then EOS / length end it.
static void hand_out(k25_engine *e, req_state *s, int32_t tok, double now) {
    K25_CHECK(tok >= 0 && tok < e->cfg->vocab, "engine: model sampled token %d for request "
              "%d, outside the vocabulary", tok, s->rec.id);
    s->rec.tokens[s->rec.n_tokens] = tok;
    s->rec.t_token[s->rec.n_tokens] = now;
    s->rec.n_tokens++;
    if (!s->ignore_eos && config_is_eos(e->cfg, tok))
        finish(e, s, K25_FINISH_EOS, now);
    else if (s->rec.n_tokens == s->rec.max_new)
        finish(e, s, K25_FINISH_LENGTH, now);
    if (e->token_fn) e->token_fn(e->token_ctx, &s->rec, tok);
}

// ------------------------------------------------------------------------------------------
// Speculative decoding (spec.h): drafts before the step, verification and the draft's view of
// the step's rows after it
// ------------------------------------------------------------------------------------------

void engine_set_spec(k25_engine *e, k25_spec *sp) {
    if (e->spec) spec_detach(e->spec);
    e->spec = sp;
    if (!sp) return;
    // Verification steps take every sequence through all stages (drafts and captured hidden
    // states need the target's step whole): no pipelined groups.
    if (e->n_groups > 1) {
        K25_CHECK(e->steps == 0 && e->n_run == 0, "engine: speculative decoding must be set "
                  "before the first step");
        for (int g = 1; g < e->n_groups; g++) free(e->pend[g].out), free(e->pend[g].req_id);
        e->n_groups = 1;
    }
    if (!e->sseq) {
        e->sseq = k25_calloc(e->o.max_batch, sizeof *e->sseq);
        e->sseq_entry = k25_calloc(e->o.max_batch, sizeof(int32_t));
        e->sobs = k25_calloc(e->o.max_batch, sizeof *e->sobs);
    }
    spec_attach(sp);
}

// Drafts for every decoding sequence, in run order. Each running sequence keeps one row of
// max_rows, so the drafts never crowd out a prefill. Returns how many sequences.
static int spec_draft_step(k25_engine *e) {
    int n = 0, budget = e->o.max_rows - e->n_run;
    for (int i = 0; i < e->n_run; i++) {
        req_state *s = e->req[e->run[i]];
        if (s->n_fed < s->rec.n_prompt || s->rec.n_tokens == 0) continue;
        // Verification emits up to k + 1 tokens: at most max_new in all.
        int k = s->rec.max_new - s->rec.n_tokens - 1;
        if (k > budget) k = budget;
        if (k < 0) k = 0;
        budget -= k;
        e->sseq[n++] = (k25_spec_seq){
            .slot = s->slot, .id = s->rec.id, .prompt = s->prompt, .n_prompt = s->rec.n_prompt,
            .gen = s->rec.tokens, .n_gen = s->rec.n_tokens, .max_draft = k,
            .max_len = cache_len(s->rec.n_prompt, s->rec.max_new), .sampling = s->sampling};
    }
    spec_propose(e->spec, e->sseq, n);
    return n;
}

// Verification of decoding sequence i: its tokens, then the cache cut back to what was
// accepted.
static void spec_hand_out(k25_engine *e, int i, const float *logits, double now) {
    const k25_spec_seq *q = &e->sseq[i];
    int j = e->sseq_entry[i];
    req_state *s = e->req[e->sample_req[j]];
    int32_t emit[K25_SPEC_MAX_K + 1];
    int n = spec_verify(e->spec, q, e->out + j,
                        logits ? logits + (size_t)j * e->cfg->vocab : NULL, emit);
    int pos = s->rec.n_prompt + s->rec.n_tokens - 1;
    for (int t = 0; t < n && s->slot >= 0; t++) hand_out(e, s, emit[t], now);
    // Rows past the accepted drafts hold rejected positions: overwritten later.
    if (s->slot >= 0) kvcache_truncate(&e->kv, s->slot, pos + n);
}

// Each still-running sequence's rows of the step, for drafts that read the target's hidden
// states (EAGLE-3). A sequence's rows are consecutive.
static void spec_observe_step(k25_engine *e, int T) {
    int n = 0;
    for (int r = 0; r < T;) {
        int r1 = r;
        while (r1 < T && e->seq[r1] == e->seq[r]) r1++;
        for (int i = 0; i < e->n_run; i++) {
            req_state *s = e->req[e->run[i]];
            if (s->slot != e->seq[r]) continue;
            e->sobs[n++] = (k25_spec_obs){
                .slot = s->slot, .row0 = r, .pos0 = e->pos[r], .n_rows = r1 - r,
                .max_len = cache_len(s->rec.n_prompt, s->rec.max_new), .prompt = s->prompt,
                .n_prompt = s->rec.n_prompt, .gen = s->rec.tokens, .n_gen = s->rec.n_tokens};
            break;
        }
        r = r1;
    }
    spec_observe(e->spec, e->sobs, n);
}

// ------------------------------------------------------------------------------------------
// The step (continued)
// ------------------------------------------------------------------------------------------

// Drops finished sequences from the running list, keeping admission order.
static void drop_finished(k25_engine *e) {
    int k = 0;
    for (int i = 0; i < e->n_run; i++) {
        req_state *s = e->req[e->run[i]];
        if (s->slot >= 0)
            e->run[k++] = e->run[i];
        else
            e->group_n[s->group]--;
    }
    e->n_run = k;
}

// The tokens of group g's previous step (pipelined steps), handed out; how many.
static int collect(k25_engine *e, int g) {
    pending_step *p = &e->pend[g];
    int n = p->ns;
    if (!n) return 0;
    MPI_CHECK(MPI_Wait(&p->req, MPI_STATUS_IGNORE));
    double now = k25_now_ms();
    for (int j = 0; j < n; j++) hand_out(e, e->req[p->req_id[j]], p->out[j], now);
    p->ns = 0;
    drop_finished(e);
    return n;
}

int engine_step(k25_engine *e) {
    const int g = (int)(e->steps % e->n_groups), grouped = e->n_groups > 1;
    // Handing out a pipelined step's last tokens is work too: a driver that stops at 0 must
    // see them (and may submit more before the next call).
    int handed = grouped ? collect(e, g) : 0;
    double t_start = k25_now_ms();
    admit(e, t_start);
    if (e->n_run == 0) return handed > 0;

    // Decode rows first: one per sequence past its prompt, feeding its last token. With
    // pipelined steps only the sequences of group g take part.
    int T = 0, ns = 0, n_decode = 0, n_prefill_seqs = 0, hold = 0;
    if (e->o.prefill_first)
        for (int i = 0; i < e->n_run; i++)
            if (e->req[e->run[i]]->n_fed < e->req[e->run[i]]->rec.n_prompt &&
                e->req[e->run[i]]->group == g)
                hold = 1;
    // With speculative decoding the drafts follow, each a sampled row too (RNG counter: the
    // index of the token it decides).
    int n_spec = e->spec && !hold ? spec_draft_step(e) : 0, si = 0;
    for (int i = 0; i < e->n_run && !hold; i++) {
        req_state *s = e->req[e->run[i]];
        if (s->group != g) continue;
        if (s->n_fed < s->rec.n_prompt || s->rec.n_tokens == 0) continue;
        int pos = s->rec.n_prompt + s->rec.n_tokens - 1;
        const k25_spec_seq *q = n_spec ? &e->sseq[si] : NULL;
        int k = q ? q->n_draft : 0;
        if (q) e->sseq_entry[si++] = ns;
        grow(e, s, pos + 1 + k);
        add_sample(e, &ns, T, s);
        add_row(e, &T, s, s->rec.tokens[s->rec.n_tokens - 1], pos);
        for (int j = 0; j < k; j++) {
            add_sample(e, &ns, T, s);
            e->params[ns - 1].counter += (uint64_t)(j + 1);
            add_row(e, &T, s, q->draft[j], pos + 1 + j);
        }
        n_decode += 1 + k;
    }
    int n_spec_entries = n_spec ? ns : 0;
    // Then prompt chunks, oldest first, within the prefill budget and the row limit.
    int budget = e->o.prefill_chunk;
    if (budget > e->o.max_rows - T) budget = e->o.max_rows - T;
    for (int i = 0; i < e->n_run && budget > 0; i++) {
        req_state *s = e->req[e->run[i]];
        if (s->group != g) continue;
        int left = s->rec.n_prompt - s->n_fed;
        if (left == 0) continue;
        int k = left < budget ? left : budget;
        grow(e, s, s->n_fed + k);
        for (int j = 0; j < k; j++) add_row(e, &T, s, s->prompt[s->n_fed + j], s->n_fed + j);
        s->n_fed += k;
        budget -= k;
        n_prefill_seqs++;
        // The last prompt row predicts the first generated token.
        if (s->n_fed == s->rec.n_prompt) add_sample(e, &ns, T - 1, s);
    }
    if (T == 0 && grouped) { // group g holds no sequence now; the others go on
        e->last = (k25_step_info){.n_running = e->n_run, .n_waiting = e->n_req - e->next_admit};
        e->steps++;
        return 1;
    }
    K25_CHECK(T > 0, "engine: %d running sequences but no row to run", e->n_run);

    k25_batch b = {
        .T = T,
        .tokens = e->tokens,
        .pos = e->pos,
        .seq = e->seq,
        .block_table = e->kv.block_table,
        .max_seqs = e->kv.max_seqs,
        .max_blocks_per_seq = e->kv.max_blocks_per_seq,
    };
    float *logits = n_spec && spec_needs_logits(e->spec, e->sseq, n_spec)
                        ? spec_logits_buffer(e->spec, ns) : NULL;
    double t0 = k25_now_ms();
    if (grouped) { // the tokens are collected when group g's turn comes again
        pending_step *p = &e->pend[g];
        memcpy(p->req_id, e->sample_req, sizeof(int32_t) * (size_t)ns);
        model_step_issue(e->m, &b, e->sample_rows, ns, e->params, p->out, &p->req);
        p->ns = ns;
    } else {
        model_step(e->m, &b, e->sample_rows, ns, e->params, e->out, logits);
    }
    double now = k25_now_ms();

    e->last = (k25_step_info){
        .n_decode = n_decode,
        .n_prefill = T - n_decode,
        .n_prefill_seqs = n_prefill_seqs,
        .n_sampled = ns,
        .n_running = e->n_run,
        .n_waiting = e->n_req - e->next_admit,
        .ms = now - t0,
    };

    if (!grouped) {
        for (int i = 0; i < n_spec; i++) spec_hand_out(e, i, logits, now);
        for (int j = n_spec_entries; j < ns; j++)
            hand_out(e, e->req[e->sample_req[j]], e->out[j], now);
        if (e->spec) spec_observe_step(e, T);
        drop_finished(e);
    }
    e->steps++;
    return 1;
}

void engine_run(k25_engine *e) {
    while (engine_busy(e))
        if (!engine_step(e)) break;
}
