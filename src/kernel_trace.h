// A kernel trace of decode steps: every kernel the GPU ran inside the marked steps, with its
// start and end on the GPU's clock, as CSV. The step breakdown of src/op_profile.h syncs after
// every operation; this one records the steps as they run (CUDA graphs, programmatic dependent
// launch, the shared expert's stream), so it shows the overlap and the gaps between kernels.
//
// CUDA builds record through CUPTI's activity API (concurrent-kernel records: tracing does not
// serialize the kernels, and each kernel of a graph is recorded); other builds return an error.
// One trace per process, on the calling rank's GPU.
#pragma once

// Starts recording every kernel launched from now on (before the backend is created, so that
// its context is traced from the start). Returns 0, or -1 with err.
int kernel_trace_start(char *err);
// Marks a step: kernels that start between begin and end belong to it. A begin without an end
// (a step not worth keeping) is dropped by the next begin. `rows` labels the step in the CSV.
void kernel_trace_step_begin(void);
void kernel_trace_step_end(int rows);
// Stops recording and writes the marked steps' kernels to path:
//   rows,step,start_ns,end_ns,stream,grid,block,regs,smem_dyn,smem_config,name
// start and end relative to the step's mark, smem_config the shared memory (bytes) the SM was
// configured with for the kernel. Returns 0, or -1 with err (records dropped, file unwritable).
int kernel_trace_finish(const char *path, char *err);
