// The one-shot all-reduce of allreduce_oneshot.cuh: setup over MPI and CUDA IPC, the plain and the
// fused (residual add + RMSNorm) kernels with their two exchange protocols, and the launchers.
//
// Memory of each rank: one cudaMalloc registered with CUDA IPC and opened by every peer,
//   flags    uint32 [OS_MAX_BLOCKS][OS_MAX_RANKS]  slot [b][p]: the last call in which block b of
//                                                  rank p signalled this rank (pull protocol)
//   buffer 0, buffer 1 (buf_bytes each)            pull protocol: this rank's wire data of even /
//                                                  odd calls, read by every peer
//   words    uint64 [2][nranks][ll_words]          push protocol: what rank p wrote to this rank
//                                                  at even / odd calls
// and, local only, state uint32 [2] (calls finished; blocks done with the call number) and a
// host-mapped record of a timeout.
//
// Every rank counts the same calls: call e (1, 2, ...) uses parity e % 2 everywhere. The launch
// reads e from state[0]; the last block to count itself done (atomic) writes e back for the next
// launch, after every block of this launch has read it.
//
// Pull protocol (any size), in block b of each rank:
//   1. copy-in: the pieces block b will reduce, from the caller's input into its own buffer e % 2;
//   2. barrier: __syncthreads; thread p stores e into rank p's slot [b][me] (st.release.sys) and
//      polls this rank's slot [b][p] (ld.acquire.sys) until it holds e or more (wrap-safe);
//      __syncthreads. Release/acquire at system scope, with the CTA barriers on both sides, orders
//      every thread's copy-in before every peer thread's reads;
//   3. reduce: read the same pieces from the n buffers e % 2 (ld.global.cg, 16 bytes: nothing
//      stale from L1), sum in f32 in rank order 0..n-1, write the caller's output.
// Block b of every rank copies and reads the same pieces: the grid and the mapping of pieces to
// blocks are functions of the sizes and of limits agreed over the group at setup only.
// One barrier is enough: rank A rewrites its buffer e % 2 at call e + 2. Before that A's call
// e + 1 finished, so A saw every peer's call-(e+1) signal; a peer signals call e + 1 from its
// kernel e + 1, which starts after its kernel e, with its reads of A's buffer e % 2, completed
// (stream order). Likewise a slot holds at most e + 1 while its rank waits for e: a peer signals
// e + 2 only after this rank signalled e + 1. Hence "e or more" and two buffers suffice.
//
// Push protocol (small messages, where latency is all that counts; NCCL's LL idea): every 32-bit
// payload (an f32 value or two bf16) travels with a 32-bit flag f(e) = 2e + 1 in one 8-byte word,
// stored with st.volatile.v2.u64 into each peer's words [e % 2][me]. A 64-bit aligned access is
// single-copy atomic, so a reader that sees flag f(e) in a word also sees its payload: the reader
// polls its own (local) memory, no fence and no round trip over NVLink. The reader zeroes each
// word it consumed (flags are odd, so 0 never matches), so no stale word can match a later call
// even after the 32-bit counter wraps. The parity argument above holds unchanged: the writer
// rewrites words [e % 2][A] at call e + 2 only after the reader's kernel e, clearing included,
// completed.
//
// Deadlock: blocks wait only for data that the same block index of the peers produces before it
// waits itself, so every block of a grid must be resident at once. Grids are capped by the
// occupancy of each kernel (blocks per SM x SMs, or co-resident clusters), the minimum over the
// ranks, computed at setup. A block that waits longer than the timeout records it in host memory
// and traps, so a peer that stopped calling gives an error instead of a hang.
//
// Programmatic dependent launch (cuda_common.cuh): both kernels go through k25_launch, so their
// blocks may be scheduled while the kernel before them in the stream still runs. k25_pdl_wait()
// comes first in both, before the call counter and any flag, word or buffer of this rank or a
// peer: the arguments above (the input is complete when it is copied or pushed; kernel e + 1
// starts after kernel e completed) hold from the wait on. Residency is kept: a block scheduled
// early only waits for the previous kernel, all of whose blocks have started already (the next
// kernel is scheduled once every block of a grid has passed k25_pdl_trigger), so it never keeps
// a block of an exchange from becoming resident.
#include <cooperative_groups.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "cuda_common.cuh"
#include "allreduce_oneshot.cuh"
#include "dist.h"

#define OS_MAX_RANKS 8
#define OS_MAX_BLOCKS 1024   // flag slots per rank, so the most blocks of any grid
#define OS_FLAT_THREADS 256  // block of the plain kernels
#define OS_FUSED_THREADS 512 // most threads of a fused block
#define OS_GROUP_ROWS 16     // rows of a cluster normalized together (shared-memory partials)
#define OS_FLAGS_BYTES ((size_t)OS_MAX_BLOCKS * OS_MAX_RANKS * sizeof(uint32_t))
#define OS_PUSH_WORDS (8 * 7168) // push-protocol capacity: payload words per (parity, source)
// Calls that send each peer at most this many words push: on 2 H200s push wins up to 4 rows of
// f32 and 8 rows of bf16 (bench/micro_allreduce_oneshot.cu).
#define OS_PUSH_DEFAULT (4 * 7168)

// Kernel arguments fixed at setup (a __grid_constant__ parameter: indexed in place).
struct os_args {
    char *data[OS_MAX_RANKS];                // rank p's two pull buffers, in this address space
    uint32_t *flags[OS_MAX_RANKS];           // rank p's flags [OS_MAX_BLOCKS][OS_MAX_RANKS]
    unsigned long long *words[OS_MAX_RANKS]; // rank p's push words [2][nranks][push_words]
    uint32_t *state;                         // this rank's [0] calls finished, [1] blocks counted
    unsigned int *timeout_rec;               // host-mapped [4]: set, call, peer, block
    size_t buf_bytes;                        // bytes of one pull buffer
    size_t push_words;                       // words per (parity, source)
    unsigned long long timeout_ns;           // 0: wait forever
    int rank, nranks;
};

