#!/usr/bin/env bash
# Continuous batching on 2 tensor-parallel ranks: tests/test_engine.c under mpirun (batched,
# chunked and paged runs must give every request the tokens it gets alone, on both ranks).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=${K25_BUILD:-build}/tests/test_engine
[ -x "$bin" ] || { echo "missing $bin (build it first)"; exit 1; }
timeout 300 mpirun -np 2 "$bin" || { echo "FAIL: test_engine on 2 ranks"; exit 1; }
echo "t_engine: ok"
