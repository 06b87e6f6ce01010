// One process's model stack for programs that drive the engine (k25bench, engine tests): the
// tensor-parallel and pipeline groups, this rank's weight slices (a checkpoint directory or
// the synthetic generator), a backend and the model, built in that order and torn down in
// reverse.
#pragma once
#include "checkpoint.h"
#include "model.h"

typedef struct k25_instance {
    k25_weights w;
    k25_checkpoint *ck;      // NULL for synthetic weights
    k25_backend *be;
    k25_model *m;
} k25_instance;

typedef struct k25_instance_opts {
    const char *model_dir;   // checkpoint directory, or NULL for synthetic weights
    uint64_t synth_seed;
    const char *backend;     // "cpu" or "cuda"; NULL: cfg->backend
    int threads;             // CPU backend threads; 0: cfg->threads
    k25_model_opts model;
    int kv_cache_mb;         // most MiB of latent cache on a rank (run.kv_cache_mb): caps
                             // model.max_blocks; 0: none
    int64_t kv_extra_values; // values a position takes in a draft's cache beside the model's
                             // (spec_check), which has as many blocks: the cap covers both
    int min_blocks;          // under that cap, the fewest blocks the run can work with, and
    const char *min_for;     // what needs them ("the context of N tokens"): a cap below is
                             // refused before the weights load
} k25_instance_opts;

#ifdef __cplusplus
extern "C" {
#endif

// Splits the world into run.pp pipeline stages of tp ranks: tp = cfg->tp, or world / pp when
// 0; checks the stage layout (pipeline.h) and that the config divides over tp. Returns 0 or
// -1 with a message.
int instance_setup_dist(k25_dist *d, const k25_config *cfg, char *err);
// Plans this rank's weights (its stage's layers, its TP slices), creates the backend and the
// model. cfg and d must outlive the instance.
// Returns 0 or -1 with a message (bad checkpoint tensor, unknown backend, no CUDA build).
int instance_open(k25_instance *in, const k25_config *cfg, const k25_dist *d,
                  const k25_instance_opts *o, char *err);
void instance_close(k25_instance *in);

#ifdef __cplusplus
}
#endif
