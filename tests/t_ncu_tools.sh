#!/usr/bin/env bash
# The ncu readers on hand-written exports. bench/ncu_source.py (ncu's source page): stall totals
# summed over instructions (the "Not Issued" columns left out), a repeated kernel block counted
# once, the instructions ranked by samples with their largest reasons, a clear error for a file
# that is not such an export. bench/ncu_step.py (per-kernel durations): the steps cut at the
# embedding kernel, times in every unit ncu writes converted, sums per operation group, and clear
# errors for a window without a step and for a step index out of range.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
hdr='"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait","stall_barrier","stall_long_sb (Not Issued)"'
{
    echo '"Kernel Name","void k<(int)2>(const int *, int)",'
    echo "$hdr"
    echo '"0x7f00a0","LDG.E R2, [R4]","30","25","5","0","99"'
    echo '"0x7f00b0","BAR.SYNC 0x0","12","0","2","10","99"'
    echo '"0x7f00c0","HMMA R8, R4, R6, R8","8","0","8","0","99"'
    echo '"Kernel Name","void k<(int)2>(const int *, int)",'   # the same block again
    echo "$hdr"
    echo '"0x7f00a0","LDG.E R2, [R4]","30","25","5","0","99"'
    echo '"0x7f00b0","BAR.SYNC 0x0","12","0","2","10","99"'
    echo '"0x7f00c0","HMMA R8, R4, R6, R8","8","0","8","0","99"'
    echo '"Kernel Name","other_kernel(float *)",'
    echo "$hdr"
    echo '"0x7f01a0","FFMA R1, R2, R3, R1","4","0","4","0","0"'
} >"$tmp/sass.csv"

out=$(python3 bench/ncu_source.py "$tmp/sass.csv" --top 2) || { echo "FAIL: ncu_source.py exited non-zero"; fail=1; }
want_lines=(
    '### void k<(int)2>'
    '50 samples'
    '| long_sb | 25 | 50.0% |'
    '| wait | 15 | 30.0% |'
    '| barrier | 10 | 20.0% |'
    '| f00a0 | 30 | 60.0% | `LDG.E R2, [R4]` | long_sb 25, wait 5 |'
    '| f00b0 | 12 | 24.0% | `BAR.SYNC 0x0` | barrier 10, wait 2 |'
    '### other_kernel'
    '4 samples'
)
for w in "${want_lines[@]}"; do
    if grep -qxF -- "$w" <<<"$out"; then echo "ok   has: $w"; else echo "FAIL missing: $w"; fail=1; fi
done
n=$(grep -c '^### void k<' <<<"$out")
[ "$n" = 1 ] && echo "ok   repeated block counted once" || { echo "FAIL: kernel k reported $n times"; fail=1; }
grep -q 'HMMA' <<<"$out" && { echo "FAIL: --top 2 printed a third instruction"; fail=1; }
grep -q 'Not Issued' <<<"$out" && { echo "FAIL: a Not Issued column was summed"; fail=1; }

one=$(python3 bench/ncu_source.py "$tmp/sass.csv" --kernel 1)
grep -q '^### other_kernel' <<<"$one" && ! grep -q '^### void k<' <<<"$one" && echo "ok   --kernel 1" \
    || { echo "FAIL: --kernel 1 did not select the second kernel"; fail=1; }

echo "Address,Source" >"$tmp/bad.csv"
if err=$(python3 bench/ncu_source.py "$tmp/bad.csv" 2>&1); then echo "FAIL: a non-export was accepted"; fail=1
elif grep -q "bad.csv: no 'Kernel Name' block" <<<"$err"; then echo "ok   non-export refused: $err"
else echo "FAIL: unclear error: $err"; fail=1; fi

