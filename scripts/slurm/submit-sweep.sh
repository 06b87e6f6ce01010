#!/usr/bin/env bash
# Submits a benchmark sweep: a job array with one task per line of SWEEP_FILE
# (scripts/slurm/bench-sweep.sbatch), then the summary job that merges the results into one
# table and plot (scripts/slurm/bench-summary.sbatch), chained with afterok so it starts when
# every task succeeded and is cancelled when one failed.
#
#   scripts/slurm/submit-sweep.sh [--wait] SWEEP_FILE [sbatch options for the array tasks ...]
#
#   K25_MODEL=/ckpt/Kimi-K2.5 scripts/slurm/submit-sweep.sh bench/sweeps/concurrency.txt
#   K25_CONFIG=config/tiny.ini K25_SYNTHETIC=1 K25_BACKEND=cpu \
#       scripts/slurm/submit-sweep.sh --wait bench/sweeps/tiny.txt --ntasks-per-node=2 --gpus-per-node=0
#
# --wait: return when the summary job ends, with its exit status. The model comes from
# K25_MODEL / K25_CONFIG / K25_SYNTHETIC / K25_BACKEND / K25_ARGS (scripts/slurm/common.sh),
# exported to the jobs. Results: ${K25_RESULTS_ROOT:-bench/results}/<sweep name>_<array job id>;
# logs: logs/ under the current directory. Options for both jobs (partition, account) go in
# SBATCH_PARTITION / SBATCH_ACCOUNT.
set -euo pipefail
K25_ROOT=${K25_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
export K25_ROOT
source "$K25_ROOT/scripts/slurm/common.sh"

wait=()
if [ "${1:-}" = --wait ]; then wait=(--wait); shift; fi
sweep=${1:?usage: $0 [--wait] SWEEP_FILE [sbatch options ...]}
shift
[ -r "$sweep" ] || { echo "$0: cannot read sweep file $sweep" >&2; exit 1; }
sweep=$(cd "$(dirname "$sweep")" && pwd)/$(basename "$sweep")
n=$(k25_sweep_count "$sweep")
[ "$n" -gt 0 ] || { echo "$0: $sweep has no task lines" >&2; exit 1; }
# A line that does not split into words would fail only when its task runs: refused here.
open="not shell words (a quote or parenthesis left open?)"
task=0
while IFS= read -r line; do
    k25_words_ok "$line" || { echo "$0: $sweep, task $task: $open: $line" >&2; exit 1; }
    task=$((task + 1))
done < <(k25_sweep_lines "$sweep")
for v in K25_ARGS K25_SRUN_ARGS; do
    k25_words_ok "${!v:-}" || { echo "$0: $v: $open: ${!v}" >&2; exit 1; }
done
command -v sbatch >/dev/null || { echo "$0: sbatch not found: run on a Slurm login node" >&2; exit 1; }

# Slurm does not create the directory of --output: without it a job fails with no log at all.
mkdir -p logs
array=$(sbatch --parsable --array="0-$((n - 1))" "$@" "$K25_ROOT/scripts/slurm/bench-sweep.sbatch" "$sweep")
array=${array%%;*}
results=$(k25_sweep_results "$sweep" "$array")
echo "sweep: $sweep ($n tasks) -> array job $array, logs logs/k25-sweep_${array}_<task>.out"
echo "results: $results"
summary=$(sbatch --parsable ${wait[@]+"${wait[@]}"} --dependency="afterok:$array" --kill-on-invalid-dep=yes \
    "$K25_ROOT/scripts/slurm/bench-summary.sbatch" "$results" "$n") || status=$?
summary=${summary%%;*}
echo "summary: job ${summary:-?} -> $results/summary.md, log logs/k25-sweep-summary_${summary:-?}.out"
[ ${#wait[@]} -gt 0 ] || exit "${status:-0}"

# sbatch --wait reports 0 for a job cancelled before it started (the summary, when a task
# failed): ask the controller how both jobs ended, while it still remembers them.
state=$(scontrol show job -o "$summary" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' || true)
if [ -n "$state" ] && [ "$state" != COMPLETED ]; then
    echo "$0: summary job $summary ended $state" >&2
    status=${status:-1}
fi
tasks=$(scontrol show job -o "$array" 2>/dev/null | sed -n '/JobState=COMPLETED/d
    s/.* ArrayTaskId=\([0-9]*\) .* JobState=\([A-Z_]*\) .* ExitCode=\([0-9:]*\) .*/\1 \2 \3/p' || true)
while read -r task st code; do
    [ -n "$task" ] && echo "$0: task $task ended $st (exit $code): logs/k25-sweep_${array}_$task.out" >&2
done <<<"$tasks"
exit "${status:-0}"
