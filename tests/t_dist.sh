#!/usr/bin/env bash
# The MPI world under mpirun: node-local ranks, tp x pp splits, TP sums and the OK vote on 2
# and 4 ranks (tests/test_dist.c), plus the fatal paths: an MPI call that fails must name the
# call, and a Slurm launch that produced singletons must be refused (mpirun inside a larger
# allocation, even of one rank, is not one; k25dec -v notes such a world).
set -u
cd "$(dirname "$0")/.." || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=${K25_BUILD:-build}/tests/test_dist
[ -x "$bin" ] || { echo "missing $bin (build it first)"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 120 "$@"; }

for np in 2 4; do
    run mpirun -np "$np" "$bin" || fail "test_dist on $np ranks"
done

out=$(run mpirun -np 2 "$bin" --mpi-error 2>&1) && fail "an invalid MPI call did not stop the job"
grep -q "MPI error in MPI_Send" <<<"$out" || fail "no 'MPI error in MPI_Send' message: $out"

# srun without PMIx: every task is a world of one while SLURM_NTASKS says otherwise.
out=$(SLURM_NTASKS=4 run "$bin" 2>&1) && fail "a singleton with SLURM_NTASKS=4 was accepted"
grep -q "srun --mpi=pmix" <<<"$out" || fail "singleton message lacks the fix: $out"
# mpirun inside a larger allocation is a real world: accepted.
SLURM_NTASKS=8 run mpirun -np 2 "$bin" || fail "mpirun -np 2 inside an allocation of 8 tasks"
# So is mpirun -np 1 there (one rank timing a simulated shard): it was refused as a singleton.
out=$(SLURM_NTASKS=8 run mpirun -np 1 "$bin" 2>&1) || fail "mpirun -np 1 inside an allocation of 8 tasks: $out"
# k25dec -v notes it (the flag was applied after the MPI world was checked, so -v printed nothing)
dec=${K25_DEC:-./k25dec}
if [ -x "$dec" ]; then
    note="note: SLURM_NTASKS=8, MPI world size 2"
    out=$(SLURM_NTASKS=8 run mpirun -np 2 "$dec" -v --tokens 1 -n 1 2>&1) || fail "k25dec -v: $out"
    grep -q "$note" <<<"$out" || fail "k25dec -v inside an allocation of 8 tasks: no '$note': $out"
    out=$(SLURM_NTASKS=8 run mpirun -np 2 "$dec" --tokens 1 -n 1 2>&1) || fail "k25dec: $out"
    grep -q "$note" <<<"$out" && fail "k25dec without -v printed '$note'"
fi
echo "t_dist: ok"
