// The MPI world: node-local ranks, tp x pp group splits, TP allreduce sums and the collective
// OK vote, checked against sums computed locally. Runs alone (world size 1) or under
// mpirun -np N (tests/t_dist.sh). Modes for t_dist.sh's failure checks:
//   test_dist --mpi-error   makes an invalid MPI call (must die naming the call)
//   (SLURM_NTASKS > 1 with a world of one rank must die before the test starts)
#include "dist.h"
#include "test_util.h"

#include <string.h>


// Value rank r puts at index i; small integers and halves, so float sums are exact.
static float contrib(int r, size_t i) { return (float)(r * 1000 + (int)(i % 997)) * 0.5f; }

static void check_groups(k25_dist *d, int tp, int pp) {
    char err[K25_ERR_LEN] = "";
    CHECK(dist_setup_groups(d, tp, pp, err) == 0, "tp=%d pp=%d: %s", tp, pp, err);
    int r = d->world_rank;
    CHECK(d->tp_size == tp && d->tp_rank == r % tp, "tp=%d: tp rank %d/%d", tp, d->tp_rank,
          d->tp_size);
    CHECK(d->pp_size == pp && d->pp_rank == r / tp, "tp=%d: pp rank %d/%d", tp, d->pp_rank,
          d->pp_size);

    // The TP group is ranks [stage*tp, stage*tp + tp): sum of their contributions.
    size_t n = 3001;
    float *buf = k25_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) buf[i] = contrib(r, i);
    dist_allreduce_sum_f32(d, buf, n);
    int stage = r / tp, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int q = stage * tp; q < stage * tp + tp; q++) want += contrib(q, i);
        if (buf[i] != (float)want && !bad++)
            CHECK(0, "tp=%d: sum[%zu] = %g, want %g", tp, i, buf[i], want);
    }
    free(buf);

    // Pipeline groups hold the ranks with the same TP rank: check membership by a world sum
    // restricted through the pp communicator.
    int mine = r, total = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, d->pp));
    int want = 0;
    for (int s = 0; s < pp; s++) want += s * tp + r % tp;
    CHECK(total == want, "tp=%d: pp group rank sum %d, want %d", tp, total, want);
}

int main(int argc, char **argv) {
    k25_dist d;
    dist_init(&d, &argc, &argv);
    char err[K25_ERR_LEN] = "";

    if (argc > 1 && !strcmp(argv[1], "--mpi-error")) {
        int x = 0;
        // Rank out of range: MPI returns an error (MPI_ERRORS_RETURN) and MPI_CHECK dies.
        MPI_CHECK(MPI_Send(&x, 1, MPI_INT, d.world_size + 5, 0, d.world));
        fprintf(stderr, "invalid MPI call returned without an error\n");
        return 0;  // t_dist.sh expects a non-zero exit
    }

    int n = d.world_size, r = d.world_rank;
    CHECK(k25_log_rank == r, "log rank %d", k25_log_rank);
    CHECK(r >= 0 && r < n, "rank %d of %d", r, n);
    // One node: the node-local rank is the world rank. Open MPI also says so in the env.
    CHECK(d.local_rank == r && d.local_size == n, "local %d/%d", d.local_rank, d.local_size);
    const char *env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (env) CHECK(atoi(env) == d.local_rank, "env local rank %s vs %d", env, d.local_rank);
    CHECK(d.cuda_aware_mpi == 0 || d.cuda_aware_mpi == 1, "cuda aware %d", d.cuda_aware_mpi);

    // Before dist_setup_groups the TP group is the whole world.
    CHECK(d.tp_size == n && d.tp_rank == r && d.pp_size == 1 && d.pp_rank == 0, "initial groups");
    float one = 1.0f;
    dist_allreduce_sum_f32(&d, &one, 1);
    CHECK(one == (float)n, "initial world sum %g", one);

    // Every factorization tp x pp of the world.
    for (int tp = 1; tp <= n; tp++)
        if (n % tp == 0) check_groups(&d, tp, n / tp);

    // A wrong product names both numbers and the world size.
    CHECK(dist_setup_groups(&d, n + 1, 1, err) != 0, "tp=%d accepted", n + 1);
    char want[64];
    snprintf(want, sizeof want, "tp=%d x pp=1", n + 1);
    CHECK(strstr(err, want) && strstr(err, "world"), "message: %s", err);
    CHECK(dist_setup_groups(&d, 0, n, err) != 0, "tp=0 accepted");

    // The vote: all agree, one dissent, everyone dissents.
    CHECK(dist_all_ok(&d, 1) == 1, "all ok");
    CHECK(dist_all_ok(&d, r != n - 1) == 0, "last rank says no");
    CHECK(dist_all_ok(&d, 0) == 0, "nobody ok");
    CHECK(dist_all_ok(&d, 7) == 1, "any non-zero is ok");

    int ok = dist_all_ok(&d, test_failures == 0);
    if (r == 0) printf("test_dist: %d rank(s): %s\n", n, ok ? "ok" : "FAILED");
    dist_finalize(&d);
    return ok ? 0 : 1;
}
