// Shared by the GPU micro benchmarks: event timing of graph replays (median of many), the
// device-to-device copy bandwidth measured in the same run, and the output (a markdown table on
// stdout with '#' description lines, JSON lines to the file given by --json).
#pragma once
#include <algorithm>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "cuda_kernels.cuh"

static FILE *bench_json = NULL;

static void bench_open_json(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--json")) {
            bench_json = fopen(argv[i + 1], "a");
            if (!bench_json) K25_DIE("cannot open %s", argv[i + 1]);
        }
}

static void bench_jsonl(const char *fmt, ...) {
    if (!bench_json) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(bench_json, fmt, ap);
    va_end(ap);
    fputc('\n', bench_json);
    fflush(bench_json);
}

static int bench_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name)) return 1;
    return 0;
}

// Integer value of --name N, or def.
static int bench_int(int argc, char **argv, const char *name, int def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return def;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0.0;
}

// Median time in microseconds of one call of fn(rep) over `reps` calls captured in a graph
// (inner calls per replay), replayed `iters` times after a warm-up replay.
template <typename F>
static double time_graph_us(cudaStream_t s, int inner, int iters, F fn) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int r = 0; r < inner; r++) fn(r);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaGraphLaunch(ex, s)); // warm-up
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int i = 0; i < iters; i++) {
        CUDA_CHECK(cudaEventRecord(a, s));
        CUDA_CHECK(cudaGraphLaunch(ex, s));
        CUDA_CHECK(cudaEventRecord(b, s));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e3 / inner);
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    CUDA_CHECK(cudaGraphExecDestroy(ex));
    CUDA_CHECK(cudaGraphDestroy(g));
    return median(t);
}

__global__ void copy_kernel(const uint4 *__restrict__ a, uint4 *__restrict__ b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

// Device-to-device copy of `bytes` by a kernel (SMs, as the kernels under test; the copy
// engines are slower): GB/s counting bytes read plus bytes written.
static double copy_bandwidth_gbs(cudaStream_t s, size_t bytes) {
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, s));
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    double us = time_graph_us(s, 1, 20, [&](int) {
        copy_kernel<<<sms * 8, 512, 0, s>>>((const uint4 *)a, (uint4 *)b, bytes / 16);
    });
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return 2.0 * bytes / (us * 1e-6) / 1e9;
}

static void print_device(FILE *f) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    fprintf(f, "# device %d: %s, %d SMs, %.1f GiB, L2 %d MB, CUDA runtime %d, driver %d\n", dev,
            p.name, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, p.l2CacheSize >> 20,
            rt, drv);
}

// Start of a single-GPU benchmark (device 0): --json, a stream, the SM count, the device line
// and the device-to-device copy bandwidth (printed and written as a JSON line). Returns the
// copy bandwidth in GB/s.
static double bench_start_single_gpu(int argc, char **argv, cudaStream_t *s, int *sms) {
    bench_open_json(argc, argv);
    CUDA_CHECK(cudaStreamCreate(s));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    *sms = prop.multiProcessorCount;
    print_device(stdout);
    const double copy_gbs = copy_bandwidth_gbs(*s, (size_t)1 << 30);
    printf("# device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
    bench_jsonl("{\"bench\":\"copy\",\"gbs\":%.1f}", copy_gbs);
    return copy_gbs;
}

// Multi-rank benchmarks (one MPI rank per GPU, NCCL): available when the including file has
// included <mpi.h> first.
#if defined(MPI_VERSION)
#include <unistd.h>

// MPI_Init, then this rank's GPU: its node-local rank modulo the GPUs it sees. --json is
// opened on rank 0 only. Every rank prints its host, device, PCI bus and device name, in rank
// order.
static void bench_start_mpi_gpu(int *argc, char ***argv, int *rank, int *size) {
    MPI_Init(argc, argv);
    int local;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    CUDA_CHECK(cudaSetDevice(local % ndev));
    bench_open_json(*argc, *argv);
    if (*rank != 0 && bench_json) fclose(bench_json), bench_json = NULL;
    char host[64];
    gethostname(host, sizeof host);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, local % ndev));
    char bus[32];
    cudaDeviceGetPCIBusId(bus, sizeof bus, local % ndev);
    for (int r = 0; r < *size; r++) {
        if (r == *rank)
            printf("# Rank %d on %s device %d [%s] %s\n", *rank, host, local % ndev, bus,
                   prop.name);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

// An NCCL communicator over MPI_COMM_WORLD (rank 0 makes the unique id).
static ncclComm_t bench_nccl_world(int rank, int size) {
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
    return comm;
}
#endif
