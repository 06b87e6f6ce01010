// BF16 projections of a few activation rows on Hopper's warpgroup MMA: y[T][N] = x[T][K] W^T for
// 5..32 rows, from the split operand [hi; lo] (bf16 [2][T][K], lo = bf16(x - hi)) that the norms
// stage. Between the tile GEMV (up to 4 rows, f32 FMAs) and cuBLASLt (a split-K GEMM of 2T rows,
// its reduction kernel and the hi + lo sum: three launches at 10-50% of the copy bandwidth on
// the TP8 shapes at 8-16 rows), one launch (1.15-1.93x faster than those three on the shapes at
// 5-16 rows, `bench/results/micro-matmul-wgmma-h200x1.md`):
//
// - Operands swapped: the weights are the MMA's M side (64 rows a block, one m64 MMA), the
//   activation rows its N side (hi rows [0, TP), lo rows [TP, 2 TP)), so that 8-32 rows fill an
//   MMA without padding the weights' side, as cuBLASLt's skinny kernels do.
// - Both operands by tensor-map copies into a ring of stages (one thread issues them;
//   an mbarrier per stage counts the bytes), 128-byte swizzled as the MMA's descriptors expect;
//   rows past T and past N arrive as zeros.
// - The weights' first stages are requested before the PDL wait (they are written only at load
//   time), the activations' after it.
// - K is split over a thread-block cluster (slices in rank order through distributed shared
//   memory, as the GEMV does): deterministic, and a plan from N and K only. A column's MMA sums
//   do not depend on the other columns, so a row's bits do not depend on the step's other rows
//   either (checked by gpu_ops and micro_matmul for 1-16 rows).
// - hi and lo of the same row land in the same thread's accumulators (TP a multiple of 8) and
//   are added there: no products workspace, no sum kernel.
// - The dispatch takes it only where its K slices are at most WG_MAX_SLICE_STEPS long
//   (k25k_wgmma_preferred): o_proj at TP2 and TP1 stays on cuBLASLt.
#include <cooperative_groups.h>

#include "cuda_kernels.cuh"

#define WG_BN 64     // weight rows per block: one m64 MMA
#define WG_BK 64     // K elements a stage: one 128-byte swizzled row per weight or activation row
#define WG_MAX_KS 16 // K slices per cluster (16: a non-portable cluster size, allowed on sm_90)
#define WG_PER_SM 2  // blocks an SM the grid is planned for
// A block's ring takes at most a third of an SM's shared memory: with half, the blocks of a
// small kernel still running beside it (a norm's, under programmatic dependent launch) left room
// for one block on their SMs, and the grid's last blocks ran as a second wave (q_a + kv_a at 16
// rows 8.6 -> 14.6 us in the step)
#define WG_SMEM_SHARE 3

// Bytes of one stage: 64 weight rows, then 2 TP activation rows, 128 bytes each.
__host__ __device__ constexpr int wg_stage_bytes(int TP) { return (WG_BN + 2 * TP) * WG_BK * 2; }
// Dynamic shared memory of a ring of S stages (1024-byte aligned for the swizzle), its mbarriers.
static size_t wg_smem(int TP, int S) {
    return (size_t)S * wg_stage_bytes(TP) + 1024 + 8 * (size_t)S;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE_WGMMA 1
#else
#define WG_HAVE_WGMMA 0
#endif

// Shared-memory matrix descriptor of a K-major operand tile in 128-byte swizzle: 8-row groups
// 1024 bytes apart (stride byte offset), the leading offset unused by this swizzle.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

// d[64 x NC] += A[64 x 16] B[16 x NC]^T, A and B K-major in shared memory (scale-d set: the
// accumulators start from the zeros they are initialized with).
template <int NC>
__device__ __forceinline__ void wg_mma(float (&d)[NC / 2], uint64_t a, uint64_t b) {
#if WG_HAVE_WGMMA
    if constexpr (NC == 16) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7])
                     : "l"(a), "l"(b), "r"(1));
    } else if constexpr (NC == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, "
                     "p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "l"(a), "l"(b), "r"(1));
    } else {
        static_assert(NC == 64, "MMA widths: 16, 32, 64");
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"
                     "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, "
                     "p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
                       "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),
                       "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(a), "l"(b), "r"(1));
    }
