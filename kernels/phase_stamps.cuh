// In-kernel phase stamps: where a kernel's time goes between its launch and its end, block by
// block (its wait, the first dependent load, the first weights landed, the consume, the tail).
// A kernel trace gives each kernel's start and end only; at one row most of a kernel's time is
// a chain inside it. Compiled in by a measurement build only (make PHASES=1, -DK25_PHASES);
// elsewhere every stamp is empty. Thread 0 of a block stamps the GPU's global timer; each launch
// overwrites the previous launch's stamps, so what is read after a step is its last layer's
// (kernel_phases_write in kernels/phases.cu, src/kernel_trace.h; k25bench --phases).
#pragma once

#include <stdint.h>

#define K25_PHASE_BLOCKS 1024 // blocks stamped per site (blocks past it are not)
#define K25_PHASE_N 8         // stamps per block

// The stamped kernels. Their phases (the stamp index p):
//   router top-k (+ the routing sort): 0 entry, 1 after the wait, 2 block 0's row chosen,
//     3 end (the sort done, before the trigger);
//   grouped W4A16 GEMM: 0 entry, 1 after the wait, 2 first unit's expert id loaded, 3 its first
//     chunk landed (warp 0), 4 its chunks consumed and partials stored, 5 its split counted
//     (gate+up with more than one split), 6 its end (after the tail, if this block ran it),
//     7 exit; and the units the block ran.
enum { K25_SITE_ROUTER, K25_SITE_GATE_UP, K25_SITE_DOWN, K25_PHASE_SITES };

#ifdef K25_PHASES
// Device variables are per file without relocatable device code: each stamping file has its own
// copy (K25_PHASES_READER defines its reader), and stamps only its own sites.
static __device__ unsigned long long k25_phase_t[K25_PHASE_SITES][K25_PHASE_BLOCKS][K25_PHASE_N];
static __device__ int k25_phase_units[K25_PHASE_SITES][K25_PHASE_BLOCKS];

// The entry stamp (p = 0) clears the block's others: a phase this launch does not reach reads 0.
__device__ __forceinline__ void k25_stamp(int site, int p) {
    if (threadIdx.x == 0 && blockIdx.x < K25_PHASE_BLOCKS) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
        k25_phase_t[site][blockIdx.x][p] = t;
        if (p == 0) {
            for (int q = 1; q < K25_PHASE_N; q++) k25_phase_t[site][blockIdx.x][q] = 0;
            k25_phase_units[site][blockIdx.x] = 0;
        }
    }
}
// The same, once `dep` is in a register: the stamp then follows the load that produced it.
__device__ __forceinline__ void k25_stamp_after(int site, int p, int dep) {
    asm volatile("" ::"r"(dep) : "memory");
    k25_stamp(site, p);
}
__device__ __forceinline__ void k25_stamp_units(int site, int units) {
    if (threadIdx.x == 0 && blockIdx.x < K25_PHASE_BLOCKS) k25_phase_units[site][blockIdx.x] = units;
}
#define K25_STAMP(site, p) k25_stamp(site, p)
#define K25_STAMP_AFTER(site, p, dep) k25_stamp_after(site, p, dep)
#define K25_STAMP_UNITS(site, units) k25_stamp_units(site, units)
#else // nothing for the compiler to see: the kernels compile as without the stamps
#define K25_STAMP(site, p) ((void)0)
#define K25_STAMP_AFTER(site, p, dep) ((void)0)
#define K25_STAMP_UNITS(site, units) ((void)0)
#endif

// A stamping file's reader: copies its stamps (where set) into t and units, host arrays of
// [K25_PHASE_SITES][K25_PHASE_BLOCKS][K25_PHASE_N] and [K25_PHASE_SITES][K25_PHASE_BLOCKS], then
// clears them on the device. The device must be idle.
void k25k_phases_read_router(unsigned long long *t, int *units);
void k25k_phases_read_moe(unsigned long long *t, int *units);
#ifdef K25_PHASES
#define K25_PHASES_READER(name)                                                                  \
    void name(unsigned long long *t, int *units) {                                               \
        static unsigned long long dt[K25_PHASE_SITES][K25_PHASE_BLOCKS][K25_PHASE_N];            \
        static int du[K25_PHASE_SITES][K25_PHASE_BLOCKS];                                        \
        CUDA_CHECK(cudaMemcpyFromSymbol(dt, k25_phase_t, sizeof dt));                            \
        CUDA_CHECK(cudaMemcpyFromSymbol(du, k25_phase_units, sizeof du));                        \
        for (size_t i = 0; i < sizeof dt / sizeof dt[0][0][0]; i++)                              \
            if ((&dt[0][0][0])[i]) t[i] = (&dt[0][0][0])[i];                                     \
        for (size_t i = 0; i < sizeof du / sizeof du[0][0]; i++)                                 \
            if ((&du[0][0])[i]) units[i] = (&du[0][0])[i];                                       \
        memset(dt, 0, sizeof dt), memset(du, 0, sizeof du);                                      \
        CUDA_CHECK(cudaMemcpyToSymbol(k25_phase_t, dt, sizeof dt));                              \
        CUDA_CHECK(cudaMemcpyToSymbol(k25_phase_units, du, sizeof du));                          \
    }
#else
#define K25_PHASES_READER(name)                                                                  \
    void name(unsigned long long *t, int *units) { (void)t, (void)units; }
#endif
