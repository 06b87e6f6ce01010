#!/usr/bin/env bash
# The k25dec command line: every bad input (unknown flag, missing value, bad number, a prompt
# longer than the context, a rank count that cannot split the heads, a backend that is not
# built) fails on every rank with a non-zero status and a clear message, within a timeout;
# -h prints the usage; --dump-config round-trips and the built-in default equals
# config/tiny.ini; the README command prints tokens; -n past the context stops at the context
# end; an EOS token stops generation.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# expect_fail NP "message part" args...: every rank exits non-zero, stderr has the message.
expect_fail() {
    local np=$1 msg=$2
    shift 2
    timeout 60 mpirun -np "$np" bash -c './k25dec "$@"; echo "k25rc $OMPI_COMM_WORLD_RANK $?" >&2' \
        k25dec "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? ranks
    ranks=$(grep -c '^k25rc [0-9]* [1-9]' "$tmp/err")
    if [ "$rc" -eq 124 ]; then bad "timed out: k25dec $*"
    elif [ "$ranks" -ne "$np" ]; then bad "not every rank failed ($ranks of $np): k25dec $*"; cat "$tmp/err"
    elif ! grep -q -- "$msg" "$tmp/err"; then bad "no \"$msg\" in the error of: k25dec $*"; cat "$tmp/err"
    else echo "ok   fails on $np ranks: k25dec $* -> $(grep -m1 'error' "$tmp/err")"
    fi
}

# run NP args...: succeeds, stdout in $tmp/out, stderr in $tmp/err
run() {
    local np=$1
    shift
    if ! timeout 60 mpirun -np "$np" ./k25dec "$@" >"$tmp/out" 2>"$tmp/err"; then
        bad "k25dec $* failed"
        cat "$tmp/err"
        return 1
    fi
}

expect_fail 2 'unknown option "--bogus"' --bogus -p hi
expect_fail 2 'unexpected argument' -p hi stray
expect_fail 2 '-n needs a value' -p hi -n
expect_fail 2 '"abc" is not an integer' -p hi -n abc
expect_fail 2 '"1.5x" is not a number' -p hi --temp 1.5x
expect_fail 2 'out of range' -p hi --top-p 1.5
expect_fail 2 'bad token id' --tokens 1,,2
expect_fail 2 'no prompt' -n 4
expect_fail 2 'more than the context' -c 4 --tokens 1,2,3,4,5
expect_fail 2 'outside the vocabulary' --tokens 1,2,100000
expect_fail 3 '3 ranks cannot split 8 attention heads' -p hi
expect_fail 2 'add --synthetic SEED' --config config/tiny.ini -p hi
expect_fail 2 'cannot open' --config /nonexistent.ini --synthetic 1 -p hi
expect_fail 2 'model.no_such_key' --set model.no_such_key=1 -p hi
expect_fail 2 'CUDA' --backend cuda -p hi

# -h: usage with an example on stdout, status 0
if run 2 -h && grep -q '^Usage:' "$tmp/out" && grep -q 'Example' "$tmp/out" &&
    [ "$(grep -c '^Usage:' "$tmp/out")" -eq 1 ]; then echo "ok   -h prints the usage once"
else bad "-h"; fi

# --dump-config: the resolved config loads back to the same config; the built-in default is
# config/tiny.ini
run 1 --dump-config --set run.ctx_size=300 -c 256 --temp 0.5 && cp "$tmp/out" "$tmp/a.ini"
run 2 --config "$tmp/a.ini" --synthetic 1 --dump-config && cp "$tmp/out" "$tmp/b.ini"
if [ -s "$tmp/a.ini" ] && cmp -s "$tmp/a.ini" "$tmp/b.ini" && grep -q '^ctx_size = 256' "$tmp/a.ini" &&
    grep -q '^temp = 0.5' "$tmp/a.ini"; then echo "ok   --dump-config round trip (flags over --set)"
else bad "--dump-config round trip"; diff "$tmp/a.ini" "$tmp/b.ini"; fi
run 1 --dump-config && cp "$tmp/out" "$tmp/builtin.ini"
run 1 --config config/tiny.ini --synthetic 1 --dump-config && cp "$tmp/out" "$tmp/file.ini"
if [ -s "$tmp/builtin.ini" ] && cmp -s "$tmp/builtin.ini" "$tmp/file.ini"; then
    echo "ok   the built-in default resolves like config/tiny.ini"
else bad "built-in default differs from config/tiny.ini"; diff "$tmp/builtin.ini" "$tmp/file.ini"; fi

# The README command: 8 token ids on one line on stdout (no tokenizer: ids), the same as the
# explicit form, timings on stderr
if run 2 -p "Hello" -n 8 && [ "$(wc -l <"$tmp/out")" -eq 1 ] && [ "$(wc -w <"$tmp/out")" -eq 8 ] &&
    grep -q 'eval time' "$tmp/err"; then
    cp "$tmp/out" "$tmp/hello.txt"
    run 1 --config config/tiny.ini --synthetic 1 --tokens 72,101,108,108,111 -n 8
    if cmp -s "$tmp/out" "$tmp/hello.txt"; then echo "ok   mpirun -np 2 ./k25dec -p Hello -n 8: $(cat "$tmp/out")"
    else bad "-p Hello differs from its bytes as --tokens"; fi
else bad "README command"; cat "$tmp/out" "$tmp/err"; fi

# -n past the context: 10 prompt tokens, context 12 -> 3 tokens (the last needs no position)
if run 2 --tokens 1,2,3,4,5,6,7,8,9,10 -c 12 -n 8 && [ "$(wc -w <"$tmp/out")" -eq 3 ] &&
    grep -q 'context end' "$tmp/err"; then echo "ok   -n past the context stops at the context end"
else bad "-n past the context"; cat "$tmp/out" "$tmp/err"; fi

# EOS: make the second greedy token an end-of-sequence id; generation stops right after it
run 1 --tokens 9,8,7 -n 6 && read -r -a toks <"$tmp/out"
if [ "${#toks[@]}" -eq 6 ] && run 2 --tokens 9,8,7 -n 6 --set "tokens.eos_token_ids=${toks[1]}" &&
    [ "$(cat "$tmp/out")" = "${toks[0]} ${toks[1]}" ]; then echo "ok   generation stops at EOS (${toks[1]})"
else bad "EOS stop"; cat "$tmp/out"; fi

[ "$fail" -eq 0 ] && echo "cli ok"
exit "$fail"
