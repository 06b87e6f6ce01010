// Pipeline hand-off between GPUs (see pp_nccl.h): ncclSend / ncclRecv of the hidden states on a
// communicator of the pipeline group, with the same TP rank at both ends.
//
// It stands beside the backend rather than inside it, so it runs on its own stream and orders
// itself against the backend's with be->sync: before a send the hidden states are complete,
// before a receive nothing still reads the buffer it overwrites. Both return once the transfer
// is done, like the MPI hand-off they replace (model.c), and both run outside graph capture.
#include <nccl.h>
#include <string.h>

#include "cuda_common.cuh" // first: gives weights.h C linkage
#include "backend.h"
#include "cuda_backend.h"
#include "pp_nccl.h"

// One attached backend: its pipeline communicator and stream, and its own destroy.
typedef struct pp_link {
    k25_backend *be;
    ncclComm_t comm;
    cudaStream_t stream;
    void (*destroy)(k25_backend *be);
} pp_link;

#define PP_MAX_LINKS 8
static pp_link links[PP_MAX_LINKS];

static pp_link *link_of(k25_backend *be) {
    for (int i = 0; i < PP_MAX_LINKS; i++)
        if (links[i].be == be) return &links[i];
    K25_DIE("pipeline hand-off: backend %p was not attached (pp_nccl_attach)", (void *)be);
}

static void nccl_pp_send(k25_backend *be, const float *x, size_t n, int stage) {
    pp_link *l = link_of(be);
    be->sync(be);
    NCCL_CHECK(ncclSend(x, n, ncclFloat32, stage, l->comm, l->stream));
    CUDA_CHECK(cudaStreamSynchronize(l->stream));
}

static void nccl_pp_recv(k25_backend *be, float *x, size_t n, int stage) {
    pp_link *l = link_of(be);
    be->sync(be);
    NCCL_CHECK(ncclRecv(x, n, ncclFloat32, stage, l->comm, l->stream));
    CUDA_CHECK(cudaStreamSynchronize(l->stream));
    k25_cuda_wrote(be, x, n * sizeof(float));
}

static void nccl_pp_destroy(k25_backend *be) {
    pp_link *l = link_of(be);
    void (*destroy)(k25_backend *) = l->destroy;
    NCCL_CHECK(ncclCommDestroy(l->comm));
    CUDA_CHECK(cudaStreamDestroy(l->stream));
    memset(l, 0, sizeof *l);
    destroy(be);
}

extern "C" void pp_nccl_attach(k25_backend *be) {
    const k25_dist *d = be->dist;
    if (!d || d->pp_size <= 1) return;
    pp_link *l = NULL;
    for (int i = 0; i < PP_MAX_LINKS && !l; i++)
        if (!links[i].be) l = &links[i];
    if (!l) K25_DIE("pipeline hand-off: more than %d CUDA backends attached", PP_MAX_LINKS);
    // The backend made its GPU current: the communicator and the stream live there.
    CUDA_CHECK(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (d->pp_rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, d->pp));
    NCCL_CHECK(ncclCommInitRank(&l->comm, d->pp_size, id, d->pp_rank));
    l->be = be;
    l->destroy = be->destroy;
    be->destroy = nccl_pp_destroy;
    be->pp_send = nccl_pp_send;
    be->pp_recv = nccl_pp_recv;
}
