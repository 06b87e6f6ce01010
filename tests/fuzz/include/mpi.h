// The four MPI names src/common.c uses, for fuzz builds: the parsers under test never start
// MPI, so the fatal-error path only asks whether MPI is up (it is not) and exits.
#pragma once

typedef int MPI_Comm;
#define MPI_COMM_WORLD ((MPI_Comm)0)

int MPI_Initialized(int *flag);
int MPI_Finalized(int *flag);
int MPI_Abort(MPI_Comm comm, int errorcode);
