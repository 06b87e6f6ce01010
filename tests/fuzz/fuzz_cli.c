// Fuzz target: the k25dec command line (cli_parse), then the configuration it resolves to
// (cli_load_config: the built-in tiny model, every --set section.key=value, the run flags).
//
// The input is the argument list, arguments separated by NUL bytes (argv[0] is added).
// --model / --config name files; those readers have their own targets, so a command line
// naming one is parsed but not loaded. A rejected command line says why and owns no memory
// afterwards (the leak checker sees a forgotten --tokens list); an accepted one that loads is
// checked by fuzz_check_config.
#include "cli.h"
#include "fuzz_common.h"
#include "fuzz_config_check.h"

#define MAX_ARGS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // Split a private copy at NUL bytes; a trailing NUL does not add an empty argument.
    char *buf = malloc(size + 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = "k25dec";
    for (size_t i = 0; i < size && argc < MAX_ARGS;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;

    k25_cli o;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (cli_parse(argc, argv, &o, err)) {
        if (!err[0]) fuzz_fail("cli_parse rejected the command line without a message");
        if (o.tokens) fuzz_fail("cli_parse failed but kept its --tokens list");
    } else {
        if (o.n_tokens < 0 || (o.n_tokens > 0 && !o.tokens)) fuzz_fail("bad --tokens list");
        for (int i = 0; i < o.n_tokens; i++)
            if (o.tokens[i] < 0) fuzz_fail("negative token id %d accepted", o.tokens[i]);
        if (o.n_sets < 0 || o.n_sets > CLI_MAX_SETS) fuzz_fail("n_sets %d", o.n_sets);
        if (!o.model_dir && !o.config_file) {
            k25_config c;
            err[0] = 0;
            if (cli_load_config(&o, &c, err)) {
                if (!err[0]) fuzz_fail("cli_load_config failed without a message");
            } else {
                fuzz_check_config(&c);
            }
        }
        cli_free(&o);
    }
    free(buf);
    return 0;
}
