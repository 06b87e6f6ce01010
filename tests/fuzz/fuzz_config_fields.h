// Field-by-field comparison of two configurations (from config.def, so new keys are covered
// without edits). Floats compare by bits so -0 and 0 count as different; list fields compare
// only their used entries. Returns the first differing "section.key" or NULL.
#pragma once
#include <string.h>

#include "config.h"

static inline const char *fuzz_config_diff(const k25_config *a, const k25_config *b) {
#define K25_CFG_INT(f) if (a->f != b->f) return
#define K25_CFG_BOOL(f) if (a->f != b->f) return
#define K25_CFG_FLOAT(f) if (memcmp(&a->f, &b->f, sizeof a->f)) return
#define K25_CFG_STR(f) if (strcmp(a->f, b->f)) return
#define K25_CFG_INTS(f)                                                                            \
    if (a->f##_n != b->f##_n || memcmp(a->f, b->f, sizeof a->f[0] * (size_t)a->f##_n)) return
#define K25_CFG(section, key, type, field, def) K25_CFG_##type(field) #section "." #key;
#include "config.def"
#undef K25_CFG
#undef K25_CFG_INT
#undef K25_CFG_FLOAT
#undef K25_CFG_BOOL
#undef K25_CFG_STR
#undef K25_CFG_INTS
    return NULL;
}
