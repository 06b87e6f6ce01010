// safetensors reader: header parsing and validation, mmap of one file, name lookup.
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "weights.h"

// ------------------------------------------------------------------------------------------
// dtypes

static const struct {
    const char *name;
    int bits;
    int k25; // k25_dtype or -1
} st_dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 8, -1},           [ST_F4] = {"F4", 4, -1},
    [ST_F6_E2M3] = {"F6_E2M3", 6, -1},     [ST_F6_E3M2] = {"F6_E3M2", 6, -1},
    [ST_U8] = {"U8", 8, -1},               [ST_I8] = {"I8", 8, -1},
    [ST_F8_E5M2] = {"F8_E5M2", 8, -1},     [ST_F8_E4M3] = {"F8_E4M3", 8, -1},
    [ST_F8_E8M0] = {"F8_E8M0", 8, -1},     [ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, -1},
    [ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, -1},
    [ST_I16] = {"I16", 16, -1},            [ST_U16] = {"U16", 16, -1},
    [ST_F16] = {"F16", 16, -1},            [ST_BF16] = {"BF16", 16, K25_BF16},
    [ST_I32] = {"I32", 32, K25_I32},       [ST_U32] = {"U32", 32, -1},
    [ST_F32] = {"F32", 32, K25_F32},       [ST_C64] = {"C64", 64, -1},
    [ST_F64] = {"F64", 64, -1},            [ST_I64] = {"I64", 64, -1},
    [ST_U64] = {"U64", 64, -1},
};

const char *st_dtype_name(st_dtype t) {
    return (unsigned)t < ST_N_DTYPES ? st_dtypes[t].name : "?";
}

int st_dtype_bits(st_dtype t) { return (unsigned)t < ST_N_DTYPES ? st_dtypes[t].bits : 0; }

int st_dtype_from_name(const char *s) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) return i;
    return -1;
}

// ------------------------------------------------------------------------------------------
// header

