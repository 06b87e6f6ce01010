#!/usr/bin/env bash
# The bench tools' Python readers on bad input: bench/plot.py, bench/merge_results.py,
# bench/ab_steps.py, bench/trace_summary.py, bench/phases_summary.py, bench/ncu_step.py and
# bench/ncu_source.py each end with exit status 2 and one line on stderr naming the file (and the
# line, or what is wrong in it) instead of a traceback or a result from input they cannot read:
# a missing file, a directory, bytes that are not UTF-8, JSON that is not an object, a missing
# field, a value of the wrong kind, a truncated CSV row, an output they cannot write (checked
# before anything is written or printed). Also: plot.py checks its input before looking for
# matplotlib (so this runs without it), merge_results.py fails when the plot fails and writes
# whole files, ab_steps.py fails when the builds share no level, and the zero-span and all-zero
# inputs that divided by zero.
set -uo pipefail
B=$(cd "$(dirname "$0")/../bench" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # files by their short names, in the messages too
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

refused() { # refused NAME STATUS MESSAGE CMD...: CMD exits STATUS, stderr's last line is MESSAGE
    local name=$1 want=$2 msg=$3 rc; shift 3
    "$@" >out 2>err; rc=$?
    if [ $rc -eq "$want" ] && [ "$(tail -1 err)" = "$msg" ] && ! grep -q Traceback err; then
        ok "$name: exit $rc: $msg"
    else
        bad "$name: exit $rc (want $want): $(cat err)"
    fi
}

# ---- plot.py ----
printf '%s\n' '{"max_concurrency":1,"output_throughput":10,"median_tpot_ms":2,"p99_tpot_ms":3}' \
    '{"max_concurrency":4,"output_throughput":30,"median_tpot_ms":4,"p99_tpot_ms":6}' >r.jsonl
echo '[1]' >list.jsonl
echo '{"a":1}' >nokey.jsonl
printf '{"max_concurrency":1,\xff}\n' >bytes.jsonl
sed '1s/:1,/:"4",/' r.jsonl >str.jsonl
: >empty.jsonl
mkdir dir
plot() { python3 "$B/plot.py" --out "$@"; }
refused "plot: missing file" 2 "plot.py: no.jsonl: No such file or directory" plot p.png no.jsonl
refused "plot: a directory" 2 "plot.py: dir: Is a directory" plot p.png dir
refused "plot: not an object" 2 "plot.py: list.jsonl:1: not a JSON object" plot p.png list.jsonl
refused "plot: no max_concurrency" 2 \
    "plot.py: nokey.jsonl:1: no max_concurrency (not a k25bench --json line)" plot p.png nokey.jsonl
refused "plot: not UTF-8" 2 "plot.py: bytes.jsonl:1: not UTF-8 text" plot p.png bytes.jsonl
refused "plot: a level as a string" 2 "plot.py: str.jsonl:1: max_concurrency '4' is not a number" \
    plot p.png str.jsonl
refused "plot: no results" 2 "plot.py: empty.jsonl: no results" plot p.png empty.jsonl
refused "plot: --out in no directory" 2 "plot.py: dir/no/p.png: no directory dir/no" \
    plot dir/no/p.png r.jsonl
refused "plot: --out ." 2 "plot.py: .: is a directory" \
    sh -c 'cd dir && exec python3 "$1/plot.py" --out . ../r.jsonl' sh "$B"
[ -e dir/.png ] && bad "plot --out . wrote dir/.png"
# good input goes on to the plot: 0 with matplotlib, 3 without
plot p.png r.jsonl >/dev/null 2>err; rc=$?
case $rc in
0) [ -s p.png ] && ok "plot: good input plotted" || bad "plot: exit 0 and no PNG" ;;
3) grep -qx "plot.py: matplotlib is not installed (pip install matplotlib)" err &&
       ok "plot: good input, matplotlib missing: exit 3" || bad "plot: exit 3: $(cat err)" ;;
*) bad "plot: good input: exit $rc: $(cat err)" ;;
esac

