// k25dec: parse the command line, resolve the configuration, load this rank's weight slices,
// generate after the prompt, print the tokens and the timings.
//
// Every rank parses the same arguments and reads the same files, so a bad input fails on every
// rank alike; each check that could differ between ranks (a file readable on one node only) is
// agreed on collectively before anyone moves on, so every failure exits non-zero on all ranks
// instead of leaving some waiting in a collective.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dist.h"
#include "generate.h"
#include "instance.h"
#include "out_file.h"
#include "pipeline.h"
#include "spec.h"
#include "stop_signal.h"
#include "chat.h"
#include "tokenizer.h"
#include "tokenizer_cli.h"
#include "verify.h"

// ------------------------------------------------------------------------------------------
// Collective exits
// ------------------------------------------------------------------------------------------

static void agree_or_exit(k25_dist *d, int ok, const char *msg) {
    dist_agree_or_exit(d, ok, "k25dec", msg);
}

// ------------------------------------------------------------------------------------------
// Text: the checkpoint's tokenizer (DIR/tiktoken.model) behind generate.h's codec
// ------------------------------------------------------------------------------------------

typedef struct tok_codec {
    k25_tokenizer *tok;
    k25_detok detok;
} tok_codec;

static int tok_encode(void *ctx, const char *text, int32_t **ids, int *n, char *err) {
    tok_codec *c = ctx;
    size_t m = 0;
    // Special-token strings in a prompt become their ids, as the reference tokenizer's encode
    // (allowed_special="all") does.
    if (tokenizer_encode(c->tok, text, strlen(text), 1, ids, &m, err)) return -1;
    *n = (int)m;
    return 0;
}

static size_t tok_decode(void *ctx, int32_t id, char *out, size_t cap) {
    tok_codec *c = ctx;
    size_t len = 0;
    if (!tokenizer_token_bytes(c->tok, id, &len) || 4 * (len + 8) > cap) return 0;
    return detok_push(&c->detok, id, out, cap);
}

static size_t tok_flush(void *ctx, char *out, size_t cap) {
    return detok_flush(&((tok_codec *)ctx)->detok, out, cap);
}

// The tokenizer: --tokenizer FILE, else the checkpoint directory's tiktoken.model if it has
// one; with tokenizer_config.json from the same directory when present. Returns 0 (loaded, or
// none: the codec stays empty, the byte fallback) or -1 (a broken tokenizer, or none where one
// was meant to be).
static int load_tokenizer(const k25_cli *o, int n_vocab, tok_codec *tc, k25_text_codec *codec,
                          char *err) {
    char model[4096];
    struct stat st;
    if (o->tokenizer_file) {
        snprintf(model, sizeof model, "%s", o->tokenizer_file);
    } else if (o->model_dir) {
        snprintf(model, sizeof model, "%s/tiktoken.model", o->model_dir);
        // A dangling link is there, and fails to open, instead of passing for no tokenizer
        if (lstat(model, &st) != 0) {
            if (o->tokenizer_pattern)
                return k25_err(err, "--tokenizer-pattern: %s has no tiktoken.model to apply it "
                               "to (give --tokenizer FILE)", o->model_dir);
            return 0;
        }
    } else {
        return 0;
    }
    if (tokenizer_load_with_config(model, o->tokenizer_pattern, n_vocab, &tc->tok, err)) return -1;
    detok_init(&tc->detok, tc->tok);
    codec->ctx = tc;
    codec->encode = tok_encode;
    codec->decode = tok_decode;
    codec->flush = tok_flush;
    return 0;
}

