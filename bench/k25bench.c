// k25bench: the serving benchmark, in process. For each concurrency level it builds a random
// workload (like `vllm bench serve --dataset-name random --ignore-eos`: random prompt ids from
// the non-special vocabulary, fixed or ranged input/output lengths, at least 5 x concurrency
// requests), submits every request at t = 0 to the batching engine with at most `concurrency`
// in flight, and reports throughput and latency metrics as vLLM defines them
// (../shared/PERF.md §8, src/serve_metrics.h), the peak backend memory and where the time of a
// full decode step goes (src/op_profile.h), and with --trace a kernel trace of the decode steps
// as served (src/kernel_trace.h).
//
// Output: '#' lines describing the run and a markdown table on stdout (one row per level, as
// levels finish), progress on stderr, one JSON object per level in --json FILE (rewritten
// atomically after each level), a PNG plot through bench/plot.py with --plot.
//
// Every rank runs the same engine on the same workload (the prompts come from --seed), so the
// ranks always step together; rank 0 measures and writes.
//
// SIGINT / SIGTERM (src/stop_signal.h): the level in progress stops after the engine step in
// flight and is dropped; the completed levels stay printed and in --json, the tables of them
// follow, and every rank exits with 130.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "config.h"
#include "dist.h"
#include "engine.h"
#include "instance.h"
#include "kernel_trace.h"
#include "out_file.h"
#include "op_profile.h"
#include "pipeline.h"
#include "serve_metrics.h"
#include "spec.h"
#include "stop_signal.h"

#ifdef K25_CUDA
#include <nccl.h>
#endif

#define MAX_LEVELS 32
#define MAX_SETS 64
#define MAX_SPEC_MODES 16

typedef struct bench_args {
    const char *model_dir, *config_file, *backend, *json, *plot, *trace, *phases;
    int synthetic;
    uint64_t synth_seed;
    const char *sets[MAX_SETS];
    int n_sets;
    int threads;
    int pp;                  // pipeline stages (0: run.pp)
    int levels[MAX_LEVELS], n_levels;
    int input_len, output_len;
    double range_ratio;
    int prompts_factor;
    uint64_t seed;
    int profile_steps;
    int profile_only; // the decode steps alone: no warm-up, no measured run
    int warmup;
    int help;
    // speculative decoding: draft, k, and the runs per level (the real draft, or the
    // controlled-acceptance oracle at rate alpha)
    const char *spec_draft;
    int spec_k;
    int n_spec_modes;
    int spec_oracle[MAX_SPEC_MODES];
    double spec_alpha[MAX_SPEC_MODES];
} bench_args;

static void usage(FILE *f) {
    fputs(
        "usage: mpirun -np N ./k25bench (--model DIR | --config FILE.ini --synthetic SEED) "
        "[options]\n"
        "\n"
        "Serving benchmark: random prompts, all requests sent at t=0 with at most C in flight,\n"
        "swept over concurrency levels C. Table on stdout, progress on stderr.\n"
        "\n"
        "model:\n"
        "  --model DIR             checkpoint directory (config.json + safetensors)\n"
        "  --config FILE.ini       model configuration (weights must then be synthetic)\n"
        "  --synthetic SEED        synthetic weights from SEED (also with --model: its config)\n"
        "  --set SECTION.KEY=V     override a configuration value (repeatable)\n"
        "  --backend cpu|cuda      default: the config's run.backend\n"
        "  --threads N             CPU backend threads (default: run.threads)\n"
        "  --pp P                  pipeline stages (default: run.pp): P stages of ranks / P\n"
        "                          consecutive tensor-parallel ranks (layers: run.pp_layers)\n"
        "workload:\n"
        "  --concurrency LIST      levels, e.g. 1,4,16 (default 1,2,4,...,256)\n"
        "  --input-len N           prompt tokens (default 1024)\n"
        "  --output-len N          generated tokens, EOS ignored (default 128)\n"
        "  --range-ratio R         lengths uniform in [L(1-R), L(1+R)] (default 0)\n"
        "  --num-prompts-factor K  requests per level = K x concurrency (default 5, at least 5)\n"
        "  --seed S                workload seed (default 0)\n"
        "  --no-warmup             skip the short warm-up run before each level\n"
        "  --profile-steps N       decode steps timed per operation group at each level after\n"
        "                          the measured run (default 3; 0: no breakdown)\n"
        "  --profile-only          only the decode steps of the whole batch and their breakdown\n"
        "                          (no warm-up, no measured run: seconds where a level takes\n"
        "                          minutes; for A/B timing of a change)\n"
        "speculative decoding (each level runs plain, then with drafts):\n"
        "  --spec-draft SRC        ngram[:N], model:DIR, model:FILE.ini[@SEED] or eagle3:DIR\n"
        "  --spec-k K              tokens drafted per step (default 3)\n"
        "  --spec-accept LIST      controlled acceptance, e.g. draft,0.5,0.8,1: for each number\n"
        "                          alpha a run whose drafts (computed for real by SRC) are then\n"
        "                          replaced by the plain run's token with probability alpha and\n"
        "                          by a wrong one otherwise (greedy only); 'draft' = SRC's\n"
        "                          own tokens (default: draft)\n"
        "output:\n"
        "  --json FILE             one JSON object per level (rewritten after each level)\n"
        "  --trace FILE.csv        every kernel of the breakdown's decode steps as served, with\n"
        "                          its start and end on the GPU (rank 0's GPU; CUDA builds;\n"
        "                          summary: bench/trace_summary.py FILE.csv)\n"
        "  --phases FILE.csv       the in-kernel phase stamps of the last layer of the\n"
        "                          breakdown's decode steps as served (a build with\n"
        "                          make PHASES=1; summary: bench/phases_summary.py FILE.csv)\n"
        "  --plot FILE.png         output tok/s and TPOT against concurrency (needs python3 +\n"
        "                          matplotlib; skipped with a message when missing)\n"
        "  -h, --help\n",
        f);
}

// ------------------------------------------------------------------------------------------
// Command line
// ------------------------------------------------------------------------------------------

static const char *const value_flags[] = {
    "--model",       "--config",      "--synthetic",     "--set",          "--backend",
    "--threads",     "--pp",          "--concurrency",   "--input-len",    "--output-len",
    "--range-ratio", "--num-prompts-factor", "--seed",   "--profile-steps", "--spec-draft",
    "--spec-k",      "--spec-accept", "--json",          "--plot",         "--trace",
    "--phases",      NULL};