#endif
}

// grid (ks, weight-row tiles), cluster (ks, 1, 1), 128 threads (one warpgroup), a ring of S
// stages. wmap: W [N][K] (N = N1 + N2: a pair's matrices adjacent in memory), boxes of 64 x 64;
// xmap: the operand as [2][T][K], boxes of 2 x TP x 64. Block q of a cluster takes the K steps
// [q kt / ks, (q + 1) kt / ks) of kt = K / 64 (rounded up; the copies fill past K with zeros).
// Rows [0, N1) go to y1 [T][N1], rows [N1, N) to y2 [T][N2].
template <int TP>
__global__ void __launch_bounds__(128) wg_gemm_kernel(const __grid_constant__ CUtensorMap wmap,
                                                      const __grid_constant__ CUtensorMap xmap,
                                                      int T, int N1, int N2, int kt, int S,
                                                      float *__restrict__ y1,
                                                      float *__restrict__ y2) {
    k25_pdl_trigger();
#if WG_HAVE_WGMMA
    constexpr int NC = 2 * TP, SB = wg_stage_bytes(TP), WB = WG_BN * WG_BK * 2;
    extern __shared__ unsigned char wg_smem_raw[];
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    unsigned char *ring = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(wg_smem_raw) + 1023) & ~(uintptr_t)1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + S * SB);
    const int tid = threadIdx.x, ks = gridDim.x, q = blockIdx.x, n0 = blockIdx.y * WG_BN;
    const int k0 = q * kt / ks, nk = (q + 1) * kt / ks - k0;
    const uint32_t ring_a = k25_smem_addr(ring);
    auto bar = [&](int s) { return k25_smem_addr(full + s); };

    if (tid == 0) {
        for (int s = 0; s < S; s++) k25_mbar_init(full + s, 1);
        k25_mbar_init_fence();
        for (int s = 0; s < S && s < nk; s++) {
            k25_mbar_expect_tx(full + s, SB);
            k25_tensor_copy_2d(ring_a + s * SB, &wmap, (k0 + s) * WG_BK, n0, bar(s));
        }
    }
    // the operand comes from the previous kernel, and y may still be read by it
    k25_pdl_wait();
    if (tid == 0)
        for (int s = 0; s < S && s < nk; s++)
            k25_tensor_copy_3d(ring_a + s * SB + WB, &xmap, (k0 + s) * WG_BK, 0, 0, bar(s));
    __syncthreads(); // the mbarriers' initialization before anyone waits on them

    float d[NC / 2];
