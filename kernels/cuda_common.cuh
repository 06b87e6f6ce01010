// Shared by every CUDA source of the backend: the check macros (one per API family), bf16 bit
// helpers, warp reductions and launch-error checking.
//
// Every CUDA runtime call goes through CUDA_CHECK; every kernel launch is followed by
// K25_LAUNCH_CHECK(stream), which always reads cudaGetLastError and, when K25_CUDA_SYNC=1 is
// set in the environment (debug mode), also synchronizes the stream (outside graph capture) so
// that a faulting kernel is reported at its own launch site.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
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
int k25_cuda_debug_sync(void);
void k25_cuda_launch_check(cudaStream_t s, const char *what, const char *file, int line);
#define K25_LAUNCH_CHECK(stream, what) k25_cuda_launch_check((stream), (what), __FILE__, __LINE__)

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

// Round to nearest even, as common.h's k25_f32_to_bf16 (NaN kept quiet).
__device__ __forceinline__ uint16_t k25_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
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
__device__ __forceinline__ int k25_block_incl_scan(int v, int *tot, int *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) tot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int t = lane < nw ? tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int n = __shfl_up_sync(0xffffffffu, t, o);
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
