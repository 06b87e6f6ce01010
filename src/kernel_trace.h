// A kernel trace of decode steps: every kernel the GPU ran inside the marked steps, with its
// start and end on the GPU's clock, as CSV. The step breakdown of src/op_profile.h syncs after
// every operation; this one records the steps as they run (CUDA graphs, programmatic dependent
// launch, the shared expert's stream), so it shows the overlap and the gaps between kernels.
//
// CUDA builds record through CUPTI's activity API (concurrent-kernel records: tracing does not
// serialize the kernels, and each kernel of a graph is recorded); other builds return an error.
// One trace per process, on the calling rank's GPU.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

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

// In-kernel phase stamps (kernels/phase_stamps.cuh, a build with make PHASES=1): appends the
// stamps of the stamped kernels' last launches to path, labelled with `rows`, and clears them:
//   rows,site,block,units,t0,...,t7
// times in ns after the earliest stamp read. Returns 0, or -1 with err (another build, the file
// unwritable).
int kernel_phases_write(const char *path, int rows, char *err);
// 0 when this binary has the stamps, else -1 with err.
int kernel_phases_built(char *err);

#ifdef __cplusplus
}
#endif
