#include "json_keys.h"

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

int json_check_unique_keys(const cJSON *v, const char *name, char *err) {
    return check_keys(v, "", name, err);
}