# ---- ncu_step.py ----
m='"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"'
{
    echo '==PROF== Connected to process 1'  # ncu's own lines are not CSV
    echo "$m"
    echo '"0","synth_fill_kernel(int)","(8, 1, 1)","(256, 1, 1)","gpu__time_duration.sum","ns","5,000"'
    echo '"1","embed_kernel(int)","(1, 1, 1)","(256, 1, 1)","gpu__time_duration.sum","us","10"'
    echo '"2","void gemv_tile_kernel<1, 1>(const float *)","(8, 22, 1)","(256, 1, 1)","gpu__time_duration.sum","ns","13,500"'
    echo '"3","w4a16_grouped_kernel(int)","(528, 1, 1)","(128, 1, 1)","gpu__time_duration.sum","ns","14,000"'
    echo '"4","embed_kernel(int)","(1, 1, 1)","(256, 1, 1)","gpu__time_duration.sum","ms","0.012"'
    echo '"5","moe_combine_kernel(int)","(56, 1, 1)","(128, 1, 1)","gpu__time_duration.sum","ns","4,000"'
} >"$tmp/step.csv"
s0=$(python3 bench/ncu_step.py "$tmp/step.csv" --step 0) || { echo "FAIL: ncu_step.py --step 0 exited non-zero"; fail=1; }
for w in 'projections     1 kernels      13.5 us  36.0%' 'experts         1 kernels      14.0 us  37.3%' \
         'other           1 kernels      10.0 us  26.7%' '3 kernels, 37.5 us in all (step 0 of 2;'; do
    if grep -qF -- "$w" <<<"$s0"; then echo "ok   step 0 has: $w"; else echo "FAIL step 0 missing: $w"; fail=1; fi
done
grep -q synth_fill <<<"$s0" && { echo "FAIL: a kernel before the first step was counted"; fail=1; }
s1=$(python3 bench/ncu_step.py "$tmp/step.csv")
grep -qF '2 kernels, 16.0 us in all (step -1 of 2;' <<<"$s1" && echo "ok   last step: 12 us (ms) + 4 us (ns)" \
    || { echo "FAIL: last step: $(tail -1 <<<"$s1")"; fail=1; }
if err=$(python3 bench/ncu_step.py "$tmp/step.csv" --step -3 2>&1); then echo "FAIL: --step -3 accepted"; fail=1
elif grep -q -- "--step -3: the file holds 2 step(s)" <<<"$err"; then echo "ok   $err"
else echo "FAIL: unclear error: $err"; fail=1; fi
# the units ncu writes: ns, us, ms, s (--print-units auto) and nsecond, usecond, ... (base)
{
    echo "$m"
    k='"(1, 1, 1)","(256, 1, 1)","gpu__time_duration.sum"'
    echo "\"0\",\"embed_kernel(int)\",$k,\"nsecond\",\"1,500\""
    echo "\"1\",\"rmsnorm_kernel(int)\",$k,\"usecond\",\"2.5\""
    echo "\"2\",\"mla_kernel(int)\",$k,\"msecond\",\"0.004\""
    echo "\"3\",\"sample_kernel(int)\",$k,\"second\",\"0.000008\""
    echo "\"4\",\"nccl_kernel(int)\",$k,\"s\",\"0.000016\""
} >"$tmp/units.csv"
su=$(python3 bench/ncu_step.py "$tmp/units.csv")
if grep -qF '5 kernels, 32.0 us in all (step -1 of 1;' <<<"$su" &&
   grep -qF 'sampling        1 kernels       8.0 us' <<<"$su"; then
    echo "ok   nsecond, usecond, msecond, second and s converted"
else echo "FAIL: units: $su"; fail=1; fi
head -3 "$tmp/step.csv" >"$tmp/nostep.csv"
if err=$(python3 bench/ncu_step.py "$tmp/nostep.csv" 2>&1); then echo "FAIL: a window without a step accepted"; fail=1
elif grep -q "no embedding kernel among its 1 kernels" <<<"$err"; then echo "ok   $err"
else echo "FAIL: unclear error: $err"; fail=1; fi
exit $fail