static int parse_args(int argc, char **argv, bench_args *a, char *err) {
    memset(a, 0, sizeof *a);
    a->input_len = 1024;
    a->output_len = 128;
    a->prompts_factor = 5;
    a->profile_steps = 3;
    a->warmup = 1;
    for (int c = 1; c <= 256; c *= 2) a->levels[a->n_levels++] = c;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        long v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            a->help = 1;
            return 0;
        }
        if (!strcmp(f, "--no-warmup")) {
            a->warmup = 0;
            continue;
        }
        if (!strcmp(f, "--profile-only")) {
            a->profile_only = 1;
            continue;
        }
        if (!k25_is_one_of(f, value_flags))
            return k25_err(err, "unknown option '%s' (see --help)", f);
        if (i + 1 >= argc) return k25_err(err, "%s: missing value", f);
        const char *val = argv[++i];
        if (!strcmp(f, "--model")) {
            a->model_dir = val;
        } else if (!strcmp(f, "--config")) {
            a->config_file = val;
        } else if (!strcmp(f, "--synthetic")) {
            if (k25_parse_seed(val, &a->synth_seed))
                return k25_err(err, "--synthetic: '%s' is not a non-negative integer seed", val);
            a->synthetic = 1;
        } else if (!strcmp(f, "--set")) {
            if (a->n_sets == MAX_SETS) return k25_err(err, "--set: more than %d", MAX_SETS);
            a->sets[a->n_sets++] = val;
        } else if (!strcmp(f, "--backend")) {
            if (strcmp(val, "cpu") && strcmp(val, "cuda"))
                return k25_err(err, "--backend: '%s' is not cpu or cuda", val);
            a->backend = val;
        } else if (!strcmp(f, "--threads")) {
            if (k25_parse_long(val, 0, 4096, &v))
                return k25_err(err, "--threads: bad value '%s'", val);
            a->threads = (int)v;
        } else if (!strcmp(f, "--pp")) {
            if (k25_parse_long(val, 1, 4096, &v)) return k25_err(err, "--pp: bad value '%s'", val);
            a->pp = (int)v;
        } else if (!strcmp(f, "--concurrency")) {
            a->n_levels = 0;
            char buf[512];
            snprintf(buf, sizeof buf, "%s", val);
            for (char *rest = buf, *t; (t = strsep(&rest, ",")) != NULL;) { // "" items too
                if (a->n_levels == MAX_LEVELS)
                    return k25_err(err, "--concurrency: more than %d levels", MAX_LEVELS);
                if (k25_parse_long(t, 1, 256, &v))
                    return k25_err(err, "--concurrency: '%s' is not a level in 1..256", t);
                a->levels[a->n_levels++] = (int)v;
            }
        } else if (!strcmp(f, "--input-len")) {
            if (k25_parse_long(val, 1, 1 << 24, &v))
                return k25_err(err, "--input-len: bad '%s'", val);
            a->input_len = (int)v;
        } else if (!strcmp(f, "--output-len")) {
            if (k25_parse_long(val, 1, 1 << 24, &v))
                return k25_err(err, "--output-len: bad '%s'", val);
            a->output_len = (int)v;
        } else if (!strcmp(f, "--range-ratio")) {
            char *end;
            a->range_ratio = strtod(val, &end);
            if (end == val || *end || !(a->range_ratio >= 0 && a->range_ratio < 1))
                return k25_err(err, "--range-ratio: '%s' is not in [0, 1)", val);
        } else if (!strcmp(f, "--num-prompts-factor")) {
            if (k25_parse_long(val, 5, 1000, &v))
                return k25_err(err, "--num-prompts-factor: '%s' is not in 5..1000", val);
            a->prompts_factor = (int)v;
        } else if (!strcmp(f, "--seed")) {
            if (k25_parse_long(val, 0, LONG_MAX, &v)) return k25_err(err, "--seed: bad '%s'", val);
            a->seed = (uint64_t)v;
        } else if (!strcmp(f, "--profile-steps")) {
            if (k25_parse_long(val, 0, 1000, &v))
                return k25_err(err, "--profile-steps: bad '%s'", val);
            a->profile_steps = (int)v;
        } else if (!strcmp(f, "--spec-draft")) {
            a->spec_draft = val;
        } else if (!strcmp(f, "--spec-k")) {
            if (k25_parse_long(val, 1, K25_SPEC_MAX_K, &v))
                return k25_err(err, "--spec-k: '%s' is not in 1..%d", val, K25_SPEC_MAX_K);
            a->spec_k = (int)v;
        } else if (!strcmp(f, "--spec-accept")) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", val);
            a->n_spec_modes = 0;
            for (char *rest = buf, *t; (t = strsep(&rest, ",")) != NULL;) { // "" items too
                if (a->n_spec_modes == MAX_SPEC_MODES)
                    return k25_err(err, "--spec-accept: more than %d runs", MAX_SPEC_MODES);
                int m = a->n_spec_modes++;
                char *end;
                a->spec_oracle[m] = strcmp(t, "draft") != 0;
                a->spec_alpha[m] = a->spec_oracle[m] ? strtod(t, &end) : 0;
                if (a->spec_oracle[m] && (end == t || *end || !(a->spec_alpha[m] >= 0 &&
                                                                  a->spec_alpha[m] <= 1)))
                    return k25_err(err, "--spec-accept: '%s' is not 'draft' or a rate in [0, 1]",
                                   t);
            }
        } else if (!strcmp(f, "--json")) {
            a->json = val;
        } else if (!strcmp(f, "--plot")) {
            a->plot = val;
        } else if (!strcmp(f, "--trace")) {
            a->trace = val;
        } else if (!strcmp(f, "--phases")) {
            a->phases = val;
        }
    }
    if (!a->model_dir && !a->config_file)
        return k25_err(err, "no model: give --model DIR or --config FILE.ini --synthetic SEED");
    if (a->model_dir && a->config_file)
        return k25_err(err, "--model and --config both given: choose one");
    if (a->config_file && !a->synthetic)
        return k25_err(err, "--config %s has no weights: add --synthetic SEED", a->config_file);
    if ((a->spec_k || a->n_spec_modes) && !a->spec_draft)
        return k25_err(err, "--spec-k / --spec-accept need --spec-draft");
    if (a->profile_only && a->spec_draft)
        return k25_err(err, "--profile-only times plain decode steps: not with --spec-draft");
    if (a->profile_only && a->profile_steps == 0)
        return k25_err(err, "--profile-only with --profile-steps 0 would time nothing");
    if (a->profile_only && a->plot)
        return k25_err(err, "--plot draws the serving levels' rates and TPOT: --profile-only "
                            "runs none");
    if (a->trace && a->profile_steps == 0)
        return k25_err(err, "--trace records the breakdown's decode steps: not with "
                            "--profile-steps 0");
    if (a->phases && a->profile_steps == 0)
        return k25_err(err, "--phases reads the breakdown's decode steps: not with "
                            "--profile-steps 0");
    if (a->spec_draft && !a->spec_k) a->spec_k = 3;
    if (a->spec_draft && !a->n_spec_modes) a->n_spec_modes = 1; // the draft's own tokens
    return 0;
}

// ------------------------------------------------------------------------------------------
// Collective exits and small helpers
// ------------------------------------------------------------------------------------------

// Every rank brings its own ok; when any failed, rank 0 (or the failing rank) says why and every
// rank exits 1, so none is left waiting in a collective.
static void agree_or_exit(k25_dist *d, int ok, const char *msg) {
    dist_agree_or_exit(d, ok, "k25bench", msg);
}

// First line of a shell command's output (trailing newline removed); 0 when it printed one.
static int run_line(const char *cmd, char *out, size_t cap) {
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int got = fgets(out, (int)cap, p) != NULL;
    while (fgetc(p) != EOF) {
    }
    int rc = pclose(p);
    if (!got || rc != 0) {
        out[0] = 0;
        return -1;
    }
    out[strcspn(out, "\n")] = 0;
    return 0;
}

// Whole output of a shell command into a malloc'ed string (NULL when it failed).
static char *run_all(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t n = 0, cap = 4096;
    char *buf = k25_malloc(cap);
    int ch;
    while ((ch = fgetc(p)) != EOF) {
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
        K25_CHECK(buf, "out of host memory");
        buf[n++] = (char)ch;
    }
    buf[n] = 0;
    if (pclose(p) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

// Single-quoted for /bin/sh.
static void shell_quote(const char *s, char *out, size_t cap) {
    size_t n = 0;
    if (n + 1 < cap) out[n++] = '\'';
    for (; *s && n + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(out + n, "'\\''", 4);
            n += 4;
        } else {
            out[n++] = *s;
        }
    }
    if (n + 1 < cap) out[n++] = '\'';
    out[n] = 0;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Directory of this executable (for bench/plot.py and git), "." when unknown.
static void exe_dir(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) {
        snprintf(out, cap, ".");
        return;
    }
    out[n] = 0;
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
}

// ------------------------------------------------------------------------------------------
// The run description
// ------------------------------------------------------------------------------------------

typedef struct run_desc {
    char command[1024];
    char hosts[512];
    char devices[512];       // GPU names from nvidia-smi, else the CPU model
    char git[64];
    char nccl[32];
    char date[64];
    char backend[64];
    char model[512];
    char weights[512];
    int ranks, tp, pp;
    int sim_tp; // run.sim_tp: this rank times one rank's share of a tp = sim_tp run
} run_desc;

static void describe(run_desc *r, const bench_args *a, const k25_config *c, const k25_dist *d,
                     const k25_instance *in, int argc, char **argv) {
    memset(r, 0, sizeof *r);
    size_t n = 0;
    for (int i = 0; i < argc && n < sizeof r->command - 1; i++)
        n += (size_t)snprintf(r->command + n, sizeof r->command - n, "%s%s", i ? " " : "", argv[i]);

    // Host names of every rank, each once, in rank order.
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_CHECK(MPI_Get_processor_name(name, &len));
    char *all = k25_calloc((size_t)d->world_size, MPI_MAX_PROCESSOR_NAME);
    MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME,
                            MPI_CHAR, d->world));
    n = 0;
    for (int i = 0; i < d->world_size; i++) {
        const char *h = all + (size_t)i * MPI_MAX_PROCESSOR_NAME;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(h, all + (size_t)j * MPI_MAX_PROCESSOR_NAME);
        if (!seen && n < sizeof r->hosts - 1)
            n += (size_t)snprintf(r->hosts + n, sizeof r->hosts - n, "%s%s", n ? "," : "", h);
    }
    free(all);

    if (d->world_rank != 0) return; // the rest is only printed by rank 0

    // Devices: "8x NVIDIA H200" from nvidia-smi, else the CPU model.
    char *gpus = run_all("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null");
    if (gpus && gpus[0]) {
        int count = 0;
        char first[256] = "", *save = NULL;
        int same = 1;
        for (char *t = strtok_r(gpus, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
            if (!count) snprintf(first, sizeof first, "%s", t);
            else if (strcmp(first, t)) same = 0;
            count++;
        }
        if (same) snprintf(r->devices, sizeof r->devices, "%dx %s", count, first);
        else snprintf(r->devices, sizeof r->devices, "%d GPUs (mixed, first %s)", count, first);
    } else {
        char cpu[256] = "";
        if (run_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'", cpu,
                     sizeof cpu) != 0 || !cpu[0])
            snprintf(cpu, sizeof cpu, "unknown CPU");
        snprintf(r->devices, sizeof r->devices, "no GPU; %ld x %s", sysconf(_SC_NPROCESSORS_ONLN),
                 cpu);
    }
    free(gpus);

    char dir[PATH_MAX], q[PATH_MAX + 16], cmd[PATH_MAX + 128];
    exe_dir(dir, sizeof dir);
    shell_quote(dir, q, sizeof q);
    // "-dirty" when the tree that ran differs from its commit: the numbers then belong to
    // uncommitted code
    snprintf(cmd, sizeof cmd, "git -C %s describe --always --dirty --abbrev=7 2>/dev/null", q);
    if (run_line(cmd, r->git, sizeof r->git) != 0) snprintf(r->git, sizeof r->git, "unknown");