# An output that exists and is no regular file is written where it is: /dev/stdout into a pipe
# (its real path under /proc cannot be created anew), and /dev/null needs no writable /dev.
got=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import k25results as k
k.check_out("/dev/stdout", "t"); k.write_out("/dev/stdout", "piped\n", "t")
k.check_out("/dev/null", "t"); k.write_out("/dev/null", "x", "t")' "$B" | cat)
[ "$got" = piped ] && ok "outputs in place: /dev/stdout into a pipe, /dev/null" ||
    bad "outputs in place: '$got'"

# ---- merge_results.py ----
sweep() { # sweep NAME: a results directory with one task of levels 1 and 4
    rm -rf "$1"; mkdir "$1"
    cp r.jsonl "$1/task_0.jsonl"; echo "--concurrency 1,4 --input-len 8" >"$1/task_0.args"
}
merge() { python3 "$B/merge_results.py" "$@"; }
sweep list; echo '[1]' >>list/task_0.jsonl
refused "merge: a list line" 2 "merge_results.py: list/task_0.jsonl:3: not a JSON object" \
    merge list --no-plot
sweep num; echo '5' >>num/task_0.jsonl
refused "merge: a number line" 2 "merge_results.py: num/task_0.jsonl:3: not a JSON object" \
    merge num --no-plot
sweep bytes; printf '\xff\n' >>bytes/task_0.jsonl
refused "merge: not UTF-8" 2 "merge_results.py: bytes/task_0.jsonl:3: not UTF-8 text" \
    merge bytes --no-plot
sweep stray; cp r.jsonl stray/task_old.jsonl
refused "merge: a stray file" 2 \
    "merge_results.py: stray/task_old.jsonl: not a task's file (task_<number>.jsonl or .args)" \
    merge stray --no-plot
sweep quote; echo "--x 'unterminated" >quote/task_0.args
refused "merge: an unterminated quote" 2 \
    "merge_results.py: quote/task_0.args: not a sweep line: No closing quotation" \
    merge quote --no-plot
sweep nolevel; echo '{"foo":1}' >nolevel/task_0.jsonl
refused "merge: a line without a level" 2 "merge_results.py: nolevel/task_0.jsonl:1: concurrency \
level None is not a positive integer (max_concurrency or concurrency)" \
    merge nolevel --no-plot --expect 1
sweep prof; echo '{"profile_only":true,"decode_profile":{"batch":1}}' >prof/task_0.jsonl
refused "merge: a --profile-only line" 2 "merge_results.py: prof/task_0.jsonl:1: a k25bench \
--profile-only line (decode steps, no serving level): the summary tabulates serving levels" \
    merge prof --no-plot
sweep neg
refused "merge: --expect -3" 2 "merge_results.py: error: argument --expect: -3 is less than 1" \
    merge neg --no-plot --expect -3
for out in results.jsonl plot.png; do
    sweep outdir; mkdir "outdir/$out"
    refused "merge: $out a directory" 2 "merge_results.py: outdir/$out: is a directory" \
        merge outdir
    [ -e outdir/summary.md ] && bad "merge wrote summary.md before refusing $out"
done
if [ -w /dev/full ]; then
    sweep full
    refused "merge: stdout full" 2 "merge_results.py: stdout: No space left on device" \
        sh -c 'exec python3 "$1/merge_results.py" full --no-plot >/dev/full' sh "$B"
fi
# a plot that fails fails the merge (lines plot.py cannot draw); matplotlib missing does not
sweep noplot; echo '{"max_concurrency":1}' >noplot/task_0.jsonl
echo "--concurrency 1" >noplot/task_0.args
merge noplot >/dev/null 2>err; rc=$?
want='^merge_results.py: no plot: bench/plot.py failed \(2\): plot.py: .*:1: no output_throughput'
[ $rc -eq 1 ] && grep -qE "$want \(not a k25bench --json line\)$" err &&
    ok "merge: a failed plot: exit 1" || bad "merge: a failed plot: exit $rc: $(cat err)"
