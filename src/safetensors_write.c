// Writing safetensors files: the length-prefixed JSON header that st_parse_header reads back.
// The data buffer is the caller's to write, in whatever pieces it produces it.
#include <errno.h>
#include <string.h>

#include "safetensors.h"

int st_write_all(FILE *f, const void *p, size_t n, const char *path, char *err) {
    if (n && fwrite(p, 1, n, f) != n)
        return k25_err(err, "%s: write error: %s", path, strerror(errno));
    return 0;
}

FILE *st_write_header(const char *path, const st_out_tensor *ts, int n, char *err) {
    // Room per entry: the name plus the fixed keys, a dtype name, ST_MAX_DIMS dimensions and
    // two offsets of at most 20 digits each.
    size_t cap = 64, len = 0;
    for (int i = 0; i < n; i++) cap += strlen(ts[i].name) + 64 + 21 * ST_MAX_DIMS + 42;
    char *hdr = k25_malloc(cap);
    len += (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        const st_out_tensor *t = &ts[i];
        K25_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "%s: %d dimensions", t->name, t->ndim);
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                t->name, st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)t->shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)t->begin, (unsigned long long)t->end);
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    K25_CHECK(len < cap, "header buffer overflow");
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        k25_err(err, "%s: cannot create: %s", path, strerror(errno));
        return NULL;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)len >> (8 * i));
    int rc = st_write_all(f, le, 8, path, err) || st_write_all(f, hdr, len, path, err);
    free(hdr);
    if (rc) {
        fclose(f);
        return NULL;
    }
    return f;
}