#ifdef K25_CUDA
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess)
        snprintf(r->nccl, sizeof r->nccl, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
#endif
    if (!r->nccl[0]) snprintf(r->nccl, sizeof r->nccl, "none");

    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(r->date, sizeof r->date, "%Y-%m-%dT%H:%M:%S%z", &tm);

    if (!strcmp(in->be->name, "cpu"))
        snprintf(r->backend, sizeof r->backend, c->threads > 0 ? "cpu (%d threads)" :
                 "cpu (threads: cores / ranks on the node)", c->threads);
    else
        snprintf(r->backend, sizeof r->backend, "%s", in->be->name);
    r->ranks = d->world_size;
    r->tp = d->tp_size;
    r->sim_tp = c->sim_tp > 1 ? c->sim_tp : 0;
    r->pp = d->pp_size;
    char quant[32];
    if (c->experts_int4) snprintf(quant, sizeof quant, "INT4 g%d", c->quant_group);
    else snprintf(quant, sizeof quant, "BF16");
    snprintf(r->model, sizeof r->model,
             "%d layers (%d dense), hidden %d, %d heads, kv_lora %d, experts %d top-%d + %d "
             "shared (%s), vocab %d",
             c->n_layers, c->first_dense, c->hidden, c->n_heads, c->kv_lora_rank, c->n_experts,
             c->top_k, c->n_shared, quant, c->vocab);
    double gib = (double)weights_bytes(&in->w) / (1024.0 * 1024.0 * 1024.0);
    if (a->synthetic)
        snprintf(r->weights, sizeof r->weights, "synthetic seed %llu%s%s, %.3f GiB per rank",
                 (unsigned long long)a->synth_seed, a->model_dir ? ", config " : "",
                 a->model_dir ? a->model_dir : "", gib);
    else
        snprintf(r->weights, sizeof r->weights, "checkpoint %s, %.3f GiB per rank", a->model_dir,
                 gib);
}

static void print_desc(const run_desc *r, const bench_args *a, const k25_config *c) {
    printf("# k25bench: %s\n", r->command);
    printf("# date: %s\n", r->date);
    printf("# hosts: %s\n", r->hosts);
    printf("# devices: %s\n", r->devices);
    printf("# ranks: %d (tp %d, pp %d), backend %s, nccl %s\n", r->ranks, r->tp, r->pp,
           r->backend, r->nccl);
    if (r->sim_tp && r->tp == 1)
        printf("# SIMULATED SHARD: one rank runs rank 0's share of tp %d (weights sliced for %d "
               "ranks, no all-reduce): per-rank work only, outputs are not the model's\n",
               r->sim_tp, r->sim_tp);
    else if (r->sim_tp)
        printf("# SIMULATED SHARD: %d TP ranks run ranks 0..%d's shares of tp %d (all-reduces "
               "across the %d): per-rank work of the larger run, outputs are not the model's\n",
               r->tp, r->tp - 1, r->sim_tp, r->tp);
    if (c->uniform_routing)
        printf("# UNIFORM ROUTING: every row's experts drawn uniformly (run.uniform_routing), not "
               "the router's: the spread of a load-balanced router, outputs are not the model's\n");
    if (r->pp > 1) {
        int *first = k25_malloc(sizeof(int) * (size_t)(r->pp + 1));
        char err[K25_ERR_LEN];
        if (pipeline_layout(c, r->pp, first, err) == 0)
            pipeline_print(stdout, "# pipeline ", c, r->pp, first, r->ranks);
        free(first);
    }
    printf("# git: %s\n", r->git);
    printf("# model: %s\n", r->model);
    printf("# weights: %s\n", r->weights);
    printf("# workload: random prompts, input %d, output %d (EOS ignored), range ratio %g, "
           "%d x concurrency requests per level, all sent at t=0, seed %llu\n",
           a->input_len, a->output_len, a->range_ratio, a->prompts_factor,
           (unsigned long long)a->seed);
    if (c->kv_cache_mb > 0)
        printf("# CACHE CAP: at most %d MiB of latent cache a rank (run.kv_cache_mb%s): requests "
               "may wait for cache blocks below the level's concurrency\n", c->kv_cache_mb,
               a->spec_draft ? ", the draft's included" : "");
    printf("# engine: ctx %d, kv_block %d, prefill_chunk %d, sampling temp %g top_k %d top_p %g%s\n",
           c->ctx_size, c->kv_block, c->prefill_chunk, (double)c->temp, c->sample_top_k,
           (double)c->sample_top_p,
           r->pp > 1 ? (c->pp_async ? ", pipelined steps (one sequence group per stage)"
                                    : ", steps through the stages one at a time")
                     : "");
    printf("# metrics: TTFT first token - send; TPOT (E2E - TTFT) / (out - 1); ITL gap between "
           "chunks (a step's tokens); E2E last token - send; ms; p50 = median\n");
    fflush(stdout);
}

// ------------------------------------------------------------------------------------------
// Checks before anything heavy starts
// ------------------------------------------------------------------------------------------

