// The k25dec command line: a small argument parser (short and long flags, "--flag value" and
// "--flag=value"), strict number parsing, the usage text and the built-in default model.
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------------------------------
// The built-in default model: config/tiny.ini, kept equal to the file (tests/t_cli.sh checks)
// ------------------------------------------------------------------------------------------

const char k25_builtin_ini[] =
    "; Tiny test model: the Kimi-K2.5 architecture at small sizes, for tp = 1, 2, 4.\n"
    "; Token ids 0..255 are bytes for the fallback tokenizer.\n"
    "\n"
    "[model]\n"
    "hidden_size = 128\n"
    "num_hidden_layers = 4\n"
    "first_k_dense_replace = 1\n"
    "intermediate_size = 256\n"
    "moe_intermediate_size = 128\n"
    "n_routed_experts = 16\n"
    "n_shared_experts = 1\n"
    "num_experts_per_tok = 4\n"
    "n_group = 1\n"
    "topk_group = 1\n"
    "routed_scaling_factor = 2.827\n"
    "norm_topk_prob = true\n"
    "scoring_func = sigmoid\n"
    "topk_method = noaux_tc\n"
    "num_attention_heads = 8\n"
    "q_lora_rank = 64\n"
    "kv_lora_rank = 32\n"
    "qk_nope_head_dim = 16\n"
    "qk_rope_head_dim = 8\n"
    "v_head_dim = 16\n"
    "vocab_size = 512\n"
    "max_position_embeddings = 4096\n"
    "rms_norm_eps = 1e-5\n"
    "latent_norm_eps = 1e-6\n"
    "tie_word_embeddings = false\n"
    "\n"
    "[rope]\n"
    "rope_theta = 50000\n"
    "type = yarn\n"
    "factor = 4\n"
    "original_max_position_embeddings = 256\n"
    "beta_fast = 32\n"
    "beta_slow = 1\n"
    "mscale = 1\n"
    "mscale_all_dim = 1\n"
    "\n"
    "[quant]\n"
    "experts_int4 = true\n"
    "group_size = 32\n"
    "\n"
    "[tokens]\n"
    "bos_token_id = 256\n"
    "eos_token_ids = 257\n"
    "pad_token_id = 511\n"
    "\n"
    "[run]\n"
    "ctx_size = 512\n";

// ------------------------------------------------------------------------------------------
// Usage
// ------------------------------------------------------------------------------------------

