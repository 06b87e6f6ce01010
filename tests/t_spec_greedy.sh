#!/usr/bin/env bash
# Greedy speculative decoding is plain greedy decoding, token for token: k25dec with every draft
# source (ngram, a smaller draft model, the target as its own draft, a synthetic EAGLE-3 head
# from k25-mkeagle) and two draft lengths prints the same ids and writes the same
# --dump-logits file as without a draft, on 1 and 2 ranks. Then the engine with several
# concurrent sequences (tests/test_spec_engine.c) and the EAGLE-3 head against its reference
# (tests/test_spec_eagle3.c) on 2 ranks, and bad --spec-draft values (or a head given as the
# model) failing on every rank.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
build=${K25_BUILD:-build}
dec=./k25dec
for b in "$dec" ./k25-mkeagle "$build/tests/test_spec_engine" "$build/tests/test_spec_eagle3"; do
    [ -x "$b" ] || { echo "missing $b (build it first)"; exit 1; }
done
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

./k25-mkeagle --config config/tiny.ini --synthetic 5 --aux-layers 0,1,2 --out "$tmp/eagle" \
    2>/dev/null || fail "k25-mkeagle"

# A prompt with a repeated pattern (the n-gram draft finds it), 32 new tokens. Each source runs
# with one draft length per rank count (both lengths over the two counts).
args=(--threads 1 --tokens 11,12,13,14,11,12,13,14,11,12 -n 32)
cases1=("ngram 3" "ngram:1 1" "model:config/tiny_draft.ini@7 1" "model:config/tiny.ini@1 3"
        "eagle3:$tmp/eagle 1")
cases2=("ngram 1" "model:config/tiny_draft.ini@7 3" "model:config/tiny.ini@1 2"
        "eagle3:$tmp/eagle 3")
for np in 1 2; do
    run() { timeout 120 mpirun -np "$np" "$dec" "${args[@]}" "$@"; }
    ref=$(run --dump-logits "$tmp/ref.bin" 2>"$tmp/err") || { cat "$tmp/err"; fail "plain run ($np ranks)"; }
    [ "$(echo "$ref" | wc -w)" -eq 32 ] || fail "plain run printed '$ref'"
    if [ "$np" = 1 ]; then cases=("${cases1[@]}"); else cases=("${cases2[@]}"); fi
    for c in "${cases[@]}"; do
        src=${c% *} k=${c##* }
        out=$(run --spec-draft "$src" --spec-k "$k" --dump-logits "$tmp/spec.bin" 2>"$tmp/err") \
            || { cat "$tmp/err"; fail "$src k=$k ($np ranks) exited non-zero"; }
        [ "$out" = "$ref" ] || fail "$src k=$k ($np ranks): '$out', plain '$ref'"
        cmp -s "$tmp/ref.bin" "$tmp/spec.bin" || fail "$src k=$k ($np ranks): --dump-logits differs"
        stats=$(grep -o 'speculative.*' "$tmp/err") || fail "$src: no speculative summary"
        # The target as its own draft accepts every draft.
        case $src in *tiny.ini@1) grep -q ' 0 accepted' "$tmp/err" && fail "self-draft accepted nothing";; esac
        echo "ok   $np rank(s) $src k=$k: ${stats#*: }"
    done
done

# Drafts whose max_position_embeddings is the context (48), run to the context end: drafts
# never go past it, so they run and match plain decoding to the last position (they were
# refused, their caches sized k + 1 positions beyond the context).
sed 's/^max_position_embeddings = .*/max_position_embeddings = 48/' config/tiny.ini >"$tmp/pos48.ini"
./k25-mkeagle --config config/tiny.ini --set model.max_position_embeddings=48 --set run.ctx_size=48 \
    --synthetic 5 --aux-layers 0,1,2 --out "$tmp/eagle48" 2>/dev/null || fail "k25-mkeagle (48 positions)"