sweep good
merge good --expect 1 >out 2>err; rc=$?
[ $rc -eq 0 ] && grep -qxE "no plot: matplotlib is not installed|plot: good/plot.png" err &&
    ok "merge: good input: exit 0, $(cat err)" || bad "merge: good input: exit $rc: $(cat err)"
cmp -s out good/summary.md && ok "merge: summary.md is the printed table" ||
    bad "merge: summary.md differs from stdout"
left=$(cd good && ls -A | grep -vxE 'task_0\.(jsonl|args)|summary\.md|results\.jsonl|plot\.png')
[ -z "$left" ] && ok "merge: no temporary file left" || bad "merge left: $left"

# ---- ab_steps.py ----
line() { printf '{"decode_profile":{"batch":8,"context":%s,"graph_step_ms":%s}}\n' "$1" "$2"; }
line 1024 10 >b.jsonl; line 1024 9 >n.jsonl; line 512 9 >other.jsonl
line 1024 Infinity >inf.jsonl; line 1024 true >true.jsonl
echo '{"decode_profile":{"graph_step_ms":5}}' >noctx.jsonl
ab() { python3 "$B/ab_steps.py" --new n.jsonl --base "$@"; }
refused "ab: missing file" 2 "ab_steps: no.jsonl: No such file or directory" ab no.jsonl
refused "ab: not an object" 2 "ab_steps: list.jsonl:1: not a JSON object" ab list.jsonl
refused "ab: no context" 2 "ab_steps: noctx.jsonl:1: decode_profile has no context" ab noctx.jsonl
refused "ab: an infinite step" 2 \
    "ab_steps: inf.jsonl:1: graph_step_ms inf is not a positive number (no graph steps ran)" \
    ab inf.jsonl
refused "ab: a boolean step" 2 \
    "ab_steps: true.jsonl:1: graph_step_ms True is not a positive number (no graph steps ran)" \
    ab true.jsonl
refused "ab: no level in common" 2 \
    "ab_steps: base and new have no (context, rows) level in common" ab other.jsonl
refused "ab: --out in no directory" 2 "ab_steps: no/t.md: no directory no" ab b.jsonl --out no/t.md
[ -s out ] && bad "ab_steps printed the table before refusing --out"

# ---- trace_summary.py ----
h='rows,step,start_ns,end_ns,stream,grid,block,regs,smem_dyn,smem_config,name'
k='1,0,0,1000,7,1x1x1,32x1x1,16,0,0,"f_kernel(int)"'
printf '%s\n%s\n1,0,100\n' "$h" "$k" >trunc.csv
printf '%s\n1,0,x,1000,7,1x1x1,32x1x1,16,0,0,"f(int)"\n' "$h" >word.csv
printf 'a,b\n1,2\n' >other.csv
printf '%s\n1,0,500,500,7,1x1x1,32x1x1,16,0,0,"f(int)"\n' "$h" >zero.csv
printf '%s\n%s\n1,0,0,9,7,1x1x1,32x1x1,16,0,0,"\xff"\n' "$h" "$k" >bytes.csv
echo junk >junk.csv.xz
trace() { python3 "$B/trace_summary.py" "$@"; }
refused "trace: a truncated row" 2 "trace_summary.py: trunc.csv:3: not the header's 11 fields" \
    trace trunc.csv
refused "trace: not a number" 2 "trace_summary.py: word.csv:2: start_ns 'x' is not an integer" \
    trace word.csv
refused "trace: another header" 2 "trace_summary.py: other.csv: its header lacks rows, step, \
start_ns, end_ns, stream, grid, block, smem_config, name" trace other.csv
refused "trace: no span" 2 \
    "trace_summary.py: zero.csv: the 1-row steps take no time (each kernel ends as it starts)" \
    trace zero.csv
refused "trace: not xz" 2 \
    "trace_summary.py: junk.csv.xz: not xz data (Input format not supported by decoder)" \
    trace junk.csv.xz
refused "trace: not UTF-8" 2 "trace_summary.py: bytes.csv:3: not UTF-8 text" trace bytes.csv
refused "trace: --top -1" 2 "trace_summary.py: error: argument --top: -1 is less than 0" \
    trace zero.csv --top -1