void st_close(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    if (f->map) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

// A JSON number that is a non-negative integer <= max (doubles are exact up to 2^53).
static int json_u64(const cJSON *n, uint64_t max, uint64_t *out) {
    if (!cJSON_IsNumber(n)) return -1;
    double d = n->valuedouble;
    if (!(d >= 0) || d != floor(d) || d > 9007199254740992.0 || d > (double)max) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

// One tensor entry of the header.
static int parse_entry(st_tensor *t, const cJSON *e, const char *fname, uint64_t data_size,
                       char *err) {
    const char *nm = t->name;
    if (!cJSON_IsObject(e))
        return k25_err(err, "%s: tensor '%.200s': header entry is not a JSON object", fname, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return k25_err(err, "%s: tensor '%.200s': missing or non-string \"dtype\"", fname, nm);
    int d = st_dtype_from_name(dt->valuestring);
    if (d < 0)
        return k25_err(err, "%s: tensor '%.200s': unknown dtype \"%.40s\"", fname, nm,
                       dt->valuestring);
    t->dtype = (st_dtype)d;
    t->k25_dtype = st_dtypes[d].k25;
    if (!cJSON_IsArray(sh))
        return k25_err(err, "%s: tensor '%.200s': missing or non-array \"shape\"", fname, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return k25_err(err, "%s: tensor '%.200s': %d dimensions (at most %d supported)", fname,
                       nm, nd, ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    const uint64_t numel_max = (uint64_t)1 << 53;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, sh) {
        uint64_t v;
        if (json_u64(x, numel_max, &v))
            return k25_err(err, "%s: tensor '%.200s': shape[%d] is not a non-negative integer",
                           fname, nm, i);
        t->shape[i++] = (int64_t)v;
        if (v && numel > numel_max / v)
            return k25_err(err, "%s: tensor '%.200s': shape has too many elements", fname, nm);
        numel *= v;
    }
    t->numel = (int64_t)numel;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        json_u64(cJSON_GetArrayItem(off, 0), UINT64_MAX, &t->begin) ||
        json_u64(cJSON_GetArrayItem(off, 1), UINT64_MAX, &t->end))
        return k25_err(err, "%s: tensor '%.200s': \"data_offsets\" must be [begin, end] of "
                       "non-negative integers", fname, nm);
    if (t->end < t->begin)
        return k25_err(err, "%s: tensor '%.200s': data_offsets [%llu, %llu] end before begin",
                       fname, nm, (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t bits = numel * (uint64_t)st_dtypes[d].bits;
    if (bits % 8)
        return k25_err(err, "%s: tensor '%.200s': %llu elements of %s do not fill whole bytes",
                       fname, nm, (unsigned long long)numel, st_dtypes[d].name);
    if (t->end - t->begin != bits / 8)
        return k25_err(err, "%s: tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes but "
                       "%s x %llu elements need %llu", fname, nm, (unsigned long long)t->begin,
                       (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                       st_dtypes[d].name, (unsigned long long)numel,
                       (unsigned long long)(bits / 8));
    if (t->end > data_size)
        return k25_err(err, "%s: tensor '%.200s': data_offsets [%llu, %llu] beyond the %llu-byte "
                       "data buffer (truncated file?)", fname, nm, (unsigned long long)t->begin,
                       (unsigned long long)t->end, (unsigned long long)data_size);
    return 0;
}

static int parse_metadata(const cJSON *m, const char *fname, int *n, char *err) {
    if (!cJSON_IsObject(m))
        return k25_err(err, "%s: \"__metadata__\" is not a JSON object", fname);
    const cJSON *x;
    *n = 0;
    cJSON_ArrayForEach(x, m) {
        if (!cJSON_IsString(x))
            return k25_err(err, "%s: \"__metadata__\" value of \"%.100s\" is not a string", fname,
                           x->string ? x->string : "");
        (*n)++;
    }
    return 0;
}

// Overlap and duplicate checks once every entry is valid on its own.
static int check_layout(st_file *f, const char *fname, char *err) {
    int n = f->n_tensors;
    const st_tensor **order = k25_malloc(sizeof(*order) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)n, sizeof(*order), cmp_begin);
    int rc = 0;
    const st_tensor *prev = NULL; // the non-empty tensor reaching furthest so far
    for (int i = 0; i < n && !rc; i++) {
        const st_tensor *t = order[i];
        if (t->end == t->begin) continue;
        if (prev && t->begin < prev->end)
            rc = k25_err(err, "%s: tensor '%.180s' [%llu, %llu) overlaps tensor '%.180s' "
                         "[%llu, %llu)", fname, t->name, (unsigned long long)t->begin,
                         (unsigned long long)t->end, prev->name,
                         (unsigned long long)prev->begin, (unsigned long long)prev->end);
        if (!prev || t->end > prev->end) prev = t;
    }
    free((void *)order);
    if (rc) return rc;
    qsort(f->tensors, (size_t)n, sizeof(st_tensor), cmp_name);
    for (int i = 1; i < n; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return k25_err(err, "%s: tensor '%.200s' appears twice in the header", fname,
                           f->tensors[i].name);
    return 0;
}

int st_parse_header(st_file *f, const char *fname, const char *json, size_t len,
                    const uint8_t *data, uint64_t data_size, char *err) {
    memset(f, 0, sizeof *f);
    if (len == 0 || json[0] != '{')
        return k25_err(err, "%s: safetensors header does not begin with '{'", fname);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long pos = (at && at >= json && at <= json + len) ? (long)(at - json) : -1;
        return k25_err(err, "%s: safetensors header is not valid JSON (near byte %ld of %zu)",
                       fname, pos, len);
    }
    // The writer pads the header with spaces; anything else after the object is corrupt.
    for (const char *p = end; p && p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return k25_err(err, "%s: safetensors header has data after the JSON object (byte "
                           "%ld)", fname, (long)(p - json));
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return k25_err(err, "%s: safetensors header is not a JSON object", fname);
    }
    int n = cJSON_GetArraySize(root);
    f->tensors = k25_calloc((size_t)(n ? n : 1), sizeof(st_tensor));
    f->data = data;
    f->data_size = data_size;
    const cJSON *e;
    int rc = 0;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            rc = parse_metadata(e, fname, &f->n_metadata, err);
        } else {
            st_tensor *t = &f->tensors[f->n_tensors++];
            t->name = k25_strdup(e->string);
            rc = parse_entry(t, e, fname, data_size, err);
            t->data = data ? data + t->begin : NULL;
        }
        if (rc) break;
    }
    cJSON_Delete(root);
    if (!rc) rc = check_layout(f, fname, err);
    if (rc) {
        st_close(f);
        return -1;
    }
    return 0;
}

// ------------------------------------------------------------------------------------------
// files

int st_parse_buffer(st_file *f, const char *fname, const uint8_t *buf, size_t len, char *err) {
    memset(f, 0, sizeof *f);
    if (len < 8)
        return k25_err(err, "%s: %zu bytes, too short for a safetensors file (truncated?)", fname,
                       len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > ST_MAX_HEADER)
        return k25_err(err, "%s: header length %llu exceeds the %llu-byte limit (not a "
                       "safetensors file?)", fname, (unsigned long long)n,
                       (unsigned long long)ST_MAX_HEADER);
    if (n > len - 8)
        return k25_err(err, "%s: header length %llu exceeds the file size %zu (truncated?)",
                       fname, (unsigned long long)n, len);
    return st_parse_header(f, fname, (const char *)buf + 8, (size_t)n, buf + 8 + n,
                           (uint64_t)(len - 8 - n), err);
}

int st_open(st_file *f, const char *path, char *err) {
    memset(f, 0, sizeof *f);
    size_t size;
    int fd = k25_open_regular(path, &size, err);
    if (fd < 0) return -1;
    if (size < 8) {
        close(fd);
        return k25_err(err, "%s: %zu bytes, too short for a safetensors file (truncated?)", path,
                       size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return k25_err(err, "%s: mmap failed: %s", path, strerror(e));
    if (st_parse_buffer(f, path, map, size, err)) {
        munmap(map, size);
        return -1;
    }
    f->map = map;
    f->map_size = size;
    f->path = k25_strdup(path);
    return 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f->n_tensors) return NULL;
    st_tensor key;
    key.name = (char *)name;
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof(st_tensor), cmp_name);
}
