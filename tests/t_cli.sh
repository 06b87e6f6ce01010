#!/usr/bin/env bash
# The k25dec command line: every bad input (unknown flag, missing value, bad number, a prompt
# longer than the context, a rank count that cannot split the heads, a missing file or key)
# fails on every rank with a non-zero status and a clear message, within a timeout; so do
# --backend cuda without a GPU, --check-finite on an overflow (naming the layer) and a cpu
# backend asked for more host memory than the node has; -h prints the usage; --dump-config
# round-trips and the built-in default equals config/tiny.ini; the README command prints tokens;
# with a tokenizer the text out matches the ids; -n past the context stops at the context end;
# an EOS token stops generation; run.kv_cache_mb caps the latent cache, a draft's with the
# target's.
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
# run.kv_cache_mb caps a rank's latent cache. A block of the tiny model on the CPU backend takes
# 4 layers x 64 tokens x 40 values x 4 bytes = 40 KiB: 1 MiB holds 25 blocks, 1600 tokens. A
# context of 1600 runs, one of 1601 is refused before the weights load.
expect_fail 2 'run.kv_cache_mb=1 holds 25 cache blocks of 64 tokens; the context of 1601 tokens needs 26' \
    --set run.kv_cache_mb=1 -c 1601 --tokens 1,2,3 -n 2
grep -q "capped from" "$tmp/err" && bad "run.kv_cache_mb too small for the context refused after the model was made"
expect_fail 2 'run.kv_cache_mb=1 holds no cache block: a block takes 2.50 MiB' \
    --set run.kv_cache_mb=1 --set run.kv_block_size=4096 --tokens 1,2,3 -n 2
run 2 --set run.kv_cache_mb=1 -c 1600 --tokens 1,2,3 -n 2
# A draft's cache has as many blocks as the target's, inside the same cap: config/tiny_draft.ini
# adds 2 layers x 24 values a token, so a block takes (160 + 48) x 64 x 4 bytes = 52 KiB and
# 1 MiB holds 19 blocks, 1216 tokens.
draft=(--spec-draft model:config/tiny_draft.ini --set run.kv_cache_mb=1 --tokens 1,2,3 -n 8)
expect_fail 2 "run.kv_cache_mb=1 holds 19 cache blocks of 64 tokens and as many of the draft's; the context of 1217 tokens needs 20" \
    "${draft[@]}" -c 1217
expect_fail 2 "a block takes 3.25 MiB (4096 tokens x (4 layers x 40 values + the draft's 48) x 4 bytes)" \
    "${draft[@]}" --set run.kv_block_size=4096
run 2 "${draft[@]}" -c 1216 && grep -q "speculative (model, k = " "$tmp/err" ||
    bad "a draft inside the cap did not run: $(cat "$tmp/err")"
expect_fail 2 'outside the vocabulary' --tokens 1,2,100000
expect_fail 3 '3 ranks cannot split 8 attention heads' -p hi
expect_fail 2 'add --synthetic SEED' --config config/tiny.ini -p hi
expect_fail 2 'cannot open' --config /nonexistent.ini --synthetic 1 -p hi
expect_fail 2 'model.no_such_key' --set model.no_such_key=1 -p hi
# run.threads beyond what --threads takes crashed in the OpenMP runtime (SIGSEGV, or an abort
# naming no setting); rope_theta 1 under YaRN made every logit NaN.
expect_fail 2 'run.threads = 100000 is too large' --set run.threads=100000 -p hi -n 2
expect_fail 2 'rope.rope_theta must not be 1' --set rope.rope_theta=1 -p hi -n 2
# An indented line after a key is inih's continuation of that key's value: the EOS list of
# the tiny model silently became [258].
sed '/^eos_token_ids/a\    258' config/tiny.ini > "$tmp/cont.ini"
expect_fail 2 "indented line would continue the value of key 'tokens.eos_token_ids'" \
    --config "$tmp/cont.ini" --synthetic 1 -p hi -n 2