void cli_usage(FILE *f) {
    fputs(
        "Usage: mpirun -np N k25dec [model options] (-p TEXT | --tokens IDS) [options]\n"
        "\n"
        "Distributed decoder for Kimi-K2.5 (tensor parallel over the MPI ranks).\n"
        "\n"
        "Example:\n"
        "  mpirun -np 2 ./k25dec -p \"Hello\" -n 8\n"
        "  mpirun -np 8 ./k25dec --model /ckpt/Kimi-K2.5 --backend cuda -p \"Hi\" -n 64\n"
        "\n"
        "Model (default: the built-in tiny model of config/tiny.ini, --synthetic 1):\n"
        "  --model DIR           checkpoint directory (config.json + safetensors shards)\n"
        "  --config FILE.ini     model/run configuration file (needs --synthetic)\n"
        "  --synthetic SEED      deterministic synthetic weights from SEED\n"
        "  --set SEC.KEY=VALUE   override one configuration key (repeatable)\n"
        "  --verify              check the checkpoint's CRC manifest before loading\n"
        "  --dump-config         print the resolved configuration as .ini and exit\n"
        "\n"
        "Input:\n"
        "  -p, --prompt TEXT     prompt text\n"
        "  --tokens IDS          prompt token ids, comma-separated (e.g. 1,2,3)\n"
        "  --tokenizer FILE      tiktoken.model to use (default: DIR/tiktoken.model of --model;\n"
        "                        without one, prompt bytes are ids 0..255 and ids are printed)\n"
        "  --tokenizer-pattern RE  pre-tokenizer regex (Rust syntax; default: Kimi's)\n"
        "  --chat                wrap the prompt in Kimi's chat template (needs a tokenizer);\n"
        "                        generation also stops at <|im_end|>\n"
        "  --system TEXT         system message of the chat\n"
        "  --think on|off        thinking mode of the chat template (default on)\n"
        "\n"
        "Generation:\n"
        "  -n, --n-predict N     tokens to generate (default: run.n_predict; -1 = until EOS or\n"
        "                        the context end)\n"
        "  --temp T              temperature (default 0 = greedy)\n"
        "  --top-k K             keep the K most likely tokens (default 0 = off)\n"
        "  --top-p P             nucleus sampling (default 1 = off); top-k and top-p consider\n"
        "                        at most the 1024 most likely tokens\n"
        "  --seed S              sampling seed (default 0)\n"
        "  -c, --ctx-size N      context size in tokens (default: run.ctx_size)\n"
        "  --spec-draft SRC      speculative decoding with draft SRC: ngram[:N] (prompt\n"
        "                        lookup), model:DIR or model:FILE.ini[@SEED] (a smaller model\n"
        "                        of the same family), eagle3:DIR (EAGLE-3 MLA head)\n"
        "  --spec-k K            tokens drafted per step (default 3)\n"
        "\n"
        "Execution:\n"
        "  --backend cpu|cuda    compute backend (default: run.backend)\n"
        "  --threads N           CPU threads per rank (default 0 = cores / ranks on the node)\n"
        "  --pp P                pipeline stages (default: run.pp = 1): the ranks form P stages\n"
        "                        of tp = ranks / P consecutive ranks, each stage holding its\n"
        "                        share of the layers (run.pp_layers, e.g. 16,15,15,15)\n"
        "\n"
        "Tokenizer tools (no model, no mpirun needed; --tokenizer FILE or the byte fallback):\n"
        "  --tokenize            UTF-8 text on stdin -> token ids on stdout\n"
        "  --detokenize          token ids on stdin -> text on stdout\n"
        "\n"
        "Output:\n"
        "  --print-ids           print generated token ids instead of text\n"
        "  -o, --output FILE     write the generated text (or ids) to FILE, not stdout: it\n"
        "                        appears whole at the end (FILE.tmp until then), and a failed\n"
        "                        write fails the run (stdout under mpirun goes through mpirun,\n"
        "                        which does not report a write it could not make)\n"
        "  --dump-logits FILE    write the logits of every position (K25LOGIT format)\n"
        "  --check-finite        stop at the first NaN/Inf hidden state, naming layer/position\n"
        "                        (on by default in debug builds, make DEBUG=1)\n"
        "  -v, --verbose         more logging on stderr\n"
        "  -h, --help            this text\n"
        "\n"
        "Generated text (or ids) goes to stdout (or -o FILE), everything else to stderr.\n",
        f);
}

// ------------------------------------------------------------------------------------------
// Number parsing
// ------------------------------------------------------------------------------------------

static int parse_int(const char *flag, const char *s, long lo, long hi, int *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno)
        return k25_err(err, "%s: \"%s\" is not an integer", flag, s);
    if (v < lo || v > hi) return k25_err(err, "%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, int lo_open,
                       float *out, char *err) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        return k25_err(err, "%s: \"%s\" is not a number", flag, s);
    if (v < lo || v > hi || (lo_open && v == lo))
        return k25_err(err, "%s: %g is out of range %s%g, %g]", flag, v, lo_open ? "(" : "[",
                       lo, hi);
    *out = v;
    return 0;
}

static int parse_tokens(const char *s, int32_t **out, int *n, char *err) {
    int cap = 16, m = 0;
    int32_t *ids = k25_malloc(sizeof *ids * (size_t)cap);
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            return k25_err(err, "--tokens: bad token id at \"%s\" (expected ids like 1,2,3)", p);
        }
        if (m == cap) {
            cap *= 2;
            int32_t *g = k25_malloc(sizeof *g * (size_t)cap);
            memcpy(g, ids, sizeof *g * (size_t)m);
            free(ids);
            ids = g;
        }
        ids[m++] = (int32_t)v;
        if (*end == '\0') break;
        if (*end != ',') {
            free(ids);
            return k25_err(err, "--tokens: unexpected \"%s\" (expected ids like 1,2,3)", end);
        }
        p = end + 1;
    }
    *out = ids;
    *n = m;
    return 0;
}

