#!/usr/bin/env bash
# The kernel trace reader (bench/trace_summary.py) on a hand-written trace: the frontier time of
# overlapping kernels (programmatic dependent launch, a second stream) counted once, idle time
# between kernels, means over steps, one layer cut between two attention kernels, its kernels'
# medians over all layers and beside another trace's, and a clear error for a trace without
# kernels. The phase stamps' reader (bench/phases_summary.py) on hand-written stamps: phase times
# after the routing's end, per-block intervals, a unit's mean time, an earlier launch's blocks
# left out. Then k25bench's refusals of --trace and --phases where they cannot work.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check NAME OUTPUT WANT...: every WANT is a whole line of OUTPUT
    local name=$1 out=$2; shift 2
    for w in "$@"; do
        if grep -qxF -- "$w" <<<"$out"; then echo "ok   $name has: $w"
        else echo "FAIL $name missing: $w"; fail=1; fi
    done
}
{
    echo 'rows,step,start_ns,end_ns,stream,grid,block,regs,smem_dyn,smem_config,name'
    # step 0: a 0-10, b 8-15 (starts 2 us early), idle 5, c 20-25 with d 21-23 beside it on a
    # second stream, attention 25-30, e 30-32, attention 32-40: span 40 us
    echo '1,0,0,10000,7,8x1x1,256x1x1,40,0,16384,"void a_kernel<1, 2>(float const*, int)"'
    echo '1,0,8000,15000,7,4x1x1,256x1x1,40,0,16384,"b_kernel(float*)"'
    echo '1,0,20000,25000,7,1x1x1,128x1x1,32,0,65536,"c_kernel(float*)"'
    echo '1,0,21000,23000,9,1x1x1,128x1x1,32,0,16384,"d_kernel(float*)"'
    echo '1,0,25000,30000,7,132x1x1,256x1x1,64,0,233472,"mla_attn_mma_kernel(int)"'
    echo '1,0,30000,32000,7,1x1x1,256x1x1,64,0,16384,"e_kernel(int)"'
    echo '1,0,32000,40000,7,132x1x1,256x1x1,64,0,233472,"mla_attn_mma_kernel(int)"'
    # step 1: a runs 2 us longer and b adds 2 us less; the rest as step 0
    echo '1,1,0,12000,7,8x1x1,256x1x1,40,0,16384,"void a_kernel<1, 2>(float const*, int)"'
    echo '1,1,8000,15000,7,4x1x1,256x1x1,40,0,16384,"b_kernel(float*)"'
    echo '1,1,20000,25000,7,1x1x1,128x1x1,32,0,65536,"c_kernel(float*)"'
    echo '1,1,21000,23000,9,1x1x1,128x1x1,32,0,16384,"d_kernel(float*)"'
    echo '1,1,25000,30000,7,132x1x1,256x1x1,64,0,233472,"mla_attn_mma_kernel(int)"'
    echo '1,1,30000,32000,7,1x1x1,256x1x1,64,0,16384,"e_kernel(int)"'
    echo '1,1,32000,40000,7,132x1x1,256x1x1,64,0,233472,"mla_attn_mma_kernel(int)"'
    # 4 rows, one step: two kernels, 3 us apart
    echo '4,2,0,5000,7,1x1x1,32x1x1,16,0,0,"f_kernel(int)"'
    echo '4,2,8000,9000,7,1x1x1,32x1x1,16,0,0,"f_kernel(int)"'
} >"$tmp/trace.csv"

out=$(python3 bench/trace_summary.py "$tmp/trace.csv" --top 3) || { echo "FAIL: trace_summary.py exited non-zero"; fail=1; }
check "1 rows" "$out" \
    '## 1 rows: 2 steps, span 40.0 us (min 40.0, max 40.0), idle between kernels 5.0 us, 7 kernels a step' \
    '| `mla_attn_mma_kernel` | 2 | 6.50 | 13.0 | 32.5 | 228 |' \
    '| `a_kernel<1, 2>` | 1 | 11.00 | 11.0 | 27.5 | 16 |' \
    '| `c_kernel` | 1 | 5.00 | 5.0 | 12.5 | 64 |' \
    '| 3 others | | | 6.0 | 15.0 | |' \
    '| idle | | | 5.0 | 12.5 | |'
check "layer" "$out" \
    'One layer of a 1-row step (kernels 5-6, after one `mla_attn` kernel to the next):' \
    '| 5 | `e_kernel` | 7 | 1x1x1 | 256x1x1 | 0.00 | 2.00 | 2.00 | 16 |' \
    '| 6 | `mla_attn_mma_kernel` | 7 | 132x1x1 | 256x1x1 | 0.00 | 8.00 | 8.00 | 228 |' \
    "The layer's span: 10.0 us; its kernels' frontier time 10.0 us."
# every layer of both steps with the shown layer's kernels: e adds 2 us, the attention 8
check "layer medians" "$out" \
    'Frontier us of the same kernels over 2 layers with this sequence (median, min, max):' \
    '| 0 | `e_kernel` | 2.00 | 2.00 | 2.00 |' \
    '| 1 | `mla_attn_mma_kernel` | 8.00 | 8.00 | 8.00 |' \
    'Sum of the medians: 10.0 us.'
check "4 rows" "$out" \
    '## 4 rows: 1 steps, span 9.0 us (min 9.0, max 9.0), idle between kernels 3.0 us, 2 kernels a step' \
    '| `f_kernel` | 2 | 3.00 | 6.0 | 66.7 | 0 |' \
    "(no two 'mla_attn' kernels in a 4-row step: no layer shown)"