struct k25_oneshot {
    MPI_Comm comm;
    int rank, nranks, dev, sms;
    char *region;             // own flags + buffers + words (IPC-registered)
    char *peer[OS_MAX_RANKS]; // every rank's region here (own: region)
    uint32_t *state;          // device [2]
    unsigned int *rec_host;   // timeout record, host view
    size_t buf_bytes, limit;
    size_t push_max; // payload words per peer up to which calls push
    int wire;
    int flat_cap;      // co-resident blocks of the plain kernels, on every rank
    int fused_maxc[4]; // co-resident clusters of 1, 2, 4, 8 fused blocks, every rank
    int tune_cluster, tune_flat;
    int p2p_perf, p2p_atomics; // worst P2P performance rank / native atomics over the peers
    os_args args;
};

// ------------------------------------------------------------------------------------------
// Device side: wire formats
// ------------------------------------------------------------------------------------------

// A unit is 8 consecutive values, kWords 32-bit payload words on the wire (f32: 8, bf16: 4).
struct wire_f32 {
    static constexpr int kWords = 8;
    static constexpr int kBytes = 4;
    __device__ static __forceinline__ void pack(const float v[8], uint32_t w[8]) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = __float_as_uint(v[k]);
    }
    __device__ static __forceinline__ void unpack(const uint32_t w[8], float v[8]) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = __uint_as_float(w[k]);
    }
};

struct wire_bf16 {
    static constexpr int kWords = 4;
    static constexpr int kBytes = 2;
    __device__ static __forceinline__ void pack(const float v[8], uint32_t w[4]) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)k25_f2bf(v[2 * k]) | ((uint32_t)k25_f2bf(v[2 * k + 1]) << 16);
    }
    __device__ static __forceinline__ void unpack(const uint32_t w[4], float v[8]) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[2 * k] = k25_bf16_lo(w[k]), v[2 * k + 1] = k25_bf16_hi(w[k]);
    }
};

// Values i0..i0+7 of p[n]: two 16-byte loads when aligned and whole, else element by element
// (missing values read as 0). Plain loads: in the in-place sum the same thread later writes them.
__device__ __forceinline__ void load8(const float *p, size_t i0, size_t n, bool vec, float v[8]) {
    if (vec && i0 + 8 <= n) {
        const float4 a = *reinterpret_cast<const float4 *>(p + i0);
        const float4 b = *reinterpret_cast<const float4 *>(p + i0 + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = i0 + k < n ? p[i0 + k] : 0.0f;
    }
}

__device__ __forceinline__ void store8(float *p, size_t i0, size_t n, bool vec, const float v[8]) {
    if (vec && i0 + 8 <= n) {
        *reinterpret_cast<float4 *>(p + i0) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4 *>(p + i0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i0 + k < n) p[i0 + k] = v[k];
    }
}

__device__ __forceinline__ void load8_bf16(const uint16_t *w, size_t i0, bool vec, float v[8]) {
    if (vec) {
        const uint4 q = *reinterpret_cast<const uint4 *>(w + i0);
        v[0] = k25_bf16_lo(q.x), v[1] = k25_bf16_hi(q.x), v[2] = k25_bf16_lo(q.y);
        v[3] = k25_bf16_hi(q.y), v[4] = k25_bf16_lo(q.z), v[5] = k25_bf16_hi(q.z);
        v[6] = k25_bf16_lo(q.w), v[7] = k25_bf16_hi(q.w);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = k25_bf16f(w[i0 + k]);
    }
}

// ------------------------------------------------------------------------------------------
// Device side: synchronization
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Two 8-byte words, each single-copy atomic (volatile = relaxed at system scope).
__device__ __forceinline__ void st_words(unsigned long long *p, unsigned long long a,
                                         unsigned long long b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ld_words(const unsigned long long *p, unsigned long long &a,
                                         unsigned long long &b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(a), "=l"(b)
                 : "l"(p)
                 : "memory");
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// This launch's call number: calls finished + 1. state[0] is written only by the last block of
// the previous launch, so every thread of this launch reads the same value.
__device__ __forceinline__ uint32_t os_call(const os_args &a) {
    return *(volatile const uint32_t *)a.state + 1u;
}

// Counts this block done with the call number (every thread of it has read it); the last block
// of the grid advances state[0] for the next launch.
__device__ __forceinline__ void os_count(const os_args &a, uint32_t call) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(a.state + 1, 1u) == gridDim.x - 1) {
            ((volatile uint32_t *)a.state)[1] = 0u;
            ((volatile uint32_t *)a.state)[0] = call;
            __threadfence();
        }
    }
}

__device__ __noinline__ void os_give_up(const os_args &a, uint32_t call, int peer) {
    volatile unsigned int *r = a.timeout_rec;
    r[1] = call, r[2] = (unsigned)peer, r[3] = blockIdx.x;
    __threadfence_system();
    r[0] = 1u;
    __threadfence_system();
    __trap();
}

// Step 2 of the pull protocol for this block.
__device__ __forceinline__ void os_barrier(const os_args &a, uint32_t call) {
    __syncthreads(); // the block's copy-in is complete
    const int p = threadIdx.x;
    if (p < a.nranks) {
        st_release_sys(a.flags[p] + (size_t)blockIdx.x * OS_MAX_RANKS + a.rank, call);
        const uint32_t *mine = a.flags[a.rank] + (size_t)blockIdx.x * OS_MAX_RANKS + p;
        if ((int32_t)(ld_acquire_sys(mine) - call) < 0) {
            const uint64_t t0 = global_ns();
            while ((int32_t)(ld_acquire_sys(mine) - call) < 0)
                if (a.timeout_ns && global_ns() - t0 > a.timeout_ns) os_give_up(a, call, p);
        }
    }
    __syncthreads(); // the peers' copy-in is visible to every thread of the block
}

