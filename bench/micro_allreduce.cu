// Micro benchmark of the tensor-parallel sum: NCCL all-reduce of M x 7168 activations (the
// hidden size) in bf16 and f32 for M = 1..256, one MPI rank per GPU, timed outside and inside
// a CUDA graph (nccl-tests style: time per call in us, algorithm and bus bandwidth, and a
// #wrong column from a checked sum). The slowest rank's median is reported.
//
//   mpirun -np N micro_allreduce [--json FILE] [--quick]
#include <mpi.h>
#include <nccl.h>

#include "micro_common.cuh"

__global__ void fill_kernel(float *x, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}
__global__ void fill_bf16_kernel(uint16_t *x, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = k25_f2bf(v);
}

int main(int argc, char **argv) {
    int rank, size;
    bench_start_mpi_gpu(&argc, &argv, &rank, &size);
    const int quick = bench_flag(argc, argv, "--quick");
    ncclComm_t comm = bench_nccl_world(rank, size);
    int ver = 0;
    ncclGetVersion(&ver);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int D = 7168, Mmax = 256;
    float *xf;
    uint16_t *xb;
    CUDA_CHECK(cudaMalloc(&xf, sizeof(float) * D * Mmax));
    CUDA_CHECK(cudaMalloc(&xb, sizeof(uint16_t) * D * Mmax));
    if (rank == 0) {
        printf("# NCCL %d, %d ranks, all-reduce (sum) of M x %d values in place; time per call "
               "(median of the slowest rank); busbw = algbw * 2(n-1)/n\n", ver, size, D);
        printf("\n| M | dtype | bytes | us | graph us | algbw GB/s | busbw GB/s | #wrong |\n");
        printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
    }
    const int Ms_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    const int Ms_quick[] = {1, 8, 64, 256};
    const int *Ms = quick ? Ms_quick : Ms_full;
    const int nM = quick ? 4 : 9;
    const int iters = quick ? 20 : 50, inner = 20;
    for (int dt = 0; dt < 2; dt++)
        for (int mi = 0; mi < nM; mi++) {
            const int M = Ms[mi];
            const size_t n = (size_t)M * D;
            void *buf = dt ? (void *)xb : (void *)xf;
            ncclDataType_t type = dt ? ncclBfloat16 : ncclFloat32;
            const size_t bytes = n * (dt ? 2 : 4);
            // correctness: every rank holds rank+1, the sum is n(n+1)/2 (exact in bf16 for n<=8)
            if (dt)
                fill_bf16_kernel<<<64, 256, 0, s>>>(xb, n, (float)(rank + 1));
            else
                fill_kernel<<<64, 256, 0, s>>>(xf, n, (float)(rank + 1));
            NCCL_CHECK(ncclAllReduce(buf, buf, n, type, ncclSum, comm, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            std::vector<float> h(n);
            if (dt) {
                std::vector<uint16_t> hb(n);
                CUDA_CHECK(cudaMemcpy(hb.data(), xb, n * 2, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < n; i++) h[i] = k25_bf16_to_f32(hb[i]);
            } else {
                CUDA_CHECK(cudaMemcpy(h.data(), xf, n * 4, cudaMemcpyDeviceToHost));
            }
            long wrong = 0;
            const float want = size * (size + 1) / 2.0f;
            for (size_t i = 0; i < n; i++) wrong += h[i] != want;
            MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            // outside a graph: one call per timed interval, after warm-up
            for (int i = 0; i < 5; i++) NCCL_CHECK(ncclAllReduce(buf, buf, n, type, ncclSum, comm, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            cudaEvent_t a, b;
            CUDA_CHECK(cudaEventCreate(&a));
            CUDA_CHECK(cudaEventCreate(&b));
            std::vector<double> t;
            for (int i = 0; i < iters; i++) {
                MPI_Barrier(MPI_COMM_WORLD);
                CUDA_CHECK(cudaEventRecord(a, s));
                NCCL_CHECK(ncclAllReduce(buf, buf, n, type, ncclSum, comm, s));
                CUDA_CHECK(cudaEventRecord(b, s));
                CUDA_CHECK(cudaEventSynchronize(b));
                float ms;
                CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
                t.push_back(ms * 1e3);
            }
            double us = median(t);
            MPI_Barrier(MPI_COMM_WORLD);
            double us_g = time_graph_us(s, inner, iters, [&](int) {
                NCCL_CHECK(ncclAllReduce(buf, buf, n, type, ncclSum, comm, s));
            });
            MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &us_g, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            double alg = bytes / (us_g * 1e-6) / 1e9, bus = alg * 2.0 * (size - 1) / size;
            if (rank == 0) {
                printf("| %d | %s | %zu | %.1f | %.1f | %.1f | %.1f | %ld |\n", M, dt ? "bf16" : "f32",
                       bytes, us, us_g, alg, bus, wrong);
                fflush(stdout);
                bench_jsonl("{\"bench\":\"allreduce\",\"ranks\":%d,\"M\":%d,\"dtype\":\"%s\",\"bytes\":%zu,"
                            "\"us\":%.2f,\"graph_us\":%.2f,\"algbw\":%.2f,\"busbw\":%.2f,\"wrong\":%ld}",
                            size, M, dt ? "bf16" : "f32", bytes, us, us_g, alg, bus, wrong);
            }
            CUDA_CHECK(cudaEventDestroy(a));
            CUDA_CHECK(cudaEventDestroy(b));
        }
    ncclCommDestroy(comm);
    if (bench_json) fclose(bench_json);
    MPI_Finalize();
    return 0;
}