expect_fail 2 'cannot create /nonexistent/x.bin.tmp' -p hi -n 2 --dump-logits /nonexistent/x.bin
expect_fail 2 '--think needs --chat' -p hi --think off
expect_fail 2 '--tokenizer-pattern needs a tokenizer' -p hi --tokenizer-pattern '('
# invalid UTF-8 in the prompt: the message names the option (it gave only the byte offset)
expect_fail 2 '-p/--prompt: invalid UTF-8 at byte offset 1 (byte 0xff)' --set model.vocab_size=6512 \
    --tokenizer tests/data/tokenizer/tiktoken.model -p $'a\xff'
# a pattern that matches none of the text: no tokens, said so (not "the prompt is empty")
expect_fail 2 'encodes to no tokens' --set model.vocab_size=6512 \
    --tokenizer tests/data/tokenizer/tiktoken.model --tokenizer-pattern x -p hi

# --backend cuda without a usable GPU (CPU-only build: "built without CUDA"; CUDA build on a
# machine without a GPU: the backend's own fatal error) fails, without hanging
if [ -z "$(command -v nvidia-smi)" ] || ! nvidia-smi -L >/dev/null 2>&1; then
    timeout 60 mpirun -np 2 ./k25dec --backend cuda -p hi -n 2 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qi 'cuda\|gpu' "$tmp/err"; then
        echo "ok   --backend cuda without a GPU: $(grep -m1 -i 'error' "$tmp/err")"
    else bad "--backend cuda without a GPU (rc $rc)"; cat "$tmp/err"; fi
fi

# --check-finite names the layer and position of the first NaN/Inf (routing weights ~1e38
# overflow the MoE output of layer 1); a fatal error aborts the job: non-zero, no hang
timeout 60 mpirun -np 2 ./k25dec --check-finite --set model.routed_scaling_factor=3e38 -p hi -n 2 \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    grep -q 'non-finite hidden state (inf) after layer 1: row 0 (sequence 0, position 0' "$tmp/err"; then
    echo "ok   --check-finite: $(grep -m1 'non-finite' "$tmp/err")"
else bad "--check-finite (rc $rc)"; cat "$tmp/err"; fi

# The cpu backend refuses what the node cannot hold before allocating it (else the kernel kills a
# rank mid-load without a word): the full model's weights on 2 ranks (553 GiB), the tiny
# model's latent cache at 61 layers x 16M positions (305 GiB), and its step buffers for prefill
# chunks of 1M rows with a vocabulary of 163840 (the two ranks' logits alone 640 GiB), named by
# the setting that sizes them. Skipped on a node that big.
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [ "${mem_kb:-0}" -lt $((600 * 1024 * 1024)) ]; then
    long_ctx="--set model.max_position_embeddings=16777216 -c 16777216"
    m1=1048576
    big_steps="--set model.vocab_size=163840 --set model.max_position_embeddings=$m1 -c $m1"
    big_steps+=" --set run.prefill_chunk=$m1"
    for c in "this rank's weights|--config config/kimi_k25.ini --synthetic 1" \
             "the latent cache|--set model.num_hidden_layers=61 $long_ctx" \
             "the step buffers of up to $m1 rows (run.prefill_chunk $m1)|$big_steps"; do
        what=${c%%|*}
        read -ra args <<<"${c#*|}"
        timeout 60 mpirun -np 2 ./k25dec --backend cpu "${args[@]}" -p hi -n 2 >"$tmp/out" 2>"$tmp/err"
        rc=$?
        if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
            grep -q "cannot hold $what in host memory: .* x 2 ranks on this node" "$tmp/err"; then
            echo "ok   host memory ($what): $(grep -m1 'error' "$tmp/err")"
        else bad "host memory check for $what (rc $rc)"; cat "$tmp/err"; fi
    done
else
    echo "skip host memory checks: this node has $((mem_kb / 1024 / 1024)) GiB"
fi

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

# With a tokenizer: text on stdout, equal to the printed ids detokenized; the prompt text and
# its ids from --tokenize give the same tokens
tokargs=(--config config/tiny.ini --set model.vocab_size=6512 --synthetic 1
         --tokenizer tests/data/tokenizer/tiktoken.model -n 10)