// ------------------------------------------------------------------------------------------
// Parsing
// ------------------------------------------------------------------------------------------

typedef enum {
    F_MODEL, F_CONFIG, F_SYNTH, F_SET, F_VERIFY, F_DUMP_CONFIG, F_PROMPT, F_TOKENS, F_N,
    F_TEMP, F_TOPK, F_TOPP, F_SEED, F_CTX, F_BACKEND, F_THREADS, F_PP, F_PRINT_IDS, F_OUTPUT,
    F_DUMP_LOGITS,
    F_CHECK_FINITE, F_VERBOSE, F_HELP, F_TOKENIZER, F_TOK_PATTERN, F_TOKENIZE, F_DETOKENIZE,
    F_SPEC_DRAFT, F_SPEC_K, F_CHAT, F_SYSTEM, F_THINK
} flag_id;

typedef struct flag_def {
    const char *shrt, *lng;
    flag_id id;
    int takes_value;
} flag_def;

static const flag_def flags[] = {
    {NULL, "--model", F_MODEL, 1},          {NULL, "--config", F_CONFIG, 1},
    {NULL, "--synthetic", F_SYNTH, 1},      {NULL, "--set", F_SET, 1},
    {NULL, "--verify", F_VERIFY, 0},        {NULL, "--dump-config", F_DUMP_CONFIG, 0},
    {"-p", "--prompt", F_PROMPT, 1},        {NULL, "--tokens", F_TOKENS, 1},
    {"-n", "--n-predict", F_N, 1},          {NULL, "--temp", F_TEMP, 1},
    {NULL, "--top-k", F_TOPK, 1},           {NULL, "--top-p", F_TOPP, 1},
    {NULL, "--seed", F_SEED, 1},            {"-c", "--ctx-size", F_CTX, 1},
    {NULL, "--backend", F_BACKEND, 1},      {NULL, "--threads", F_THREADS, 1},
    {NULL, "--pp", F_PP, 1},
    {NULL, "--print-ids", F_PRINT_IDS, 0},  {"-o", "--output", F_OUTPUT, 1},
    {NULL, "--dump-logits", F_DUMP_LOGITS, 1},
    {NULL, "--check-finite", F_CHECK_FINITE, 0}, {"-v", "--verbose", F_VERBOSE, 0},
    {"-h", "--help", F_HELP, 0},            {NULL, "--tokenizer", F_TOKENIZER, 1},
    {NULL, "--tokenizer-pattern", F_TOK_PATTERN, 1}, {NULL, "--tokenize", F_TOKENIZE, 0},
    {NULL, "--detokenize", F_DETOKENIZE, 0},
    {NULL, "--spec-draft", F_SPEC_DRAFT, 1}, {NULL, "--spec-k", F_SPEC_K, 1},
    {NULL, "--chat", F_CHAT, 0},            {NULL, "--system", F_SYSTEM, 1},
    {NULL, "--think", F_THINK, 1},
};

static const flag_def *find_flag(const char *arg, const char **inline_value) {
    *inline_value = NULL;
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const flag_def *f = &flags[i];
        if ((f->shrt && strlen(f->shrt) == len && !strncmp(arg, f->shrt, len)) ||
            (strlen(f->lng) == len && !strncmp(arg, f->lng, len))) {
            if (eq) *inline_value = eq + 1;
            return f;
        }
    }
    return NULL;
}

