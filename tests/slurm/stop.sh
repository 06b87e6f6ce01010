#!/usr/bin/env bash
# Stops the Slurm daemons started by tests/slurm/start.sh DIR (by the pids in their pid files),
# including any job steps still running under them. Safe to call when nothing runs.
set -uo pipefail
dir=${1:?usage: $0 DIR}
pids=()
for f in slurmd.pid slurmctld.pid; do
    [ -s "$dir/$f" ] || continue
    pid=$(cat "$dir/$f")
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
done
# slurmd terminates its job steps on the way down; give both daemons a few seconds.
for _ in $(seq 1 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
done
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null; done
rm -f "$dir/slurmd.pid" "$dir/slurmctld.pid"
exit 0