// ------------------------------------------------------------------------------------------
// Device side: the two exchanges of one unit
// ------------------------------------------------------------------------------------------

// put: phase 1 for unit u holding this rank's values v. sum: acc = the sum over ranks 0..nr-1,
// in that order, of unit u (own: this rank's values again, which the pull protocol reads back
// from its buffer and the push protocol takes from v). NR = 0: rank count known at run time
// only (up to OS_MAX_RANKS).
template <class Wire, int NR, bool kPush> struct xchg;

template <class Wire, int NR> struct xchg<Wire, NR, false> {
    static constexpr int kVecs = Wire::kWords / 4; // 16-byte vectors per unit
    __device__ static __forceinline__ void put(const os_args &a, uint32_t call, size_t u,
                                               const float v[8]) {
        uint32_t w[Wire::kWords];
        Wire::pack(v, w);
        uint4 *dst =
            reinterpret_cast<uint4 *>(a.data[a.rank] + (call & 1u) * a.buf_bytes) + u * kVecs;
#pragma unroll
        for (int k = 0; k < kVecs; k++)
            dst[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
    __device__ static __forceinline__ void sum(const os_args &a, uint32_t call, int nr, size_t u,
                                               const float *, float acc[8]) {
        constexpr int P = NR ? NR : OS_MAX_RANKS;
        const size_t off = (call & 1u) * a.buf_bytes;
        uint4 raw[P][kVecs];
#pragma unroll
        for (int p = 0; p < P; p++)
            if (NR || p < nr) {
                const uint4 *src = reinterpret_cast<const uint4 *>(a.data[p] + off) + u * kVecs;
#pragma unroll
                for (int k = 0; k < kVecs; k++)
                    raw[p][k] = __ldcg(src + k);
            }
#pragma unroll
        for (int p = 0; p < P; p++)
            if (NR || p < nr) {
                uint32_t w[Wire::kWords];
                float v[8];
#pragma unroll
                for (int k = 0; k < kVecs; k++)
                    w[4 * k] = raw[p][k].x, w[4 * k + 1] = raw[p][k].y, w[4 * k + 2] = raw[p][k].z,
                          w[4 * k + 3] = raw[p][k].w;
                Wire::unpack(w, v);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[j] = p ? acc[j] + v[j] : v[j];
            }
    }
};

template <class Wire, int NR> struct xchg<Wire, NR, true> {
    __device__ static __forceinline__ unsigned long long *slot(const os_args &a, int owner,
                                                               uint32_t call, int src, size_t u) {
        return a.words[owner] + ((size_t)(call & 1u) * a.nranks + src) * a.push_words +
               u * Wire::kWords;
    }
    __device__ static __forceinline__ void put(const os_args &a, uint32_t call, size_t u,
                                               const float v[8]) {
        uint32_t w[Wire::kWords];
        Wire::pack(v, w);
        const unsigned long long f = (unsigned long long)(2u * call + 1u) << 32;
        constexpr int P = NR ? NR : OS_MAX_RANKS;
#pragma unroll
        for (int p = 0; p < P; p++)
            if ((NR || p < a.nranks) && p != a.rank) {
                unsigned long long *dst = slot(a, p, call, a.rank, u);
#pragma unroll
                for (int k = 0; k < Wire::kWords; k += 2)
                    st_words(dst + k, f | w[k], f | w[k + 1]);
            }
    }
    // Waits for unit u from rank p, takes its payload, zeroes the words.
    __device__ static __forceinline__ void take(const os_args &a, uint32_t call, int p, size_t u,
                                                uint32_t w[Wire::kWords]) {
        unsigned long long *src = slot(a, a.rank, call, p, u);
        const uint32_t f = 2u * call + 1u;
        unsigned long long q[Wire::kWords];
        uint64_t t0 = 0;
        for (;;) {
            bool ok = true;
#pragma unroll
            for (int k = 0; k < Wire::kWords; k += 2) {
                ld_words(src + k, q[k], q[k + 1]);
                ok &= (uint32_t)(q[k] >> 32) == f && (uint32_t)(q[k + 1] >> 32) == f;
            }
            if (ok) break;
            if (a.timeout_ns) {
                const uint64_t t = global_ns();
                if (!t0)
                    t0 = t;
                else if (t - t0 > a.timeout_ns)
                    os_give_up(a, call, p);
            }
        }
#pragma unroll
        for (int k = 0; k < Wire::kWords; k++)
            w[k] = (uint32_t)q[k];
#pragma unroll
        for (int k = 0; k < Wire::kWords; k += 2)
            st_words(src + k, 0ull, 0ull);
    }
    __device__ static __forceinline__ void sum(const os_args &a, uint32_t call, int nr, size_t u,
                                               const float *own, float acc[8]) {
        constexpr int P = NR ? NR : OS_MAX_RANKS;
#pragma unroll
        for (int p = 0; p < P; p++)
            if (NR || p < nr) {
                uint32_t w[Wire::kWords];
                float v[8];
                if (p == a.rank)
                    Wire::pack(own, w); // the same rounding as the peers'
                else
                    take(a, call, p, u, w);
                Wire::unpack(w, v);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[j] = p ? acc[j] + v[j] : v[j];
            }
    }
};

// Units reduced at once per thread: enough 16-byte loads in flight, registers kept bounded.
template <int NR, bool kPush> struct batch {
    static constexpr int kFlat = kPush ? 1 : (NR == 2 ? 4 : (NR == 4 ? 2 : 1));
    static constexpr int kFused = kPush ? 1 : (NR == 2 ? 2 : 1);
};

// ------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------

// dst[n] = sum (kAdd false; in may equal dst) or dst[n] += sum (kAdd true) of the group's in[n].
// Thread g of the grid owns units g, g + stride, ... in both phases.
template <class Wire, int NR, bool kAdd, bool kPush>
__global__ void __launch_bounds__(OS_FLAT_THREADS)
    os_flat_kernel(const __grid_constant__ os_args a, const float *in, float *dst, size_t n,
                   int in_vec, int dst_vec) {
    k25_pdl_trigger();
    k25_pdl_wait(); // first of all: see "Programmatic dependent launch" at the top
    typedef xchg<Wire, NR, kPush> X;
    const uint32_t call = os_call(a);
    const size_t units = (n + 7) / 8;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t u = first; u < units; u += stride) {
        float v[8];
        load8(in, u * 8, n, in_vec, v);
        X::put(a, call, u, v);
    }
    if (!kPush) os_barrier(a, call);
    os_count(a, call);
    const int nr = NR ? NR : a.nranks;
    constexpr int UB = batch<NR, kPush>::kFlat;
    for (size_t u0 = first; u0 < units; u0 += stride * UB) {
        float acc[UB][8];
#pragma unroll
        for (int b = 0; b < UB; b++) {
            const size_t u = u0 + b * stride;
            if (u < units) {
                float own[8];
                if (kPush) load8(in, u * 8, n, in_vec, own);
                X::sum(a, call, nr, u, own, acc[b]);
            }
        }
#pragma unroll
        for (int b = 0; b < UB; b++) {
            const size_t u = u0 + b * stride;
            if (u >= units) break;
            if (kAdd) {
                float hv[8];
                load8(dst, u * 8, n, dst_vec, hv);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[b][j] = hv[j] + acc[b][j];
            }
            store8(dst, u * 8, n, dst_vec, acc[b]);
        }
    }
}

__device__ __forceinline__ uint32_t cluster_id_x() {
    uint32_t v;
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ uint32_t cluster_count_x() {
    uint32_t v;
    asm("mov.u32 %0, %%nclusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// h[T][n] += sum of the group's d[T][n]; out = h / sqrt(mean(h^2) + eps) * w. A cluster of C
// blocks owns rows cid, cid + ncl, ...; block cb of it owns units [cb*U/C, (cb+1)*U/C) of each
// (U = n/8). Sums of squares: per thread in unit order, per warp (shuffle tree), per block (warps
// in order), per cluster (blocks in order, through distributed shared memory), so every block
// of every rank gets the same bits.
template <class Wire, int NR, bool kPush>
__global__ void __launch_bounds__(OS_FUSED_THREADS)
    os_fused_kernel(const __grid_constant__ os_args a, const float *d, float *h, const uint16_t *w,
                    float eps, int T, int n, float *out, uint16_t *hi, uint16_t *lo, int vec) {
    typedef xchg<Wire, NR, kPush> X;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float s_warp[OS_GROUP_ROWS][32];
    __shared__ float s_block[OS_GROUP_ROWS];
    __shared__ float s_rinv[OS_GROUP_ROWS];
    k25_pdl_trigger();
    k25_pdl_wait(); // first of all: see "Programmatic dependent launch" at the top
    const uint32_t call = os_call(a);
    const int C = (int)cluster.num_blocks(), cb = (int)cluster.block_rank();
    const int cid = (int)cluster_id_x(), ncl = (int)cluster_count_x();
    const int U = n / 8;
    const int su0 = (int)((int64_t)cb * U / C), su1 = (int)((int64_t)(cb + 1) * U / C);
    const int R = cid < T ? (T - cid + ncl - 1) / ncl : 0;
    for (int i = 0; i < R; i++) {
        const size_t r = (size_t)cid + (size_t)i * ncl;
        for (int u = su0 + (int)threadIdx.x; u < su1; u += blockDim.x) {
            float v[8];
            load8(d + r * n, (size_t)u * 8, (size_t)n, vec, v);
            X::put(a, call, r * U + u, v);
        }
    }
    if (!kPush) os_barrier(a, call);
    os_count(a, call);

    const int nr = NR ? NR : a.nranks;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    constexpr int RB = batch<NR, kPush>::kFused;
    for (int g0 = 0; g0 < R; g0 += OS_GROUP_ROWS) {
        const int ng = min(OS_GROUP_ROWS, R - g0);
        if (g0) cluster_wait(); // the cluster is done reading s_block of the previous group
        // h += sum, partial sums of squares of the new h
        for (int i0 = 0; i0 < ng; i0 += RB) {
            float sq[RB];
#pragma unroll
            for (int rb = 0; rb < RB; rb++)
                sq[rb] = 0.0f;
            for (int u = su0 + (int)threadIdx.x; u < su1; u += blockDim.x) {
                float acc[RB][8];
#pragma unroll
                for (int rb = 0; rb < RB; rb++)
                    if (i0 + rb < ng) {
                        const size_t r = (size_t)cid + (size_t)(g0 + i0 + rb) * ncl;
                        float own[8];
                        if (kPush) load8(d + r * n, (size_t)u * 8, (size_t)n, vec, own);
                        X::sum(a, call, nr, r * U + u, own, acc[rb]);
                    }
#pragma unroll
                for (int rb = 0; rb < RB; rb++)
                    if (i0 + rb < ng) {
                        const size_t r = (size_t)cid + (size_t)(g0 + i0 + rb) * ncl;
                        float hv[8];
                        load8(h + r * n, (size_t)u * 8, (size_t)n, vec, hv);
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            hv[j] = hv[j] + acc[rb][j];
                            sq[rb] += hv[j] * hv[j];
                        }
                        store8(h + r * n, (size_t)u * 8, (size_t)n, vec, hv);
                    }
            }
#pragma unroll
            for (int rb = 0; rb < RB; rb++)
                if (i0 + rb < ng) { // uniform over the block
                    const float s = k25_warp_sum(sq[rb]);
                    if (lane == 0) s_warp[i0 + rb][warp] = s;
                }
        }
        __syncthreads();
        if ((int)threadIdx.x < ng) {
            float s = 0.0f;
            for (int k = 0; k < nwarps; k++)
                s += s_warp[threadIdx.x][k];
            s_block[threadIdx.x] = s;
        }
        cluster.sync(); // every block's partials are visible to the cluster
        if ((int)threadIdx.x < ng) {
            float s = 0.0f;
            for (int c = 0; c < C; c++)
                s += cluster.map_shared_rank(s_block, c)[threadIdx.x];
            s_rinv[threadIdx.x] = rsqrtf(s / (float)n + eps);
        }
        cluster_arrive(); // this block's reads of the cluster's s_block are done
        __syncthreads();
        for (int i = 0; i < ng; i++) {
            const size_t r = (size_t)cid + (size_t)(g0 + i) * ncl;
            const float rinv = s_rinv[i];
            for (int u = su0 + (int)threadIdx.x; u < su1; u += blockDim.x) {
                float hv[8], wv[8], o[8];
                load8(h + r * n, (size_t)u * 8, (size_t)n, vec, hv); // this thread's own stores
                load8_bf16(w, (size_t)u * 8, vec, wv);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    o[j] = hv[j] * rinv * wv[j];
                store8(out + r * n, (size_t)u * 8, (size_t)n, vec, o);
                if (hi) {
                    const size_t i0 = r * n + (size_t)u * 8;
                    if (vec) {
                        k25_st_split<4>(hi, lo, i0, o);
                        k25_st_split<4>(hi, lo, i0 + 4, o + 4);
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            k25_st_split<1>(hi, lo, i0 + j, o + j);
                    }
                }
            }
        }
    }
    if (R) cluster_wait(); // no block leaves while another may still read its s_block
}

// ------------------------------------------------------------------------------------------
// Kernel selection
// ------------------------------------------------------------------------------------------

typedef void (*flat_fn)(const os_args, const float *, float *, size_t, int, int);
typedef void (*fused_fn)(const os_args, const float *, float *, const uint16_t *, float, int, int,
                         float *, uint16_t *, uint16_t *, int);

template <class Wire, bool kAdd, bool kPush> static flat_fn flat_for(int nr) {
    switch (nr) {
    case 2: return os_flat_kernel<Wire, 2, kAdd, kPush>;
    case 4: return os_flat_kernel<Wire, 4, kAdd, kPush>;
    case 8: return os_flat_kernel<Wire, 8, kAdd, kPush>;
    default: return os_flat_kernel<Wire, 0, kAdd, kPush>;
    }
}

template <class Wire> static flat_fn flat_wire(int nr, bool add, bool push) {
    if (add) return push ? flat_for<Wire, true, true>(nr) : flat_for<Wire, true, false>(nr);
    return push ? flat_for<Wire, false, true>(nr) : flat_for<Wire, false, false>(nr);
}

static flat_fn flat_kernel(int wire, int nr, bool add, bool push) {
    return wire == ONESHOT_WIRE_BF16 ? flat_wire<wire_bf16>(nr, add, push)
                                     : flat_wire<wire_f32>(nr, add, push);
}

template <class Wire, bool kPush> static fused_fn fused_for(int nr) {
    switch (nr) {
    case 2: return os_fused_kernel<Wire, 2, kPush>;
    case 4: return os_fused_kernel<Wire, 4, kPush>;
    case 8: return os_fused_kernel<Wire, 8, kPush>;
    default: return os_fused_kernel<Wire, 0, kPush>;
    }
}

static fused_fn fused_kernel(int wire, int nr, bool push) {
    if (wire == ONESHOT_WIRE_BF16)
        return push ? fused_for<wire_bf16, true>(nr) : fused_for<wire_bf16, false>(nr);
    return push ? fused_for<wire_f32, true>(nr) : fused_for<wire_f32, false>(nr);
}

static size_t wire_elem(int wire) {
    return wire == ONESHOT_WIRE_BF16 ? 2 : 4;
}

static int cluster_index(int c) {
    return c == 8 ? 3 : c == 4 ? 2 : c == 2 ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// Setup and teardown
// ------------------------------------------------------------------------------------------

// Every rank learns whether all are ok; the reason of the lowest failing rank reaches all (err).
static int agree(MPI_Comm comm, int rank, int ok, char *err) {
    int bad = ok ? INT_MAX : rank, first = INT_MAX;
    MPI_CHECK(MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == INT_MAX) return 1;
    char msg[K25_ERR_LEN];
    if (rank == first) memcpy(msg, err, K25_ERR_LEN);
    msg[K25_ERR_LEN - 1] = 0;
    MPI_CHECK(MPI_Bcast(msg, K25_ERR_LEN, MPI_CHAR, first, comm));
    msg[K25_ERR_LEN - 1] = 0;
    snprintf(err, K25_ERR_LEN, "one-shot all-reduce unavailable: rank %d: %.400s", first, msg);
    return 0;
}

// First failure of this rank (later ones keep the first message).
#define OS_FAIL(...)                                                                               \
    do {                                                                                           \
        if (ok) snprintf(err, K25_ERR_LEN, __VA_ARGS__);                                           \
        ok = 0;                                                                                    \
    } while (0)

// A CUDA call during setup: its failure makes the one-shot path unavailable, not fatal.
#define OS_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            OS_FAIL("%s: %s", #call, cudaGetErrorString(e_));                                      \
            cudaGetLastError();                                                                    \
        }                                                                                          \
    } while (0)

// Frees what setup made; collective (peers' mappings are closed before any region is freed).
// Returns NULL for the failure paths of oneshot_create.
static k25_oneshot *release(k25_oneshot *c) {
    for (int p = 0; p < OS_MAX_RANKS; p++)
        if (c->peer[p] && c->peer[p] != c->region) cudaIpcCloseMemHandle(c->peer[p]);
    MPI_CHECK(MPI_Barrier(c->comm));
    if (c->region) cudaFree(c->region);
    if (c->state) cudaFree(c->state);
    if (c->rec_host) cudaFreeHost(c->rec_host);
    cudaGetLastError();
    free(c);
    return NULL;
}

static size_t env_size(const char *name, size_t dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    double v = strtod(e, &end);
    if (end == e || v < 0) return dflt;
    return (size_t)v;
}

// Co-resident blocks / clusters of every kernel this group can launch, on this GPU.
static void occupancy(k25_oneshot *c, int *flat_cap, int maxc[4]) {
    *flat_cap = OS_MAX_BLOCKS;
    for (int i = 0; i < 4; i++)
        maxc[i] = OS_MAX_BLOCKS >> i;
    int cluster_ok = 0;
    cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, c->dev);
    for (int v = 0; v < 8; v++) {
        const int wire = v & 1, add = (v >> 1) & 1, push = v >> 2;
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm,
                                                          flat_kernel(wire, c->nranks, add, push),
                                                          OS_FLAT_THREADS, 0) != cudaSuccess)
            per_sm = 0;
        *flat_cap = std::min(*flat_cap, per_sm * c->sms);
    }
    for (int v = 0; v < 4; v++) {
        fused_fn k = fused_kernel(v & 1, c->nranks, v >> 1);
        for (int i = 0; i < 4; i++) {
            const int C = 1 << i;
            int nc = 0;
            if (C == 1 || cluster_ok) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr;
                attr.id = cudaLaunchAttributeClusterDimension;
                attr.val.clusterDim.x = C, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
                cfg.gridDim = dim3(C);
                cfg.blockDim = dim3(OS_FUSED_THREADS);
                cfg.attrs = &attr;
                cfg.numAttrs = 1;
                if (cudaOccupancyMaxActiveClusters(&nc, (void *)k, &cfg) != cudaSuccess) nc = 0;
            }
            maxc[i] = std::min(maxc[i], std::min(nc, OS_MAX_BLOCKS / C));
        }
    }
    cudaGetLastError();
}

