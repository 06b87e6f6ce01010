// Shared by every CUDA source of the backend: the check macros (one per API family), bf16 bit
// helpers, warp reductions and launch-error checking.
//
// Every CUDA runtime call goes through CUDA_CHECK; every kernel launch is followed by
// K25_LAUNCH_CHECK(stream), which always reads cudaGetLastError and, when K25_CUDA_SYNC=1 is
// set in the environment (debug mode), also synchronizes the stream (outside graph capture) so
// that a faulting kernel is reported at its own launch site.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <initializer_list>
#include <nccl.h>
#include <stdint.h>

#include "common.h"
#include "weights.h"

// ------------------------------------------------------------------------------------------
// Error checks
// ------------------------------------------------------------------------------------------

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            k25_fatal(__FILE__, __LINE__, "CUDA error %s (%s) in %s", cudaGetErrorName(err_),      \
                      cudaGetErrorString(err_), #call);                                            \
    } while (0)

#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            k25_fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s: %s", (int)r_,                 \
                      ncclGetErrorString(r_), #call, ncclGetLastError(NULL));                      \
    } while (0)

// Non-zero when K25_CUDA_SYNC=1: synchronize after every launch (slow, precise errors).
// Non-zero when environment variable `name` is set to anything but "" or "0" (the backend's
// switches; callers read it once).
int k25_env_flag(const char *name);
// An integer knob: the variable's value, or dflt when it is unset or empty.
int k25_env_int(const char *name, int dflt);
int k25_cuda_debug_sync(void);
void k25_cuda_launch_check(cudaStream_t s, const char *what, const char *file, int line);
#define K25_LAUNCH_CHECK(stream, what) k25_cuda_launch_check((stream), (what), __FILE__, __LINE__)

// ------------------------------------------------------------------------------------------
// Programmatic dependent launch (PDL, sm_90)
// ------------------------------------------------------------------------------------------
// A decode step is ~20 dependent kernels per layer, most of them a few microseconds long, so
// the drain of one kernel and the ramp of the next are a large share of the step. A kernel
// launched through k25_launch may be scheduled while the kernel before it in the stream is
// still running: its blocks start as soon as every block of the previous kernel has called
// k25_pdl_trigger() (or exited), do their independent prologue (weight loads, index math) and
// call k25_pdl_wait() before they read or write anything an earlier kernel produces or reads.
// k25_pdl_wait() returns once the previous grid has completed and its writes are visible; since
// that grid itself waited for its own predecessor, the order of the whole stream is kept.
// Rules for a kernel launched through k25_launch: no global access that depends on an earlier
// kernel before k25_pdl_wait(); a thread that touches such memory reaches the wait first; at
// least one thread of the grid always waits (a grid that exits without waiting could complete
// before its predecessor, and the next kernel would then wait on the wrong grid). Where work
// comes before the wait, dependent data is read with coherent loads: ptxas moves
// non-coherent loads (ld.global.nc: __ldg, const __restrict__) across griddepcontrol.wait.
// scripts/check_pdl_sass.py checks the placement in the SASS. Both calls are no-ops for a
// kernel launched without the attribute. K25_NO_PDL=1 launches without it
// (A/B measurements).
__device__ __forceinline__ void k25_pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void k25_pdl_trigger(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

int k25_pdl_enabled(void);

// *p += v at GPU scope, releasing this thread's earlier stores (and those a block barrier
// ordered before it) to whoever acquires the count. Release only: an acquire-release fence
// before an atomic would also invalidate this SM's L1, which its blocks read activations from.
__device__ __forceinline__ void k25_red_release_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A count that other blocks of running grids increment after releasing their stores: a load
// at GPU scope with acquire semantics (the count from L2, and this SM's L1 invalidated, so that
// the loads after it see those stores), for polling.
__device__ __forceinline__ int k25_ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute, and a cluster of
// `cluster` blocks along x when cluster > 1. Checks the launch like K25_LAUNCH_CHECK.
template <typename... KArgs, typename... Args>
static inline void k25_launch_impl(const char *what, const char *file, int line,
                                   void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t s, unsigned cluster, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (k25_pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (err != cudaSuccess)
        k25_fatal(file, line, "kernel %s: launch failed: %s (%s)", what, cudaGetErrorName(err),
                  cudaGetErrorString(err));
    k25_cuda_launch_check(s, what, file, line);
}
#define k25_launch(what, kernel, grid, block, smem, s, ...)                                        \
    k25_launch_impl((what), __FILE__, __LINE__, (kernel), (grid), (block), (smem), (s), 1u,        \
                    __VA_ARGS__)
#define k25_launch_cluster(what, kernel, grid, block, smem, s, cluster, ...)                       \
    k25_launch_impl((what), __FILE__, __LINE__, (kernel), (grid), (block), (smem), (s),            \
                    (unsigned)(cluster), __VA_ARGS__)

// The driver's tensor-map encoder, through cudart's entry point (nothing links libcuda); dies
// where the driver has none.
static inline PFN_cuTensorMapEncodeTiled_v12000 k25_tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                    cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !fn)
            K25_DIE("the CUDA driver has no cuTensorMapEncodeTiled");
        encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    return encode;
}

