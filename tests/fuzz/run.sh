#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (built by `make fuzz`), one after the other, each over
# its seed corpus tests/fuzz/corpus/<target>/ and a work corpus that collects what the fuzzer
# finds ($BUILD/fuzz/work/<target>/corpus; the committed seeds are never written to).
#
#   tests/fuzz/run.sh [-t SECONDS] [-n] [-k] [-r] [TARGET...]
#     -t SECONDS  fuzzing time per target (default 60)
#     -n          do not (re)build first
#     -k          keep going after a finding (libFuzzer fork mode: every distinct crash, leak or
#                 timeout is saved and the run continues until the time is up)
#     -r          only replay tests/fuzz/crashes/<target>/* (the saved reproducers), no fuzzing
#     TARGET      names without the fuzz_ prefix (default: every tests/fuzz/fuzz_*.c)
#   Env: BUILD (default build-fuzz), FUZZ_NICE (default 19), FUZZ_ARGS (extra libFuzzer flags).
#
# Findings go to $BUILD/fuzz/work/<target>/artifacts/ (crash-*, leak-*, timeout-*, oom-*);
# the log of each run to $BUILD/fuzz/work/<target>/log. One summary line per target; exits
# non-zero if any target found something or a reproducer still fails.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-fuzz}
secs=60 build=1 keep=0 replay=0
while getopts "t:nkr" opt; do
    case $opt in
    t) secs=$OPTARG ;;
    n) build=0 ;;
    k) keep=1 ;;
    r) replay=1 ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ]; then targets=("$@"); else
    targets=(); for f in tests/fuzz/fuzz_*.c; do t=${f##*/fuzz_}; targets+=("${t%.c}"); done
fi
if [ "$build" = 1 ]; then
    mkdir -p "$BUILD"
    make BUILD="$BUILD" -j2 fuzz >"$BUILD/fuzz-build.log" 2>&1 || {
        echo "make fuzz failed:"; tail -30 "$BUILD/fuzz-build.log"; exit 1; }
fi
# Parsers that only read files get their input through a scratch file: keep it in memory.
[ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
# Leak checking stays on even when the caller turned it off for MPI programs (tests/run.sh
# does for sanitizer builds); the fuzz targets do not use MPI.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1"
nice=${FUZZ_NICE:-19}
bad=0
for t in "${targets[@]}"; do
    bin=$BUILD/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "FAIL $t: $bin not built"; bad=1; continue; }
    work=$BUILD/fuzz/work/$t
    mkdir -p "$work/corpus" "$work/artifacts"
    crashes=(); [ -d "tests/fuzz/crashes/$t" ] && for f in tests/fuzz/crashes/"$t"/*; do [ -f "$f" ] && crashes+=("$f"); done
    if [ "$replay" = 1 ]; then
        [ ${#crashes[@]} -eq 0 ] && { echo "ok   $t: no saved reproducers"; continue; }
        nfail=0
        for f in "${crashes[@]}"; do
            "$bin" -runs=1 "$f" >"$work/replay.log" 2>&1 || { nfail=$((nfail + 1)); echo "     still fails: $f"; }
        done
        if [ $nfail -gt 0 ]; then bad=1; echo "FAIL $t: $nfail of ${#crashes[@]} reproducers still fail"
        else echo "ok   $t: ${#crashes[@]} reproducers pass"; fi
        continue
    fi
    dict=(); [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
    mode=(); [ "$keep" = 1 ] && mode=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
    before=$(ls "$work/artifacts" | wc -l)
    start=$(date +%s)
    # shellcheck disable=SC2086
    nice -n "$nice" "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dict[@]}" "${mode[@]}" \
        ${FUZZ_ARGS:-} "$work/corpus" "tests/fuzz/corpus/$t" >"$work/log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    found=$(( $(ls "$work/artifacts" | wc -l) - before ))
    runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | tail -1 | grep -o '[0-9]*$')
    [ -z "$runs" ] && runs=$(grep -a -oE '^#[0-9]+' "$work/log" | tail -1 | tr -d '#')
    last=$(grep -a -E 'cov: [0-9]+ ft: [0-9]+' "$work/log" | tail -1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.*corp: \([^ ]*\).*/\1/p' <<<"$last")
    line="$t: ${took}s, ${runs:-?} runs, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, new findings $found"
    if [ $rc -ne 0 ] || [ "$found" -gt 0 ]; then
        bad=1; echo "FAIL $line (log: $work/log)"
        grep -a -m3 -E 'ERROR|property violated|runtime error' "$work/log" | sed 's/^/     /'
    else
        echo "ok   $line"
    fi
done
exit $bad