extern "C" k25_oneshot *oneshot_create(MPI_Comm tp, size_t max_bytes, char *err) {
    int rank = 0, n = 0;
    MPI_CHECK(MPI_Comm_rank(tp, &rank));
    MPI_CHECK(MPI_Comm_size(tp, &n));
    k25_oneshot *c = (k25_oneshot *)k25_calloc(1, sizeof *c);
    c->comm = tp, c->rank = rank, c->nranks = n;
    int ok = 1;
    err[0] = 0;

    // ---- the group ----
    const char *off = getenv("K25_ONESHOT");
    if (n < 2 || n > OS_MAX_RANKS)
        OS_FAIL("%d ranks in the group (2..%d supported)", n, OS_MAX_RANKS);
    if (off && !strcmp(off, "0")) OS_FAIL("disabled by K25_ONESHOT=0");
    if (!max_bytes) OS_FAIL("no buffer size given");
    if (ok) {
        MPI_Comm node;
        int node_size = 0;
        MPI_CHECK(MPI_Comm_split_type(tp, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
        MPI_CHECK(MPI_Comm_size(node, &node_size));
        MPI_CHECK(MPI_Comm_free(&node));
        if (node_size != n)
            OS_FAIL("the group spans several nodes (%d of %d ranks here)", node_size, n);
    }
    if (!agree(tp, rank, ok, err)) return release(c);

    // ---- peer access between every pair of GPUs ----
    char bus[OS_MAX_RANKS][32] = {{0}};
    OS_TRY(cudaGetDevice(&c->dev));
    OS_TRY(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->dev));
    OS_TRY(cudaDeviceGetPCIBusId(bus[rank], 32, c->dev));
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bus, 32, MPI_CHAR, tp));
    c->p2p_perf = INT_MIN, c->p2p_atomics = 1;
    for (int p = 0; p < n && ok; p++) {
        if (p == rank) continue;
        bus[p][31] = 0;
        int pd = -1, can = 0;
        if (cudaDeviceGetByPCIBusId(&pd, bus[p]) != cudaSuccess) {
            cudaGetLastError();
            OS_FAIL("GPU %s of rank %d is not visible in this process (CUDA_VISIBLE_DEVICES must "
                    "show every GPU of the group)",
                    bus[p], p);
            break;
        }
        if (pd == c->dev) {
            OS_FAIL("ranks %d and %d share GPU %s", rank, p, bus[p]);
            break;
        }
        OS_TRY(cudaDeviceCanAccessPeer(&can, c->dev, pd));
        if (ok && !can) OS_FAIL("GPU %s cannot access GPU %s (no peer access)", bus[rank], bus[p]);
        if (!ok) break;
        cudaError_t e = cudaDeviceEnablePeerAccess(pd, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
            cudaGetLastError();
        else
            OS_TRY(e);
        int perf = 0, atom = 0;
        cudaDeviceGetP2PAttribute(&perf, cudaDevP2PAttrPerformanceRank, c->dev, pd);
        cudaDeviceGetP2PAttribute(&atom, cudaDevP2PAttrNativeAtomicSupported, c->dev, pd);
        cudaGetLastError();
        c->p2p_perf = std::max(c->p2p_perf, perf);
        c->p2p_atomics &= atom != 0;
    }
    if (!agree(tp, rank, ok, err)) return release(c);

    // ---- own memory, registered ----
    c->buf_bytes = (max_bytes + 4095) & ~(size_t)4095;
    const size_t push_words = OS_PUSH_WORDS;
    const size_t words_bytes = 2 * (size_t)n * push_words * sizeof(unsigned long long);
    const size_t region_bytes = OS_FLAGS_BYTES + 2 * c->buf_bytes + words_bytes;
    cudaIpcMemHandle_t handles[OS_MAX_RANKS];
    memset(handles, 0, sizeof handles);
    OS_TRY(cudaMalloc((void **)&c->region, region_bytes));
    OS_TRY(cudaMalloc((void **)&c->state, 2 * sizeof(uint32_t)));
    OS_TRY(cudaHostAlloc((void **)&c->rec_host, 4 * sizeof(unsigned int), cudaHostAllocMapped));
    unsigned int *rec_dev = NULL;
    if (ok) {
        memset(c->rec_host, 0, 4 * sizeof(unsigned int));
        OS_TRY(cudaHostGetDevicePointer((void **)&rec_dev, c->rec_host, 0));
        OS_TRY(cudaMemset(c->region, 0, region_bytes));
        OS_TRY(cudaMemset(c->state, 0, 2 * sizeof(uint32_t)));
        OS_TRY(cudaDeviceSynchronize()); // zeroed before any peer can look
        OS_TRY(cudaIpcGetMemHandle(&handles[rank], c->region));
    }
    c->peer[rank] = c->region;
    if (!agree(tp, rank, ok, err)) return release(c);

    // ---- the peers' memory ----
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, handles, sizeof(cudaIpcMemHandle_t),
                            MPI_BYTE, tp));
    for (int p = 0; p < n && ok; p++) {
        if (p == rank) continue;
        void *ptr = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&ptr, handles[p], cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            cudaGetLastError();
            OS_FAIL("cudaIpcOpenMemHandle of rank %d's buffers: %s", p, cudaGetErrorString(e));
        } else {
            c->peer[p] = (char *)ptr;
        }
    }
    if (!agree(tp, rank, ok, err)) return release(c);

    // ---- limits every rank shares ----
    int lim[6];
    occupancy(c, &lim[1], &lim[2]);
    lim[0] = c->sms;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, lim, 6, MPI_INT, MPI_MIN, tp));
    c->sms = lim[0], c->flat_cap = lim[1];
    for (int i = 0; i < 4; i++)
        c->fused_maxc[i] = lim[2 + i];
    if (c->flat_cap < 1 || c->fused_maxc[0] < 1) {
        OS_FAIL("no co-resident grid (flat %d blocks, fused %d blocks)", c->flat_cap,
                c->fused_maxc[0]);
        agree(tp, rank, ok, err);
        return release(c);
    }
    // 2 ranks: 4 MiB measured on 2 H200s (bf16 3.5 MiB wins 0.6x, f32 7 MiB loses 1.2x);
    // more ranks read n-1 peers each: vLLM's one-shot sizes until measured.
    const size_t dflt = n <= 2   ? ((size_t)4 << 20)
                        : n <= 4 ? ((size_t)1 << 20)
                                 : ((size_t)512 << 10);
    unsigned long long limit = env_size("K25_ONESHOT_MAX_BYTES", dflt);
    unsigned long long push = env_size("K25_ONESHOT_PUSH_WORDS", OS_PUSH_DEFAULT);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &limit, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, tp));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &push, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, tp));
    c->limit = std::min((size_t)limit, c->buf_bytes);
    c->push_max = std::min((size_t)push, (size_t)OS_PUSH_WORDS);
    const char *wire = getenv("K25_ONESHOT_WIRE");
    c->wire = wire && !strcmp(wire, "bf16") ? ONESHOT_WIRE_BF16 : ONESHOT_WIRE_F32;
    MPI_CHECK(MPI_Bcast(&c->wire, 1, MPI_INT, 0, tp));

    os_args *a = &c->args;
    for (int p = 0; p < n; p++) {
        a->flags[p] = (uint32_t *)c->peer[p];
        a->data[p] = c->peer[p] + OS_FLAGS_BYTES;
        a->words[p] = (unsigned long long *)(c->peer[p] + OS_FLAGS_BYTES + 2 * c->buf_bytes);
    }
    a->state = c->state;
    a->timeout_rec = rec_dev;
    a->buf_bytes = c->buf_bytes;
    a->push_words = push_words;
    a->rank = rank, a->nranks = n;
    const char *t = getenv("K25_ONESHOT_TIMEOUT_S");
    oneshot_set_timeout(c, t && *t ? atof(t) : 300.0);
    MPI_CHECK(MPI_Barrier(tp));
    return c;
}

