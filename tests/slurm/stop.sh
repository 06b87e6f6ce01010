#!/usr/bin/env bash
# Stops the Slurm daemons started by tests/slurm/start.sh DIR (by the pids in their pid files),
# after cancelling the jobs still queued or running. Safe to call when nothing runs.
set -uo pipefail
dir=${1:?usage: $0 DIR}
# Cancel what is still queued or running while the controller is up, so no job step outlives
# the daemons (slurmd leaves running steps alone when it stops).
if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF=$dir/slurm.conf
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
        scancel --full $(squeue -h -o %i) 2>/dev/null
        for _ in $(seq 1 50); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi
pids=()
for f in slurmd.pid slurmctld.pid; do
    [ -s "$dir/$f" ] || continue
    pid=$(cat "$dir/$f")
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
done
# Give both daemons a few seconds to exit.
for _ in $(seq 1 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
done
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null; done
rm -f "$dir/slurmd.pid" "$dir/slurmctld.pid"
exit 0