int cli_parse(int argc, char **argv, k25_cli *o, char *err) {
    memset(o, 0, sizeof *o);
    o->synth_seed = 1;
    o->spec_k = 3;
    o->think = 1;
    int rc = 0;
    const char *run_flag = NULL, *think_flag = NULL; // for the checks of combinations below
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *arg = argv[i], *val = NULL;
        const flag_def *f = find_flag(arg, &val);
        if (!f) {
            rc = k25_err(err, arg[0] == '-' ? "unknown option \"%s\"" : "unexpected argument \"%s\"",
                         arg);
            break;
        }
        if (f->takes_value && !val) {
            if (i + 1 >= argc) {
                rc = k25_err(err, "%s needs a value", arg);
                break;
            }
            val = argv[++i];
        } else if (!f->takes_value && val) {
            rc = k25_err(err, "%s takes no value", f->lng);
            break;
        }
        const char *name = f->lng;
        if (f->id == F_THINK) think_flag = name;
        // What the tokenizer tools take; any other option is for a decode.
        if (!run_flag && f->id != F_TOKENIZER && f->id != F_TOK_PATTERN && f->id != F_TOKENIZE &&
            f->id != F_DETOKENIZE && f->id != F_HELP && f->id != F_VERBOSE)
            run_flag = arg;
        if (val && !*val && (f->id == F_MODEL || f->id == F_CONFIG || f->id == F_TOKENIZER ||
                             f->id == F_OUTPUT || f->id == F_DUMP_LOGITS)) {
            rc = k25_err(err, "%s: the path is empty", name); // "" would read "/config.json"
            break;
        }
        switch (f->id) {
        case F_MODEL: o->model_dir = val; break;
        case F_CONFIG: o->config_file = val; break;
        case F_SYNTH:
            if (k25_parse_seed(val, &o->synth_seed))
                rc = k25_err(err, "--synthetic: \"%s\" is not a non-negative integer seed", val);
            o->synthetic = 1;
            break;
        case F_SET:
            if (o->n_sets == CLI_MAX_SETS) rc = k25_err(err, "too many --set (at most %d)", CLI_MAX_SETS);
            else if (!strchr(val, '=') || !strchr(val, '.'))
                rc = k25_err(err, "--set: \"%s\" is not section.key=value", val);
            else o->sets[o->n_sets++] = val;
            break;
        case F_VERIFY: o->verify = 1; break;
        case F_DUMP_CONFIG: o->dump_config = 1; break;
        case F_PROMPT: o->prompt = val; break;
        case F_TOKENS:
            free(o->tokens);
            o->tokens = NULL;
            rc = parse_tokens(val, &o->tokens, &o->n_tokens, err);
            break;
        case F_N: rc = parse_int(name, val, -1, INT_MAX, &o->n_predict, err); o->has_n_predict = 1; break;
        case F_TEMP: rc = parse_float(name, val, 0, 1e6f, 0, &o->temp, err); o->has_temp = 1; break;
        case F_TOPK: rc = parse_int(name, val, 0, INT_MAX, &o->top_k, err); o->has_top_k = 1; break;
        case F_TOPP: rc = parse_float(name, val, 0, 1, 1, &o->top_p, err); o->has_top_p = 1; break;
        case F_SEED: rc = parse_int(name, val, 0, INT_MAX, &o->seed, err); o->has_seed = 1; break;
        case F_CTX: rc = parse_int(name, val, 1, INT_MAX, &o->ctx_size, err); o->has_ctx_size = 1; break;
        case F_THREADS: rc = parse_int(name, val, 0, K25_CFG_THREADS_MAX, &o->threads, err); o->has_threads = 1; break;
        case F_PP: rc = parse_int(name, val, 1, 4096, &o->pp, err); o->has_pp = 1; break;
        case F_BACKEND:
            if (strcmp(val, "cpu") && strcmp(val, "cuda"))
                rc = k25_err(err, "--backend: \"%s\" is not cpu or cuda", val);
            o->backend = val;
            break;
        case F_PRINT_IDS: o->print_ids = 1; break;
        case F_OUTPUT: o->output = val; break;
        case F_DUMP_LOGITS: o->dump_logits = val; break;
        case F_CHECK_FINITE: o->check_finite = 1; break;
        case F_VERBOSE: o->verbose = 1; break;
        case F_HELP: o->help = 1; break;
        case F_TOKENIZER: o->tokenizer_file = val; break;
        case F_TOK_PATTERN: o->tokenizer_pattern = val; break;
        case F_TOKENIZE: o->tokenize = 1; break;
        case F_DETOKENIZE: o->detokenize = 1; break;
        case F_SPEC_DRAFT: o->spec_draft = val; break;
        case F_SPEC_K: rc = parse_int(name, val, 1, 16, &o->spec_k, err); o->has_spec_k = 1; break;
        case F_CHAT: o->chat = 1; break;
        case F_SYSTEM: o->system = val; break;
        case F_THINK:
            if (!strcmp(val, "on")) o->think = 1;
            else if (!strcmp(val, "off")) o->think = 0;
            else rc = k25_err(err, "--think takes on or off (got \"%s\")", val);
            break;
        }
    }
    if (rc == 0 && !o->help && (o->tokenize || o->detokenize)) {
        if (o->tokenize && o->detokenize)
            rc = k25_err(err, "--tokenize and --detokenize exclude each other");
        else if (run_flag)
            rc = k25_err(err, "%s does not apply to %s (it reads stdin and takes only --tokenizer "
                         "and --tokenizer-pattern)", run_flag,
                         o->tokenize ? "--tokenize" : "--detokenize");
        else if (o->tokenizer_pattern && !o->tokenizer_file)
            rc = k25_err(err, "--tokenizer-pattern needs --tokenizer FILE (without one the ids "
                              "are the bytes, and no pattern applies)");
    } else if (rc == 0 && !o->help) {
        if (o->model_dir && o->config_file)
            rc = k25_err(err, "--model and --config exclude each other");
        else if (o->config_file && !o->synthetic)
            rc = k25_err(err, "--config %s gives no weights: add --synthetic SEED", o->config_file);
        else if (o->verify && !o->model_dir)
            rc = k25_err(err, "--verify checks a checkpoint: it needs --model DIR");
        else if (o->prompt && o->tokens)
            rc = k25_err(err, "-p/--prompt and --tokens exclude each other");
        else if (!o->prompt && !o->tokens && !o->dump_config)
            rc = k25_err(err, "no prompt: give -p TEXT or --tokens IDS");
        else if (o->has_spec_k && !o->spec_draft)
            rc = k25_err(err, "--spec-k needs --spec-draft");
        else if (o->chat && !o->prompt)
            rc = k25_err(err, "--chat needs the user's message as -p TEXT");
        else if (!o->chat && o->system)
            rc = k25_err(err, "--system needs --chat");
        else if (!o->chat && think_flag)
            rc = k25_err(err, "--think needs --chat");
        else if (o->tokenizer_pattern && !o->tokenizer_file && !o->model_dir)
            rc = k25_err(err, "--tokenizer-pattern needs a tokenizer: --tokenizer FILE, or --model "
                              "DIR with its tiktoken.model");
    }
    if (!o->model_dir) o->synthetic = 1; // the built-in model or --config: generated weights
    if (rc) cli_free(o);
    return rc;
}