extern "C" void oneshot_destroy(k25_oneshot *c) {
    if (!c) return;
    CUDA_CHECK(cudaDeviceSynchronize()); // no kernel of this rank reads a peer's memory any more
    MPI_CHECK(MPI_Barrier(c->comm));     // nor any peer's
    release(c);
}

// ------------------------------------------------------------------------------------------
// Settings
// ------------------------------------------------------------------------------------------

extern "C" size_t oneshot_wire_bytes(const k25_oneshot *c, size_t n) {
    return (n + 7) / 8 * 8 * wire_elem(c->wire);
}
extern "C" void oneshot_set_wire(k25_oneshot *c, int wire) {
    c->wire = wire == ONESHOT_WIRE_BF16 ? ONESHOT_WIRE_BF16 : ONESHOT_WIRE_F32;
}
extern "C" int oneshot_wire(const k25_oneshot *c) {
    return c->wire;
}
extern "C" void oneshot_set_limit(k25_oneshot *c, size_t bytes) {
    c->limit = std::min(bytes, c->buf_bytes);
}
extern "C" size_t oneshot_limit(const k25_oneshot *c) {
    return c->limit;
}
extern "C" void oneshot_set_timeout(k25_oneshot *c, double seconds) {
    c->args.timeout_ns = seconds > 0 ? (unsigned long long)(seconds * 1e9) : 0ull;
}
extern "C" void oneshot_tune(k25_oneshot *c, int cluster, int flat_blocks, long push_words) {
    c->tune_cluster = cluster == 1 || cluster == 2 || cluster == 4 || cluster == 8 ? cluster : 0;
    c->tune_flat = flat_blocks > 0 ? flat_blocks : 0;
    if (push_words >= 0) c->push_max = std::min((size_t)push_words, (size_t)OS_PUSH_WORDS);
}