__host__ __device__ static inline int64_t k25_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An attribute of the current device, read once per call site (*cache starts at -1): one
// process drives one GPU.
static inline int k25_device_attr(int *cache, cudaDeviceAttr a) {
    if (*cache < 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(cache, a, dev));
    }
    return *cache;
}

// ------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ float k25_bf16_lo(uint32_t packed) { return __uint_as_float(packed << 16); }
__device__ __forceinline__ float k25_bf16_hi(uint32_t packed) {
    return __uint_as_float(packed & 0xffff0000u);
}
__device__ __forceinline__ float k25_bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
// SiLU, one expression for the element-wise SiLU*up and the MoE GEMM's fused reduction (the same
// bits from both)
__device__ __forceinline__ float k25_silu(float z) { return z / (1.0f + expf(-z)); }

// V consecutive f32 (V = 4: one 16-byte access, the pointer 16-byte aligned) or bf16 (V = 4: one
// 8-byte store) values, for the vector paths of the element-wise kernels, MLA's split and the
// MoE combine.
template <int V> __device__ __forceinline__ void k25_ldv(const float *p, float (&r)[V]) {
    if constexpr (V == 4) {
        const float4 q = *reinterpret_cast<const float4 *>(p);
        r[0] = q.x, r[1] = q.y, r[2] = q.z, r[3] = q.w;
    } else {
        r[0] = *p;
    }
}
template <int V> __device__ __forceinline__ void k25_stv(float *p, const float (&r)[V]) {
    if constexpr (V == 4)
        *reinterpret_cast<float4 *>(p) = make_float4(r[0], r[1], r[2], r[3]);
    else
        *p = r[0];
}
template <int V> __device__ __forceinline__ void k25_stv(uint16_t *p, const uint16_t (&r)[V]) {
    if constexpr (V == 4)
        *reinterpret_cast<uint2 *>(p) = make_uint2((uint32_t)r[0] | (uint32_t)r[1] << 16,
                                                   (uint32_t)r[2] | (uint32_t)r[3] << 16);
    else
        *p = r[0];
}

// The V = 4 paths apply: n a multiple of 4, f32 pointers 16-byte and bf16 ones 8-byte aligned.
static inline bool k25_vec4(size_t n, std::initializer_list<const float *> f,
                            std::initializer_list<const uint16_t *> h = {}) {
    if (n % 4) return false;
    for (const float *p : f)
        if ((uintptr_t)p & 15) return false;
    for (const uint16_t *p : h)
        if ((uintptr_t)p & 7) return false;
    return true;
}

// Round to nearest even, as common.h's k25_f32_to_bf16 (NaN kept quiet).
__device__ __forceinline__ uint16_t k25_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// The two bf16 operands of an f32 activation in the tensor-core products: hi = bf16(a), lo =
// bf16(a - hi), whose sum carries about f32 accuracy (kernels/NOTES.md, "Numerics").
__device__ __forceinline__ void k25_split_bf16(float a, uint16_t &hi, uint16_t &lo) {
    hi = k25_f2bf(a);
    lo = k25_f2bf(a - k25_bf16f(hi));
}

