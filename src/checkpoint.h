// A Hugging Face checkpoint directory: model.safetensors.index.json (weight_map: tensor ->
// shard file) with its shards, or a single model.safetensors; every shard mmap'd and its
// header validated at open. config.json is read by the caller (config_load_hf_json on
// checkpoint_config_path()).
//
// Tensors are looked up by canonical name (without the "language_model." prefix of the
// Kimi-K2.5 wrapper); both the prefixed and the plain form are tried, so K2.5, K2 and
// DeepSeek-V3 layouts load the same way. Vision tensors and anything the model does not ask
// for are never touched.
#pragma once
#include "common.h"
#include "safetensors.h"
#include "weights.h"

#define CKPT_INDEX_FILE "model.safetensors.index.json"
#define CKPT_SINGLE_FILE "model.safetensors"
#define CKPT_PREFIX "language_model."

typedef struct k25_checkpoint {
    char *dir;
    st_file *shards;          // [n_shards], opened
    char **shard_names;       // [n_shards] file names relative to dir, sorted
    int n_shards;
    struct ckpt_entry { char *name; int shard; } *index; // weight_map sorted by name (NULL: single file)
    int n_index;
    uint64_t file_bytes;      // sum of shard file sizes
} k25_checkpoint;

#ifdef __cplusplus
extern "C" {
#endif

// A directory to write a new checkpoint into, created when absent; -1 when it already holds a
// checkpoint (config.json, the index or a .safetensors shard), whose stale files would mix with
// the new ones (or be overwritten: a draft head written over a model).
int checkpoint_dir_fresh(const char *dir, char *err);
// Opens dir; NULL with err naming the file (index, missing or bad shard) on failure.
k25_checkpoint *checkpoint_open(const char *dir, char *err);
void checkpoint_close(k25_checkpoint *ck);
// "<dir>/config.json" into buf[cap].
void checkpoint_config_path(const k25_checkpoint *ck, char *buf, size_t cap);
// The tensor stored under a canonical name (prefixed or not), or NULL; *shard gets its shard
// index. On NULL, err (may be NULL) says why (not listed, listed but absent from its shard).
const st_tensor *checkpoint_find(const k25_checkpoint *ck, const char *canonical, int *shard,
                                 char *err);
// The source for weights_plan: checks dtype and global shape (and an INT4 tensor's
// weight_shape) and points the tensor at its bytes in the mapped shard.
k25_tensor_source checkpoint_source(k25_checkpoint *ck);

#ifdef __cplusplus
}
#endif
