// MPI as seen by fuzz builds (include/mpi.h): never initialized. A parser that reaches
// K25_DIE therefore exits, which libFuzzer reports as a finding.
#include <mpi.h>
#include <stdlib.h>

int MPI_Initialized(int *flag) {
    *flag = 0;
    return 0;
}

int MPI_Finalized(int *flag) {
    *flag = 0;
    return 0;
}

int MPI_Abort(MPI_Comm comm, int errorcode) {
    (void)comm;
    (void)errorcode;
    abort();
}