// --chat: the prompt rendered with Kimi's chat template. The assistant's turn ends with
// <|im_end|>, so that token joins the stop set (the K2.5 config.json lists only [EOS]).
static int chat_prompt(const k25_cli *o, const tok_codec *tc, k25_config *cfg, int32_t **ids,
                       int *n, char *err) {
    if (!tc->tok)
        return k25_err(err, "--chat needs a tokenizer: the checkpoint's tiktoken.model or "
                            "--tokenizer FILE");
    size_t m = 0;
    if (chat_render(tc->tok, o->system, o->prompt, o->think, ids, &m, err)) return -1;
    *n = (int)m;
    int end = tokenizer_special_id(tc->tok, "<|im_end|>");
    if (end < 0 || config_is_eos(cfg, end)) return 0;
    if (cfg->eos_ids_n == K25_CFG_INTS_MAX) // else the reply would run on past its turn
        return k25_err(err, "--chat: the stop set already holds %d ids (tokens.eos_token_ids), "
                       "no room for <|im_end|> (%d)", K25_CFG_INTS_MAX, end);
    cfg->eos_ids[cfg->eos_ids_n++] = end;
    return 0;
}

// ------------------------------------------------------------------------------------------
// Start-up summary (rank 0, stderr)
// ------------------------------------------------------------------------------------------

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

static void print_summary(const k25_dist *d, const k25_config *c, const k25_cli *o,
                          const k25_instance *in) {
    const k25_weights *w = &in->w;
    unsigned long long mine[2] = {weights_bytes(w), in->be->mem_peak(in->be)};
    unsigned long long *all = k25_malloc(sizeof mine * (size_t)d->world_size);
    MPI_CHECK(MPI_Gather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, 0,
                         d->world));
    k25_log("k25dec: %d MPI rank%s, tp %d, pp %d, backend %s, CUDA-aware MPI: %s\n",
            d->world_size, d->world_size > 1 ? "s" : "", d->tp_size, d->pp_size,
            in->be->name, d->cuda_aware_mpi ? "yes" : "no");
    k25_log("k25dec: model: %d layers (%d dense), hidden %d, %d heads (%d per rank), "
            "q_lora %d, kv_lora %d, rope %d, experts %d top-%d + %d shared (%s), vocab %d, "
            "context %d\n",
            c->n_layers, c->first_dense, c->hidden, c->n_heads, w->n_heads_local,
            c->q_lora_rank, c->kv_lora_rank, c->qk_rope_dim, c->n_experts, c->top_k, c->n_shared,
            c->experts_int4 ? "INT4" : "BF16", c->vocab, c->ctx_size);
    if (o->model_dir && !o->synthetic)
        k25_log("k25dec: weights: checkpoint %s\n", o->model_dir);
    else
        k25_log("k25dec: weights: synthetic, seed %llu\n", (unsigned long long)o->synth_seed);
    if (c->uniform_routing)
        k25_log("k25dec: run.uniform_routing: every row's experts are drawn uniformly, not the "
                "router's (a benchmark load): outputs are not the model's\n");
    if (c->sim_tp > 1)
        k25_log("k25dec: run.sim_tp = %d: the ranks run only their shares of a %d-way "
                "tensor-parallel split (a benchmark shard): outputs are not the model's\n",
                c->sim_tp, c->sim_tp);
    for (int r = 0; r < d->world_size; r++)
        k25_log("k25dec: rank %d: %.2f MiB of weights, %.2f MiB of backend memory\n", r,
                mib((double)all[2 * r]), mib((double)all[2 * r + 1]));
    free(all);
    if (d->pp_size > 1 && d->world_rank == 0) {
        int *first = k25_malloc(sizeof(int) * (size_t)(d->pp_size + 1));
        char err[K25_ERR_LEN];
        if (pipeline_layout(c, d->pp_size, first, err) == 0)
            pipeline_print(stderr, "k25dec: pipeline ", c, d->pp_size, first, d->world_size);
        free(first);
    }
}

