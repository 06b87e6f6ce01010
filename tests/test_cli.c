// The built-in default model text equals config/tiny.ini byte for byte, and the argument
// parser maps flags as documented (both flag forms, -n -1, --tokens lists, precedence of run
// flags over --set in the resolved config), refuses combinations that do not apply, and reads a
// seed the one way every tool does.
#include <stdint.h>
#include <string.h>

#include "cli.h"

static int failures;

static void check(const char *what, int ok) {
    printf("%-56s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

static int parse(k25_cli *o, char *err, int argc, char **argv) { return cli_parse(argc, argv, o, err); }
#define PARSE(o, err, ...)                                                                          \
    parse(o, err, (int)(sizeof((char *[]){"k25dec", __VA_ARGS__}) / sizeof(char *)),                \
          (char *[]){"k25dec", __VA_ARGS__})

int main(void) {
    FILE *f = fopen("config/tiny.ini", "rb");
    char file[8192] = "";
    size_t n = f ? fread(file, 1, sizeof file - 1, f) : 0;
    if (f) fclose(f);
    file[n] = 0;
    check("built-in default text == config/tiny.ini", n > 0 && strcmp(file, k25_builtin_ini) == 0);

    k25_cli o;
    char err[K25_ERR_LEN];
    int rc = PARSE(&o, err, "--tokens", "5,6,7", "-n", "-1", "--temp=0.5", "--top-k", "3", "-c", "64",
                   "--set", "run.ctx_size=32", "--set=run.seed=9");
    check("flags parse", rc == 0);
    check("--tokens list", rc == 0 && o.n_tokens == 3 && o.tokens[0] == 5 && o.tokens[2] == 7);
    check("-n -1 means until EOS / context end", rc == 0 && o.has_n_predict && o.n_predict == -1);
    check("--flag=value form", rc == 0 && o.has_temp && o.temp == 0.5f && o.n_sets == 2);
    check("default weights: synthetic seed 1", rc == 0 && o.synthetic && o.synth_seed == 1);
    k25_config c;
    rc = rc == 0 ? cli_load_config(&o, &c, err) : -1;
    check("resolved: -c over --set, --set applied, top-k",
          rc == 0 && c.ctx_size == 64 && c.seed == 9 && c.sample_top_k == 3 && c.hidden == 128);
    cli_free(&o);

    check("--verify without --model is refused", PARSE(&o, err, "--verify", "-p", "x") != 0);
    check("-p and --tokens exclude each other", PARSE(&o, err, "-p", "x", "--tokens", "1") != 0);
    check("--synthetic needs a number", PARSE(&o, err, "--synthetic", "-3", "-p", "x") != 0);
    check("--print-ids takes no value", PARSE(&o, err, "--print-ids=1", "-p", "x") != 0);
    check("--think without --chat is refused", PARSE(&o, err, "--think", "off", "-p", "x") != 0 &&
                                                    strstr(err, "--think needs --chat"));
    check("--tokenize takes no decode option",
          PARSE(&o, err, "--tokenize", "-p", "x") != 0 &&
              strstr(err, "-p does not apply to --tokenize"));
    check("an empty --model is refused",
          PARSE(&o, err, "--model", "", "-p", "x") != 0 && strstr(err, "--model: the path is empty"));
    check("an empty --tokenizer is refused",
          PARSE(&o, err, "--tokenize", "--tokenizer=") != 0 &&
              strstr(err, "--tokenizer: the path is empty"));
    check("--tokenize with a pattern and no tokenizer is refused",
          PARSE(&o, err, "--tokenize", "--tokenizer-pattern", "(") != 0 &&
              strstr(err, "--tokenizer-pattern needs --tokenizer FILE"));
    rc = PARSE(&o, err, "-p", "x", "-o", "out.txt");
    check("-o FILE: the generated text's file", rc == 0 && o.output && !strcmp(o.output, "out.txt"));
    cli_free(&o);
    check("an empty --output is refused", PARSE(&o, err, "-p", "x", "--output=") != 0 &&
                                              strstr(err, "--output: the path is empty"));
    // The Slurm scripts log a run's configuration with the run's own arguments
    check("--dump-config takes a run's -o and --dump-logits",
          PARSE(&o, err, "--dump-config", "-p", "x", "-o", "x", "--dump-logits", "y") == 0);
    cli_free(&o);
    check("--detokenize takes --tokenizer",
          PARSE(&o, err, "--detokenize", "--tokenizer", "t") == 0);
    // A seed is decimal everywhere: 010 is ten (k25-mkckpt read octal), 2^64 - 1 the largest.
    uint64_t seed = 0;
    check("seed 010 is 10", k25_parse_seed("010", &seed) == 0 && seed == 10);
    check("seed 2^64 - 1",
          k25_parse_seed("18446744073709551615", &seed) == 0 && seed == UINT64_MAX);
    const char *bad_seeds[] = {"", "-1", "+5", " 5", "5 ", "0x10", "1e3", "18446744073709551616"};
    int refused = 0;
    for (size_t i = 0; i < sizeof bad_seeds / sizeof bad_seeds[0]; i++)
        refused += k25_parse_seed(bad_seeds[i], &seed) != 0;
    check("seeds with a sign, space, hex, exponent or past 2^64 refused",
          refused == (int)(sizeof bad_seeds / sizeof bad_seeds[0]));
    rc = PARSE(&o, err, "--synthetic", "010", "-p", "x");
    check("--synthetic 010 is seed 10", rc == 0 && o.synth_seed == 10);
    cli_free(&o);
    rc = PARSE(&o, err, "--model", "/m", "-p", "x");
    check("--model alone: checkpoint weights", rc == 0 && !o.synthetic && !strcmp(o.model_dir, "/m"));
    cli_free(&o);

    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
