// Micro benchmark of a dependent kernel boundary: what one more kernel on a decode step's chain
// costs when the kernel itself does next to nothing. A graph of N kernels in one stream, each
// reading the value its predecessor wrote (one thread, after the wait) and writing the next, as
// the step's kernels hand activations on; the median graph replay over N is the cost of one
// boundary: launch, the predecessor's drain, the wait's release and the first dependent load.
// Each shape is timed with programmatic dependent launch (the step's launches: the kernel
// triggers its dependents at its start and waits before its dependent load) and without it
// (plain stream order), for grids of 1 to 4 blocks an SM and with or without a large dynamic
// shared-memory request (the step's GEMM and attention blocks take 64-228 KB, which can keep a
// block from starting beside the previous kernel's).
//
//   micro_hop [--json FILE] [--chain N]
#include "micro_common.cuh"

// Thread 0 of block 0 carries the chain; every block waits (a grid must not complete before its
// predecessor, see k25_pdl_wait).
__global__ void hop_kernel(int *chain, int i) {
    k25_pdl_trigger();
    k25_pdl_wait();
    if (blockIdx.x == 0 && threadIdx.x == 0) chain[i + 1] = __ldcg(chain + i) + 1;
}

static void hop_launch(int *chain, int i, int blocks, size_t smem, bool pdl, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, hop_kernel, chain, i));
}

int main(int argc, char **argv) {
    const int N = bench_int(argc, argv, "--chain", 200);
    cudaStream_t s;
    int sms;
    bench_start_single_gpu(argc, argv, &s, &sms);
    int *chain;
    CUDA_CHECK(cudaMalloc(&chain, sizeof(int) * (N + 1)));
    CUDA_CHECK(cudaMemset(chain, 0, sizeof(int) * (N + 1)));
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CUDA_CHECK(cudaFuncSetAttribute(hop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    optin));
    printf("# one boundary = a graph of %d dependent kernels (256 threads a block) / %d; each "
           "reads its predecessor's value after the wait\n", N, N);
    printf("\n| blocks | dynamic smem KB | us with PDL | us without | chain checked |\n"
           "|---:|---:|---:|---:|---|\n");
    const int per_sm[] = {0, 1, 2, 4}; // 0: one block
    const size_t smems[] = {0, 100 * 1024, (size_t)optin};
    for (int b : per_sm)
        for (size_t smem : smems) {
            const int blocks = b ? b * sms : 1;
            if (b * smem > (size_t)optin + 1024 && b > 1) continue; // would not fit b an SM
            double us[2];
            for (int pdl = 1; pdl >= 0; pdl--)
                us[1 - pdl] = time_graph_us(s, 1, 50, [&](int) {
                    for (int i = 0; i < N; i++) hop_launch(chain, i, blocks, smem, pdl, s);
                }) / N;
            CUDA_CHECK(cudaStreamSynchronize(s));
            int last = 0;
            CUDA_CHECK(cudaMemcpy(&last, chain + N, sizeof(int), cudaMemcpyDeviceToHost));
            // every replay rewrites chain[1..N] from chain[0] = 0: chain[N] = N
            const bool ok = last == N;
            printf("| %d | %zu | %.2f | %.2f | %s |\n", blocks, smem / 1024, us[0], us[1],
                   ok ? "yes" : "NO");
            bench_jsonl("{\"bench\":\"hop\",\"blocks\":%d,\"smem_kb\":%zu,\"us_pdl\":%.3f,"
                        "\"us_plain\":%.3f,\"ok\":%d}", blocks, smem / 1024, us[0], us[1], ok);
            if (!ok) K25_DIE("hop chain ended at %d, not %d", last, N);
        }
    CUDA_CHECK(cudaFree(chain));
    return 0;
}
