// The phase stamps' file: every stamping file's stamps gathered and written as CSV
// (kernels/phase_stamps.cuh).
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "cuda_common.cuh"
#include "kernel_trace.h"
#include "phase_stamps.cuh"

#ifdef K25_PHASES
static const char *const site_name[K25_PHASE_SITES] = {"router", "gate_up", "down"};

// Appends rows,site,block,units,t0..t7 (ns after the earliest stamp read, empty where a stamp
// is missing), then clears the stamps so that the next read holds only later launches.
int kernel_phases_write(const char *path, int rows, char *err) {
    static unsigned long long t[K25_PHASE_SITES][K25_PHASE_BLOCKS][K25_PHASE_N];
    static int units[K25_PHASE_SITES][K25_PHASE_BLOCKS];
    memset(t, 0, sizeof t), memset(units, 0, sizeof units);
    CUDA_CHECK(cudaDeviceSynchronize());
    k25k_phases_read_router(&t[0][0][0], &units[0][0]);
    k25k_phases_read_moe(&t[0][0][0], &units[0][0]);
    unsigned long long t0 = ~0ull;
    for (int s = 0; s < K25_PHASE_SITES; s++)
        for (int b = 0; b < K25_PHASE_BLOCKS; b++)
            if (t[s][b][0] && t[s][b][0] < t0) t0 = t[s][b][0];
    FILE *f = fopen(path, "a");
    if (!f) return k25_err(err, "--phases: cannot write %s", path);
    fseek(f, 0, SEEK_END); // an empty file gets the header
    if (ftell(f) == 0) fprintf(f, "rows,site,block,units,t0,t1,t2,t3,t4,t5,t6,t7\n");
    for (int s = 0; s < K25_PHASE_SITES; s++)
        for (int b = 0; b < K25_PHASE_BLOCKS; b++) {
            if (!t[s][b][0]) continue;
            fprintf(f, "%d,%s,%d,%d", rows, site_name[s], b, units[s][b]);
            for (int p = 0; p < K25_PHASE_N; p++) {
                if (t[s][b][p]) fprintf(f, ",%llu", t[s][b][p] - t0);
                else fputs(",", f);
            }
            fputc('\n', f);
        }
    const int bad = ferror(f) | fclose(f);
    if (bad) return k25_err(err, "--phases: writing %s failed", path);
    return 0;
}
int kernel_phases_built(char *err) {
    (void)err;
    return 0;
}
#else
int kernel_phases_write(const char *path, int rows, char *err) {
    (void)path, (void)rows;
    return kernel_phases_built(err);
}
int kernel_phases_built(char *err) {
    return k25_err(err, "--phases: this binary was built without the stamps (make PHASES=1)");
}
#endif
