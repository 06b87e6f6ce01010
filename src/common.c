// Fatal errors, logging, checked allocation.
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int k25_log_rank = -1;
const char *k25_prog = "k25dec";
int k25_verbose = 0;

void k25_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k25_log_rank >= 0)
        fprintf(stderr, "%s: error: rank %d: %s (%s:%d)\n", k25_prog, k25_log_rank, msg, file,
                line);
    else
        fprintf(stderr, "%s: error: %s (%s:%d)\n", k25_prog, msg, file, line);
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

static _Thread_local const char *alloc_purpose;

const char *k25_alloc_purpose(const char *why) {
    const char *prev = alloc_purpose;
    alloc_purpose = why;
    return prev;
}

const char *k25_alloc_purpose_now(void) { return alloc_purpose; }

static K25_NORETURN void out_of_host_memory(size_t n, size_t size) {
    const double gib = (double)n * (double)size / (1024.0 * 1024 * 1024);
    if (alloc_purpose)
        K25_DIE("out of host memory allocating %.3f GiB for %s", gib, alloc_purpose);
    K25_DIE("out of host memory allocating %zu x %zu bytes", n, size);
}

void *k25_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) out_of_host_memory(1, bytes);
    return p;
}

void *k25_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_host_memory(n, size);
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
        int e = errno;
        free(buf);
        k25_err(err, "%s: read error: %s", name, strerror(e));
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int k25_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int k25_is_one_of(const char *s, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(s, *list)) return 1;
    return 0;
}

int k25_flush_check(FILE *f, const char *what, char *err) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return 0;
    int e = errno;
    return k25_err(err, "writing %s failed%s%s", what, e ? ": " : "", e ? strerror(e) : "");
}

int k25_parse_seed(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return -1; // strtoull would take a sign or spaces
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

int k25_open_regular(const char *path, size_t *size, char *err) {
    // O_NONBLOCK: the open of a named pipe would wait for a writer, before the check could refuse it
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        k25_err(err, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        k25_err(err, "%s: not a regular file", path);
        errno = 0; // not the open's: a caller that tells a missing file by errno sees none
        return -1;
    }
    if (size) *size = (size_t)st.st_size;
    return fd;
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

// A Slurm job sets its limit on the job or step, not on the task's own leaf cgroup, hence the walk
// up the tree.
size_t k25_cgroup_limit(const char *root, const char *path, const char *file) {
    size_t lim = SIZE_MAX;
    char dir[1024], name[1200];
    snprintf(dir, sizeof dir, "%s%s", root, path);
    for (;;) {
        snprintf(name, sizeof name, "%s/%s", dir, file);
        FILE *f = fopen(name, "r");
        unsigned long long v;
        if (f) {
            if (fscanf(f, "%llu", &v) == 1 && v < lim) lim = (size_t)v;
            fclose(f);
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(root)) break;
        *slash = 0;
    }
    return lim;
}

size_t k25_host_mem_limit(const char **what) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t phys = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX;
    size_t lim = SIZE_MAX;
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        // "0::/path" (v2) or "N:controller,...:/path" (v1)
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        size_t v = SIZE_MAX;
        if (!c1[1]) {
            v = k25_cgroup_limit("/sys/fs/cgroup", c2 + 1, "memory.max");
        } else {
            char *save = NULL;
            for (char *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (!strcmp(tok, "memory"))
                    v = k25_cgroup_limit("/sys/fs/cgroup/memory", c2 + 1,
                                         "memory.limit_in_bytes");
        }
        if (v < lim) lim = v;
    }
    if (f) fclose(f);
    if (what) *what = lim < phys ? "the cgroup memory limit" : "physical memory";
    return lim < phys ? lim : phys;
}
