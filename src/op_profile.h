// Where the time of a model step goes, by operation group, measured by interposing on the
// backend's operation table: every operation is followed by be->sync() and timed on the host
// clock, and CUDA-graph replay is turned off (run_graph calls the step function directly), so
// the groups add up to the step. The syncs remove the overlap between operations and add launch
// gaps: the shares are a guide to what dominates, not a trace. Matmuls are put in a group by
// their weight's name (self_attn, shared_experts, dense mlp, lm_head); silu_mul and add go
// with the FFN matmuls they follow.
//
// One backend per process: install on it, run steps, take the times, remove.
#pragma once
#include "backend.h"

typedef enum {
    K25_OPG_ATTN = 0,     // attention: q/kv projections, MLA, o_proj
    K25_OPG_ROUTER,       // MoE router (scores, top-k)
    K25_OPG_EXPERTS,      // routed experts
    K25_OPG_SHARED,       // shared expert
    K25_OPG_DENSE,        // dense MLP (the first layers)
    K25_OPG_NORM,         // RMSNorms (with the residual add they fuse)
    K25_OPG_ALLREDUCE,    // tensor-parallel sums (includes waiting for the slowest rank)
    K25_OPG_LMHEAD,       // final lm_head and sampling
    K25_OPG_OTHER,        // embedding, batch upload, host overhead
    K25_OPG_N
} k25_op_group;

#ifdef __cplusplus
extern "C" {
#endif

extern const char *const k25_op_group_names[K25_OPG_N];  // short names for tables and JSON

void op_profile_install(k25_backend *be);
void op_profile_remove(k25_backend *be);
// Milliseconds per group since the last take (or install); zeroes the counters.
void op_profile_take(double ms[K25_OPG_N]);
// The group a matmul weight belongs to, by its canonical name.
k25_op_group op_profile_group_of(const char *tensor_name);

#ifdef __cplusplus
}
#endif