extern "C" void oneshot_describe(const k25_oneshot *c, char *buf, size_t len) {
    snprintf(buf, len,
             "one-shot all-reduce: %d ranks, wire %s, taken up to %.1f KiB of wire data, push "
             "protocol up to %zu words per peer, buffers 2 x %.1f KiB, plain kernels <= %d blocks "
             "of %d, "
             "fused clusters of 1/2/4/8 <= %d/%d/%d/%d, %d SMs, P2P performance rank %d, native "
             "atomics %s",
             c->nranks, c->wire == ONESHOT_WIRE_BF16 ? "bf16" : "f32", c->limit / 1024.0,
             c->push_max, c->buf_bytes / 1024.0, c->flat_cap, OS_FLAT_THREADS, c->fused_maxc[0],
             c->fused_maxc[1], c->fused_maxc[2], c->fused_maxc[3], c->sms, c->p2p_perf,
             c->p2p_atomics ? "yes" : "no");
}

extern "C" int oneshot_check(const k25_oneshot *c, char *err) {
    const volatile unsigned int *r = c->rec_host;
    if (!r || !r[0]) return 0;
    snprintf(err, K25_ERR_LEN,
             "one-shot all-reduce: rank %d, block %u waited more than %.1f s for rank %u at call "
             "%u (a peer stopped calling, or the ranks' call sequences differ)",
             c->rank, r[3], c->args.timeout_ns * 1e-9, r[2], r[1]);
    return 1;
}