// Another process holding GPU memory skews every number: say it loudly (each node once).
static void check_gpus_free(const k25_dist *d) {
    if (d->local_rank != 0) return;
    char *apps = run_all("nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                         "--format=csv,noheader 2>/dev/null");
    if (!apps) {
        k25_log_all("k25bench: warning: nvidia-smi failed: cannot check that the GPUs are free\n");
        return;
    }
    if (apps[strspn(apps, " \n")] != 0) {
        char host[MPI_MAX_PROCESSOR_NAME];
        int len;
        MPI_CHECK(MPI_Get_processor_name(host, &len));
        fprintf(stderr,
                "\n"
                "k25bench: ************************************************************\n"
                "k25bench: WARNING: other processes hold GPU memory on %s:\n", host);
        char *save = NULL;
        for (char *t = strtok_r(apps, "\n", &save); t; t = strtok_r(NULL, "\n", &save))
            fprintf(stderr, "k25bench:   %s\n", t);
        fprintf(stderr,
                "k25bench: the numbers below will be skewed (memory and compute are shared)\n"
                "k25bench: ************************************************************\n\n");
    }
    free(apps);
}

// Finds bench/plot.py and checks python3 + matplotlib. 0 and the script path, or -1 (why in
// err).
static int find_plotter(char *script, size_t cap, char *err) {
    const char *env = getenv("K25_PLOT_PY");
    char dir[PATH_MAX];
    exe_dir(dir, sizeof dir);
    // Set by hand, beside the binary (repository root), one level up (a build directory).
    char beside[PATH_MAX + 32], above[PATH_MAX + 32];
    snprintf(beside, sizeof beside, "%s/bench/plot.py", dir);
    snprintf(above, sizeof above, "%s/../bench/plot.py", dir);
    const char *cands[4] = {env, beside, above, "bench/plot.py"};
    script[0] = 0;
    for (int i = 0; i < 4 && !script[0]; i++)
        if (cands[i] && access(cands[i], R_OK) == 0) snprintf(script, cap, "%s", cands[i]);
    if (!script[0]) return k25_err(err, "bench/plot.py not found (set K25_PLOT_PY)");
    char out[64];
    if (run_line("python3 -c 'import matplotlib' >/dev/null 2>&1 && echo yes", out, sizeof out) ||
        strcmp(out, "yes"))
        return k25_err(err, "python3 with matplotlib not found (pip install matplotlib)");
    return 0;
}

// ------------------------------------------------------------------------------------------
// Workload
// ------------------------------------------------------------------------------------------

typedef struct workload {
    int n;
    int32_t **prompt;        // [n][n_in[i]]
    int *n_in, *n_out;
} workload;

static void length_range(int L, double r, int *lo, int *hi) {
    *lo = (int)floor(L * (1 - r));
    *hi = (int)ceil(L * (1 + r));
    if (*lo < 1) *lo = 1;
    if (*hi < *lo) *hi = *lo;
}

// Ids below the lowest special token (BOS, EOS, PAD): plain text ids in Kimi's vocabulary
// layout (specials at the top) and bytes in the fallback tokenizer's.
static int n_plain_ids(const k25_config *c) {
    int n = c->vocab;
    if (c->bos_id > 0 && c->bos_id < n) n = c->bos_id;
    if (c->pad_id > 0 && c->pad_id < n) n = c->pad_id;
    for (int i = 0; i < c->eos_ids_n; i++)
        if (c->eos_ids[i] > 0 && c->eos_ids[i] < n) n = c->eos_ids[i];
    return n;
}

// The same on every rank: a pure function of (seed, level, request, position).
static void make_workload(workload *w, const bench_args *a, const k25_config *c, int level,
                          int n) {
    int in_lo, in_hi, out_lo, out_hi, ids = n_plain_ids(c);
    length_range(a->input_len, a->range_ratio, &in_lo, &in_hi);
    length_range(a->output_len, a->range_ratio, &out_lo, &out_hi);
    w->n = n;
    w->prompt = k25_calloc(n, sizeof *w->prompt);
    w->n_in = k25_calloc(n, sizeof(int));
    w->n_out = k25_calloc(n, sizeof(int));
    uint64_t base = mix64(a->seed ^ mix64((uint64_t)level));
    for (int i = 0; i < n; i++) {
        uint64_t h = mix64(base ^ mix64(0x100000000ull + (uint64_t)i));
        w->n_in[i] = in_lo + (int)(h % (uint64_t)(in_hi - in_lo + 1));
        w->n_out[i] = out_lo + (int)(mix64(h) % (uint64_t)(out_hi - out_lo + 1));
        w->prompt[i] = k25_malloc(sizeof(int32_t) * (size_t)w->n_in[i]);
        for (int j = 0; j < w->n_in[i]; j++)
            w->prompt[i][j] = (int32_t)(mix64(h ^ mix64((uint64_t)j + 1)) % (uint64_t)ids);
    }
}

static void free_workload(workload *w) {
    for (int i = 0; i < w->n; i++) free(w->prompt[i]);
    free(w->prompt);
    free(w->n_in);
    free(w->n_out);
    memset(w, 0, sizeof *w);
}

static void submit_all(k25_engine *e, const workload *w, const k25_config *c, int max_new_cap,
                       int n) {
    char err[K25_ERR_LEN];
    for (int i = 0; i < n; i++) {
        int max_new = w->n_out[i] < max_new_cap ? w->n_out[i] : max_new_cap;
        k25_request r = {
            .prompt = w->prompt[i],
            .n_prompt = w->n_in[i],
            .max_new = max_new,
            .sampling = {.temp = c->temp, .top_k = c->sample_top_k, .top_p = c->sample_top_p,
                         .seed = (uint64_t)c->seed + (uint64_t)i},
            .ignore_eos = 1,
        };
        if (engine_submit(e, &r, err) < 0) K25_DIE("%s", err);
    }
}

// ------------------------------------------------------------------------------------------
// One level
// ------------------------------------------------------------------------------------------

typedef struct level_result {
    k25_serve_metrics m;
    long steps;
    double mean_decode_rows, mean_rows;
    unsigned long long mem_peak;       // max over ranks
    int have_profile;
    int prof_batch, prof_steps, prof_ctx;
    double prof_step_ms;
    double graph_step_ms;              // the same steps unprofiled, as served (0: none ran)
    double prof_ms[K25_OPG_N];         // per step
    struct spec_run *spec;             // [n_spec] speculative runs of the level
    int n_spec;
} level_result;

// Every engine on the model uses the model's slot count as its block-table height, so the
// batch geometry the backend sees never changes between levels.
static int model_slots;

// Speculative decoding (set by main when --spec-draft is given): rows each decoding sequence
// may need, the spec measure() attaches, where measure() copies the tokens of each request
// (the oracle's reference), and the model_step time of the last measured run.
static int rows_per_seq = 1;
// Prompt rows a step may hold: run.prefill_chunk, or every prompt of the largest level when
// those are fewer (no step can fill more).
static int chunk_rows;
static k25_spec *bench_spec;
static int32_t **keep_tokens;
static double measured_step_ms;
static const char *spec_kind = "";
static cJSON *spec_json(const level_result *res, const bench_args *a);

static k25_engine *new_engine(k25_model *m, const k25_config *c, int conc, int prefill_first) {
    char err[K25_ERR_LEN];
    k25_engine_opts o;
    engine_opts_from_config(c, &o);
    o.max_batch = conc;
    o.max_seqs = model_slots;
    o.prefill_chunk = chunk_rows;
    o.max_rows = conc * rows_per_seq + chunk_rows;
    o.prefill_first = prefill_first;
    // the breakdown times steps of every sequence together: no pipelined groups there
    if (prefill_first) o.pp_async = 0;
    k25_engine *e = engine_create(m, c, &o, err);
    if (!e) K25_DIE("%s", err);
    return e;
}

// Set on the rank that traces kernels (--trace): the unprofiled decode steps are marked.
static int tracing;
// Where that rank writes the phase stamps after the unprofiled decode steps (--phases), or NULL.
static const char *phases_path;

// Set when a signal stopped the sweep (at the same step on every rank).
static int bench_stopped;

// One engine step, then whether to go on: the engine has work, the step made progress, and no
// rank has seen SIGINT/SIGTERM. The signal check is a collective of one int per step (mpirun
// kills the ranks about a second after forwarding a signal: the stop must come sooner).
static int step_on(k25_engine *e, const k25_dist *d) {
    if (!engine_busy(e) || !engine_step(e)) return 0;
    if (stop_signal_any(d)) bench_stopped = 1;
    return !bench_stopped;
}

// Short requests through a fresh engine: first-use costs (allocations, kernel selection) stay
// out of the measured run.
static void warm_up(k25_model *m, const k25_config *c, const workload *w, int conc,
                    const k25_dist *d) {
    k25_engine *e = new_engine(m, c, conc, 0);
    if (bench_spec) engine_set_spec(e, bench_spec);
    workload s = *w;
    int n = conc < w->n ? conc : w->n;
    int *n_in = k25_malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) n_in[i] = w->n_in[i] < 32 ? w->n_in[i] : 32;
    s.n_in = n_in;
    submit_all(e, &s, c, 4, n);
    while (step_on(e, d)) {
    }
    engine_free(e);
    free(n_in);
}

