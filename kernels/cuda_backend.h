// The CUDA backend's C interface beyond src/backend.h (backend_cuda_create is declared there):
// what tools and tests may ask about the GPUs without touching CUDA headers.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Number of visible CUDA devices (0 when the driver or runtime is unusable).
int k25_cuda_device_count(void);

struct k25_backend;
// Device memory [p, p + bytes) of the CUDA backend be was written outside its ops (the pipeline
// hand-off receiving into activations): what the backend derived from it is dropped.
void k25_cuda_wrote(struct k25_backend *be, const void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
