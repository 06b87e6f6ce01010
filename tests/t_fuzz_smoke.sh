#!/usr/bin/env bash
# Fuzzing smoke test: builds the libFuzzer targets (`make fuzz`, clang with ASan + UBSan),
# replays every saved reproducer in tests/fuzz/crashes/<target>/ (each must pass once its bug
# is fixed), then fuzzes each target for FUZZ_SMOKE_SECONDS (default 20) over its seed corpus.
# Any crash, leak, undefined behaviour, broken property or timeout fails the test; the input
# is left in $K25_BUILD/fuzz/work/<target>/artifacts/ (see tests/fuzz/RESULTS.md for how to
# reproduce and report it).
# Needs clang and its libFuzzer runtime (Debian: clang, libclang-rt-dev or libclang-rt-14-dev);
# without clang the test is skipped (exit 0).
set -u
cd "$(dirname "$0")/.." || exit 1
export BUILD=${K25_BUILD:-build}
# The fuzz targets are ASan + UBSan builds of their own, so the sanitizer suite (make test
# SAN=1, whose build directory ends in -san) has nothing to add: the plain suite runs them.
case "$BUILD" in *-san) echo "SKIP: sanitizer suite; the fuzz targets run in the plain suite"; exit 0;; esac
cc=${FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "SKIP: $cc not found, fuzz targets not built (install clang and libclang-rt-dev)"
    exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }' >"$probe/p.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
    echo "FAIL: $cc cannot link a libFuzzer target (install libclang-rt-dev / libclang-rt-14-dev):"
    cat "$probe/err"
    exit 1
fi
# A clean make: knobs of an enclosing make (SAN=1 in MAKEFLAGS) would move the build directory.
if ! env -u MAKEFLAGS -u MAKELEVEL make BUILD="$BUILD" FUZZ_CC="$cc" -j2 fuzz >"$probe/build.log" 2>&1; then
    echo "FAIL: make fuzz"
    tail -30 "$probe/build.log"
    exit 1
fi
fail=0
tests/fuzz/run.sh -n -r || fail=1
tests/fuzz/run.sh -n -t "${FUZZ_SMOKE_SECONDS:-20}" || fail=1
[ $fail -eq 0 ] && echo "t_fuzz_smoke: ok"
exit $fail
