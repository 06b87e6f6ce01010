#!/usr/bin/env bash
# The Slurm scripts end to end on a private single-node Slurm (tests/slurm/start.sh, which
# installs Debian's slurmctld/slurmd/slurm-client when missing), CPU backend, 2 ranks, tiny
# model:
#   - every job script refuses to run outside Slurm;
#   - decode.sbatch: the tokens equal those of the same run under plain mpirun, k25dec reports
#     2 ranks, the log shows the node and the resolved configuration;
#   - multinode.sbatch on one node: adds run.pp = number of nodes (1) and decodes the same tokens
#     (into a -o file);
#   - submit-sweep.sh --wait over bench/sweeps/tiny.txt: a job array plus the chained summary;
#     every task and every concurrency level the sweep file asks for is in the merged results,
#     each from a 2-rank run, and the table has one row per (task, level); a task's --set
#     shows in its resolved configuration;
#   - bench/merge_results.py names a task and a level missing from a sweep's results;
#   - a sweep with a failing task: the summary is cancelled and submit-sweep.sh fails, naming
#     the task.
# The daemons are stopped at the end, pass or fail.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The binaries under test: ./k25dec and ./k25bench unless K25_DEC / K25_BENCH name others.
dec=${K25_DEC:-$root/k25dec} bench=${K25_BENCH:-$root/k25bench}
for bin in "$dec" "$bench"; do
    [ -x "$bin" ] || { echo "FAIL: $bin not built (make first)"; exit 1; }
done
# A job started inside another allocation would inherit its identity.
for v in $(compgen -e | grep '^SLURM_' || true); do unset "$v"; done

tmp=$(mktemp -d /tmp/k25-t_slurm.XXXXXX)
cleanup() {
    "$root/tests/slurm/stop.sh" "$tmp/slurm"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*"
    for f in "$tmp"/work/logs/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }; done
    exit 1
}

# Stable copies: other builds may replace the binaries at the repository root meanwhile.
mkdir -p "$tmp/bin" "$tmp/work/logs"
cp "$dec" "$tmp/bin/k25dec"
cp "$bench" "$tmp/bin/k25bench"
export K25_DEC=$tmp/bin/k25dec K25_BENCH=$tmp/bin/k25bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---------------------------------------------------------------------------------------------
# Outside Slurm every job script refuses to run
# ---------------------------------------------------------------------------------------------
for s in decode bench-sweep bench-summary multinode; do
    if out=$(bash "scripts/slurm/$s.sbatch" 2>&1); then fail "$s.sbatch ran outside Slurm"; fi
    grep -q "run with sbatch" <<<"$out" || fail "$s.sbatch outside Slurm said: $out"
done
echo "ok: the job scripts refuse to run outside Slurm"

