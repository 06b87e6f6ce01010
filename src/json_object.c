#include "json_object.h"

#include <stdio.h>
#include <string.h>

#include "common.h"

// path: the dotted name of v (empty at the top).
static int check_keys(const cJSON *v, const char *path, const char *name, char *err) {
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        char sub[512];
        if (cJSON_IsObject(v)) {
            for (const cJSON *d = v->child; d != c; d = d->next)
                if (!strcmp(d->string, c->string))
                    return k25_err(err, "%s: key '%s%s%s' appears more than once", name, path,
                                   *path ? "." : "", c->string);
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", c->string);
        } else {
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
        }
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && check_keys(c, sub, name, err)) return -1;
    }
    return 0;
}

cJSON *json_parse_object(const char *text, size_t len, const char *name, char *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text && at <= text + len ? (long)(at - text) : -1;
        k25_err(err, "%s: invalid JSON (near byte %ld)", name, off);
        return NULL;
    }
    // cJSON stops after the first value; Python's json refuses what follows, and so do we.
    const char *p = end;
    while (p && p < text + len && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (p && p < text + len)
        k25_err(err, "%s: data after the JSON object (byte %ld)", name, (long)(p - text));
    else if (!cJSON_IsObject(root))
        k25_err(err, "%s: expected a JSON object", name);
    else if (!check_keys(root, "", name, err))
        return root;
    cJSON_Delete(root);
    return NULL;
}