void cli_free(k25_cli *o) {
    free(o->tokens);
    o->tokens = NULL;
    o->n_tokens = 0;
}

// ------------------------------------------------------------------------------------------
// Configuration
// ------------------------------------------------------------------------------------------

int cli_load_config(const k25_cli *o, k25_config *cfg, char *err) {
    config_init_defaults(cfg);
    if (o->model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", o->model_dir);
        if (config_load_hf_json(cfg, path, err)) return -1;
    } else if (o->config_file) {
        if (config_load_ini(cfg, o->config_file, err)) return -1;
    } else if (config_load_ini_string(cfg, k25_builtin_ini, "built-in config/tiny.ini", err)) {
        return -1;
    }
    for (int i = 0; i < o->n_sets; i++)
        if (config_set(cfg, o->sets[i], err)) return -1;
    if (o->has_n_predict && o->n_predict >= 0) cfg->n_predict = o->n_predict;
    if (o->has_temp) cfg->temp = o->temp;
    if (o->has_top_k) cfg->sample_top_k = o->top_k;
    if (o->has_top_p) cfg->sample_top_p = o->top_p;
    if (o->has_seed) cfg->seed = o->seed;
    if (o->has_ctx_size) cfg->ctx_size = o->ctx_size;
    if (o->has_threads) cfg->threads = o->threads;
    if (o->has_pp) cfg->pp = o->pp;
    if (o->backend) snprintf(cfg->backend, sizeof cfg->backend, "%s", o->backend);
    return config_validate(cfg, err);
}
