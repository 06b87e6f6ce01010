#!/usr/bin/env bash
# bench/ncu_source.py on a hand-written export of ncu's source page: stall totals summed over
# instructions (the "Not Issued" columns left out), a repeated kernel block counted once, the
# instructions ranked by samples with their largest reasons, and a clear error for a file that
# is not such an export.
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
exit $fail