// The measured run: every request at t = 0, at most conc in flight.
static void measure(k25_model *m, const k25_config *c, const workload *w, int conc,
                    const k25_dist *d, level_result *res) {
    k25_engine *e = new_engine(m, c, conc, 0);
    if (bench_spec) engine_set_spec(e, bench_spec);
    MPI_CHECK(MPI_Barrier(d->world));
    submit_all(e, w, c, INT_MAX, w->n);
    double t0 = k25_now_ms(), t_report = t0;
    long decode_rows = 0, rows = 0;
    measured_step_ms = 0;
    while (step_on(e, d)) {
        const k25_step_info *si = engine_last_step(e);
        measured_step_ms += si->ms;
        decode_rows += si->n_decode;
        rows += si->n_decode + si->n_prefill;
        double now = k25_now_ms();
        if (now - t_report > 10000) {
            int done = 0;
            for (int i = 0; i < w->n; i++) done += engine_record(e, i)->finish != K25_FINISH_NONE;
            k25_log("k25bench: concurrency %d: %d/%d requests done, %.0f s\n", conc, done, w->n,
                    (now - t0) / 1000);
            t_report = now;
        }
    }
    if (bench_stopped) { // unfinished requests: no metrics
        engine_free(e);
        return;
    }
    const k25_seq_record **recs = k25_malloc(sizeof *recs * (size_t)w->n);
    for (int i = 0; i < w->n; i++) recs[i] = engine_record(e, i);
    serve_metrics(recs, w->n, t0, conc, &res->m);
    free(recs);
    res->steps = engine_steps(e);
    res->mean_decode_rows = res->steps ? (double)decode_rows / res->steps : 0;
    res->mean_rows = res->steps ? (double)rows / res->steps : 0;
    for (int i = 0; keep_tokens && i < w->n; i++) {
        const k25_seq_record *r = engine_record(e, i);
        keep_tokens[i] = k25_malloc(sizeof(int32_t) * (size_t)(r->n_tokens + 1));
        memcpy(keep_tokens[i], r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
        keep_tokens[i][r->n_tokens] = -1;
    }
    engine_free(e);
}

// Tokens each sequence of the breakdown generates: the prefill's token, then twice one untimed
// decode step and `steps` timed ones.
static int profile_tokens(int steps) { return 2 * steps + 3; }

// Runs engine steps until `steps` of them decoded all n sequences and prefilled nothing, after
// one such step untimed (the first after prefill or after a change of step mode). Returns how
// many were timed; *ms gets their total time and, when groups is given, the operation
// profile's per-group times of those same steps are added to it (the profile accumulates over
// every step: taken after each). Without groups (the steps as served) the kernel trace, when
// on, marks the timed steps.
static int time_full_decode_steps(k25_engine *e, int n, int steps, const k25_dist *d, double *ms,
                                  double groups[K25_OPG_N]) {
    double g[K25_OPG_N];
    int seen = 0, timed = 0;
    *ms = 0;
    while (timed < steps) {
        if (tracing && !groups) kernel_trace_step_begin();
        if (!step_on(e, d)) break;
        if (groups) op_profile_take(g);
        const k25_step_info *si = engine_last_step(e);
        if (si->n_prefill != 0 || si->n_decode != n) continue;
        if (seen++ == 0) continue;
        if (tracing && !groups) kernel_trace_step_end(n);
        for (int k = 0; groups && k < K25_OPG_N; k++) groups[k] += g[k];
        *ms += si->ms;
        timed++;
    }
    return timed;
}

// Full decode steps of conc sequences at the level's prompt length, all prefilled first: first
// `steps` as the serving run executes them (graphs, no syncs inside), which gives the decode
// rate with no prefill mixed in, then `steps` more with every operation group timed.
static void profile(k25_instance *in, const k25_config *c, const workload *w, int conc,
                    int steps, const k25_dist *d, level_result *res) {
    k25_engine *e = new_engine(in->m, c, conc, 1);
    int n = conc < w->n ? conc : w->n;
    // as many tokens as both timings need, whatever the workload's output length
    workload s = *w;
    int *n_out = k25_malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) n_out[i] = profile_tokens(steps);
    s.n_out = n_out;
    submit_all(e, &s, c, INT_MAX, n);
    free(n_out);
    double graph_ms, step_ms, sum[K25_OPG_N] = {0};
    int graph_steps = time_full_decode_steps(e, n, steps, d, &graph_ms, NULL);
    char err[K25_ERR_LEN];
    if (phases_path && kernel_phases_write(phases_path, n, err) != 0) {
        k25_log("k25bench: %s: no more phase stamps are written\n", err);
        phases_path = NULL;
    }
    res->graph_step_ms = graph_steps ? graph_ms / graph_steps : 0;
    op_profile_install(in->be);
    int timed = time_full_decode_steps(e, n, steps, d, &step_ms, sum), ctx = 0;
    op_profile_remove(in->be);
    for (int i = 0; i < n; i++) ctx += w->n_in[i];
    engine_free(e);
    if (!timed) return;
    res->have_profile = 1;
    res->prof_batch = n;
    res->prof_steps = timed;
    res->prof_ctx = ctx / n;
    res->prof_step_ms = step_ms / timed;
    double named = 0;
    for (int g = 0; g < K25_OPG_N; g++) {
        res->prof_ms[g] = sum[g] / timed;
        if (g != K25_OPG_OTHER) named += res->prof_ms[g];
    }
    // Whatever the operations do not cover (host work in model_step) counts as other.
    double rest = res->prof_step_ms - named;
    res->prof_ms[K25_OPG_OTHER] = rest > 0 ? rest : 0;
    if (res->prof_step_ms < named) res->prof_step_ms = named;
}

// ------------------------------------------------------------------------------------------
// Output
// ------------------------------------------------------------------------------------------

static const char *const COLS[] = {
    "conc", "reqs", "in tok", "out tok", "dur s", "out tok/s", "total tok/s", "req/s",
    "TTFT ms", "TTFT p50", "TTFT p99", "TPOT ms", "TPOT p50", "TPOT p99",
    "ITL ms", "ITL p50", "ITL p99", "E2E ms", "E2E p50", "E2E p99", "mem GiB",
};
#define N_COLS (int)(sizeof COLS / sizeof COLS[0])
static int col_w[N_COLS];

static void print_table_head(void) {
    for (int i = 0; i < N_COLS; i++) {
        col_w[i] = (int)strlen(COLS[i]);
        if (col_w[i] < 8) col_w[i] = 8;
    }
    printf("|");
    for (int i = 0; i < N_COLS; i++) printf(" %*s |", col_w[i], COLS[i]);
    printf("\n|");
    for (int i = 0; i < N_COLS; i++) {
        printf(" ");
        for (int k = 0; k < col_w[i] - 1; k++) putchar('-');
        printf(": |"); // right-aligned numbers
    }
    printf("\n");
    fflush(stdout);
}

static void print_table_row(const level_result *r) {
    const k25_serve_metrics *m = &r->m;
    char cell[N_COLS][32];
    int i = 0;
    snprintf(cell[i++], 32, "%d", m->concurrency);
    snprintf(cell[i++], 32, "%d", m->n_completed);
    snprintf(cell[i++], 32, "%ld", m->in_tokens);
    snprintf(cell[i++], 32, "%ld", m->out_tokens);
    snprintf(cell[i++], 32, "%.2f", m->duration_s);
    snprintf(cell[i++], 32, "%.2f", m->out_tok_per_s);
    snprintf(cell[i++], 32, "%.2f", m->total_tok_per_s);
    snprintf(cell[i++], 32, "%.3f", m->req_per_s);
    const k25_stat *st[4] = {&m->ttft_ms, &m->tpot_ms, &m->itl_ms, &m->e2el_ms};
    for (int k = 0; k < 4; k++) {
        snprintf(cell[i++], 32, "%.2f", st[k]->mean);
        snprintf(cell[i++], 32, "%.2f", st[k]->median);
        snprintf(cell[i++], 32, "%.2f", st[k]->p99);
    }
    snprintf(cell[i++], 32, "%.3f", (double)r->mem_peak / (1024.0 * 1024.0 * 1024.0));
    printf("|");
    for (int k = 0; k < N_COLS; k++) printf(" %*s |", col_w[k], cell[k]);
    printf("\n");
    fflush(stdout);
}

// Tokens per second of full-batch decode steps alone: one token per sequence and step.
static double graph_tok_s(const level_result *r) {
    return r->graph_step_ms > 0 ? 1000.0 * r->prof_batch / r->graph_step_ms : 0;
}

static void print_profile_table(const level_result *res, int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= res[i].have_profile;
    if (!any) return;
    printf("\n# decode steps of the whole batch, no prefill: 'decode ms' and 'decode tok/s' as "
           "served (no syncs added), then by operation group (%% of the step; every operation "
           "synced and timed alone, no graphs: shares, not absolute speed)\n");
    printf("| conc | ctx | decode ms | decode tok/s | step ms |");
    for (int g = 0; g < K25_OPG_N; g++) printf(" %9s |", k25_op_group_names[g]);
    printf("\n| ---: | --: | --------: | -----------: | ------: |");
    for (int g = 0; g < K25_OPG_N; g++) printf(" --------: |");
    printf("\n");
    for (int i = 0; i < n; i++) {
        const level_result *r = &res[i];
        if (!r->have_profile) continue;
        printf("| %4d | %3d | %9.2f | %12.1f | %7.2f |", r->prof_batch, r->prof_ctx,
               r->graph_step_ms, graph_tok_s(r), r->prof_step_ms);
        for (int g = 0; g < K25_OPG_N; g++)
            printf(" %8.1f%% |", r->prof_step_ms > 0 ? 100 * r->prof_ms[g] / r->prof_step_ms : 0);
        printf("\n");
    }
    fflush(stdout);
}

