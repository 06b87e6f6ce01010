// The k25dec command line: flags -> a k25_cli struct (parsed the same way on every rank, so a
// bad command line makes every rank fail the same way), the usage text, the built-in default
// model (config/tiny.ini, embedded) and the mapping of flags onto the run configuration.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "config.h"

#define CLI_MAX_SETS 64

typedef struct k25_cli {
    // model and weights
    const char *model_dir;        // --model DIR (config.json + safetensors)
    const char *config_file;      // --config FILE.ini
    int synthetic;                // weights from the generator (--synthetic, or the default)
    uint64_t synth_seed;
    const char *sets[CLI_MAX_SETS]; // --set section.key=value, in order
    int n_sets;
    int verify;                   // --verify: CRC manifest check before loading

    // text
    const char *tokenizer_file;   // --tokenizer FILE (tiktoken.model); default DIR/tiktoken.model
    const char *tokenizer_pattern; // --tokenizer-pattern: pre-tokenizer regex (Rust syntax)
    int tokenize, detokenize;     // developer tools: stdin -> stdout, no model, no MPI

    // input
    const char *prompt;           // -p TEXT
    int32_t *tokens;              // --tokens 1,2,3 (malloc'ed)
    int n_tokens;

    // run settings; has_* says the flag was given (otherwise the config's [run] value holds)
    int n_predict, has_n_predict; // -1: until EOS or the context end
    float temp; int has_temp;
    int top_k; int has_top_k;
    float top_p; int has_top_p;
    int seed; int has_seed;
    int ctx_size; int has_ctx_size;
    int threads; int has_threads;
    int pp; int has_pp;           // --pp P: pipeline stages (run.pp)
    const char *backend;          // NULL: the config's run.backend

    // output and diagnostics
    const char *output;           // -o/--output FILE: the generated text instead of stdout
    const char *dump_logits;      // --dump-logits FILE
    int print_ids;
    int dump_config;
    int check_finite;
    int verbose;
    int help;

    // speculative decoding (spec.h)
    const char *spec_draft;       // --spec-draft SRC or NULL
    int spec_k, has_spec_k;       // --spec-k K (default 3)
    int chat;                     // --chat: Kimi's chat template around the prompt
    const char *system;           // --system TEXT (chat)
    int think;                    // --think on|off (chat; default on)
} k25_cli;

#ifdef __cplusplus
extern "C" {
#endif

// The built-in default model: the text of config/tiny.ini (a test compares them).
extern const char k25_builtin_ini[];

// Returns 0, or -1 with a message in err (unknown flag, missing value, bad number, conflicting
// options). Does not print or exit.
int cli_parse(int argc, char **argv, k25_cli *o, char *err);
void cli_free(k25_cli *o);
void cli_usage(FILE *f);
// Resolved configuration: defaults, then the built-in ini / --config / --model config.json,
// then --set, then the run flags. Returns 0 or -1 with a message.
int cli_load_config(const k25_cli *o, k25_config *cfg, char *err);

#ifdef __cplusplus
}
#endif
