// Pipeline parallelism bookkeeping: which layers each pipeline stage holds (run.pp,
// run.pp_layers) and how one step's rows are cut into micro-batches that flow through the
// stages one after another (model.c runs the schedule).
//
// The world is pp stages of tp ranks; a stage is tp consecutive world ranks (dist.h). Stage s
// holds layers [first[s], first[s+1]); the first stage also holds the embedding, the last one
// the final norm and the lm_head (weights_plan decides that from the layer range).
#pragma once
#include <stdio.h>

#include "backend.h"
#include "config.h"
#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

// Layer ranges of pp stages into first[pp + 1] (first[0] = 0, first[pp] = n_layers): the counts
// of run.pp_layers when it is set (one per stage), else an even split where the first
// n_layers % pp stages take one layer more. Every stage gets at least one layer. Returns 0, or
// -1 with a message naming the keys involved.
int pipeline_layout(const k25_config *cfg, int pp, int *first, char *err);

// One line describing stage s (no newline): "stage 1: layers 2-3 (2 layers) + final norm,
// lm_head; ranks 2-3". world_size <= 0 leaves out the ranks.
void pipeline_describe_stage(const k25_config *cfg, int pp, const int *first, int s,
                             int world_size, char *buf, size_t cap);
// Every stage's line, each prefixed with `prefix`, then "\n", into f.
void pipeline_print(FILE *f, const char *prefix, const k25_config *cfg, int pp,
                    const int *first, int world_size);

// Cuts the T rows of b into at most n contiguous micro-batches: cut[0] = 0 < cut[1] < ... <
// cut[k] = T, returns k (cut needs n + 1 entries). Cuts fall on sequence boundaries where one
// is close to an even split; a long run of one sequence (a prefill chunk) is cut inside when
// not. Cutting a sequence is safe because the stages run the micro-batches in order and a row
// only attends to positions up to its own; so when some sequence's positions do not increase
// with the row index the step stays one micro-batch.
int pipeline_micro_batches(const k25_batch *b, int n, int *cut);

// Blocking hand-off of n floats of host memory to / from the rank of pipeline stage `stage`
// (a rank of d->pp), for backends whose memory MPI can read.
void pipeline_send_host(const k25_dist *d, const float *x, size_t n, int stage);
void pipeline_recv_host(const k25_dist *d, float *x, size_t n, int stage);

#ifdef __cplusplus
}
#endif