// ------------------------------------------------------------------------------------------
// Calls
// ------------------------------------------------------------------------------------------

static int aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

static int run_flat(k25_oneshot *c, const float *in, float *dst, size_t n, bool add,
                    cudaStream_t s) {
    if (!c) return 1;
    if (!n) return 0;
    if (oneshot_wire_bytes(c, n) > c->limit) return 1;
    const size_t units = (n + 7) / 8;
    const bool push = units * 8 / (c->wire == ONESHOT_WIRE_BF16 ? 2 : 1) <= c->push_max;
    int cap = std::min(c->flat_cap, 2 * c->sms);
    if (c->tune_flat) cap = std::min(c->tune_flat, c->flat_cap);
    const int blocks =
        (int)std::max<size_t>(1, std::min<size_t>(k25_cdiv(units, OS_FLAT_THREADS), cap));
    k25_launch(add ? "oneshot_allreduce_add" : "oneshot_allreduce_f32",
               flat_kernel(c->wire, c->nranks, add, push), blocks, OS_FLAT_THREADS, 0, s, c->args,
               in, dst, n, aligned16(in), aligned16(dst));
    return 0;
}

extern "C" int oneshot_allreduce_f32(k25_oneshot *c, float *buf, size_t n, cudaStream_t s) {
    return run_flat(c, buf, buf, n, false, s);
}

