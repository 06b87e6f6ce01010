#!/usr/bin/env bash
# The two readers of a CUDA build's machine code on hand-written listings (a stand-in cuobjdump
# prints an object's file as its SASS). scripts/check_pdl_sass.py: a store, a reduction or an
# async copy before the PDL wait fails, a load there only in a prologue kernel, an async copy only
# in an async-prologue kernel, a kernel without the wait only when exempt; the exit status says
# whether any kernel broke a rule (or an object named has no kernel). scripts/sass_same.py: a
# kernel found by name, or under another name, with parameter offsets ignored unless --exact,
# "new" otherwise, and --require-all (which fails on an object without a kernel).
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
printf '#!/bin/sh\n[ "$1" = -sass ] && exec cat "$2"\nexit 2\n' >"$tmp/cuobjdump"
chmod +x "$tmp/cuobjdump"

# kernel NAME INSTRUCTION... : one function of a listing, addresses in steps of 0x10
kernel() {
    local name=$1 a=0 i; shift
    printf '\t\tFunction : %s\n\t.headerflags\t@"EF_CUDA_SM90"\n' "$name"
    for i in "$@"; do
        printf '        /*%04x*/                   %s ;   /* 0x000000000000000000 */\n' "$a" "$i"
        a=$((a + 16))
    done
}
expect() { # expect NAME STATUS OUTPUT PATTERN...: the exit status and a line for each pattern
    local name=$1 want=$2 got=$3 out=$4 p; shift 4
    if [ "$got" != "$want" ]; then
        echo "FAIL $name: exit $got, expected $want"; echo "$out"; fail=1; return
    fi
    for p in "$@"; do
        if ! grep -qE -- "$p" <<<"$out"; then
            echo "FAIL $name: no line matches '$p'"; echo "$out"; fail=1; return
        fi
    done
    echo "ok   $name"
}

# ---- check_pdl_sass.py ----
pdl() { python3 scripts/check_pdl_sass.py --cuobjdump "$tmp/cuobjdump" "$@" 2>&1; }
kernel good_kernel 'LDC R1, c[0x0][0x28]' 'ACQBULK' 'LDG.E R2, desc[UR4][R2.64]' \
    'STG.E desc[UR4][R4.64], R2' 'PREEXIT' 'EXIT' >"$tmp/good.o"
out=$(pdl "$tmp/good.o"); expect "pdl: stores and loads after the wait" 0 $? "$out" \
    '^ok .*good_kernel.*wait x1, trigger x1' '1 passed, 0 failed'

kernel early_store 'STG.E desc[UR4][R4.64], R2' 'ACQBULK' 'EXIT' >"$tmp/store.o"
kernel early_red '@P0 REDG.E.ADD.STRONG.GPU desc[UR4][R4.64], R2' 'ACQBULK' 'EXIT' >>"$tmp/store.o"
out=$(pdl "$tmp/store.o"); expect "pdl: a store or reduction before the wait" 1 $? "$out" \
    'early_store.*before the wait: STG' 'early_red.*before the wait: REDG' '0 passed, 2 failed'

kernel early_load 'LDG.E R2, desc[UR4][R2.64]' 'ACQBULK' 'EXIT' >"$tmp/load.o"
out=$(pdl "$tmp/load.o"); expect "pdl: a load before the wait outside a prologue kernel" 1 $? \
    "$out" 'early_load.*no prologue kernel'
out=$(pdl "$tmp/load.o" --prologue early_load); expect "pdl: the same load in a prologue kernel" \
    0 $? "$out" 'early_load.*prologue: 1 loads before the wait'

kernel early_copy 'LDGSTS.E [R1], desc[UR4][R2.64]' 'ACQBULK' 'EXIT' >"$tmp/copy.o"
out=$(pdl "$tmp/copy.o"); expect "pdl: an async copy before the wait" 1 $? "$out" \
    'early_copy.*before the wait: LDGSTS'
out=$(pdl "$tmp/copy.o" --async-prologue early_copy); expect \
    "pdl: the same copy in an async-prologue kernel" 0 $? "$out" 'early_copy.*1 async copies'