// --dump-config: the configuration, then the layers of each pipeline stage as .ini comments.
// Only the layer split is checked and shown: the dump does not depend on the rank count (one
// process may dump a configuration meant for many ranks).
static int dump_config(const k25_dist *d, const k25_config *c, char *err) {
    int *first = k25_malloc(sizeof(int) * (size_t)(c->pp + 1));
    int rc = pipeline_layout(c, c->pp, first, err);
    if (rc == 0 && d->world_rank == 0) {
        config_dump(c, stdout);
        printf("\n; pipeline: %d stage%s\n", c->pp, c->pp > 1 ? "s" : "");
        pipeline_print(stdout, ";   ", c, c->pp, first, 0);
        rc = k25_flush_check(stdout, "standard output", err);
    }
    free(first);
    return rc;
}

static void print_timings(double load_ms, const k25_gen_result *r) {
    const char *f = "k25dec";
    double total = load_ms + r->prompt_ms + r->eval_ms;
    k25_log("%s:        load time = %10.2f ms\n", f, load_ms);
    k25_log("%s: prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens "
            "per second)\n",
            f, r->prompt_ms, r->n_prompt, r->n_prompt ? r->prompt_ms / r->n_prompt : 0.0,
            r->prompt_ms > 0 ? 1e3 * r->n_prompt / r->prompt_ms : 0.0);
    k25_log("%s:        eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens "
            "per second)\n",
            f, r->eval_ms, r->n_eval, r->n_eval ? r->eval_ms / r->n_eval : 0.0,
            r->eval_ms > 0 ? 1e3 * r->n_eval / r->eval_ms : 0.0);
    k25_log("%s:       total time = %10.2f ms / %5d tokens\n", f, total,
            r->n_prompt + r->n_tokens);
}