end=(--threads 1 --tokens 11,12,13,14,11,12,13,14,11,12 -n -1 -c 48)
ref=$(timeout 120 "$dec" "${end[@]}" 2>"$tmp/err") || { cat "$tmp/err"; fail "plain run at -c 48"; }
[ "$(echo "$ref" | wc -w)" -eq 39 ] || fail "plain run at -c 48 printed '$ref'"
for src in "model:$tmp/pos48.ini@1" "eagle3:$tmp/eagle48"; do
    out=$(timeout 120 "$dec" "${end[@]}" --spec-draft "$src" --spec-k 4 2>"$tmp/err") \
        || { cat "$tmp/err"; fail "$src with a 48-position draft at -c 48 exited non-zero"; }
    [ "$out" = "$ref" ] || fail "$src at -c 48: '$out', plain '$ref'"
    echo "ok   ${src%%:*} draft of 48 positions to the end of the context of 48"
done

timeout 300 mpirun -np 2 "$build/tests/test_spec_engine" quick >"$tmp/eng" 2>&1 \
    || { tail -30 "$tmp/eng"; fail "test_spec_engine on 2 ranks"; }
echo "ok   test_spec_engine on 2 ranks"
timeout 120 mpirun -np 2 "$build/tests/test_spec_eagle3" >"$tmp/eg" 2>&1 \
    || { tail -30 "$tmp/eg"; fail "test_spec_eagle3 on 2 ranks"; }
echo "ok   test_spec_eagle3 on 2 ranks"

# Bad sources fail on every rank with a message and a non-zero status.
for bad in nonsense model:/nonexistent "eagle3:$tmp" ngram:0 ngram: model: eagle3: "model:config/tiny.ini@ 1" model:config/tiny.ini@99999999999999999999; do
    if timeout 60 mpirun -np 2 "$dec" --tokens 1,2 -n 4 --spec-draft "$bad" >/dev/null 2>"$tmp/err"; then
        fail "--spec-draft $bad was accepted"
    fi
    grep -q 'error' "$tmp/err" || { cat "$tmp/err"; fail "--spec-draft $bad: no error message"; }
done
timeout 60 mpirun -np 2 "$dec" --tokens 1,2 -n 4 --spec-draft "eagle3:$tmp" >/dev/null 2>"$tmp/err"
grep -q "error: --spec-draft eagle3:$tmp: $tmp/config.json: cannot open" "$tmp/err" ||
    { cat "$tmp/err"; fail "a head directory without config.json: message"; }
timeout 60 "$dec" --tokens 1,2 --spec-k 2 >/dev/null 2>&1 && fail "--spec-k without --spec-draft accepted"
# A draft whose configuration is wrong is named, and refused before the target's weights load
# (the line that reports them never comes): a bad value, and heads that 8 ranks cannot split (the target's 8
# can be).
sed 's/^hidden_size = .*/hidden_size = 0/' config/tiny_draft.ini >"$tmp/bad_draft.ini"
for bad in "2 $tmp/bad_draft.ini model.hidden_size must be positive" \
           "8 config/tiny_draft.ini 8 ranks cannot split 4 attention heads"; do
    read -r np file want <<<"$bad"
    timeout 60 mpirun -np "$np" "$dec" --set model.moe_intermediate_size=256 --tokens 1,2 -n 4 \
        --spec-draft "model:$file@1" >/dev/null 2>"$tmp/err" && fail "draft $file on $np ranks accepted"
    grep -q "error: draft model $file: $want" "$tmp/err" ||
        { cat "$tmp/err"; fail "draft $file on $np ranks: message"; }
    grep -q 'MiB of weights' "$tmp/err" && fail "draft $file: refused only after the target loaded"
    echo "ok   $(grep -m1 -o 'draft model.*' "$tmp/err")"
done
# A head given as the model is named as a head, with the option that takes it (it used to fail
# on the first model key the head lacks)
timeout 60 mpirun -np 2 "$dec" --model "$tmp/eagle" --tokens 1,2 >/dev/null 2>"$tmp/err" &&
    fail "an EAGLE-3 head as --model accepted"
grep -q "is an EAGLE draft head, not a model: give its directory as --spec-draft eagle3:DIR" "$tmp/err" ||
    { cat "$tmp/err"; fail "an EAGLE-3 head as --model: message"; }
echo "ok   an EAGLE-3 head as --model: $(grep -m1 -o 'Eagle3.*' "$tmp/err")"
echo "t_spec_greedy: ok"
