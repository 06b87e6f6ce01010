// Fatal errors, logging, checked allocation.
#include "common.h"

#include <errno.h>
#include <mpi.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

int k25_log_rank = -1;
int k25_verbose = 0;

void k25_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k25_log_rank >= 0)
        fprintf(stderr, "k25dec: error: rank %d: %s (%s:%d)\n", k25_log_rank, msg, file, line);
    else
        fprintf(stderr, "k25dec: error: %s (%s:%d)\n", msg, file, line);
    fflush(stderr);
    fflush(stdout);
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void vlog(int all, const char *fmt, va_list ap) {
    char msg[4096];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (all && k25_log_rank >= 0)
        fprintf(stderr, "[rank %d] %s", k25_log_rank, msg);
    else
        fputs(msg, stderr);
}

void k25_log(const char *fmt, ...) {
    if (k25_log_rank > 0) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(0, fmt, ap);
    va_end(ap);
}

void k25_log_all(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(1, fmt, ap);
    va_end(ap);
}

int k25_err(char *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, K25_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *k25_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) K25_DIE("out of host memory allocating %zu bytes", bytes);
    return p;
}

void *k25_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) K25_DIE("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

char *k25_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = k25_malloc(n);
    memcpy(p, s, n);
    return p;
}

char *k25_read_stream(FILE *f, const char *name, size_t *len, char *err) {
    // read to the end rather than trusting a size: pipes and /proc files have none
    size_t cap = 1 << 16, n = 0, got;
    char *buf = k25_malloc(cap + 1);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            char *b = realloc(buf, cap + 1);
            if (!b) K25_DIE("out of host memory reading %s", name);
            buf = b;
        }
    }
    if (ferror(f)) {
        free(buf);
        k25_err(err, "%s: read error", name);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *k25_read_file(const char *path, size_t *len, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        k25_err(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = k25_read_stream(f, path, len, err);
    fclose(f);
    return buf;
}

double k25_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
