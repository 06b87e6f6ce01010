// Fuzz target: the safetensors reader, on a whole file image (st_parse_buffer: 8-byte header
// length, JSON header, byte buffer) and on the input taken as a bare JSON header
// (st_parse_header with a large, unmapped buffer, so offset and overlap checks are reached
// without a matching file size).
//
// An accepted file must honour the header's promises, checked here independently: names
// sorted and unique, st_find finds each, shape product = numel, [begin, end) inside the
// buffer with end - begin = numel * dtype bits / 8, non-empty ranges disjoint, data pointer
// = buffer + begin. Every byte range is read at both ends, so a range past the input is an
// AddressSanitizer report.
#include "fuzz_common.h"
#include "safetensors.h"

static volatile uint8_t sink;

static void check_file(const st_file *f, const uint8_t *buf, uint64_t buf_size) {
    if (f->n_tensors < 0) fuzz_fail("n_tensors %d", f->n_tensors);
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (i && strcmp(f->tensors[i - 1].name, t->name) >= 0)
            fuzz_fail("tensors not sorted/unique at '%s'", t->name);
        if (st_find(f, t->name) != t) fuzz_fail("st_find misses '%s'", t->name);
        if ((unsigned)t->dtype >= ST_N_DTYPES) fuzz_fail("dtype %d", (int)t->dtype);
        if (st_dtype_from_name(st_dtype_name(t->dtype)) != (int)t->dtype)
            fuzz_fail("dtype name round trip for %d", (int)t->dtype);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) fuzz_fail("ndim %d", t->ndim);
        unsigned __int128 numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) fuzz_fail("negative dim");
            numel *= (uint64_t)t->shape[d];
        }
        if (numel != (unsigned __int128)(uint64_t)t->numel) fuzz_fail("numel mismatch '%s'", t->name);
        unsigned __int128 bits = numel * (unsigned)st_dtype_bits(t->dtype);
        if (t->begin > t->end || t->end > buf_size) fuzz_fail("range outside the buffer '%s'", t->name);
        if (bits % 8 || (unsigned __int128)(t->end - t->begin) != bits / 8)
            fuzz_fail("byte size mismatch '%s'", t->name);
        if (buf) {
            if (t->data != buf + t->begin) fuzz_fail("data pointer of '%s'", t->name);
            if (t->end > t->begin) sink = t->data[0] ^ t->data[t->end - t->begin - 1];
        }
        // Disjointness: quadratic, the header sizes the fuzzer makes are small.
        for (int j = 0; j < i; j++) {
            const st_tensor *u = &f->tensors[j];
            if (t->end > t->begin && u->end > u->begin && t->begin < u->end && u->begin < t->end)
                fuzz_fail("'%s' and '%s' overlap", t->name, u->name);
        }
    }
    (void)st_find(f, "");
    (void)st_find(f, "language_model.model.embed_tokens.weight");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (st_parse_buffer(&f, "fuzz.safetensors", data, size, err)) {
        if (strncmp(err, "fuzz.safetensors", 16)) fuzz_fail("message does not name the file: '%s'", err);
        if (f.tensors || f.n_tensors) fuzz_fail("rejected file still holds tensors");
    } else {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
        check_file(&f, data + 8 + n, size - 8 - n);
        st_close(&f);
    }

    const uint64_t big = (uint64_t)1 << 40;
    err[0] = 0;
    if (st_parse_header(&f, "fuzz.json", (const char *)data, size, NULL, big, err)) {
        if (!err[0]) fuzz_fail("header rejected without a message");
    } else {
        check_file(&f, NULL, big);
        st_close(&f);
    }
    return 0;
}
