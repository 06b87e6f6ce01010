// Micro benchmark of the W4A16 GEMMs' access pattern alone: how fast HBM delivers weights that
// warps pull in chunks by bulk copies into shared memory, with nothing computed on them. Each
// warp streams chunks of `w` bytes (a tile's k-blocks of weights) and, optionally, `s` bytes
// from a second array (their scales), with `stages` chunks in flight, 4 warps a block and
// `blocks` blocks an SM, as the grouped GEMM does. Chunks are taken in order (neighbouring warps
// read neighbouring chunks, as a row-block's warps read neighbouring tiles) or scattered (a
// fixed permutation, as the experts of a step lie in memory). Each launch reads a different
// quarter of 1 GB, so that nothing comes from L2. The result is the ceiling of the pattern: what
// the GEMM could reach if its consume cost nothing.
//
//   micro_stream [--json FILE]
#include "micro_common.cuh"

#define MS_WARPS 4
#define MS_MAX_STAGE 8

// chunk c of n: its position in memory (a bijection for odd multipliers when n is a power of 2)
__device__ __forceinline__ unsigned ms_place(unsigned c, unsigned n, int scatter) {
    return scatter ? (c * 2654435761u) & (n - 1) : c;
}

__global__ void __launch_bounds__(MS_WARPS * 32) stream_kernel(const uint8_t *w, const uint8_t *sc,
                                                               unsigned wb, unsigned sb,
                                                               unsigned n_chunks, int stages,
                                                               int scatter, unsigned *sink) {
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ __align__(8) uint64_t full[MS_WARPS][MS_MAX_STAGE];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *mine = ring + (size_t)warp * stages * (wb + sb);
    if (lane == 0) {
        for (int i = 0; i < stages; i++) k25_mbar_init(&full[warp][i], 1);
        k25_mbar_init_fence();
    }
    __syncwarp();
    const unsigned gw = blockIdx.x * MS_WARPS + warp, nw = gridDim.x * MS_WARPS;
    const uint64_t policy = k25_l2_evict_first();
    unsigned issued = 0, consumed = 0, acc = 0;
    auto issue = [&](unsigned c) {
        const unsigned q = issued % stages, at = ms_place(c, n_chunks, scatter);
        __syncwarp();
        if (lane == 0) {
            k25_fence_proxy_async();
            uint8_t *dst = mine + (size_t)q * (wb + sb);
            k25_mbar_expect_tx(&full[warp][q], wb + sb);
            k25_bulk_g2s(dst, w + (size_t)at * wb, wb, &full[warp][q], policy);
            if (sb) k25_bulk_g2s(dst + wb, sc + (size_t)at * sb, sb, &full[warp][q], policy);
        }
        issued++;
    };
    for (int i = 0; i < stages && gw + i * nw < n_chunks; i++) issue(gw + i * nw);
    for (unsigned c = gw; c < n_chunks; c += nw) {
        const unsigned q = consumed % stages;
        k25_mbar_wait(&full[warp][q], (consumed / stages) & 1);
        acc += mine[(size_t)q * (wb + sb) + lane * 4]; // one read, so the stage is used
        consumed++;
        const unsigned next = c + (unsigned)stages * nw;
        if (next < n_chunks) issue(next);
    }
    if (acc == 0xffffffffu) *sink = acc;
}

int main(int argc, char **argv) {
    cudaStream_t s;
    int sms;
    const double copy_gbs = bench_start_single_gpu(argc, argv, &s, &sms);
    const size_t total = (size_t)1 << 30, part = total / 4;
    uint8_t *w, *sc;
    unsigned *sink;
    CUDA_CHECK(cudaMalloc(&w, total));
    CUDA_CHECK(cudaMalloc(&sc, total / 8));
    CUDA_CHECK(cudaMalloc(&sink, 4));
    CUDA_CHECK(cudaMemset(w, 1, total));
    CUDA_CHECK(cudaMemset(sc, 1, total / 8));
    CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    200 * 1024));
    printf("# bulk copies into shared memory, nothing computed; each launch reads 256 MB of "
           "weights (+ 1/8 as much of scales where s > 0) from its own quarter of 1 GB\n");
    printf("\n| w bytes | s bytes | order | blocks an SM | stages | bytes in flight an SM KB | "
           "GB/s | %% of copy |\n|---:|---:|---|---:|---:|---:|---:|---:|\n");
    struct { unsigned wb, sb; } chunk[] = {{4096, 512}, {4608, 0}, {4096, 0}, {16384, 2048},
                                           {14336, 1792}};
    for (auto ch : chunk)
        for (int scatter = 0; scatter < 2; scatter++)
            for (int blocks : {2, 4})
                for (int stages : {1, 2, 4}) {
                    const size_t smem = (size_t)MS_WARPS * stages * (ch.wb + ch.sb);
                    if (smem * blocks > 220 * 1024) continue;
                    // chunks of a launch: a power of 2 (the scatter's bijection) within a quarter
                    unsigned n = 1;
                    while ((size_t)(n * 2) * ch.wb <= part) n *= 2;
                    const double us = time_graph_us(s, 4, 10, [&](int r) {
                        stream_kernel<<<blocks * sms, MS_WARPS * 32, smem, s>>>(
                            w + r * part, sc + r * part / 8, ch.wb, ch.sb, n, stages, scatter,
                            sink);
                    });
                    CUDA_CHECK(cudaGetLastError());
                    const double bytes = (double)n * (ch.wb + ch.sb), gbs = bytes / us / 1e3;
                    printf("| %u | %u | %s | %d | %d | %.0f | %.0f | %.0f%% |\n", ch.wb, ch.sb,
                           scatter ? "scattered" : "in order", blocks, stages,
                           smem * blocks / 1024.0, gbs, 100.0 * gbs / copy_gbs);
                    bench_jsonl("{\"bench\":\"stream\",\"w\":%u,\"s\":%u,\"scatter\":%d,"
                                "\"blocks\":%d,\"stages\":%d,\"gbs\":%.1f}",
                                ch.wb, ch.sb, scatter, blocks, stages, gbs);
                    fflush(stdout);
                }
    cudaFree(w), cudaFree(sc), cudaFree(sink);
    return 0;
}