#pragma unroll
    for (int i = 0; i < NC / 2; i++) d[i] = 0.0f;
    for (int i = 0, s = 0, phase = 0; i < nk; i++) {
        k25_mbar_wait(full + s, (unsigned)phase);
        const uint32_t a = ring_a + s * SB, b = a + WB;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) // 16 K elements: 32 bytes into the swizzled rows
            wg_mma<NC>(d, wg_desc(a + 32 * kk), wg_desc(b + 32 * kk));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < NC / 2; j++) asm volatile("" : "+f"(d[j])::"memory");
        __syncthreads(); // every warp's MMAs have read stage s: it may be refilled
        if (tid == 0 && i + S < nk) {
            k25_mbar_expect_tx(full + s, SB);
            k25_tensor_copy_2d(a, &wmap, (k0 + i + S) * WG_BK, n0, bar(s));
            k25_tensor_copy_3d(b, &xmap, (k0 + i + S) * WG_BK, 0, 0, bar(s));
        }
        if (++s == S) s = 0, phase ^= 1;
    }

    // This slice's hi + lo into part [TP][64] (over the ring: every copy has landed and every
    // MMA has read). Accumulator layout of m64nNC: warp w, lane l holds rows 16 w + l / 4 (+ 8)
    // and columns 8 g + 2 (l % 4) (+ 1) in d[4 g + {0, 1, 2, 3}]; column c < TP is row c's hi,
    // column c + TP its lo.
    float *part = reinterpret_cast<float *>(ring);
    {
        const int warp = tid >> 5, lane = tid & 31, r = 16 * warp + (lane >> 2);
#pragma unroll
        for (int g = 0; g < TP / 8; g++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = 8 * g + 2 * (lane & 3) + (j & 1), rr = r + 8 * (j >> 1);
                part[c * WG_BN + rr] = d[4 * g + j] + d[4 * (g + TP / 8) + j];
            }
    }
    // the slices of the cluster: block q sums entries [q E / ks, (q + 1) E / ks) in rank order
    cluster.sync();
    const int N = N1 + N2, E = T * WG_BN, e_beg = q * E / ks, e_end = (q + 1) * E / ks;
    for (int e = e_beg + tid; e < e_end; e += blockDim.x) {
        float v = 0.0f;
        for (int j = 0; j < ks; j++) v += cluster.map_shared_rank(part, j)[e];
        const int t = e / WG_BN, n = n0 + (e - t * WG_BN);
        if (n < N1)
            y1[(size_t)t * N1 + n] = v;
        else if (n < N)
            y2[(size_t)t * N2 + (n - N1)] = v;
    }
    cluster.sync(); // keep this block's partials alive until the cluster has read them
#else
    k25_pdl_wait();
    __trap(); // the host launches this kernel only on sm_90 devices (k25k_matmul_wgmma)
#endif
}

