// The kernel trace in a binary built without CUDA: there is no GPU to trace.
#include "common.h"
#include "kernel_trace.h"

int kernel_trace_start(char *err) {
    return k25_err(err, "--trace: this binary was built without CUDA (make CUDA=1)");
}
void kernel_trace_step_begin(void) {}
void kernel_trace_step_end(int rows) { (void)rows; }
int kernel_trace_finish(const char *path, char *err) {
    (void)path;
    return k25_err(err, "--trace: this binary was built without CUDA (make CUDA=1)");
}
int kernel_phases_write(const char *path, int rows, char *err) {
    (void)path, (void)rows;
    return kernel_phases_built(err);
}
int kernel_phases_built(char *err) {
    return k25_err(err, "--phases: this binary was built without CUDA (make CUDA=1 PHASES=1)");
}
