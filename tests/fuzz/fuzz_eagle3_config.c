// Fuzz target: an EAGLE-3 draft head's config.json (eagle3_config_parse, src/spec_eagle3_config.c)
// for the built-in tiny target, at 1, 2, 4 and 8 tensor-parallel ranks.
//
// The input is handed over with its exact length and no terminating NUL, so a read past the end
// is caught. A rejected file gets a message naming it. An accepted one must fit the target: 1..3
// aux layers, ascending, each a layer input the target has (0..n_layers; the default ones when
// the text never mentions eagle_config), the target's hidden size and vocabulary, a draft
// vocabulary in range, the head's split over the ranks, a valid two-layer configuration whose
// dump loads back (fuzz_check_config), and the context plus the drafts within its positions.
// A file accepted at some rank count is accepted at every divisor of it.
#include "cli.h"
#include "fuzz_common.h"
#include "fuzz_config_check.h"
#include "spec_eagle3_config.h"

static const char *PATH = "eagle/config.json";
static k25_config target;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[K25_ERR_LEN];
    config_init_defaults(&target);
    if (config_load_ini_string(&target, k25_builtin_ini, "tiny", err)) fuzz_fail("%s", err);
    return 0;
}

static void check_accepted(const eagle3_config *ec, int tp, int mentions_eagle_config) {
    const k25_config *t = &target, *c = &ec->cfg;
    if (ec->n_aux < 1 || ec->n_aux > EAGLE3_MAX_AUX) fuzz_fail("%d aux layers", ec->n_aux);
    for (int i = 0; i < ec->n_aux; i++) {
        if (ec->aux_ids[i] < 0 || ec->aux_ids[i] > t->n_layers)
            fuzz_fail("aux layer %d outside 0..%d", ec->aux_ids[i], t->n_layers);
        if (i && ec->aux_ids[i] < ec->aux_ids[i - 1]) fuzz_fail("aux layers not ascending");
    }
    // sglang's default [2, L/2, L-3] for the tiny target's 4 layers.
    if (!mentions_eagle_config &&
        (ec->n_aux != 3 || ec->aux_ids[0] != 1 || ec->aux_ids[1] != 2 || ec->aux_ids[2] != 2))
        fuzz_fail("default aux layers %d: %d,%d,%d", ec->n_aux, ec->aux_ids[0], ec->aux_ids[1],
                  ec->aux_ids[2]);
    if (ec->Dt != t->hidden) fuzz_fail("target hidden %d, the target's %d", ec->Dt, t->hidden);
    if (ec->Vd < 1 || ec->Vd > t->vocab || ec->Vd % tp)
        fuzz_fail("draft vocabulary %d (target %d, tp %d)", ec->Vd, t->vocab, tp);
    if (ec->norm_before_residual != 0 && ec->norm_before_residual != 1)
        fuzz_fail("norm_before_residual %d", ec->norm_before_residual);
    if (c->n_layers != 2 || c->first_dense != 2 || c->experts_int4 || c->tp != tp || c->pp != 1)
        fuzz_fail("layers %d, dense %d, int4 %d, tp %d, pp %d", c->n_layers, c->first_dense,
                  c->experts_int4, c->tp, c->pp);
    if (c->vocab != t->vocab) fuzz_fail("vocabulary %d, the target's %d", c->vocab, t->vocab);
    if (c->ctx_size != t->ctx_size || c->ctx_size > c->max_pos)
        fuzz_fail("context %d (target %d), positions %d", c->ctx_size, t->ctx_size, c->max_pos);
    if (c->n_heads % tp || c->dense_inter % tp)
        fuzz_fail("%d heads, MLP %d over %d ranks", c->n_heads, c->dense_inter, tp);
    char err[K25_ERR_LEN];
    if (config_validate(c, err)) fuzz_fail("accepted configuration invalid: %s", err);
    fuzz_check_config(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    int mentions = strstr(text, "eagle_config") != NULL || memchr(data, 0, size) != NULL ||
                   strchr(text, '\\') != NULL; // an escape can spell the key
    free(text);
    int accepted_at = 0;
    for (int tp = 8; tp >= 1; tp /= 2) {
        eagle3_fit fit = {&target, target.ctx_size, target.kv_block, tp};
        eagle3_config ec;
        char err[K25_ERR_LEN];
        err[0] = 0;
        if (eagle3_config_parse(&ec, (const char *)data, size, PATH, &fit, err)) {
            if (strncmp(err, PATH, strlen(PATH)))
                fuzz_fail("message does not name the file: '%s'", err);
            if (accepted_at)
                fuzz_fail("accepted at tp %d, rejected at %d: %s", accepted_at, tp, err);
        } else {
            check_accepted(&ec, tp, mentions);
            accepted_at = tp;
        }
    }
    return 0;
}
