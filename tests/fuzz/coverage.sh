#!/usr/bin/env bash
# Source line coverage reached by the fuzz corpora: builds the targets again with clang's
# source-based coverage (in ${BUILD}-cov, no sanitizers), runs each once over its corpora
# (the seeds in tests/fuzz/corpus/<target>/ and what tests/fuzz/run.sh collected in
# $BUILD/fuzz/work/<target>/corpus) and prints, per target, the line coverage of the files
# it exercises. Used for the figures in tests/fuzz/RESULTS.md.
#
#   tests/fuzz/coverage.sh [TARGET...]        Env: BUILD (default build-fuzz)
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-fuzz}
cov=${BUILD}-cov
profdata=$(command -v llvm-profdata || command -v llvm-profdata-14) || { echo "llvm-profdata not found"; exit 1; }
llvmcov=$(command -v llvm-cov || command -v llvm-cov-14) || { echo "llvm-cov not found"; exit 1; }
mkdir -p "$cov"
make BUILD="$cov" FUZZ_SAN="-fprofile-instr-generate -fcoverage-mapping" -j2 fuzz >"$cov/build.log" 2>&1 ||
    { echo "build failed:"; tail -20 "$cov/build.log"; exit 1; }
if [ $# -gt 0 ]; then targets=("$@"); else
    targets=(); for f in tests/fuzz/fuzz_*.c; do t=${f##*/fuzz_}; targets+=("${t%.c}"); done
fi
[ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
printf '%-18s %-22s %s\n' target file "lines covered"
for t in "${targets[@]}"; do
    bin=$cov/fuzz/fuzz_$t
    dirs=("tests/fuzz/corpus/$t")
    [ -d "$BUILD/fuzz/work/$t/corpus" ] && dirs+=("$BUILD/fuzz/work/$t/corpus")
    rm -f "$cov/$t".prof*
    LLVM_PROFILE_FILE="$cov/$t.profraw" "$bin" -runs=0 "${dirs[@]}" >"$cov/$t.runlog" 2>&1
    "$profdata" merge -sparse "$cov/$t.profraw" -o "$cov/$t.profdata" || continue
    # Files under src/ that the target executed at all.
    "$llvmcov" report "$bin" -instr-profile="$cov/$t.profdata" 2>/dev/null |
        awk -v t="$t" '$1 ~ /^src\// && $(NF-5) > 0 && $(NF-3) != "0.00%" {
            # columns: ... Lines MissedLines Cover Branches MissedBranches Cover
            printf "%-18s %-22s %s of %s (%s)\n", t, $1, $(NF-5)-$(NF-4), $(NF-5), $(NF-3) }'
done
