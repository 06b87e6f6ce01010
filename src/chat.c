// Kimi chat template, single turn (see chat.h for the rendered form).
//
// The template's text between special tokens is encoded segment by segment as ordinary text,
// which gives the same ids as encoding the rendered string with special tokens allowed
// (tiktoken encodes the text between specials independently) while keeping special-token
// strings typed by the user from becoming control tokens.
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "common.h"

typedef struct render {
    const k25_tokenizer *t;
    bpe_ids ids;
    char *err;
    int failed;
} render;

static void special(render *r, const char *name) {
    if (r->failed) return;
    int id = tokenizer_special_id(r->t, name);
    if (id < 0) {
        k25_err(r->err,
                "chat template needs the special token %s, which this vocabulary lacks (is it named in "
                "tokenizer_config.json added_tokens_decoder?)",
                name);
        r->failed = 1;
        return;
    }
    bpe_ids_push(&r->ids, id);
}

static void text(render *r, const char *what, const char *s) {
    if (r->failed) return;
    int32_t *ids;
    size_t n;
    char err[K25_ERR_LEN];
    if (tokenizer_encode(r->t, s, strlen(s), 0, &ids, &n, err)) {
        k25_err(r->err, "%s text: %s", what, err);
        r->failed = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) bpe_ids_push(&r->ids, ids[i]);
    free(ids);
}

int chat_render(const k25_tokenizer *t, const char *system, const char *user, int thinking, int32_t **ids, size_t *n,
                char *err) {
    *ids = NULL;
    *n = 0;
    render r = {.t = t, .err = err};
    if (system && system[0]) {
        special(&r, "<|im_system|>");
        text(&r, "role", "system");
        special(&r, "<|im_middle|>");
        text(&r, "system", system);
        special(&r, "<|im_end|>");
    }
    special(&r, "<|im_user|>");
    text(&r, "role", "user");
    special(&r, "<|im_middle|>");
    text(&r, "user", user ? user : "");
    special(&r, "<|im_end|>");
    special(&r, "<|im_assistant|>");
    text(&r, "role", "assistant");
    special(&r, "<|im_middle|>");
    special(&r, "<think>");
    if (!thinking) special(&r, "</think>");
    if (r.failed) {
        free(r.ids.v);
        return -1;
    }
    *ids = r.ids.v;
    *n = r.ids.n;
    return 0;
}
