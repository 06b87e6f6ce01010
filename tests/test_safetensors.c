// safetensors reader: a valid file parses with the right table; every kind of bad input is
// refused with a message naming the file and the tensor; random corruptions never crash.
//
// With arguments, `test_safetensors --dump FILE` prints one line per tensor
// "<name> <dtype> <d0,d1,...> <crc32 of its bytes as 8 hex digits>" (sorted by name), used by
// tests/t_safetensors_python.sh to compare against files written by the Python library.
#include <stdarg.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "safetensors.h"
#include "weights.h"
#include "test_util.h"


#define FNAME "bad.safetensors"

// A file image: 8-byte little-endian header length, header, data_len bytes of data (i % 251).
static uint8_t *image(const char *json, size_t data_len, size_t *len) {
    size_t n = strlen(json);
    *len = 8 + n + data_len;
    uint8_t *b = k25_malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)(i % 251);
    return b;
}

// Parses json + data_len bytes and expects an error whose message contains every given
// substring (NULL-terminated list).
static void expect_error(const char *what, const char *json, size_t data_len, ...) {
    size_t len;
    uint8_t *b = image(json, data_len, &len);
    st_file f;
    char err[K25_ERR_LEN] = "";
    int rc = st_parse_buffer(&f, FNAME, b, len, err);
    EXPECT(rc == -1, "%s: accepted", what);
    if (rc == 0) st_close(&f);
    va_list ap;
    va_start(ap, data_len);
    for (const char *s; (s = va_arg(ap, const char *));)
        EXPECT(strstr(err, s), "%s: message \"%s\" lacks \"%s\"", what, err, s);
    va_end(ap);
    free(b);
}

// ------------------------------------------------------------------------------------------

static const char *valid_json =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"b.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
    "\"c.packed\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[28,44]},"
    "\"d.half\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[44,48]},"
    "\"e.empty\":{\"dtype\":\"BF16\",\"shape\":[0,5],\"data_offsets\":[48,48]},"
    "\"f.scalar\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[48,56]}}    ";

static void check_valid_table(const st_file *f, const uint8_t *data) {
    EXPECT(f->n_tensors == 6, "n_tensors %d", f->n_tensors);
    EXPECT(f->n_metadata == 1, "n_metadata %d", f->n_metadata);
    const st_tensor *a = st_find(f, "a.weight"), *b = st_find(f, "b.bias"),
                    *c = st_find(f, "c.packed"), *d = st_find(f, "d.half"),
                    *e = st_find(f, "e.empty"), *s = st_find(f, "f.scalar");
    EXPECT(a && b && c && d && e && s, "lookup failed");
    EXPECT(!st_find(f, "__metadata__") && !st_find(f, "a") && !st_find(f, "z"), "phantom tensor");
    if (!(a && b && c && d && e && s)) return;
    EXPECT(a->dtype == ST_BF16 && a->k25_dtype == K25_BF16 && a->ndim == 2 && a->shape[0] == 2 &&
              a->shape[1] == 3 && a->numel == 6 && a->begin == 16 && a->end == 28,
          "a.weight entry");
    EXPECT(b->dtype == ST_F32 && b->k25_dtype == K25_F32 && b->ndim == 1 && b->shape[0] == 4,
          "b.bias entry");
    EXPECT(c->dtype == ST_I32 && c->k25_dtype == K25_I32, "c.packed entry");
    EXPECT(d->dtype == ST_F16 && d->k25_dtype == -1, "F16 recognized, not usable by the model");
    EXPECT(e->numel == 0 && e->ndim == 2, "empty tensor");
    EXPECT(s->ndim == 0 && s->numel == 1 && s->k25_dtype == -1, "0-rank tensor");
    EXPECT(a->data == data + 16 && b->data == data && c->data == data + 28, "data pointers");
    EXPECT(a->data[0] == 16 % 251 && c->data[15] == 43, "data bytes");
}

