#!/usr/bin/env bash
# --chat end to end: the prompt k25dec decodes from equals the tokenizer's encoding of Kimi's
# chat template written out as text (special tokens recognized), with and without a system
# message and thinking; --chat without a tokenizer, --system without --chat and a stop set with
# no room for <|im_end|> are refused.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tok=tests/data/tokenizer/tiktoken.model
# The test vocabulary has 6256 ranks + 256 specials: a tiny model with that vocabulary.
model=(--tokenizer "$tok" --set model.vocab_size=6512 --set tokens.bos_token_id=6256
       --set tokens.eos_token_ids=6257 --set tokens.pad_token_id=6511)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0

check() { # check NAME EXPECTED-TEMPLATE-TEXT K25DEC-ARGS...
    local name=$1 text=$2; shift 2
    local want got
    want=$(printf '%s' "$text" | ./k25dec --tokenizer "$tok" --tokenize | wc -w)
    timeout 120 mpirun -np 1 ./k25dec "${model[@]}" --chat -n 2 --dump-logits "$tmp/$name.bin" "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" || { echo "FAIL $name: k25dec failed"; cat "$tmp/$name.err"; fail=1; return; }
    # rows = prompt positions + generated tokens fed back (1 of 2)
    got=$(python3 -c "import struct,sys; d=open(sys.argv[1],'rb').read(24); print(struct.unpack('<4I', d[8:24])[2] - 1)" "$tmp/$name.bin")
    if [ "$got" = "$want" ]; then echo "ok   $name: $got prompt tokens"
    else echo "FAIL $name: k25dec prompt has $got tokens, the template text encodes to $want"; fail=1; fi
}
check plain '<|im_user|>user<|im_middle|>Hello there<|im_end|><|im_assistant|>assistant<|im_middle|><think>' -p "Hello there"
check system '<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>' \
    --system "Be brief." --think off -p "Hi"

if ./k25dec --chat -p hi >"$tmp/e1" 2>&1; then echo "FAIL: --chat without a tokenizer ran"; fail=1
elif grep -q "needs a tokenizer" "$tmp/e1"; then echo "ok   --chat without a tokenizer refused"
else echo "FAIL: unexpected message: $(cat "$tmp/e1")"; fail=1; fi
if ./k25dec --system x -p hi >"$tmp/e2" 2>&1; then echo "FAIL: --system without --chat ran"; fail=1
elif grep -q "needs --chat" "$tmp/e2"; then echo "ok   --system without --chat refused"
else echo "FAIL: unexpected message: $(cat "$tmp/e2")"; fail=1; fi
# A stop set with no room left for <|im_end|>: refused, not a reply that runs past its turn
full=(--set "model.vocab_size=6512" --set "tokens.eos_token_ids=6257,1,2,3,4,5,6,7")
if timeout 60 ./k25dec --tokenizer "$tok" "${full[@]}" --chat -p hi -n 2 >"$tmp/e3" 2>&1; then
    echo "FAIL: --chat with a full stop set ran"; fail=1
elif grep -q "no room for <|im_end|>" "$tmp/e3"; then echo "ok   --chat with a full stop set refused"
else echo "FAIL: unexpected message: $(cat "$tmp/e3")"; fail=1; fi
exit $fail
