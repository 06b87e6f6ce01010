#!/usr/bin/env bash
# Runs the CPU test suite: every compiled $BUILD/tests/test_* program and every tests/t_*.sh
# script. Each test exits 0 on success. Prints one line per test and a closing
# "N passed, N failed" line; exits non-zero if any test failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export K25_BUILD=$BUILD
# Sanitizer builds: Open MPI and cJSON keep allocations alive until exit by design, so leak
# reports from every MPI program would drown real errors; the fuzz targets check leaks.
case "$BUILD" in *-san) export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1;; esac
filter=${1:-}
pass=0; fail=0; failed=()
mkdir -p "$BUILD/test-logs"
for t in "$BUILD"/tests/test_* tests/t_*.sh; do
    [ -x "$t" ] || [ "${t##*.}" = sh ] || continue
    case "$t" in *.d|*.o) continue;; esac
    name=$(basename "$t")
    [ -n "$filter" ] && [[ "$name" != *$filter* ]] && continue
    log="$BUILD/test-logs/$name.log"
    start=$(date +%s)
    if [ "${t##*.}" = sh ]; then cmd=(bash "$t"); else cmd=("$t"); fi
    if timeout 600 "${cmd[@]}" >"$log" 2>&1; then
        pass=$((pass + 1)); echo "ok   $name ($(( $(date +%s) - start ))s)"
    else
        fail=$((fail + 1)); failed+=("$name"); echo "FAIL $name (log: $log)"; tail -20 "$log" | sed 's/^/     /'
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