static void test_valid(void) {
    size_t len;
    uint8_t *b = image(valid_json, 56, &len);
    st_file f;
    char err[K25_ERR_LEN];
    int rc = st_parse_buffer(&f, FNAME, b, len, err);
    EXPECT(rc == 0, "valid buffer refused: %s", err);
    if (!rc) {
        check_valid_table(&f, b + 8 + strlen(valid_json));
        st_close(&f);
    }
    // The same bytes through a real file and mmap.
    char path[] = "/tmp/k25-st-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0 && write(fd, b, len) == (ssize_t)len, "temp file");
    close(fd);
    rc = st_open(&f, path, err);
    EXPECT(rc == 0, "st_open refused a valid file: %s", err);
    if (!rc) {
        check_valid_table(&f, f.data);
        EXPECT(f.data == (const uint8_t *)f.map + 8 + strlen(valid_json), "mapped data offset");
        EXPECT(!strcmp(f.path, path), "path kept");
        st_close(&f);
    }
    // Truncated on disk: the message names the file and the tensor past the end.
    EXPECT(truncate(path, (off_t)(len - 4)) == 0, "truncate");
    rc = st_open(&f, path, err);
    EXPECT(rc == -1 && strstr(err, path) && strstr(err, "f.scalar") && strstr(err, "truncated"),
          "truncated file: %s", err);
    EXPECT(truncate(path, 5) == 0, "truncate");
    rc = st_open(&f, path, err);
    EXPECT(rc == -1 && strstr(err, path) && strstr(err, "too short"), "5-byte file: %s", err);
    unlink(path);
    rc = st_open(&f, path, err);
    EXPECT(rc == -1 && strstr(err, path), "missing file: %s", err);
    free(b);
}

static void test_bad(void) {
    // Whole-file framing.
    {
        size_t len;
        uint8_t *b = image(valid_json, 56, &len);
        st_file f;
        char err[K25_ERR_LEN] = "";
        EXPECT(st_parse_buffer(&f, FNAME, b, len - 1, err) == -1 && strstr(err, FNAME) &&
                  strstr(err, "f.scalar"),
              "truncated buffer: %s", err);
        EXPECT(st_parse_buffer(&f, FNAME, b, 7, err) == -1 && strstr(err, FNAME),
              "7-byte buffer: %s", err);
        uint64_t huge = ST_MAX_HEADER + 1;
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(huge >> (8 * i));
        EXPECT(st_parse_buffer(&f, FNAME, b, len, err) == -1 && strstr(err, FNAME) &&
                  strstr(err, "header length"),
              "header length over the limit: %s", err);
        uint64_t past = len - 8 + 1;
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(past >> (8 * i));
        EXPECT(st_parse_buffer(&f, FNAME, b, len, err) == -1 && strstr(err, "exceeds the file"),
              "header length past the file: %s", err);
        free(b);
    }
    expect_error("corrupt JSON", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],", 4, FNAME, "JSON",
                 NULL);
    expect_error("not an object", "[1,2]", 0, FNAME, NULL);
    expect_error("no opening brace", " {}", 0, FNAME, "'{'", NULL);
    expect_error("garbage after the object", "{}  x", 0, FNAME, "after", NULL);
    expect_error("offsets out of bounds",
                 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[4,12]}}", 8, FNAME,
                 "'w'", "beyond", NULL);
    expect_error("overlapping offsets",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"y\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]}}",
                 16, FNAME, "'x'", "'y'", "overlaps", NULL);
    expect_error("identical ranges",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"y\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 8, FNAME, "overlaps", NULL);
    expect_error("size does not match dtype x shape",
                 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 16,
                 FNAME, "'w'", "need 12", NULL);
    expect_error("unknown dtype",
                 "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4, FNAME,
                 "'w'", "unknown dtype", "Q4_K", NULL);
    expect_error("negative dimension",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 4, FNAME,
                 "'w'", "shape[0]", NULL);
    expect_error("fractional dimension",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", 8, FNAME,
                 "'w'", "shape[0]", NULL);
    expect_error("missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FNAME,
                 "'w'", "dtype", NULL);
    expect_error("missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, FNAME,
                 "'w'", "shape", NULL);
    expect_error("three offsets",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, FNAME,
                 "'w'", "data_offsets", NULL);
    expect_error("end before begin",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, FNAME,
                 "'w'", "end before begin", NULL);
    expect_error("element count overflow",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                 "\"data_offsets\":[0,4]}}", 8, FNAME, "'w'", NULL);
    expect_error("duplicate name",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, FNAME,
                 "'w'", "twice", NULL);
    expect_error("metadata value not a string",
                 "{\"__metadata__\":{\"format\":3}}", 0, FNAME, "__metadata__", NULL);
    expect_error("entry not an object", "{\"w\":[1,2]}", 0, FNAME, "'w'", NULL);
    expect_error("sub-byte dtype with odd count",
                 "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 4, FNAME,
                 "'w'", NULL);
}