static CUtensorMap wg_map(int rank, const void *base, const cuuint64_t *dim,
                          const cuuint64_t *stride, const cuuint32_t *box, const char *what) {
    CUtensorMap map;
    const cuuint32_t step[3] = {1, 1, 1};
    const CUresult r = k25_tensor_map_encoder()(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, const_cast<void *>(base), dim,
        stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        K25_DIE("matmul: cuTensorMapEncodeTiled failed (CUresult %d) for %s", (int)r, what);
    return map;
}

static int wg_sms(void) {
    static int sms = -1;
    return k25_device_attr(&sms, cudaDevAttrMultiProcessorCount);
}

static bool wg_device_ok(void) {
    static int major = -1, minor = -1;
    return k25_device_attr(&major, cudaDevAttrComputeCapabilityMajor) == 9 &&
           k25_device_attr(&minor, cudaDevAttrComputeCapabilityMinor) == 0;
}

// Shared memory a block may take (1 KB of each is the system's).
static int wg_block_smem(void) {
    static int per_sm = -1;
    return k25_device_attr(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor) /
               WG_SMEM_SHARE -
           1024;
}

template <int TP> static void wg_set_attrs(void) {
    static bool done = false;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(wg_gemm_kernel<TP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    wg_block_smem()));
    CUDA_CHECK(cudaFuncSetAttribute(wg_gemm_kernel<TP>,
                                    cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    done = true;
}

// Whether a cluster of 16 blocks of the largest ring (every row tile's) can be resident.
static bool wg_cluster16_fits(void) {
    static int fits = -1;
    if (fits < 0) {
        wg_set_attrs<32>();
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = 16, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
        cfg.gridDim = dim3(16);
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = (size_t)wg_block_smem();
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, wg_gemm_kernel<32>, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            n = 0;
        }
        fits = n > 0;
    }
    return fits;
}

// K slices for N x K: the most (a power of two, at most WG_MAX_KS) that keep the grid within
// WG_PER_SM blocks an SM, each slice keeping at least 4 K steps. From N and K only.
int k25k_wgmma_slices(int N, int K) {
    const int tiles = (int)k25_cdiv(N, WG_BN), kt = (int)k25_cdiv(K, WG_BK);
    const int slots = WG_PER_SM * wg_sms(), most = wg_cluster16_fits() ? WG_MAX_KS : 8;
    int ks = 1;
    while (ks < most && tiles * 2 * ks <= slots && kt >= 4 * ks) ks *= 2;
    return ks;
}

// Whether the dispatch (matmul.cu) takes the kernel for N x K: its K slices of at most
// WG_MAX_SLICE_STEPS steps of 64, the measured boundary: o_proj at TP2 and TP1 (7168 x 4096 /
// 8192, 32 / 64 steps a slice) ran at 0.82-0.94x / 0.78-0.89x of cuBLASLt at 5-32 rows, where
// the shapes of 3-24 steps ran at 1.0-1.8x (bench/NOTES.md; likely o_proj's 224 blocks on 132
// SMs, uneven once each block streams long, rather than the slice's length itself).
#define WG_MAX_SLICE_STEPS 24
int k25k_wgmma_preferred(int N, int K) {
    if (!wg_device_ok()) return 0; // the plan's occupancy query needs the kernel's image
    static int most = -1;
    if (most < 0) most = k25_env_int("K25_WGMMA_SLICE_MAX", WG_MAX_SLICE_STEPS);
    const int kt = (int)k25_cdiv(K, WG_BK), ks = k25k_wgmma_slices(N, K);
    return k25_cdiv(kt, ks) <= most;
}

// The ring: as many stages as a slice has K steps (every copy in flight from the start), within
// the block's share of shared memory.
template <int TP>
static void wg_launch(const CUtensorMap &wm, const CUtensorMap &xm, int T, int N1, int N2, int K,
                      float *y1, float *y2, cudaStream_t s) {
    wg_set_attrs<TP>();
    const int ks = k25k_wgmma_slices(N1 + N2, K), kt = (int)k25_cdiv(K, WG_BK);
    int S = (int)k25_cdiv(kt, ks);
    while (S > 2 && wg_smem(TP, S) > (size_t)wg_block_smem()) S--;
    const dim3 grid((unsigned)ks, (unsigned)k25_cdiv(N1 + N2, WG_BN));
    k25_launch_cluster("matmul wgmma", wg_gemm_kernel<TP>, grid, dim3(128), wg_smem(TP, S), s, ks,
                       wm, xm, T, N1, N2, kt, S, y1, y2);
}

int k25k_matmul_wgmma(const uint16_t *xs, const uint16_t *W, int T, int N1, int N2, int K,
                      float *y1, float *y2, cudaStream_t s) {
    if (T < 1 || T > 32 || N1 <= 0 || N2 < 0 || K < WG_BK || K % 8 != 0) return 0;
    if ((uintptr_t)xs % 16 || (uintptr_t)W % 16 || !wg_device_ok()) return 0;
    const int TP = T <= 8 ? 8 : (T <= 16 ? 16 : 32);
    const cuuint64_t wdim[2] = {(cuuint64_t)K, (cuuint64_t)(N1 + N2)},
                     wstride[1] = {(cuuint64_t)K * 2};
    const cuuint32_t wbox[2] = {WG_BK, WG_BN};
    const cuuint64_t xdim[3] = {(cuuint64_t)K, (cuuint64_t)T, 2},
                     xstride[2] = {(cuuint64_t)K * 2, (cuuint64_t)T * K * 2};
    const cuuint32_t xbox[3] = {WG_BK, (cuuint32_t)TP, 2};
    const CUtensorMap wm = wg_map(2, W, wdim, wstride, wbox, "the weights");
    const CUtensorMap xm = wg_map(3, xs, xdim, xstride, xbox, "the staged activations");
    if (TP == 8)
        wg_launch<8>(wm, xm, T, N1, N2, K, y1, y2, s);
    else if (TP == 16)
        wg_launch<16>(wm, xm, T, N1, N2, K, y1, y2, s);
    else
        wg_launch<32>(wm, xm, T, N1, N2, K, y1, y2, s);
    return 1;
}