# Under set -u, bash before 4.4 stops at "${a[@]}" or ${a[*]} of an empty array (unbound
# variable); the scripts expand every array through ${a[@]+...}, which every bash accepts.
bare=$(for f in scripts/slurm/*.sh scripts/slurm/*.sbatch; do
    sed -E 's/\$\{([A-Za-z_][A-Za-z_0-9]*)\[([@*])\]\+"?\$\{\1\[\2\]\}"?\}//g' "$f" |
        grep -nE '\$\{[A-Za-z_][A-Za-z_0-9]*\[[@*]\]\}' | grep -vE '^[0-9]+:[[:space:]]*#' |
        sed "s|^|$f:|" || true
done)
[ -z "$bare" ] || fail "array expansions without the \${a[@]+...} guard (bash < 4.4): $bare"
echo "ok: every array expansion in the Slurm scripts is guarded for bash < 4.4"

# Text split under shell quoting (K25_ARGS, K25_SRUN_ARGS, sweep lines): one that does not split
# is named, before anything runs (it was a bare "eval: unexpected EOF" from inside a job).
printf '%s\n' "--concurrency 1" '--input-len "8' > "$tmp/quote.txt"
out=$(PATH="$tmp/bin:$PATH" scripts/slurm/submit-sweep.sh "$tmp/quote.txt" 2>&1) &&
    fail "submit-sweep.sh took a sweep line with an open quote"
grep -q "quote.txt, task 1: not shell words" <<<"$out" || fail "submit-sweep.sh on an open quote: $out"
out=$(K25_ARGS='-p "two' scripts/slurm/submit-sweep.sh bench/sweeps/tiny.txt 2>&1) &&
    fail "submit-sweep.sh took K25_ARGS with an open quote"
grep -q "K25_ARGS: not shell words" <<<"$out" || fail "submit-sweep.sh on K25_ARGS: $out"
out=$(K25_ROOT=$root K25_ARGS='-p "two' bash -c 'source scripts/slurm/common.sh; k25_extra_args
    echo unreachable' 2>&1) && fail "k25_extra_args took an open quote"
grep -q "K25_ARGS: not shell words" <<<"$out" && ! grep -q unreachable <<<"$out" ||
    fail "k25_extra_args on an open quote: $out"
out=$(K25_ROOT=$root K25_ARGS='-p "two words" -n 2' bash -c 'source scripts/slurm/common.sh
    k25_extra_args; printf "<%s>" "${K25_EXTRA_ARGS[@]}"') || fail "k25_extra_args: $out"
[ "$out" = "<-p><two words><-n><2>" ] || fail "k25_extra_args split '-p \"two words\" -n 2' as $out"
echo "ok: text that does not split into shell words is named before anything runs"

# ---------------------------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------------------------
tests/slurm/start.sh "$tmp/slurm"
export SLURM_CONF=$tmp/slurm/slurm.conf
host=$(hostname -s)
cd "$tmp/work"   # logs/ of the jobs land here
cpu=(--ntasks-per-node=2 --gpus-per-node=0)
model=(--config "$root/config/tiny.ini" --synthetic 1 --backend cpu)

# The reference: the same decode under plain mpirun.
ref=$(mpirun -np 2 "$K25_DEC" "${model[@]}" -p "Hello there" -n 8 2>/dev/null)
[[ "$ref" =~ ^[0-9]+( [0-9]+){7}$ ]] || fail "mpirun reference run printed '$ref', not 8 token ids"

# ---------------------------------------------------------------------------------------------
# decode.sbatch: model from the environment, prompt through K25_ARGS (shell quoting)
# ---------------------------------------------------------------------------------------------
job=$(K25_CONFIG=$root/config/tiny.ini K25_SYNTHETIC=1 K25_BACKEND=cpu K25_ARGS='-p "Hello there" -n 8' \
    timeout 120 sbatch --parsable --wait "${cpu[@]}" "$root/scripts/slurm/decode.sbatch") \
    || fail "decode.sbatch job failed"
log=logs/k25-decode_${job%%;*}.out
[ -f "$log" ] || fail "decode.sbatch wrote no $log"
grep -Fxq "$ref" "$log" || fail "decode.sbatch: tokens differ from mpirun's '$ref'"
grep -q "^k25dec: 2 MPI ranks" "$log" || fail "decode.sbatch: k25dec did not report 2 ranks"
grep -q "^# nodes (1): $host" "$log" || fail "decode.sbatch: no node list"
grep -q "^#   num_hidden_layers = 4$" "$log" || fail "decode.sbatch: no resolved configuration"
echo "ok: decode.sbatch under srun decodes what mpirun decodes: $ref"

# ---------------------------------------------------------------------------------------------
# multinode.sbatch on the one node there is: run.pp defaults to the node count
# ---------------------------------------------------------------------------------------------
# (the tokens into a file of their own, -o, which the resolved configuration's run ignores)
job=$(timeout 120 sbatch --parsable --wait --nodes=1 "${cpu[@]}" "$root/scripts/slurm/multinode.sbatch" \
    "${model[@]}" -p "Hello there" -n 8 -o "$tmp/multinode.txt") || fail "multinode.sbatch job failed"
log=logs/k25-multinode_${job%%;*}.out
grep -q "^# run: .* --set run.pp=1$" "$log" || fail "multinode.sbatch: run.pp not set to the node count"
grep -q "^#   pp = 1$" "$log" || fail "multinode.sbatch: resolved configuration without pp = 1"
grep -Fxq "$ref" "$tmp/multinode.txt" || fail "multinode.sbatch -o: tokens differ from mpirun's '$ref'"
grep -Fxq "$ref" "$log" && fail "multinode.sbatch -o: the tokens went to the log too"
echo "ok: multinode.sbatch adds run.pp=1 on one node and decodes the same tokens into its -o file"

# ---------------------------------------------------------------------------------------------
# A sweep: job array + chained summary
# ---------------------------------------------------------------------------------------------
export K25_CONFIG=$root/config/tiny.ini K25_SYNTHETIC=1 K25_BACKEND=cpu K25_RESULTS_ROOT=$tmp/results
sweep=$root/bench/sweeps/tiny.txt
timeout 180 "$root/scripts/slurm/submit-sweep.sh" --wait "$sweep" "${cpu[@]}" > submit.out 2>&1 \
    || { cat submit.out; fail "submit-sweep.sh $sweep failed"; }
results=$(sed -n 's/^results: //p' submit.out)
[ -d "$results" ] || { cat submit.out; fail "no results directory"; }
[ -s "$results/summary.md" ] || fail "no $results/summary.md"
# What the sweep file asks for, read here without the scripts' helpers: task i = i-th line
# that is neither blank nor a comment; its levels = the list after --concurrency.
python3 - "$sweep" "$results" <<'PY' || fail "merged results do not match the sweep"
import json, re, sys
sweep, results = sys.argv[1], sys.argv[2]
lines = [l.strip() for l in open(sweep) if l.strip() and not l.strip().startswith("#")]
want = {(i, int(c)) for i, l in enumerate(lines)
        for c in re.search(r"--concurrency[ =](\S+)", l).group(1).split(",")}
rows = [json.loads(l) for l in open(f"{results}/results.jsonl") if l.strip()]
got = {(r["sweep_task"], r["max_concurrency"]) for r in rows}
assert got == want, f"levels: want {sorted(want)}, got {sorted(got)}"
assert len(rows) == len(want), f"{len(rows)} rows for {len(want)} (task, level) pairs"
for r in rows:
    assert r["sweep_args"] == lines[r["sweep_task"]], r["sweep_args"]
    assert r["ranks"] == 2, f"task {r['sweep_task']} ran on {r['ranks']} ranks"
    assert r["completed"] >= 5 * r["max_concurrency"] and r["output_throughput"] > 0, r
table = [l for l in open(f"{results}/summary.md") if re.match(r"\| \d+ \|", l)]
assert len(table) == len(want), f"summary.md has {len(table)} rows, want {len(want)}"
print(f"ok: sweep {results}: {len(lines)} tasks, {len(want)} (task, level) rows")
PY
summary_log=$(ls logs/k25-sweep-summary_*.out)
grep -q "^| task | settings | conc |" "$summary_log" || fail "the summary job did not print the table"
# The task with a --set override shows it in its resolved configuration.
grep -q "^#   prefill_chunk = 4$" logs/k25-sweep_*_2.out || fail "task 2's configuration lacks its --set"
echo "ok: the summary job printed the table; task 2 resolved prefill_chunk = 4"

# The merge notices what is missing: a level of task 2 (asked 1,2) and all of task 1.
cp -r "$results" partial
sed -i '$d' partial/task_2.jsonl
rm partial/task_1.jsonl
if python3 "$root/bench/merge_results.py" partial --expect 3 --no-plot > /dev/null 2> merge.err; then
    fail "merge_results.py accepted results with a missing task and level"
fi
grep -q "task 1 .*no results" merge.err || { cat merge.err; fail "merge_results.py did not name task 1"; }
grep -q "task 2 .*no row for concurrency 2$" merge.err || { cat merge.err; fail "merge_results.py did not name task 2's level 2"; }
echo "ok: merge_results.py names a missing task and a missing level"

# ---------------------------------------------------------------------------------------------
# A sweep whose second task fails: no summary, and submit-sweep.sh says which task
# ---------------------------------------------------------------------------------------------
printf '%s\n' "--concurrency 1 --input-len 8 --output-len 4 --no-warmup --profile-steps 0" \
    "--concurrency 1 --no-such-option" > bad.txt
if timeout 180 "$root/scripts/slurm/submit-sweep.sh" --wait bad.txt "${cpu[@]}" > bad.out 2>&1; then
    cat bad.out; fail "submit-sweep.sh succeeded with a failing task"
fi
grep -q "task 1 ended FAILED" bad.out || { cat bad.out; fail "submit-sweep.sh did not name the failed task"; }
grep -q "summary job .* ended CANCELLED" bad.out || { cat bad.out; fail "the summary job was not cancelled"; }
echo "ok: a failing sweep task cancels the summary and fails submit-sweep.sh"
