// One safetensors file: the 8-byte little-endian header length, the JSON header (tensor name ->
// dtype, shape, data_offsets into the byte buffer; optional "__metadata__" string map) and the
// byte buffer, mmap'd read-only. Every tensor entry is validated (known dtype, non-negative
// integer shape, offsets in bounds, size = numel * dtype size, no overlap, no duplicate name)
// and the table is sorted by name for binary search.
//
// The parsers never exit: they return -1 with a message naming the file and the tensor, so
// they can be driven by tests and fuzzers on arbitrary bytes.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define ST_MAX_HEADER ((uint64_t)100000000) // same bound as the reference loader
#define ST_MAX_DIMS 8

// Every dtype name of the safetensors format; only BF16, F32 and I32 are used by the model.
typedef enum {
    ST_BOOL, ST_F4, ST_F6_E2M3, ST_F6_E3M2, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0,
    ST_F8_E4M3FNUZ, ST_F8_E5M2FNUZ, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_C64, ST_F64, ST_I64, ST_U64, ST_N_DTYPES
} st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int k25_dtype;              // k25_dtype (weights.h) or -1 when the model cannot use it
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;        // byte range in the data buffer, end exclusive
    const uint8_t *data;        // first byte (NULL when the buffer is not mapped)
} st_tensor;

typedef struct st_file {
    char *path;                 // for messages
    void *map;                  // whole file, mmap'd (NULL for st_parse_buffer)
    size_t map_size;
    const uint8_t *data;        // byte buffer (after the header)
    uint64_t data_size;
    st_tensor *tensors;         // [n_tensors] sorted by name
    int n_tensors;
    int n_metadata;             // entries of __metadata__
} st_file;

#ifdef __cplusplus
extern "C" {
#endif

const char *st_dtype_name(st_dtype t);
// Bits per element (sub-byte float formats: 4 or 6).
int st_dtype_bits(st_dtype t);
// -1 when the name is not a safetensors dtype.
int st_dtype_from_name(const char *s);

// Parses a JSON header of len bytes for a byte buffer of data_size bytes (data may be NULL).
// fname is only used in messages. Returns 0 or -1 with err set; on error f holds nothing.
int st_parse_header(st_file *f, const char *fname, const char *json, size_t len,
                    const uint8_t *data, uint64_t data_size, char *err);
// Parses a whole file image (8-byte length + header + buffer) held in memory; f->data points
// into buf, which must outlive f.
int st_parse_buffer(st_file *f, const char *fname, const uint8_t *buf, size_t len, char *err);
// Opens and mmaps path and parses it.
int st_open(st_file *f, const char *path, char *err);
void st_close(st_file *f);
// Tensor by exact name, or NULL.
const st_tensor *st_find(const st_file *f, const char *name);

#ifdef __cplusplus
}
#endif

// ------------------------------------------------------------------------------------------
// Writing
// ------------------------------------------------------------------------------------------

// One tensor of a file being written: its byte range [begin, end) in the data buffer.
typedef struct st_out_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    const int64_t *shape;       // [ndim]
    uint64_t begin, end;
} st_out_tensor;

#ifdef __cplusplus
extern "C" {
#endif

// Creates path and writes the 8-byte header length and the JSON header ("__metadata__"
// {"format":"pt"}, then the tensors in the order given, padded with spaces to a multiple of 8
// bytes). Returns the file positioned at the start of the data buffer, which the caller writes
// and closes; or NULL with a message naming path.
FILE *st_write_header(const char *path, const st_out_tensor *ts, int n, char *err);
// fwrite of n bytes; -1 with a message naming path when it falls short.
int st_write_all(FILE *f, const void *p, size_t n, const char *path, char *err);

#ifdef __cplusplus
}
#endif
