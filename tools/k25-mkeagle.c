// k25-mkeagle: writes a deterministic synthetic EAGLE-3 MLA draft checkpoint
// (Eagle3DeepseekV2ForCausalLM layout: config.json + model.safetensors) for a target
// configuration, so speculative decoding with --spec-draft eagle3:DIR can be run and tested
// without the published heads.
//
//   k25-mkeagle (--config TARGET.ini | --model TARGET_DIR) [--set section.key=value ...]
//               --synthetic SEED --out DIR [--draft-vocab N] [--own-embed] [--no-lm-head]
//               [--aux-layers A,B,C] [--intermediate N] [--norm-before-residual]
#include <errno.h>
#include <string.h>

#include "config.h"
#include "spec.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: k25-mkeagle (--config TARGET.ini | --model TARGET_DIR) [--set sec.key=value]\n"
            "                   --synthetic SEED --out DIR [--draft-vocab N] [--own-embed]\n"
            "                   [--no-lm-head] [--aux-layers A,B,C] [--intermediate N]\n"
            "                   [--norm-before-residual]\n"
            "Writes a synthetic EAGLE-3 MLA draft head (config.json + model.safetensors) for the\n"
            "target configuration: attention dims of the target, one decoder layer, fc over three\n"
            "target hidden states.\n"
            "  --draft-vocab N    lm_head over N draft tokens with a d2t map (default: the whole\n"
            "                     vocabulary)\n"
            "  --own-embed        write embed_tokens (default: the target's embedding is used)\n"
            "  --no-lm-head       no lm_head (the target's is used)\n"
            "  --aux-layers A,B,C eagle_aux_hidden_state_layer_ids (the target layers whose\n"
            "                     outputs feed fc; default: none written, the default applies)\n"
            "  --intermediate N   MLP width (default: the target's intermediate_size)\n"
            "  --norm-before-residual  the variant whose residual is the normalized hidden\n");
}

int main(int argc, char **argv) {
    k25_prog = "k25-mkeagle";
    char err[K25_ERR_LEN];
    const char *ini = NULL, *model = NULL, *out = NULL, *sets[64];
    int n_sets = 0, have_seed = 0;
    k25_eagle3_synth o = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        long v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(f, "--own-embed")) { o.own_embed = 1; continue; }
        if (!strcmp(f, "--no-lm-head")) { o.no_lm_head = 1; continue; }
        if (!strcmp(f, "--norm-before-residual")) { o.norm_before_residual = 1; continue; }
        static const char *const value_flags[] = {"--config", "--model", "--set", "--synthetic",
                                                   "--out", "--draft-vocab", "--intermediate",
                                                   "--aux-layers", NULL};
        if (!k25_is_one_of(f, value_flags)) {
            fprintf(stderr, "k25-mkeagle: unknown option '%s' (see --help)\n", f);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "k25-mkeagle: %s needs a value\n", f);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(f, "--config")) {
            ini = val;
        } else if (!strcmp(f, "--model")) {
            model = val;
        } else if (!strcmp(f, "--set")) {
            if (n_sets == 64) { fprintf(stderr, "k25-mkeagle: too many --set\n"); return 2; }
            sets[n_sets++] = val;
        } else if (!strcmp(f, "--synthetic")) {
            if (k25_parse_seed(val, &o.seed)) {
                fprintf(stderr,
                        "k25-mkeagle: --synthetic: '%s' is not a non-negative integer seed\n", val);
                return 2;
            }
            have_seed = 1;
        } else if (!strcmp(f, "--out")) {
            out = val;
        } else if (!strcmp(f, "--draft-vocab")) {
            if (k25_parse_long(val, 1, 1 << 24, &v)) {
                fprintf(stderr, "k25-mkeagle: --draft-vocab: bad '%s'\n", val);
                return 2;
            }
            o.draft_vocab = (int)v;
        } else if (!strcmp(f, "--intermediate")) {
            if (k25_parse_long(val, 1, 1 << 24, &v)) {
                fprintf(stderr, "k25-mkeagle: --intermediate: bad '%s'\n", val);
                return 2;
            }
            o.intermediate = (int)v;
        } else if (!strcmp(f, "--aux-layers")) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", val);
            o.n_aux = 0;
            for (char *rest = buf, *t; (t = strsep(&rest, ",")) != NULL;) { // "" items too
                if (o.n_aux == 3 || k25_parse_long(t, -1, 1 << 20, &v)) {
                    fprintf(stderr, "k25-mkeagle: --aux-layers: '%s' is not 1 to 3 ids\n", val);
                    return 2;
                }
                o.aux_ids[o.n_aux++] = (int)v;
            }
        }
    }
    const char *wrong = NULL;
    if (!ini == !model) wrong = "give one of --config FILE.ini and --model DIR";
    else if (!have_seed) wrong = "missing --synthetic SEED";
    else if (!out) wrong = "missing --out DIR";
    else if (ini && !*ini) wrong = "--config: the path is empty";
    else if (model && !*model) wrong = "--model: the path is empty";
    else if (!*out) wrong = "--out: the path is empty";
    if (wrong) {
        fprintf(stderr, "k25-mkeagle: error: %s\n", wrong);
        usage(stderr);
        return 2;
    }
    k25_config c;
    config_init_defaults(&c);
    int rc;
    if (ini) {
        rc = config_load_ini(&c, ini, err);
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model);
        rc = config_load_hf_json(&c, path, err);
    }
    for (int i = 0; i < n_sets && rc == 0; i++) rc = config_set(&c, sets[i], err);
    if (rc == 0) rc = config_validate(&c, err);
    if (rc == 0) rc = spec_eagle3_write_synthetic(out, &c, &o, err);
    if (rc) {
        fprintf(stderr, "k25-mkeagle: error: %s\n", err);
        return 1;
    }
    fprintf(stderr, "k25-mkeagle: EAGLE-3 head for a %d-layer target (hidden %d) written to %s\n",
            c.n_layers, c.hidden, out);
    return 0;
}
