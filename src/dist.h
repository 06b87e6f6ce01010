// The parallel world as one object: MPI ranks, the node-local rank (which picks the GPU), the
// tensor-parallel and pipeline groups, and host-memory collectives. Device-memory collectives
// (NCCL) live in the CUDA backend, bootstrapped from this object.
#pragma once
#include <mpi.h>
#include "common.h"

typedef struct k25_dist {
    int world_rank, world_size;
    int local_rank, local_size;  // within the node (MPI_Comm_split_type SHARED)
    int tp_rank, tp_size;        // tensor-parallel group (consecutive world ranks)
    int pp_rank, pp_size;        // pipeline stage
    MPI_Comm world, node, tp, pp;
    int cuda_aware_mpi;          // MPIX_Query_cuda_support() where available, else 0
} k25_dist;

#ifdef __cplusplus
extern "C" {
#endif

void mpi_check(int err, const char *call, const char *file, int line);
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)

// MPI_Init, error handler MPI_ERRORS_RETURN on world (every error goes through MPI_CHECK),
// node-local rank. Checks SLURM_NTASKS against the world size when it is set.
void dist_init(k25_dist *d, int *argc, char ***argv);
// Split the world into pp stages of tp ranks (tp * pp must equal the world size).
int dist_setup_groups(k25_dist *d, int tp, int pp, char *err);
void dist_finalize(k25_dist *d);
// Sum over the TP group, in place, host memory.
void dist_allreduce_sum_f32(const k25_dist *d, float *buf, size_t n);
// Every rank of the world agrees on ok (logical AND); used before a collective error exit so
// that a bad input found on one rank makes all ranks exit non-zero without a hang.
int dist_all_ok(const k25_dist *d, int ok);
// dist_all_ok that also carries the message: when a rank is not ok, the lowest such rank's err
// reaches err on every rank ("rank N: ..." where it came from another rank), and it returns -1;
// 0 when every rank is ok. For failures that only some ranks see (a pipeline stage's layers, a
// node without the checkpoint) before a collective the others would wait in.
int dist_agree(const k25_dist *d, int ok, char *err);
// The exit of a command-line program on a bad input: returns when every rank is ok; otherwise
// the failing ranks print "PROG: error: msg" (only rank 0 when it failed too, since then all
// ranks usually failed the same way; other ranks add "rank N:") and every rank exits with 1.
void dist_agree_or_exit(k25_dist *d, int ok, const char *prog, const char *msg);

#ifdef __cplusplus
}
#endif
