// Progress of a long byte-counting task (loading weights, writing or verifying a checkpoint)
// on stderr: done / total, GB/s, time left. Shown on rank 0 only, and only when stderr is a
// terminal or the total exceeds 1 GB; at most a few updates per second (a terminal line is
// rewritten in place, a log gets a new line every few seconds).
//
// One task at a time per process; progress_update is safe to call from several threads, so a
// backend can report while it materializes weights in parallel.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Starts a task of total bytes; what: "loading weights", ...
void progress_begin(const char *what, uint64_t total);
// Adds bytes done (no-op when no task is running).
void progress_update(uint64_t bytes);
// Prints the final line (when shown) and ends the task.
void progress_end(void);

#ifdef __cplusplus
}
#endif
