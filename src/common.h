// Error handling, logging and small helpers shared by every part of k25dec.
//
// A fatal error prints "k25dec: rank R: file:line: message" and aborts the whole MPI job
// (MPI_Abort), so no rank is left waiting in a collective. Parsers and loaders that can be
// fuzzed or tested on bad input do not call K25_DIE themselves: they return non-zero and write
// a message into a caller's buffer (char err[K25_ERR_LEN]); the command line turns that into
// a fatal error.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define K25_ERR_LEN 512

// Debug builds (make DEBUG=1) check every layer's hidden state for NaN/Inf by default; release
// builds do it with --check-finite.
#if defined(K25_DEBUG) && K25_DEBUG
#define K25_CHECK_FINITE_DEFAULT 1
#else
#define K25_CHECK_FINITE_DEFAULT 0
#endif

#if defined(__GNUC__)
#define K25_NORETURN __attribute__((noreturn))
#define K25_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define K25_NORETURN
#define K25_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

// World rank for messages; -1 before MPI is up (set by dist_init).
extern int k25_log_rank;
// The program that fatal errors name ("k25dec" unless a tool's main sets its own).
extern const char *k25_prog;
// Non-zero: verbose logging on stderr (--verbose).
extern int k25_verbose;

void k25_fatal(const char *file, int line, const char *fmt, ...) K25_NORETURN K25_PRINTF(3, 4);
// Rank 0 only, to stderr.
void k25_log(const char *fmt, ...) K25_PRINTF(1, 2);
// Every rank, to stderr, prefixed with the rank.
void k25_log_all(const char *fmt, ...) K25_PRINTF(1, 2);
void *k25_malloc(size_t bytes);          // dies on failure
void *k25_calloc(size_t n, size_t size); // dies on failure
// What the allocations from here on are for, in the message of an allocation that fails (host
// or device): a size a setting decides is then named by the setting, not only by its bytes.
// NULL: nothing. Returns the previous description, to be set back once those allocations end.
const char *k25_alloc_purpose(const char *why);
// The description k25_alloc_purpose set (NULL: none).
const char *k25_alloc_purpose_now(void);
char *k25_strdup(const char *s);
double k25_now_ms(void);                 // monotonic clock
// Formats into err (K25_ERR_LEN bytes) and returns -1, for `return k25_err(err, ...)`.
int k25_err(char *err, const char *fmt, ...) K25_PRINTF(2, 3);
// A whole decimal string s as a number in lo..hi: 0, or -1 (empty, trailing text, out of range).
int k25_parse_long(const char *s, long lo, long hi, long *out);
// A synthetic-weights seed: whole decimal digits (no sign, no octal or hex) within 64 bits; 0
// or -1. Every tool reads a seed this way, so that one SEED names the same weights everywhere.
int k25_parse_seed(const char *s, uint64_t *out);
// Whether s is one of the NULL-terminated list's words (a tool's options that take a value: an
// unknown word is then named as unknown even when it comes last, not as lacking its value).
int k25_is_one_of(const char *s, const char *const *list);
// Flushes f: -1 with err naming `what` and the reason when that or an earlier write to f failed
// (a full disk, a closed pipe), so that a program never reports success over lost output.
int k25_flush_check(FILE *f, const char *what, char *err);
// Opens PATH for reading when it is a regular file (its size in *size when given): the file
// descriptor, or -1 with err set ("PATH: cannot open: ...", with the open's errno kept, or
// "PATH: not a regular file", errno 0). A named pipe in its place is refused, not waited on.
int k25_open_regular(const char *path, size_t *size, char *err);
// A whole file in a NUL-terminated buffer (*len, when given, without the NUL), to free; NULL
// with err set ("PATH: cannot open: ..." or "PATH: read error: ...") when it cannot be read.
char *k25_read_file(const char *path, size_t *len, char *err);
// The same for the rest of an open stream (stdin), named `name` in messages.
char *k25_read_stream(FILE *f, const char *name, size_t *len, char *err);
// Host memory the processes of this node may use: physical memory, or less where this
// process's cgroup (a Slurm job's --mem, a container) limits it; *what, when given, names which.
size_t k25_host_mem_limit(const char **what);
// The smallest number in FILE of the cgroup directory ROOT PATH and of each directory above it
// up to ROOT; SIZE_MAX when none has one ("max", as cgroup v2 writes no limit, reads as none).
size_t k25_cgroup_limit(const char *root, const char *path, const char *file);

#ifdef __cplusplus
}
#endif

#define K25_DIE(...) k25_fatal(__FILE__, __LINE__, __VA_ARGS__)
#define K25_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) K25_DIE(__VA_ARGS__);                                                         \
    } while (0)

static inline float k25_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

// Round to nearest even, NaN kept quiet.
static inline uint16_t k25_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t lsb = (v.u >> 16) & 1u;
    v.u += 0x7fffu + lsb;
    return (uint16_t)(v.u >> 16);
}