static void add_stat(cJSON *o, const char *name, const k25_stat *s) {
    char key[64];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->mean);
    snprintf(key, sizeof key, "median_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->median);
    snprintf(key, sizeof key, "p99_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->p99);
    snprintf(key, sizeof key, "std_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->std);
}

// One level as one JSON line (field names as vllm bench serve's result file where they exist).
static char *level_json(const level_result *r, const run_desc *d, const bench_args *a,
                        const k25_config *c) {
    const k25_serve_metrics *m = &r->m;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "bench", "k25bench");
    cJSON_AddStringToObject(o, "date", d->date);
    cJSON_AddStringToObject(o, "git", d->git);
    cJSON_AddStringToObject(o, "hosts", d->hosts);
    cJSON_AddStringToObject(o, "devices", d->devices);
    cJSON_AddNumberToObject(o, "ranks", d->ranks);
    cJSON_AddNumberToObject(o, "tp", d->tp);
    cJSON_AddNumberToObject(o, "pp", d->pp);
    if (d->sim_tp) cJSON_AddNumberToObject(o, "sim_tp", d->sim_tp);
    if (c->uniform_routing) cJSON_AddTrueToObject(o, "uniform_routing");
    cJSON_AddStringToObject(o, "backend", d->backend);
    cJSON_AddStringToObject(o, "nccl", d->nccl);
    cJSON_AddStringToObject(o, "model", d->model);
    cJSON_AddStringToObject(o, "weights", d->weights);
    cJSON_AddStringToObject(o, "command", d->command);
    cJSON_AddNumberToObject(o, "ctx_size", c->ctx_size);
    cJSON_AddNumberToObject(o, "kv_block", c->kv_block);
    cJSON_AddNumberToObject(o, "kv_cache_mb", c->kv_cache_mb);
    cJSON_AddNumberToObject(o, "prefill_chunk", c->prefill_chunk);
    if (d->pp > 1) cJSON_AddNumberToObject(o, "pp_async", c->pp_async);
    cJSON_AddNumberToObject(o, "input_len", a->input_len);
    cJSON_AddNumberToObject(o, "output_len", a->output_len);
    cJSON_AddNumberToObject(o, "range_ratio", a->range_ratio);
    cJSON_AddNumberToObject(o, "seed", (double)a->seed);
    if (a->profile_only) { // no measured run: no serving metrics
        cJSON_AddTrueToObject(o, "profile_only");
    } else {
        cJSON_AddNumberToObject(o, "max_concurrency", m->concurrency);
        cJSON_AddNumberToObject(o, "num_prompts", m->n_requests);
        cJSON_AddNumberToObject(o, "completed", m->n_completed);
        cJSON_AddNumberToObject(o, "total_input_tokens", (double)m->in_tokens);
        cJSON_AddNumberToObject(o, "total_output_tokens", (double)m->out_tokens);
        cJSON_AddNumberToObject(o, "duration", m->duration_s);
        cJSON_AddNumberToObject(o, "request_throughput", m->req_per_s);
        cJSON_AddNumberToObject(o, "output_throughput", m->out_tok_per_s);
        cJSON_AddNumberToObject(o, "total_token_throughput", m->total_tok_per_s);
        add_stat(o, "ttft", &m->ttft_ms);
        add_stat(o, "tpot", &m->tpot_ms);
        add_stat(o, "itl", &m->itl_ms);
        add_stat(o, "e2el", &m->e2el_ms);
        cJSON_AddNumberToObject(o, "engine_steps", (double)r->steps);
        cJSON_AddNumberToObject(o, "mean_decode_rows", r->mean_decode_rows);
        cJSON_AddNumberToObject(o, "mean_rows", r->mean_rows);
    }
    cJSON_AddNumberToObject(o, "peak_mem_bytes", (double)r->mem_peak);
    if (r->n_spec) cJSON_AddItemToObject(o, "speculative", spec_json(r, a));
    if (r->have_profile) {
        cJSON *p = cJSON_AddObjectToObject(o, "decode_profile");
        cJSON_AddNumberToObject(p, "batch", r->prof_batch);
        cJSON_AddNumberToObject(p, "context", r->prof_ctx);
        cJSON_AddNumberToObject(p, "steps", r->prof_steps);
        cJSON_AddNumberToObject(p, "step_ms", r->prof_step_ms);
        cJSON_AddNumberToObject(p, "graph_step_ms", r->graph_step_ms);
        cJSON_AddNumberToObject(p, "decode_tok_s", graph_tok_s(r));
        cJSON *ms = cJSON_AddObjectToObject(p, "ms");
        for (int g = 0; g < K25_OPG_N; g++)
            cJSON_AddNumberToObject(ms, k25_op_group_names[g], r->prof_ms[g]);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

// The JSON lines of the levels so far: rewritten whole (PATH.tmp, renamed) after every level,
// so that a stopped sweep leaves the finished levels. A target written in place (a pipe, a
// device) is opened once, into *live, and gets each new line: reopening a pipe per level
// would hand its reader an end of file after the first. live NULL: a plain file only.
static int write_json(k25_out_file *live, const char *path, char **lines, int n, int *n_written,
                      char *err) {
    if (!live || !live->f) {
        k25_out_file o;
        if (out_file_open(&o, path, "--json", 0, err)) return -1;
        if (live && out_file_in_place(&o)) {
            *live = o;
        } else {
            for (int i = 0; i < n; i++) fprintf(o.f, "%s\n", lines[i]);
            if (out_file_commit(&o, err)) return -1;
            *n_written = n;
            return 0;
        }
    }
    for (int i = *n_written; i < n; i++) fprintf(live->f, "%s\n", lines[i]);
    char why[K25_ERR_LEN];
    if (k25_flush_check(live->f, live->path, why)) return k25_err(err, "--json: %s", why);
    *n_written = n;
    return 0;
}

// 0 when the plot was written; -1 with why in err.
static int make_plot(const char *script, const char *json, const char *png, char *err) {
    char qs[PATH_MAX + 16], qj[PATH_MAX + 16], qp[PATH_MAX + 16], cmd[3 * PATH_MAX + 64];
    shell_quote(script, qs, sizeof qs);
    shell_quote(json, qj, sizeof qj);
    shell_quote(png, qp, sizeof qp);
    snprintf(cmd, sizeof cmd, "python3 %s --out %s %s", qs, qp, qj);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        return k25_err(err, "--plot %s: plotting failed (%s: %s %d)", png, cmd,
                       rc != -1 && WIFSIGNALED(rc) ? "signal" : "exit status",
                       rc == -1 ? -1 : WIFSIGNALED(rc) ? WTERMSIG(rc) : WEXITSTATUS(rc));
    k25_log("k25bench: plot written to %s\n", png);
    return 0;
}

// ------------------------------------------------------------------------------------------
// Speculative decoding: the level's workload again with drafts, against the plain run
// ------------------------------------------------------------------------------------------

typedef struct spec_run {
    int oracle;                        // controlled acceptance at rate alpha, else the draft
    double alpha;
    k25_serve_metrics m;
    k25_spec_stats st;
    double step_ms;                    // model_step time of the run (the target's steps)
} spec_run;

// The plain run's token of request id at index (-1 past its end).
static int32_t ref_token(void *ctx, int id, int index) {
    int32_t *const *ref = ctx;
    for (int i = 0; i <= index; i++)
        if (ref[id][i] < 0) return -1;
    return ref[id][index];
}

// Tokens per verification a draft accepting each token with probability alpha reaches:
// (1 - alpha^(k+1)) / (1 - alpha) (../shared/PERF.md §7).
static double expected_len(double alpha, int k) {
    return alpha >= 1 ? k + 1 : (1 - pow(alpha, k + 1)) / (1 - alpha);
}

static void spec_level(const bench_args *a, k25_spec *sp, k25_model *m, const k25_config *c,
                       const workload *w, int conc, const k25_dist *d, int32_t **ref,
                       level_result *res) {
    res->n_spec = a->n_spec_modes;
    res->spec = k25_calloc((size_t)res->n_spec, sizeof(spec_run));
    bench_spec = sp;
    for (int i = 0; i < res->n_spec; i++) {
        spec_run *r = &res->spec[i];
        r->oracle = a->spec_oracle[i];
        r->alpha = a->spec_alpha[i];
        spec_set_oracle(sp, r->alpha, r->oracle ? ref_token : NULL, ref);
        if (a->warmup) warm_up(m, c, w, conc, d);
        spec_reset_stats(sp);
        level_result lr = {0};
        if (!bench_stopped) measure(m, c, w, conc, d, &lr);
        if (bench_stopped) {
            res->n_spec = i;
            break;
        }
        r->m = lr.m;
        r->st = *spec_stats(sp);
        r->step_ms = measured_step_ms;
        char what[64];
        if (r->oracle) snprintf(what, sizeof what, "oracle alpha %.2f", r->alpha);
        else snprintf(what, sizeof what, "draft");
        k25_log("k25bench: concurrency %d, speculative (%s): %.2f out tok/s, accepted length "
                "%.2f\n", conc, what, r->m.out_tok_per_s,
                r->st.rounds ? (double)r->st.emitted / r->st.rounds : 0.0);
    }
    spec_set_oracle(sp, 0, NULL, NULL);
    bench_spec = NULL;
}

static double accept_len(const spec_run *r) {
    return r->st.rounds ? (double)r->st.emitted / r->st.rounds : 0;
}
static double draft_pct(const spec_run *r) {
    double t = r->st.draft_ms + r->step_ms;
    return t > 0 ? 100 * r->st.draft_ms / t : 0;
}

static void print_spec_table(const level_result *res, int n, const bench_args *a) {
    const char *kind = spec_kind;
    printf("\n# speculative decoding: draft %s (%s), k %d; speedup = spec / plain output tok/s; "
           "accept len = tokens per verification (bonus included), expected = (1-a^(k+1))/(1-a) "
           "for oracle runs; draft %% = draft time / (draft + target step time)\n",
           a->spec_draft, kind, a->spec_k);
    printf("| conc | run | plain tok/s | spec tok/s | speedup | plain TPOT | spec TPOT | "
           "accept len | expected | draft %% |\n");
    printf("| ---: | :-- | ----------: | ---------: | ------: | ---------: | --------: | "
           "---------: | -------: | ------: |\n");
    for (int i = 0; i < n; i++)
        for (int j = 0; j < res[i].n_spec; j++) {
            const spec_run *r = &res[i].spec[j];
            char run[32], exp[32];
            if (r->oracle) {
                snprintf(run, sizeof run, "oracle %.2f", r->alpha);
                snprintf(exp, sizeof exp, "%.2f", expected_len(r->alpha, a->spec_k));
            } else {
                snprintf(run, sizeof run, "draft");
                snprintf(exp, sizeof exp, "-");
            }
            double plain = res[i].m.out_tok_per_s;
            printf("| %4d | %-11s | %11.2f | %10.2f | %6.2fx | %10.2f | %9.2f | %10.2f | %8s | "
                   "%6.1f%% |\n", res[i].m.concurrency, run, plain, r->m.out_tok_per_s,
                   plain > 0 ? r->m.out_tok_per_s / plain : 0, res[i].m.tpot_ms.mean,
                   r->m.tpot_ms.mean, accept_len(r), exp, draft_pct(r));
        }
    fflush(stdout);
}

static cJSON *spec_json(const level_result *res, const bench_args *a) {
    const char *kind = spec_kind;
    cJSON *arr = cJSON_CreateArray();
    for (int j = 0; j < res->n_spec; j++) {
        const spec_run *r = &res->spec[j];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "draft", a->spec_draft);
        cJSON_AddStringToObject(o, "draft_kind", kind);
        cJSON_AddNumberToObject(o, "k", a->spec_k);
        cJSON_AddStringToObject(o, "mode", r->oracle ? "oracle" : "draft");
        if (r->oracle) {
            cJSON_AddNumberToObject(o, "alpha", r->alpha);
            cJSON_AddNumberToObject(o, "expected_accept_len", expected_len(r->alpha, a->spec_k));
        }
        cJSON_AddNumberToObject(o, "output_throughput", r->m.out_tok_per_s);
        cJSON_AddNumberToObject(o, "total_token_throughput", r->m.total_tok_per_s);
        cJSON_AddNumberToObject(o, "speedup", res->m.out_tok_per_s > 0
                                                  ? r->m.out_tok_per_s / res->m.out_tok_per_s : 0);
        add_stat(o, "tpot", &r->m.tpot_ms);
        add_stat(o, "ttft", &r->m.ttft_ms);
        add_stat(o, "itl", &r->m.itl_ms);
        cJSON_AddNumberToObject(o, "duration", r->m.duration_s);
        cJSON_AddNumberToObject(o, "mean_accept_len", accept_len(r));
        cJSON_AddNumberToObject(o, "rounds", (double)r->st.rounds);
        cJSON_AddNumberToObject(o, "drafted", (double)r->st.drafted);
        cJSON_AddNumberToObject(o, "accepted", (double)r->st.accepted);
        cJSON_AddNumberToObject(o, "draft_ms", r->st.draft_ms);
        cJSON_AddNumberToObject(o, "target_step_ms", r->step_ms);
        cJSON_AddNumberToObject(o, "draft_pct", draft_pct(r));
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

// ------------------------------------------------------------------------------------------
// Main
// ------------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    k25_prog = "k25bench";
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN] = "";
    bench_args a;
    if (parse_args(argc, argv, &a, err) != 0) {
        if (d.world_rank == 0) fprintf(stderr, "k25bench: error: %s\n", err);
        dist_finalize(&d);
        return 2;
    }
    if (a.help) {
        if (d.world_rank == 0) usage(stdout);
        dist_finalize(&d);
        return 0;
    }

    // ---- configuration ----
    k25_config cfg;
    config_init_defaults(&cfg);
    int ok = 1;
    if (a.model_dir) {
        char path[PATH_MAX];
        struct stat st;
        if (stat(a.model_dir, &st) != 0 || !S_ISDIR(st.st_mode))
            ok = k25_err(err, "--model %s: not a directory", a.model_dir) == 0;
        snprintf(path, sizeof path, "%s/config.json", a.model_dir);
        if (ok) ok = config_load_hf_json(&cfg, path, err) == 0;
    } else {
        ok = config_load_ini(&cfg, a.config_file, err) == 0;
    }
    for (int i = 0; ok && i < a.n_sets; i++) ok = config_set(&cfg, a.sets[i], err) == 0;
    if (ok && a.backend) snprintf(cfg.backend, sizeof cfg.backend, "%s", a.backend);
    if (ok && a.threads) cfg.threads = a.threads;
    if (ok && a.pp) cfg.pp = a.pp;

    // Every sequence of the largest level must fit: context and cache sized for it.
    int in_lo, in_hi, out_lo, out_hi, max_conc = 0;
    length_range(a.input_len, a.range_ratio, &in_lo, &in_hi);
    length_range(a.output_len, a.range_ratio, &out_lo, &out_hi);
    for (int i = 0; i < a.n_levels; i++) max_conc = a.levels[i] > max_conc ? a.levels[i] : max_conc;
    const int prof_need = a.profile_steps > 0 ? profile_tokens(a.profile_steps) : 0;
    int out_need = out_hi > prof_need ? out_hi : prof_need;
    if (ok && in_hi + out_need > cfg.max_pos)
        ok = k25_err(err, "input %d + output %d tokens%s exceed max_position_embeddings %d",
                     in_hi, out_need,
                     out_need > out_hi ? " (the breakdown's decode steps)" : "", cfg.max_pos) == 0;
    // A run.ctx_size set past max_position_embeddings is the configuration's to name
    if (ok && in_hi + out_need > cfg.ctx_size) cfg.ctx_size = in_hi + out_need;
    if (ok) ok = config_validate(&cfg, err) == 0;
    for (int i = 0; ok && a.spec_draft && i < a.n_spec_modes; i++)
        if (a.spec_oracle[i] && cfg.temp > 0)
            ok = k25_err(err, "--spec-accept: controlled acceptance needs greedy decoding "
                              "(run.temp = 0)") == 0;
#ifndef K25_CUDA
    if (ok && !strcmp(cfg.backend, "cuda"))
        ok = k25_err(err, "backend cuda: this binary was built without CUDA (make CUDA=1)") == 0;
#endif
    agree_or_exit(&d, ok, err);
    agree_or_exit(&d, instance_setup_dist(&d, &cfg, err) == 0, err);

    // ---- checks before loading ----
    char plot_script[PATH_MAX] = "";
    int do_plot = 0;
    if (d.world_rank == 0) {
        if (a.json) ok = out_file_check(a.json, "--json", 0, err) == 0;
        if (ok && a.plot) ok = out_file_check(a.plot, "--plot", 0, err) == 0;
        if (ok && a.trace) ok = out_file_check(a.trace, "--trace", 0, err) == 0;
        if (ok && a.phases) ok = out_file_check(a.phases, "--phases", 0, err) == 0;
        if (ok && a.phases) ok = kernel_phases_built(err) == 0;
        const char *outs[][2] = {{"--json", a.json}, {"--plot", a.plot}, {"--trace", a.trace},
                                 {"--phases", a.phases}};
        for (int i = 0; ok && i < 4; i++)
            for (int j = i + 1; ok && j < 4; j++)
                if (outs[i][1] && outs[j][1] && out_file_same(outs[i][1], outs[j][1]))
                    ok = k25_err(err, "%s and %s name one file (%s): each needs its own",
                                 outs[i][0], outs[j][0], outs[j][1]) == 0;
        if (ok && a.plot) {
            char why[K25_ERR_LEN];
            do_plot = find_plotter(plot_script, sizeof plot_script, why) == 0;
            if (!do_plot) k25_log("k25bench: %s: the run goes on without a plot\n", why);
        }
    }
    if (ok && a.trace && strcmp(cfg.backend, "cuda"))
        ok = k25_err(err, "--trace records GPU kernels: needs --backend cuda") == 0;
    if (ok && a.phases && strcmp(cfg.backend, "cuda"))
        ok = k25_err(err, "--phases reads GPU kernels' stamps: needs --backend cuda") == 0;
    // before the backend exists, so that its context is traced from its start
    if (ok && a.trace && d.world_rank == 0) ok = kernel_trace_start(err) == 0;
    tracing = ok && a.trace && d.world_rank == 0;
    if (ok && a.phases && d.world_rank == 0) {
        // The run's stamps are appended to an empty file (truncated, not removed: it may be a
        // device or a link).
        FILE *f = fopen(a.phases, "w");
        if (f) fclose(f);
        phases_path = a.phases;
    }
    agree_or_exit(&d, ok, err);
    if (!strcmp(cfg.backend, "cuda")) check_gpus_free(&d);

    // ---- model: slots and rows for the largest level, cache for all its sequences ----
    // A step prefills at most every prompt of the largest level: rows past that never fill (the
    // steps are the same), and a run.prefill_chunk far above it (up to 2^24) sized buffers for
    // them past any memory
    const int64_t all_prompts = (int64_t)max_conc * in_hi;
    chunk_rows = cfg.prefill_chunk < all_prompts ? cfg.prefill_chunk : (int)all_prompts;
    if (chunk_rows < cfg.prefill_chunk)
        k25_log("k25bench: run.prefill_chunk %d: steps hold at most the largest level's prompts, "
                "%d rows, and the buffers are sized for those\n", cfg.prefill_chunk, chunk_rows);
    int kvb = cfg.kv_block;
    int per_seq = (in_hi + out_need - 1 + kvb - 1) / kvb;
    // Past int, instance_open refuses the block table with a message naming the settings: the
    // count must not overflow on its way there
    const int64_t blocks = (int64_t)max_conc * per_seq;
    const int all_blocks = blocks < INT_MAX ? (int)blocks : INT_MAX;
    k25_instance_opts io = {
        .model_dir = a.synthetic ? NULL : a.model_dir,
        .synth_seed = a.synth_seed,
        .backend = cfg.backend,
        .threads = cfg.threads,
        .model = {.max_seqs = max_conc, .max_rows = max_conc + chunk_rows,
                  .kv_block = kvb, .n_blocks = all_blocks},
        .kv_cache_mb = cfg.kv_cache_mb,
    };
    // Under run.kv_cache_mb requests wait for free blocks, but the longest must fit on its own,
    // and the breakdown decodes the whole batch at once (fewer in flight give it no full step).
    char cap_what[160];
    if (a.profile_steps > 0) {
        io.min_blocks = all_blocks;
        snprintf(cap_what, sizeof cap_what, "the breakdown, %d sequences at once (--profile-steps "
                 "0 times the serving run alone),", max_conc);
    } else {
        io.min_blocks = per_seq;
        snprintf(cap_what, sizeof cap_what, "a request of %d positions", in_hi + out_need - 1);
    }
    io.min_for = cap_what;
    model_slots = max_conc;
    if (a.spec_draft) { // verification rows: k + 1 per decoding sequence
        rows_per_seq = a.spec_k + 1;
        io.model.max_rows = max_conc * rows_per_seq + chunk_rows;
    }
    k25_spec_opts so = {.k = a.spec_k, .max_seqs = max_conc, .max_rows = io.model.max_rows,
                        .ctx_size = cfg.ctx_size, .kv_block = kvb, .backend = cfg.backend,
                        .threads = cfg.threads};
    // The draft's own configuration before the target's load, which takes minutes
    if (a.spec_draft)
        agree_or_exit(&d, spec_check(a.spec_draft, &cfg, &d, &so, &io.kv_extra_values, err) == 0,
                      err);
    k25_instance in;
    double t_load = k25_now_ms();
    agree_or_exit(&d, instance_open(&in, &cfg, &d, &io, err) == 0, err);
    k25_log("k25bench: model ready in %.1f s\n", (k25_now_ms() - t_load) / 1000);
    k25_spec *spec = NULL;
    if (a.spec_draft) {
        so.n_blocks = model_n_blocks(in.m); // the draft follows the target's sequences
        spec = spec_create(a.spec_draft, in.m, &in.w, &cfg, &d, &so, err);
        agree_or_exit(&d, spec != NULL, err);
        spec_kind = spec_draft_kind(spec);
    }

    run_desc desc;
    describe(&desc, &a, &cfg, &d, &in, argc, argv);
    if (d.world_rank == 0) {
        print_desc(&desc, &a, &cfg);
        if (!a.profile_only) print_table_head();
    }

    // ---- the sweep ----
    // (before it, a signal ends the process the default way: nothing is written yet)
    stop_signal_install();
    level_result *res = k25_calloc(a.n_levels, sizeof *res);
    char **lines = k25_calloc(a.n_levels, sizeof(char *));
    char json_err[K25_ERR_LEN] = ""; // rank 0: the first failed --json write
    int json_lines = 0;
    k25_out_file json_live = {0};    // an --json target written in place, open for the sweep
    char plot_err[K25_ERR_LEN] = ""; // rank 0: a --plot that failed
    int n_done = a.n_levels;
    for (int li = 0; li < a.n_levels; li++) {
        int conc = a.levels[li];
        workload w;
        make_workload(&w, &a, &cfg, conc, a.prompts_factor * conc);
        k25_log("k25bench: concurrency %d: %d requests\n", conc, w.n);
        if (a.warmup && !a.profile_only) warm_up(in.m, &cfg, &w, conc, &d);
        int32_t **ref = spec ? k25_calloc((size_t)w.n, sizeof(int32_t *)) : NULL;
        keep_tokens = ref; // the plain run's tokens: the oracle's reference
        if (!bench_stopped && !a.profile_only) measure(in.m, &cfg, &w, conc, &d, &res[li]);
        keep_tokens = NULL;
        if (a.profile_steps > 0 && !bench_stopped)
            profile(&in, &cfg, &w, conc, a.profile_steps, &d, &res[li]);
        if (spec && !bench_stopped) spec_level(&a, spec, in.m, &cfg, &w, conc, &d, ref, &res[li]);
        for (int i = 0; ref && i < w.n; i++) free(ref[i]);
        free(ref);
        if (bench_stopped) {
            free_workload(&w);
            free(res[li].spec);
            k25_log("k25bench: stopped by a signal during concurrency %d; %d level(s) complete\n",
                    conc, li);
            n_done = li;
            break;
        }
        unsigned long long mem = in.be->mem_peak(in.be);
        MPI_CHECK(MPI_Allreduce(&mem, &res[li].mem_peak, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX,
                                d.world));
        free_workload(&w);
        if (d.world_rank == 0) {
            if (!a.profile_only) print_table_row(&res[li]);
            lines[li] = level_json(&res[li], &desc, &a, &cfg);
            if (a.json && !json_err[0] &&
                write_json(&json_live, a.json, lines, li + 1, &json_lines, json_err))
                k25_log("k25bench: %s: the run goes on (its results are on stdout), then exits "
                        "with this error\n", json_err);
        }
    }

    if (d.world_rank == 0) {
        print_profile_table(res, n_done);
        if (spec) print_spec_table(res, n_done, &a);
        char why[K25_ERR_LEN];
        int json_in_place = json_live.f != NULL; // a pipe or device: nothing to read back
        if (json_in_place && out_file_commit(&json_live, why) && !json_err[0])
            snprintf(json_err, sizeof json_err, "%s", why);
        // A plot that was asked for and failed fails the run; one with no level has no data.
        if (do_plot && n_done > 0 && !json_err[0]) {
            if (a.json && !json_in_place) {
                make_plot(plot_script, a.json, a.plot, plot_err);
            } else {
                char tmp[] = "/tmp/k25bench-XXXXXX";
                int fd = mkstemp(tmp);
                int none = 0;
                if (fd < 0) {
                    k25_err(plot_err, "--plot: cannot create %s: %s", tmp, strerror(errno));
                } else {
                    close(fd);
                    if (write_json(NULL, tmp, lines, n_done, &none, plot_err) == 0)
                        make_plot(plot_script, tmp, a.plot, plot_err);
                    unlink(tmp);
                }
            }
        }
    }
    if (a.trace) agree_or_exit(&d, !tracing || kernel_trace_finish(a.trace, err) == 0, err);
    // Results that did not reach their file or stdout must not end in success.
    ok = 1;
    if (d.world_rank == 0)
        ok = (json_err[0]   ? k25_err(err, "%s", json_err)
              : plot_err[0] ? k25_err(err, "%s", plot_err)
                            : k25_flush_check(stdout, "standard output", err)) == 0;
    agree_or_exit(&d, ok, err);
    for (int i = 0; i < n_done; i++) cJSON_free(lines[i]), free(res[i].spec);
    free(lines);
    free(res);
    spec_free(spec);
    instance_close(&in);
    dist_finalize(&d);
    return bench_stopped ? 130 : 0;
}
