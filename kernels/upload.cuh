// Weight upload helpers (weights_upload.cu): a pinned double-buffered stager for file-backed
// tensors and the on-device generator for synthetic ones.
#pragma once
#include "cuda_common.cuh"
#include "weights.h"

typedef struct k25k_uploader k25k_uploader;
// chunk_bytes per pinned buffer (two of them); progress: report bytes to progress_update.
k25k_uploader *k25k_uploader_create(cudaStream_t s, size_t chunk_bytes, int progress);
// Synchronizes the stream and frees the staging buffers.
void k25k_uploader_destroy(k25k_uploader *u);
// Writes the whole local slice of t (stored dtype, row-major) to device memory dst.
void k25k_upload_tensor(k25k_uploader *u, const k25_tensor *t, void *dst);