# ---- phases_summary.py ----
ph='rows,site,block,units,t0,t1,t2,t3,t4,t5,t6,t7'
echo "$ph" >header.csv
printf '%s\n1,gate_up,0,2,,1,2,3,4,5,6,7\n' "$ph" >not0.csv
printf '%s\n1,gate_up,0,2,2003500\n' "$ph" >short.csv
phases() { python3 "$B/phases_summary.py" "$@"; }
refused "phases: missing file" 2 "phases_summary.py: no.csv: No such file or directory" \
    phases no.csv
refused "phases: the header alone" 2 "phases_summary.py: header.csv: no stamps" phases header.csv
refused "phases: a trace" 2 \
    "phases_summary.py: zero.csv: its header lacks site, units, t0, t1, t2, t3, t4, t5, t6, t7" \
    phases zero.csv
refused "phases: no entry stamp" 2 \
    "phases_summary.py: not0.csv:2: no t0 (every block stamps its entry)" phases not0.csv
refused "phases: a truncated row" 2 "phases_summary.py: short.csv:2: not the header's 12 fields" \
    phases short.csv

# ---- ncu_source.py, ncu_step.py ----
kn='"Kernel Name","k(int)",'
samp='"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"'
printf '%s\n' "$kn" >nohead.csv
printf '%s\n"Address","Source","stall_wait"\n"0x1","NOP","3"\n' "$kn" >nosamp.csv
printf '%s\n%s\n"0x1","NOP"\n' "$kn" "$samp" >shortrow.csv
printf '%s\n%s\n"0x1","NOP","3","3"\n' "$kn" "$samp" >src.csv
src() { python3 "$B/ncu_source.py" "$@"; }
nosamp="no 'Warp Stall Sampling (All Samples)' column (collected without warp sampling? ncu \
--set full)"
refused "ncu_source: missing file" 2 "ncu_source.py: no.csv: No such file or directory" src no.csv
refused "ncu_source: no header" 2 "ncu_source.py: nohead.csv: kernel k(int): $nosamp" src nohead.csv
refused "ncu_source: no samples" 2 "ncu_source.py: nosamp.csv: kernel k(int): $nosamp" \
    src nosamp.csv
refused "ncu_source: a short row" 2 \
    "ncu_source.py: shortrow.csv: kernel k(int): a row has fewer fields than the header" \
    src shortrow.csv
refused "ncu_source: --kernel 5" 2 \
    "ncu_source.py: src.csv: --kernel 5: the file holds 1 kernel(s) (0..0)" src src.csv --kernel 5
m='"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"'
metric() { # metric FILE UNIT VALUE: one embedding kernel's duration
    printf '%s\n"1","embed_kernel(int)","(1, 1, 1)","(1, 1, 1)",%s,"%s","%s"\n' \
        "$m" '"gpu__time_duration.sum"' "$2" "$3" >"$1"
}
metric word.csv ns x; metric zeros.csv ns 0; metric furlong.csv furlong 5
printf '"ID","Metric Name","Metric Unit","Metric Value"\n"1","gpu__time_duration.sum","ns","5"\n' \
    >noname.csv
step() { python3 "$B/ncu_step.py" "$@"; }
refused "ncu_step: missing file" 2 "ncu_step.py: no.csv: No such file or directory" step no.csv
refused "ncu_step: not a number" 2 \
    "ncu_step.py: word.csv: kernel 1 (embed_kernel): duration 'x' is not a number" step word.csv
refused "ncu_step: no kernel names" 2 \
    "ncu_step.py: noname.csv: no Kernel Name column in its header" step noname.csv
refused "ncu_step: no time" 2 "ncu_step.py: zeros.csv: step -1: its kernels took no time" \
    step zeros.csv
refused "ncu_step: an unknown unit" 2 "ncu_step.py: furlong.csv: kernel 1 (embed_kernel): unit \
'furlong' is none of ns, nsecond, us, usecond, ms, msecond, s, second" step furlong.csv
exit $fail