extern "C" int oneshot_allreduce_add(k25_oneshot *c, const float *d, float *h, size_t n,
                                     cudaStream_t s) {
    return run_flat(c, d, h, n, true, s);
}

extern "C" int oneshot_allreduce_add_rmsnorm(k25_oneshot *c, const float *d, float *h,
                                             const uint16_t *w, float eps, int T, int n, float *out,
                                             uint16_t *hi, uint16_t *lo, cudaStream_t s) {
    if (!c || T < 0 || n <= 0 || n % 8) return 1;
    if (!T) return 0;
    if ((size_t)T * n * wire_elem(c->wire) > c->limit) return 1;
    const bool push = (size_t)T * n / (c->wire == ONESHOT_WIRE_BF16 ? 2 : 1) <= c->push_max;
    const int U = n / 8;
    // blocks per row: about one block per SM over all rows, never more than a row has units
    int C = 8;
    if (c->tune_cluster)
        C = c->tune_cluster;
    else
        while (C > 1 && (int64_t)T * C > c->sms)
            C /= 2;
    while (C > 1 && (C > U || c->fused_maxc[cluster_index(C)] < 1))
        C /= 2;
    const int ncl = std::min(T, c->fused_maxc[cluster_index(C)]);
    const int threads = (int)std::min<int64_t>(
        OS_FUSED_THREADS, std::max<int64_t>(32, k25_cdiv(k25_cdiv(U, C), 32) * 32));
    const int vec = aligned16(d) && aligned16(h) && aligned16(out) && aligned16(w) &&
                    ((uintptr_t)hi & 7) == 0 && ((uintptr_t)lo & 7) == 0;
    // C = 1: no cluster attribute, the implicit 1 x 1 x 1 clusters of a plain launch
    k25_launch_cluster("oneshot_allreduce_add_rmsnorm", fused_kernel(c->wire, c->nranks, push),
                       ncl * C, threads, 0, s, C, c->args, d, h, w, eps, T, n, out, hi, lo, vec);
    return 0;
}
