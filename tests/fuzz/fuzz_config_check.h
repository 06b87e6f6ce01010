// Checks shared by the configuration fuzz targets: what must hold for a configuration a
// parser accepted.
#pragma once
#include <stdio.h>

#include "config.h"
#include "fuzz_common.h"
#include "fuzz_config_fields.h"

// A valid configuration survives config_check_tp and the derived quantities, and its
// --dump-config output loads back to the same values. Only valid configurations are
// round-tripped: free-form strings (e.g. "a ;b" from an .ini continuation line or a JSON
// string) cannot always be written as .ini values, but validation admits only fixed words
// for every string key.
static inline void fuzz_check_config(const k25_config *c) {
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (config_validate(c, err)) {
        if (!err[0]) fuzz_fail("config_validate failed without a message");
        return;
    }
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *f = open_memstream(&dump, &dump_len);
    if (!f) abort();
    config_dump(c, f);
    fclose(f);
    k25_config back;
    config_init_defaults(&back);
    err[0] = 0;
    if (config_load_ini_string(&back, dump, "dump", err))
        fuzz_fail("config_dump output does not load back: %s\n--- dump ---\n%s", err, dump);
    const char *diff = fuzz_config_diff(c, &back);
    if (diff) fuzz_fail("config_dump round trip changes %s\n--- dump ---\n%s", diff, dump);
    free(dump);

    for (int tp = 1; tp <= 8; tp++) config_check_tp(c, tp, err);
    (void)config_softmax_scale(c);
    if (c->qk_rope_dim <= 4096) {
        float inv[2048];
        config_rope_inv_freq(c, inv);
    }
    for (int i = 0; i < c->n_layers && i < 64; i++) (void)config_is_moe_layer(c, i);
    (void)config_is_eos(c, c->bos_id);
}