// Random corruptions of a valid image: parse returns 0 or -1 and never reads out of bounds
// (the SAN=1 build turns any stray access into a failure).
static void test_mutations(void) {
    size_t len;
    uint8_t *b = image(valid_json, 56, &len);
    uint8_t *m = k25_malloc(len);
    uint64_t s = 0x1234567;
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(m, b, len);
        size_t mlen = len;
        int edits = 1 + (int)(s % 4);
        for (int e = 0; e < edits; e++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % len;
            switch ((s >> 20) % 4) {
            case 0: m[pos] = (uint8_t)(s >> 8); break;
            case 1: m[pos] = "{}[]\",:0123456789"[(s >> 8) % 17]; break;
            case 2: mlen = pos; break;
            default: m[pos] ^= (uint8_t)(1u << ((s >> 8) % 8)); break;
            }
        }
        st_file f;
        char err[K25_ERR_LEN];
        int rc = st_parse_buffer(&f, FNAME, m, mlen, err);
        EXPECT(rc == 0 || rc == -1, "return code %d", rc);
        if (rc == 0) {
            accepted++;
            for (int i = 0; i < f.n_tensors; i++) {
                const st_tensor *t = &f.tensors[i];
                EXPECT(t->end <= f.data_size && t->data >= m && t->data + (t->end - t->begin) <=
                      m + mlen, "accepted tensor outside the buffer");
            }
            st_close(&f);
        } else {
            EXPECT(strstr(err, FNAME), "message without the file name: %s", err);
        }
    }
    EXPECT(accepted > 0 && accepted < 3000, "mutations: %d accepted", accepted);
    free(m);
    free(b);
}

static void test_dtypes(void) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        EXPECT(st_dtype_from_name(st_dtype_name((st_dtype)i)) == i, "dtype %d name", i);
    EXPECT(st_dtype_from_name("bf16") == -1, "dtype names are case-sensitive");
    EXPECT(st_dtype_bits(ST_BF16) == 16 && st_dtype_bits(ST_F4) == 4 &&
              st_dtype_bits(ST_F6_E3M2) == 6 && st_dtype_bits(ST_C64) == 64,
          "dtype bits");
}

// ------------------------------------------------------------------------------------------

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int dump(const char *path) {
    st_file f;
    char err[K25_ERR_LEN];
    if (st_open(&f, path, err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    qsort(f.tensors, (size_t)f.n_tensors, sizeof(st_tensor), cmp_tensor_name);
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        printf("%s %s ", t->name, st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? "," : "", (long long)t->shape[d]);
        uLong crc = crc32(0L, Z_NULL, 0);
        crc = crc32_z(crc, t->data, (z_size_t)(t->end - t->begin));
        printf("%s %08lx\n", t->ndim ? "" : "-", (unsigned long)crc);
    }
    st_close(&f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) return dump(argv[2]);
    test_dtypes();
    test_valid();
    test_bad();
    test_mutations();
    if (test_failures) {
        fprintf(stderr, "test_safetensors: %d failure(s)\n", test_failures);
        return 1;
    }
    printf("test_safetensors: ok\n");
    return 0;
}