// The rank a launcher (mpirun, srun) gave this process, before MPI is up; -1 when none did. The
// tokenizer tools run without MPI: started by a launcher anyway, only its first process
// answers (the one that mpirun gives stdin to), instead of every process printing a line.
static int launched_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        long r;
        const char *v = getenv(vars[i]);
        if (v && k25_parse_long(v, 0, INT_MAX, &r) == 0) return (int)r;
    }
    return -1;
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    double t_start = k25_now_ms();
    char err[K25_ERR_LEN] = "";

    // ---- command line (identical on every rank); the tokenizer tools run without MPI ----
    k25_cli o;
    int parse_rc = cli_parse(argc, argv, &o, err);
    if (parse_rc == 0 && !o.help && (o.tokenize || o.detokenize) && launched_rank() > 0)
        return 0;
    if (parse_rc == 0 && !o.help && (o.tokenize || o.detokenize))
        return o.tokenize ? tokenizer_cli_tokenize(o.tokenizer_file, o.tokenizer_pattern, stdin, stdout)
                          : tokenizer_cli_detokenize(o.tokenizer_file, o.tokenizer_pattern, stdin, stdout);
    // before dist_init, whose check of the Slurm world is what -v adds a note to
    if (parse_rc == 0) k25_verbose = o.verbose;
    k25_dist d;
    dist_init(&d, &argc, &argv);
    if (parse_rc) {
        if (d.world_rank == 0) fprintf(stderr, "k25dec: error: %s\nTry 'k25dec --help'.\n", err);
        dist_finalize(&d);
        return 2;
    }
    if (o.help) {
        if (d.world_rank == 0) cli_usage(stdout);
        agree_or_exit(&d, d.world_rank || k25_flush_check(stdout, "standard output", err) == 0,
                      err);
        dist_finalize(&d);
        return 0;
    }

    // ---- configuration ----
    k25_config cfg;
    agree_or_exit(&d, cli_load_config(&o, &cfg, err) == 0, err);
    if (o.dump_config) {
        agree_or_exit(&d, dump_config(&d, &cfg, err) == 0, err);
        cli_free(&o);
        dist_finalize(&d);
        return 0;
    }
    agree_or_exit(&d, instance_setup_dist(&d, &cfg, err) == 0, err);

    // ---- tokenizer and prompt ----
    k25_text_codec codec = {0};
    tok_codec tc = {0};
    int32_t *prompt = NULL;
    int n_prompt = 0, ok = 1;
    char why[K25_ERR_LEN];
    agree_or_exit(&d, load_tokenizer(&o, cfg.vocab, &tc, &codec, err) == 0, err);
    if (!codec.encode && o.prompt)
        k25_log("k25dec: no tokenizer: the prompt's bytes are token ids 0..255, ids are printed\n");
    if (o.tokens) {
        prompt = o.tokens;
        n_prompt = o.n_tokens;
        o.tokens = NULL;
    } else if (o.chat) {
        ok = chat_prompt(&o, &tc, &cfg, &prompt, &n_prompt, err) == 0;
    } else if (gen_encode_prompt(&codec, o.prompt, &prompt, &n_prompt, why)) {
        ok = k25_err(err, "-p/--prompt: %s", why) == 0;
    }
    for (int i = 0; ok && i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= cfg.vocab)
            ok = k25_err(err, "prompt token %d (at %d) is outside the vocabulary (0..%d)",
                         prompt[i], i, cfg.vocab - 1) == 0;
    if (ok && n_prompt == 0 && o.prompt && *o.prompt)
        ok = k25_err(err, "the prompt (%zu bytes) encodes to no tokens: the pre-tokenizer pattern "
                     "matches none of it (see --tokenizer-pattern)", strlen(o.prompt)) == 0;
    if (ok && n_prompt == 0) ok = k25_err(err, "the prompt is empty") == 0;
    if (ok && n_prompt > cfg.ctx_size)
        ok = k25_err(err, "the prompt has %d tokens, more than the context of %d (raise it with "
                     "-c/--ctx-size, up to model.max_position_embeddings = %d)",
                     n_prompt, cfg.ctx_size, cfg.max_pos) == 0;
    agree_or_exit(&d, ok, err);
    // Before a load that takes minutes, not after it
    if (o.dump_logits && cfg.sim_tp > 1)
        ok = k25_err(err, "--dump-logits: run.sim_tp = %d runs a benchmark shard, which computes "
                     "part of each row's logits and not the model's", cfg.sim_tp) == 0;
    if (ok && o.dump_logits && d.world_rank == 0)
        ok = out_file_check(o.dump_logits, "--dump-logits", 1, err) == 0;
    if (ok && o.output && d.world_rank == 0)
        ok = out_file_check(o.output, "--output", 0, err) == 0;
    if (ok && o.output && o.dump_logits && d.world_rank == 0 &&
        out_file_same(o.output, o.dump_logits))
        ok = k25_err(err, "--output and --dump-logits name one file (%s): each needs its own",
                     o.output) == 0;
    agree_or_exit(&d, ok, err);
    int chunk = cfg.prefill_chunk < cfg.ctx_size ? cfg.prefill_chunk : cfg.ctx_size;
    k25_spec_opts so = {.k = o.spec_k, .max_seqs = 1, .max_rows = chunk,
                        .ctx_size = cfg.ctx_size, .kv_block = cfg.kv_block,
                        .backend = cfg.backend, .threads = cfg.threads};
    int64_t draft_values = 0; // a draft's cache shares run.kv_cache_mb with the target's
    if (o.spec_draft)
        agree_or_exit(&d, spec_check(o.spec_draft, &cfg, &d, &so, &draft_values, err) == 0, err);

    // ---- checkpoint check, weights, backend, model ----
    int from_ckpt = o.model_dir && !o.synthetic;
    if (o.verify) {
        if (from_ckpt)
            ok = verify_checkpoint_part(o.model_dir, d.world_rank, d.world_size, err) == 0;
        else
            ok = k25_err(err, "--verify: the weights are synthetic, there is no checkpoint to "
                         "check") == 0;
        agree_or_exit(&d, ok, err);
        k25_log("k25dec: checkpoint %s matches its CRC manifest\n", o.model_dir);
    }
    char ctx_what[64]; // under run.kv_cache_mb, what the sequence's blocks are for
    snprintf(ctx_what, sizeof ctx_what, "the context of %d tokens", cfg.ctx_size);
    k25_instance_opts io = {
        .model_dir = from_ckpt ? o.model_dir : NULL,
        .synth_seed = o.synth_seed,
        .backend = cfg.backend,
        .threads = cfg.threads,
        .model = {.max_seqs = 1, .max_rows = chunk, .kv_block = cfg.kv_block, .n_blocks = 0,
                  .check_finite = o.check_finite || K25_CHECK_FINITE_DEFAULT},
        .kv_cache_mb = cfg.kv_cache_mb,
        .kv_extra_values = draft_values,
        .min_for = ctx_what,
    };
    // the one sequence's table: the whole context (ctx_size is bounded far below INT_MAX)
    io.min_blocks = (int)model_table_entries(&cfg, &io.model);
    k25_instance in;
    agree_or_exit(&d, instance_open(&in, &cfg, &d, &io, err) == 0, err);
    double load_ms = k25_now_ms() - t_start;
    print_summary(&d, &cfg, &o, &in);

    // ---- speculative decoding: the draft next to the target ----
    k25_spec *spec = NULL;
    if (o.spec_draft) {
        so.n_blocks = model_n_blocks(in.m);
        spec = spec_create(o.spec_draft, in.m, &in.w, &cfg, &d, &so, err);
        agree_or_exit(&d, spec != NULL, err);
    }

    // ---- generate ----
    // Only now does a signal wait for the step to end: before, there is no output to finish,
    // and a checkpoint's load takes minutes (the default action ends it at once).
    stop_signal_install();
    int n_predict = o.has_n_predict ? o.n_predict : cfg.n_predict;
    int room = cfg.ctx_size - n_prompt + 1; // the last token needs no cache position
    if (n_predict > room)
        k25_log("k25dec: note: -n %d does not fit the context (%d prompt tokens, context %d): "
                "generation stops at the context end\n", n_predict, n_prompt, cfg.ctx_size);
    k25_gen_opts go = {
        .n_predict = n_predict,
        .ctx_size = cfg.ctx_size,
        .prefill_chunk = chunk,
        .temp = cfg.temp,
        .top_k = cfg.sample_top_k,
        .top_p = cfg.sample_top_p,
        .seed = (uint64_t)cfg.seed,
        .print_ids = o.print_ids || o.prompt == NULL, // --tokens input: ids out
        .output = o.output,
        .dump_logits = o.dump_logits,
        .spec = spec,
    };
    k25_gen_result res;
    ok = generate(in.m, &cfg, &d, &codec, prompt, n_prompt, &go, &res, err) == 0;
    agree_or_exit(&d, ok, err);
    if (res.stopped_ctx)
        k25_log("k25dec: note: stopped at the context end (%d positions)\n", cfg.ctx_size);
    if (res.stopped_signal)
        k25_log("k25dec: stopped by a signal after %d tokens\n", res.n_tokens);
    print_timings(load_ms, &res);
    if (spec) {
        const k25_spec_stats *st = spec_stats(spec);
        // eval time above counts target steps ("runs"); a step may emit several tokens.
        int decoded = res.n_tokens > 0 ? res.n_tokens - 1 : 0;
        k25_log("k25dec: speculative (%s, k = %d): %ld rounds, %ld drafted, %ld accepted, mean "
                "accepted length %.2f (bonus included), draft time %.2f ms; %d tokens after the "
                "first in %.2f ms (%.2f tokens per second)\n",
                spec_draft_kind(spec), spec_k(spec), st->rounds, st->drafted, st->accepted,
                st->rounds ? (double)st->emitted / st->rounds : 0.0, st->draft_ms, decoded,
                res.eval_ms, res.eval_ms > 0 ? 1e3 * decoded / res.eval_ms : 0.0);
        spec_free(spec);
    }

    free(res.tokens);
    free(prompt);
    if (tc.tok) tokenizer_free(tc.tok);
    instance_close(&in);
    cli_free(&o);
    dist_finalize(&d);
    return res.stopped_signal ? 130 : 0;
}
