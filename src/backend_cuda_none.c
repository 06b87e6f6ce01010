// The CUDA backend's entry point in a binary built without CUDA (make CUDA=0): there is no GPU
// backend, and callers say so ("this binary was built without CUDA (make CUDA=1)").
#include "backend.h"

k25_backend *backend_cuda_create(const k25_config *cfg, const k25_dist *dist) {
    (void)cfg;
    (void)dist;
    return NULL;
}
