// One-shot all-reduce over NVLink peer memory for the small messages of a decode step (7168 x T
// values, T = 1..256 rows: 28 KB to 7 MB of f32), optionally fused with the residual add and
// RMSNorm that follow it. Used below its measured crossover with NCCL; above it, and wherever
// setup says "unavailable", the caller keeps NCCL.
//
// How a call works (kernels/allreduce_oneshot.cu has the details and the argument for each
// ordering). Two protocols, picked by size (the same choice on every rank):
// - pull (any size): every rank copies its input into its own registered buffer (f32, or bf16
//   on the "bf16 wire"), each block signals its peers' flag slots with the call number
//   (st.release.sys) and waits for theirs (ld.acquire.sys), then reads the same piece from all n
//   ranks' buffers over NVLink (16-byte loads);
// - push (small calls: up to 4 x 7168 f32 / 8 x 7168 bf16 values by default): every rank stores
//   its values, each 32-bit payload paired with the call's flag in one 8-byte word (single-copy
//   atomic), into every peer's memory; each rank polls its own memory until the flags match.
//   No fence, no round trip: the latency of one NVLink write.
// Either way every rank sums in f32 in rank order 0..n-1, so all ranks get bit-identical results,
// and buffers used alternately by odd and even calls mean consecutive calls never race.
//
// Contract (as for any collective):
// - Every rank of the group makes the same sequence of calls with the same sizes (n, T). What a
//   call decides (taken or not) depends only on those sizes and on values agreed at setup, never
//   on pointers, so all ranks always agree.
// - All calls on one context are ordered on one stream (or by events): the call counter and the
//   two buffers assume it. Calls may be captured in CUDA graphs and replayed: no host
//   synchronization, the call counter lives in device memory, all pointers are fixed at setup.
// - Results are written to the caller's buffers only; the inputs of the fused variants are not
//   modified.
//
// Environment, read by oneshot_create (values agreed over the group):
//   K25_ONESHOT=0               setup reports "unavailable" (NCCL everywhere)
//   K25_ONESHOT_MAX_BYTES=N     crossover: calls moving more than N bytes of wire data are not
//                               taken (default: see oneshot_create)
//   K25_ONESHOT_WIRE=bf16|f32   what the buffers carry (default f32)
//   K25_ONESHOT_PUSH_WORDS=N    the push protocol for calls that send each peer at most N
//                               payload words (one f32 or two bf16 each; default 28672 = 4 rows
//                               of f32 or 8 of bf16, at most 57344; 0 = pull only)
//   K25_ONESHOT_TIMEOUT_S=S     a block waiting longer than S seconds for a peer records the
//                               fact (oneshot_check) and traps (default 300; 0 = wait forever)
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k25_oneshot k25_oneshot;

// What the registered buffers carry. f32: exact sums of the f32 inputs (the default; the
// backend's interface is f32). bf16: half the bytes, each rank's partial sum rounded to bf16
// (round to nearest even) before the f32 sum: relative error about 2e-3 on random data.
enum { ONESHOT_WIRE_F32 = 0, ONESHOT_WIRE_BF16 = 1 };

// Collective over tp (2..8 ranks, one GPU each, same node, current device already set).
// Registers 2 x max_bytes of pull buffers, 32 KB of flags and 2 x n x 448 KB of push words per
// rank, exchanges CUDA IPC handles with MPI_Allgather and opens the peers'. Returns NULL on
// every rank, with the same reason in err (K25_ERR_LEN bytes), when any rank cannot take part:
// a single rank, ranks on several nodes, a peer GPU not visible in this process or without peer
// access, an IPC or allocation failure, or K25_ONESHOT=0. CUDA failures during setup are
// reported that way too, not fatal. Crossover default: 2 ranks: 4 MiB of wire data (measured on
// 2 H200s); 3-4 ranks: 1 MiB; 5-8: 512 KiB (vLLM's custom all-reduce picks one-shot under those
// sizes; not measured here). bench/micro_allreduce_oneshot.cu measures it.
k25_oneshot *oneshot_create(MPI_Comm tp, size_t max_bytes, char *err);
// Collective: waits for the device, a barrier, closes the peers' handles, frees. Call before
// MPI_Finalize.
void oneshot_destroy(k25_oneshot *ctx);

// Sum over the group, in place: buf[n] (any n, any 4-byte alignment). Returns 0 when done
// (n == 0 included), 1 when the call is not taken (its wire bytes are over the crossover or the
// buffers): the caller then runs NCCL. Stream-ordered on s, capturable.
int oneshot_allreduce_f32(k25_oneshot *ctx, float *buf, size_t n, cudaStream_t s);
// h[n] += sum over the group of d[n] (d unchanged). Same return values.
int oneshot_allreduce_add(k25_oneshot *ctx, const float *d, float *h, size_t n, cudaStream_t s);
// The fused step after o_proj / the FFN: with sum[T][n] = the group sum of d[T][n] (d unchanged),
//   h[T][n] += sum;  out[T][n] = h / sqrt(mean(h^2) + eps) * w[n]
// (w bf16, as k25k_add_rmsnorm; hi non-NULL: out's bf16 operand for the cuBLASLt products too,
// as there). Needs n % 8 == 0; returns 1 (not taken) otherwise or when over the crossover.
int oneshot_allreduce_add_rmsnorm(k25_oneshot *ctx, const float *d, float *h, const uint16_t *w,
                                  float eps, int T, int n, float *out, uint16_t *hi, uint16_t *lo,
                                  cudaStream_t s);

// Wire bytes that a sum of n values moves per rank (what the crossover compares).
size_t oneshot_wire_bytes(const k25_oneshot *ctx, size_t n);
// Settings; every rank must set the same values at the same point of its call sequence.
void oneshot_set_wire(k25_oneshot *ctx, int wire);
int oneshot_wire(const k25_oneshot *ctx);
void oneshot_set_limit(k25_oneshot *ctx, size_t max_wire_bytes); // clamped to the buffers
size_t oneshot_limit(const k25_oneshot *ctx);
void oneshot_set_timeout(k25_oneshot *ctx, double seconds); // 0 = wait forever
// Tuning (benchmark): cluster = blocks per row of the fused kernel (1, 2, 4 or 8; 0 = automatic),
// flat_blocks = most blocks of the plain kernels (0 = automatic), push_words = calls that send
// each peer at most this many payload words push (negative: unchanged; clamped to the capacity,
// 57344). Grids stay clamped to what is co-resident.
void oneshot_tune(k25_oneshot *ctx, int cluster, int flat_blocks, long push_words);
// One line: ranks, wire, crossover, push limit, buffer size, grid limits, peer links.
void oneshot_describe(const k25_oneshot *ctx, char *buf, size_t len);
// After a failed synchronization: 1 and a message in err (K25_ERR_LEN) when a block of this
// rank gave up waiting for a peer (timeout), else 0. Reads host memory only, so it works after
// the CUDA context is lost.
int oneshot_check(const k25_oneshot *ctx, char *err);

#ifdef __cplusplus
}
#endif