// a[0..V) split into hi[i..i+V) and lo[i..i+V) (lo NULL: hi only; V = 4: 8-byte aligned), by the
// kernels that produce activations for the cuBLASLt products (the norms: k25k_rmsnorm).
template <int V>
__device__ __forceinline__ void k25_st_split(uint16_t *hi, uint16_t *lo, size_t i, const float *a) {
    uint16_t h[V], l[V];
#pragma unroll
    for (int v = 0; v < V; v++) k25_split_bf16(a[v], h[v], l[v]);
    k25_stv<V>(hi + i, h);
    if (lo) k25_stv<V>(lo + i, l);
}

// Two floats as one bf16 pair: lo in the low half (the element first in memory).
__device__ __forceinline__ uint32_t k25_pack_bf16x2(float lo, float hi) {
    return (uint32_t)k25_f2bf(lo) | ((uint32_t)k25_f2bf(hi) << 16);
}

// A shared-memory address as the state space's 32-bit form (ldmatrix, bulk copies, mbarriers).
__device__ __forceinline__ uint32_t k25_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// Bulk asynchronous copies (the TMA's non-tensor form): one thread moves a contiguous range of
// global memory (16-byte aligned, a multiple of 16 bytes) into shared memory; the copy counts
// its bytes on an mbarrier, whose phase completes when the bytes announced by expect_tx have
// arrived. Waiters on that phase then see the data; no barrier between the threads is needed.
// Before a stage that threads have read is overwritten by a new copy, those reads are ordered
// before the copy's writes by fence_proxy_async (the copies belong to the async proxy).
__device__ __forceinline__ void k25_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(k25_smem_addr(bar)), "r"(count)
                 : "memory");
}
// makes initialized mbarriers visible to the async proxy
__device__ __forceinline__ void k25_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void k25_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(k25_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void k25_mbar_wait(uint64_t *bar, unsigned parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(k25_smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void k25_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// L2 policy for data read once (weights streamed through a step)
__device__ __forceinline__ uint64_t k25_l2_evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ void k25_bulk_g2s(void *dst, const void *src, unsigned bytes,
                                             uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;\n" ::"r"(k25_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(k25_smem_addr(bar)), "l"(policy)
                 : "memory");
}

// The same without an L2 policy, for data that other blocks read too (the attention's cache
// rows, read by every head group of a row).
__device__ __forceinline__ void k25_bulk_g2s_nohint(void *dst, const void *src, unsigned bytes,
                                                    uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(k25_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(k25_smem_addr(bar))
                 : "memory");
}

// Tensor copies (the TMA's tensor form) of box (c0, r0[, p0]) of a tensor map into shared
// memory at dst, counted on the mbarrier bar (both shared-memory addresses).
__device__ __forceinline__ void k25_tensor_copy_2d(uint32_t dst, const CUtensorMap *map, int c0,
                                                   int r0, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void k25_tensor_copy_3d(uint32_t dst, const CUtensorMap *map, int c0,
                                                   int r0, int p0, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(p0), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ float k25_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float k25_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// scratch: 32 floats of shared memory.
__device__ __forceinline__ float k25_block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = k25_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nw ? scratch[lane] : 0.0f;
    return k25_warp_sum(r);
}

// Inclusive prefix sum over the block (blockDim.x a multiple of 32, at most 1024); tot[32]
// shared scratch. Returns the inclusive value; *total gets the block total. Ends with a barrier,
// so tot can be reused by the next call.
template <typename V>
__device__ __forceinline__ V k25_block_incl_scan(V v, V *tot, V *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        V n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) tot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        V t = lane < nw ? tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            V n = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += n;
        }
        tot[lane] = t;
    }
    __syncthreads();
    if (warp > 0) v += tot[warp - 1];
    *total = tot[nw - 1];
    __syncthreads();
    return v;
}
