// The CUDA backend's C interface beyond src/backend.h (backend_cuda_create is declared there):
// what tools and tests may ask about the GPUs without touching CUDA headers.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Number of visible CUDA devices (0 when the driver or runtime is unusable).
int k25_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