kernel no_wait 'STG.E desc[UR4][R4.64], R2' 'EXIT' >"$tmp/nowait.o"
out=$(pdl "$tmp/nowait.o"); expect "pdl: no wait" 1 $? "$out" 'no_wait.*no griddepcontrol.wait'
out=$(pdl "$tmp/nowait.o" --exempt no_wait); expect "pdl: no wait, exempt" 0 $? "$out" \
    'no_wait.*no PDL \(exempt\)'

# an object without a kernel: a failure when named; among the default objects only when no
# object has one (host code's objects have none)
echo junk >"$tmp/none.o"
out=$(pdl "$tmp/none.o"); expect "pdl: a named object without a kernel" 1 $? "$out" \
    '^FAIL none\.o +no kernel in its SASS listing$' '^0 passed, 1 failed$'
out=$(pdl "$tmp/good.o" "$tmp/none.o"); expect "pdl: and beside a good one" 1 $? "$out" \
    '^FAIL none\.o' '^1 passed, 1 failed$'
mkdir -p "$tmp/b/kernels"; cp "$tmp/none.o" "$tmp/b/kernels/host.o"
out=$(BUILD="$tmp/b" pdl); expect "pdl: default objects without a kernel" 1 $? "$out" \
    "^FAIL no kernel in $tmp/b/kernels/\*\.o \(1 objects\)$" '^0 passed, 1 failed$'
cp "$tmp/good.o" "$tmp/b/kernels/"
out=$(BUILD="$tmp/b" pdl); expect "pdl: a host code object among the default ones" 0 $? "$out" \
    '^1 passed, 0 failed$'

# ---- sass_same.py ----
same() { python3 scripts/sass_same.py --cuobjdump "$tmp/cuobjdump" "$@" 2>&1; }
{
    kernel kept 'LDC R1, c[0x0][0x28]' 'ACQBULK' 'EXIT'
    kernel old_name 'IMAD R2, R3, 0x4, RZ' 'EXIT'
    kernel moved 'LDC R4, c[0x0][0x210]' 'EXIT'
} >"$tmp/ref.o"
{
    kernel kept 'LDC R1, c[0x0][0x28]' 'ACQBULK' 'EXIT'
    kernel new_name 'IMAD R2, R3, 0x4, RZ' 'EXIT'
    kernel moved 'LDC R4, c[0x0][0x218]' 'EXIT'
    kernel changed 'IMAD R2, R3, 0x8, RZ' 'EXIT'
} >"$tmp/new.o"
out=$(same "$tmp/new.o" "$tmp/ref.o"); expect "same: by name, by code, parameter offsets" 0 $? \
    "$out" '^same  kept  \(3 instructions\) = .*ref\.o$' \
    '^same  new_name  \(2 instructions\) = .*ref\.o as old_name$' \
    '^same  moved  \(2 instructions\)' '^new   changed  \(2 instructions\)$' \
    '^3 of 4 kernels have a reference'
out=$(same "$tmp/new.o" "$tmp/ref.o" --exact); expect "same: --exact sees the moved parameter" \
    0 $? "$out" '^new   moved' '^2 of 4 kernels'
out=$(same "$tmp/new.o" "$tmp/ref.o" --require-all); expect "same: --require-all" 1 $? "$out" \
    '^3 of 4 kernels'
out=$(same "$tmp/ref.o" "$tmp/new.o" --require-all); expect "same: --require-all, every kernel" \
    0 $? "$out" '^same  old_name  \(2 instructions\) = .*new\.o as new_name$' '^3 of 3 kernels'
out=$(same "$tmp/none.o" "$tmp/ref.o" --require-all); expect "same: --require-all, no kernel" 1 $? \
    "$out" "^sass_same.py: $tmp/none\.o: no kernel in its SASS listing, so none to require$"
out=$(python3 scripts/sass_same.py --cuobjdump "$tmp/nope" "$tmp/new.o" "$tmp/ref.o" 2>&1)
expect "same: no cuobjdump" 1 $? "$out" 'sass_same.py: cuobjdump not found'
exit $fail