if run 2 "${tokargs[@]}" -p "Hello world" --print-ids && cp "$tmp/out" "$tmp/ids.txt" &&
    run 2 "${tokargs[@]}" -p "Hello world" && cp "$tmp/out" "$tmp/text.txt" &&
    ids=$(printf 'Hello world' | ./k25dec --tokenizer tests/data/tokenizer/tiktoken.model --tokenize) &&
    run 1 "${tokargs[@]}" --tokens "$(echo $ids | tr ' ' ',')" && cmp -s "$tmp/out" "$tmp/ids.txt" &&
    ./k25dec --tokenizer tests/data/tokenizer/tiktoken.model --detokenize <"$tmp/ids.txt" >"$tmp/det.txt" &&
    echo >>"$tmp/det.txt" && cmp -s "$tmp/det.txt" "$tmp/text.txt"; then
    echo "ok   tokenizer: text out == detokenized ids; -p == --tokens of --tokenize"
else bad "tokenizer text output"; cat "$tmp/ids.txt" "$tmp/text.txt" "$tmp/out"; fi

# Unreadable standard input (a directory): a message naming the option, a non-zero exit, for
# both directions (the reader once returned empty input there)
for op in --tokenize --detokenize; do
    if ./k25dec --tokenizer tests/data/tokenizer/tiktoken.model $op <tests >"$tmp/out" 2>"$tmp/err"; then
        bad "$op with a directory on stdin exited 0"
    elif grep -q -- "$op: standard input: read error" "$tmp/err"; then
        echo "ok   $op: unreadable stdin -> $(cat "$tmp/err")"
    else bad "$op: no read error message: $(cat "$tmp/err")"; fi
done

# -n past the context: 10 prompt tokens, context 12 -> 3 tokens (the last needs no position)
if run 2 --tokens 1,2,3,4,5,6,7,8,9,10 -c 12 -n 8 && [ "$(wc -w <"$tmp/out")" -eq 3 ] &&
    grep -q 'context end' "$tmp/err"; then echo "ok   -n past the context stops at the context end"
else bad "-n past the context"; cat "$tmp/out" "$tmp/err"; fi

# -n at its largest: the token buffer was sized n + 1 (an int overflow, then a 16 EiB
# allocation); the context bounds it: 2 prompt tokens, context 8 -> 7 tokens
if run 2 --tokens 1,2 -c 8 -n 2147483647 && [ "$(wc -w <"$tmp/out")" -eq 7 ]; then
    echo "ok   -n 2147483647 stops at the context end"
else bad "-n 2147483647"; cat "$tmp/out" "$tmp/err"; fi

# The tokenizer tools under mpirun: one answer (from the process that gets stdin), not one line
# a process
ids=$(printf 'Hello world' | timeout 60 mpirun -np 2 ./k25dec --tokenizer tests/data/tokenizer/tiktoken.model --tokenize)
one=$(printf 'Hello world' | ./k25dec --tokenizer tests/data/tokenizer/tiktoken.model --tokenize)
if [ -n "$one" ] && [ "$ids" = "$one" ]; then echo "ok   --tokenize under mpirun -np 2: one line, $ids"
else bad "--tokenize under mpirun -np 2 printed '$ids', alone '$one'"; fi

# EOS: make the second greedy token an end-of-sequence id; generation stops right after it
run 1 --tokens 9,8,7 -n 6 && read -r -a toks <"$tmp/out"
if [ "${#toks[@]}" -eq 6 ] && run 2 --tokens 9,8,7 -n 6 --set "tokens.eos_token_ids=${toks[1]}" &&
    [ "$(cat "$tmp/out")" = "${toks[0]} ${toks[1]}" ]; then echo "ok   generation stops at EOS (${toks[1]})"
else bad "EOS stop"; cat "$tmp/out"; fi

[ "$fail" -eq 0 ] && echo "cli ok"
exit "$fail"
