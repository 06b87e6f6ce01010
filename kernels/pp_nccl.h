// Pipeline hand-off between GPUs through NCCL point-to-point, as the CUDA backend's optional
// pp_send / pp_recv (src/backend.h).
#pragma once
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Creates the NCCL communicator of this rank's pipeline group (be->dist->pp: a collective over
// it, so every rank of the group attaches at the same point) and sets be->pp_send / pp_recv;
// the communicator goes with the backend (be->destroy). Nothing happens without a pipeline.
void pp_nccl_attach(k25_backend *be);

#ifdef __cplusplus
}
#endif
