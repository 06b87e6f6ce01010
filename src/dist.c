// The MPI world: start-up checks, node-local ranks, tensor-parallel / pipeline groups and the
// host-memory collectives. Every MPI call goes through MPI_CHECK: the world communicator
// returns errors instead of aborting inside the library, so a failure names its call site.
#include "dist.h"

#include <limits.h>
#include <string.h>

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

void mpi_check(int err, const char *call, const char *file, int line) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "error code %d", err);
    k25_fatal(file, line, "MPI error in %s: %s", call, msg);
}

static int query_cuda_aware_mpi(void) {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
    return MPIX_Query_cuda_support();
#else
    return 0;
#endif
}

// A launcher that cannot wire processes together (srun without PMIx) starts N singletons that
// each believe they are alone; every one of them would then load the whole model.
static void check_slurm_world(int world_size) {
    const char *s = getenv("SLURM_NTASKS");
    if (!s || !*s) return;
    char *end;
    long ntasks = strtol(s, &end, 10);
    if (*end || ntasks <= 0) return;
    // A launcher that sized the world itself (mpirun -np 1 inside the allocation) started one
    // rank on purpose; the singletons of a plain srun carry no such size.
    const char *sized = getenv("OMPI_COMM_WORLD_SIZE");
    if (!sized) sized = getenv("PMI_SIZE");
    if (world_size == 1 && ntasks > 1 && !(sized && strtol(sized, NULL, 10) == world_size))
        K25_DIE("SLURM_NTASKS=%ld but the MPI world has 1 rank: the launcher started %ld "
                "independent singletons (srun without PMIx). Launch with srun --mpi=pmix, or "
                "mpirun inside the allocation",
                ntasks, ntasks);
    // mpirun -np N inside a larger allocation is legitimate; only mention it.
    if (ntasks != world_size && k25_verbose)
        k25_log("note: SLURM_NTASKS=%ld, MPI world size %d\n", ntasks, world_size);
}

void dist_init(k25_dist *d, int *argc, char ***argv) {
    memset(d, 0, sizeof *d);
    int provided = 0;
    // FUNNELED: OpenMP threads compute, only the main thread talks MPI.
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    d->world = MPI_COMM_WORLD;
    MPI_CHECK(MPI_Comm_rank(d->world, &d->world_rank));
    MPI_CHECK(MPI_Comm_size(d->world, &d->world_size));
    k25_log_rank = d->world_rank;
    if (provided < MPI_THREAD_FUNNELED)
        K25_DIE("the MPI library provides thread level %d, k25dec needs MPI_THREAD_FUNNELED",
                provided);
    check_slurm_world(d->world_size);

    MPI_CHECK(MPI_Comm_split_type(d->world, MPI_COMM_TYPE_SHARED, d->world_rank, MPI_INFO_NULL,
                                  &d->node));
    MPI_CHECK(MPI_Comm_rank(d->node, &d->local_rank));
    MPI_CHECK(MPI_Comm_size(d->node, &d->local_size));

    // Until dist_setup_groups: one TP group spanning the world, one pipeline stage.
    d->tp = d->world;
    d->tp_rank = d->world_rank;
    d->tp_size = d->world_size;
    d->pp = MPI_COMM_SELF;
    d->pp_rank = 0;
    d->pp_size = 1;
    d->cuda_aware_mpi = query_cuda_aware_mpi();
}

static void free_comm(MPI_Comm *c) {
    if (*c != MPI_COMM_NULL && *c != MPI_COMM_WORLD && *c != MPI_COMM_SELF)
        MPI_CHECK(MPI_Comm_free(c));
    *c = MPI_COMM_NULL;
}

int dist_setup_groups(k25_dist *d, int tp, int pp, char *err) {
    if (tp <= 0 || pp <= 0)
        return k25_err(err, "tp (%d) and pp (%d) must be positive", tp, pp);
    if ((long)tp * pp != d->world_size)
        return k25_err(err, "tp=%d x pp=%d = %ld ranks, but the MPI world has %d ranks", tp, pp,
                       (long)tp * pp, d->world_size);
    free_comm(&d->tp);
    free_comm(&d->pp);
    // TP groups are consecutive ranks (usually one node, where NVLink is); a pipeline group
    // holds the ranks with the same TP rank across stages.
    int stage = d->world_rank / tp, tpr = d->world_rank % tp;
    MPI_CHECK(MPI_Comm_split(d->world, stage, tpr, &d->tp));
    MPI_CHECK(MPI_Comm_split(d->world, tpr, stage, &d->pp));
    MPI_CHECK(MPI_Comm_rank(d->tp, &d->tp_rank));
    MPI_CHECK(MPI_Comm_size(d->tp, &d->tp_size));
    MPI_CHECK(MPI_Comm_rank(d->pp, &d->pp_rank));
    MPI_CHECK(MPI_Comm_size(d->pp, &d->pp_size));
    return 0;
}

void dist_finalize(k25_dist *d) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down) return;
    free_comm(&d->tp);
    free_comm(&d->pp);
    free_comm(&d->node);
    MPI_CHECK(MPI_Finalize());
}

void dist_allreduce_sum_f32(const k25_dist *d, float *buf, size_t n) {
    if (d->tp_size <= 1) return;
    // MPI counts are int: reduce in chunks.
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)m, MPI_FLOAT, MPI_SUM, d->tp));
    }
}

int dist_all_ok(const k25_dist *d, int ok) {
    int v = ok ? 1 : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, d->world));
    return v;
}

int dist_agree(const k25_dist *d, int ok, char *err) {
    int first = ok ? d->world_size : d->world_rank;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, d->world));
    if (first == d->world_size) return 0;
    char msg[K25_ERR_LEN];
    if (d->world_rank == first) snprintf(msg, sizeof msg, "%s", err);
    MPI_CHECK(MPI_Bcast(msg, K25_ERR_LEN, MPI_CHAR, first, d->world));
    if (d->world_rank != first) k25_err(err, "rank %d: %s", first, msg);
    return -1;
}

void dist_agree_or_exit(k25_dist *d, int ok, const char *prog, const char *msg) {
    if (dist_all_ok(d, ok)) return;
    int root_ok = ok;
    MPI_CHECK(MPI_Bcast(&root_ok, 1, MPI_INT, 0, d->world));
    if (!ok && (d->world_rank == 0 || root_ok)) {
        if (d->world_size > 1 && d->world_rank != 0)
            fprintf(stderr, "%s: error: rank %d: %s\n", prog, d->world_rank, msg);
        else
            fprintf(stderr, "%s: error: %s\n", prog, msg);
    }
    fflush(stderr);
    dist_finalize(d);
    exit(1);
}
