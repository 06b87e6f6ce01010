// The kernel trace on CUPTI's activity API (src/kernel_trace.h). CUPTI hands over full record
// buffers from its own thread; each is reduced at once to the kernels that can still belong to a
// marked step, so a long run traced from the start keeps only its steps' records.
#include <cupti.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernel_trace.h"

// the C++ runtime's demangler (the CUDA builds link libstdc++): kernel names are mangled
extern char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

#define TRACE_BUF_BYTES (8u << 20)

#define CUPTI_TRY(call)                                                                    \
    do {                                                                                   \
        CUptiResult r_ = (call);                                                           \
        if (r_ != CUPTI_SUCCESS) {                                                         \
            const char *s_ = "unknown error";                                              \
            cuptiGetResultString(r_, &s_);                                                 \
            return k25_err(err, "--trace: %s: %s", #call, s_);                             \
        }                                                                                  \
    } while (0)

typedef struct {
    uint64_t start, end;
    uint32_t stream, regs, smem_dyn, smem_config;
    int32_t grid[3], block[3];
    int name; // index into tr.names
} trace_kernel;

typedef struct {
    uint64_t t0, t1;
    int rows;
} trace_step;

static struct {
    pthread_mutex_t lock;
    trace_kernel *k;
    size_t n_k, cap_k;
    trace_step *steps;
    size_t n_steps, cap_steps;
    uint64_t pending;  // the open step's begin (0: none open)
    char **names;      // distinct kernel names, in CUPTI's mangled form
    size_t n_names, cap_names;
} tr = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void grow(void **p, size_t elem, size_t need, size_t *cap) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap * 2 : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) K25_DIE("--trace: out of host memory for %zu records", need);
    *p = q;
    *cap = c;
}

static int name_index(const char *name) {
    for (size_t i = tr.n_names; i-- > 0;)
        if (!strcmp(tr.names[i], name)) return (int)i;
    grow((void **)&tr.names, sizeof(char *), tr.n_names + 1, &tr.cap_names);
    tr.names[tr.n_names] = k25_strdup(name);
    return (int)tr.n_names++;
}

// Whether a kernel that started at t can belong to a marked step: inside a closed one, or after
// the open one's begin (steps are marked in time order, so every later step starts after now).
static int may_belong(uint64_t t) {
    if (tr.pending && t >= tr.pending) return 1;
    size_t lo = 0, hi = tr.n_steps; // first step with t0 > t
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tr.steps[mid].t0 <= t) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && t <= tr.steps[lo - 1].t1;
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, TRACE_BUF_BYTES); // NULL: CUPTI drops records, finish reports it
    *size = *buf ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&tr.lock);
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *a = (const CUpti_ActivityKernel10 *)rec;
        // a forced flush can hand over a kernel not yet timed (its end 0): never one of a step's
        if (a->end < a->start || !may_belong(a->start)) continue;
        grow((void **)&tr.k, sizeof *tr.k, tr.n_k + 1, &tr.cap_k);
        tr.k[tr.n_k++] = (trace_kernel){
            .start = a->start, .end = a->end, .stream = a->streamId,
            .regs = a->registersPerThread,
            .smem_dyn = (uint32_t)a->dynamicSharedMemory,
            .smem_config = a->sharedMemoryExecuted,
            .grid = {a->gridX, a->gridY, a->gridZ}, .block = {a->blockX, a->blockY, a->blockZ},
            .name = name_index(a->name ? a->name : "?"),
        };
    }
    pthread_mutex_unlock(&tr.lock);
    free(buf);
}

int kernel_trace_start(char *err) {
    CUPTI_TRY(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    return 0;
}

static uint64_t now_ns(void) {
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    return t;
}

void kernel_trace_step_begin(void) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&tr.lock);
    tr.pending = t;
    pthread_mutex_unlock(&tr.lock);
}

void kernel_trace_step_end(int rows) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&tr.lock);
    if (tr.pending) {
        grow((void **)&tr.steps, sizeof *tr.steps, tr.n_steps + 1, &tr.cap_steps);
        tr.steps[tr.n_steps++] = (trace_step){.t0 = tr.pending, .t1 = t, .rows = rows};
        tr.pending = 0;
    }
    pthread_mutex_unlock(&tr.lock);
}

static int by_start(const void *a, const void *b) {
    const trace_kernel *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int kernel_trace_finish(const char *path, char *err) {
    CUPTI_TRY(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    CUPTI_TRY(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    size_t dropped = 0;
    CUPTI_TRY(cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped));
    if (dropped) return k25_err(err, "--trace: %zu kernel records dropped (host memory)", dropped);
    FILE *f = fopen(path, "w");
    if (!f) return k25_err(err, "--trace %s: %s", path, strerror(errno));
    fprintf(f, "rows,step,start_ns,end_ns,stream,grid,block,regs,smem_dyn,smem_config,name\n");
    qsort(tr.k, tr.n_k, sizeof *tr.k, by_start);
    size_t s = 0;
    for (size_t i = 0; i < tr.n_k; i++) {
        const trace_kernel *k = &tr.k[i];
        while (s < tr.n_steps && tr.steps[s].t1 < k->start) s++;
        if (s == tr.n_steps) break;
        const trace_step *st = &tr.steps[s];
        if (k->start < st->t0) continue;
        int status = -1;
        char *name = __cxa_demangle(tr.names[k->name], NULL, NULL, &status);
        fprintf(f, "%d,%zu,%llu,%llu,%u,%dx%dx%d,%dx%dx%d,%u,%u,%u,\"%s\"\n", st->rows, s,
                (unsigned long long)(k->start - st->t0), (unsigned long long)(k->end - st->t0),
                k->stream, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
                k->block[2], k->regs, k->smem_dyn, k->smem_config,
                status == 0 ? name : tr.names[k->name]);
        free(name);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return k25_err(err, "--trace %s: write failed", path);
    return 0;
}