# the first step's b: starts 2 us before a ends and adds 5 us
all=$(python3 bench/trace_summary.py "$tmp/trace.csv" --layer a_kernel)
grep -qF '| `b_kernel` | 1 | 7.00 | 4.0 | 10.0 | 16 |' <<<"$all" && echo "ok   b's frontier: 5 then 3 us" \
    || { echo "FAIL: b's row: $(grep b_kernel <<<"$all" | head -1)"; fail=1; }

# another build's trace: a g kernel between e and the second attention, which adds 1 us less
{
    grep -v 'mla_attn_mma_kernel(int)"$' "$tmp/trace.csv" | grep -v '^4,'
    for s in 0 1; do
        echo "1,$s,25000,30000,7,132x1x1,256x1x1,64,0,233472,\"mla_attn_mma_kernel(int)\""
        echo "1,$s,32000,33000,7,1x1x1,32x1x1,16,0,0,\"g_kernel(int)\""
        echo "1,$s,33000,40000,7,132x1x1,256x1x1,64,0,233472,\"mla_attn_mma_kernel(int)\""
    done
} >"$tmp/other.csv"
vs=$(python3 bench/trace_summary.py "$tmp/trace.csv" --top 3 --against "$tmp/other.csv") \
    || { echo "FAIL: --against exited non-zero"; fail=1; }
check "against" "$vs" \
    '| 0 | `e_kernel` | 2.00 | 2.00 | +0.00 |' \
    '| | `g_kernel` | — | 1.00 | |' \
    '| 1 | `mla_attn_mma_kernel` | 8.00 | 7.00 | +1.00 |' \
    'Sums: this 10.0 us, other 10.0 us, difference +0.0 us.'

err=$(python3 bench/trace_summary.py "$tmp/trace.csv" --against "$tmp/missing.csv" 2>&1)
if [ $? -eq 2 ] && [ "$err" = "trace_summary.py: $tmp/missing.csv: No such file or directory" ]
then echo "ok   exit 2: $err"
else echo "FAIL: a missing trace: $err"; fail=1; fi

head -1 "$tmp/trace.csv" >"$tmp/empty.csv"
if err=$(python3 bench/trace_summary.py "$tmp/empty.csv" 2>&1); then echo "FAIL: an empty trace was accepted"; fail=1
elif grep -q "empty.csv: no kernels in marked steps" <<<"$err"; then echo "ok   $err"
else echo "FAIL: unclear error: $err"; fail=1; fi

# phase stamps (ns): the router ends at 2003000 (the origin); gate+up's 4 blocks load their
# expert ids 0.8-1.1 us after their wait, each next phase 1 us or more later; block 3 alone ran
# the tail; block 9 is an earlier launch's (1 ms and more before the others)
{
    echo 'rows,site,block,units,t0,t1,t2,t3,t4,t5,t6,t7'
    echo '1,router,0,0,2000000,2001000,2001500,2003000,,,,'
    for b in 0 1 2 3; do
        t6=; [ $b = 3 ] && t6=2009500
        echo "1,gate_up,$b,2,2003500,2004000,$((2004800 + 100 * b)),$((2005800 + 100 * b)),2008000,2008800,$t6,2010000"
    done
    echo '1,gate_up,9,1,0,10,20,30,40,50,60,70'
} >"$tmp/phases.csv"
ph=$(python3 bench/phases_summary.py "$tmp/phases.csv") \
    || { echo "FAIL: phases_summary.py exited non-zero"; fail=1; }
check "phases" "$ph" \
    '| router | 1 | end | 0.00 | 0.00 | 0.00 |' \
    '| gate_up | 4 | expert id | 1.95 | 1.80 | 2.10 |' \
    '| gate_up | 1 | unit end | 6.50 | 6.50 | 6.50 |' \
    '| gate_up | 4 | exit | 7.00 | 7.00 | 7.00 |' \
    '| gate_up | wait -> expert id | 4 | 0.95 | 1.10 |' \
    '| gate_up | expert id -> first chunk | 4 | 1.00 | 1.00 |' \
    '| gate_up | counted -> unit end | 1 | 0.70 | 0.70 |' \
    '| gate_up | units a block: median 2, max 2; us a unit after the wait | 4 | 3.00 | 3.00 |'

# k25bench: --trace only where there are GPU kernels to trace and decode steps to mark; --phases
# only from a build with the stamps (checked before the backend: a CPU-only build refuses
# --backend cuda first), and only with decode steps to read them after
B=(./k25bench --config config/kimi_k25.ini --synthetic 1 --backend cpu --trace "$tmp/t.csv")
P=(./k25bench --config config/kimi_k25.ini --synthetic 1 --backend cpu --phases "$tmp/p.csv")
for c in "B_CPU|${B[*]} --profile-only|--trace records GPU kernels: needs --backend cuda" \
         "STEPS0|${B[*]} --profile-steps 0|--trace records the breakdown's decode steps: not with --profile-steps 0" \
         "NO_STAMPS|${P[*]} --profile-only|--phases: this binary was built without" \
         "P_STEPS0|${P[*]} --profile-steps 0|--phases reads the breakdown's decode steps: not with --profile-steps 0"; do
    IFS='|' read -r name cmd want <<<"$c"
    err=$($cmd 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -qF -- "$want" <<<"$err"; then echo "ok   $name: exit $rc: $want"
    else echo "FAIL $name: exit $rc: $err"; fail=1; fi
done
[ -e "$tmp/t.csv" ] && { echo "FAIL: a refused run wrote the trace"; fail=1; }
[ -e "$tmp/p.csv" ] && { echo "FAIL: a refused run wrote the phase stamps"; fail=1; }
exit $fail
