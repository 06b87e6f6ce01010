#!/usr/bin/env bash
# Golden test: k25dec against Hugging Face transformers' DeepseekV3ForCausalLM.
#
# tests/data/golden_tiny and tests/data/golden_group are Kimi-K2.5-layout checkpoints (INT4
# routed experts, config/tiny.ini and config/tiny_group.ini dimensions) with reference logits
# recorded by transformers (scripts/golden/make_golden.py). For each model and for 1, 2 and 4
# ranks, k25dec decodes the golden prompt greedily; its --dump-logits rows must match the
# reference at every prompt and generated position within max|d| <= 1e-4 * max|ref|, and the
# greedy tokens must equal the reference for at least 32 generated tokens.
# Env: K25_GOLDEN_BACKEND=cuda runs the same comparison on the GPU backend; K25_DEC=PATH tests
# another k25dec binary.
set -uo pipefail
cd "$(dirname "$0")/.."

K25=${K25_DEC:-./k25dec}
[ -x "$K25" ] || { echo "missing $K25 (build it first)"; exit 1; }
python3 -c "import numpy" 2>/dev/null || { echo "numpy is required (pip install numpy)"; exit 1; }
backend=()
[ -n "${K25_GOLDEN_BACKEND:-}" ] && backend=(--backend "$K25_GOLDEN_BACKEND")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for dir in tests/data/golden_tiny tests/data/golden_group; do
    name=$(basename "$dir")
    prompt=$(awk '$1 == "prompt" { $1 = ""; print }' "$dir/tokens.txt" | xargs | tr ' ' ',')
    n_gen=$(awk '$1 == "continuation" { print NF - 1 }' "$dir/tokens.txt")
    if [ -z "$prompt" ] || [ -z "$n_gen" ]; then
        echo "FAIL $name: bad $dir/tokens.txt"; fail=1; continue
    fi
    for np in 1 2 4; do
        out="$tmp/$name.np$np"
        if ! mpirun -np "$np" "$K25" --model "$dir" --tokens "$prompt" -n "$n_gen" --temp 0 \
                --threads 1 "${backend[@]}" --dump-logits "$out.k25logits" \
                >"$out.stdout" 2>"$out.stderr"; then
            echo "FAIL $name np=$np: k25dec exited with an error"
            tail -20 "$out.stderr"
            fail=1
            continue
        fi
        python3 tests/py/compare_logits.py "$dir/reference.k25logits" "$out.k25logits" \
            --tokens "$dir/tokens.txt" --stdout "$out.stdout" --rtol 1e-4 --min-gen 32 \
            --label "$name np=$np" || fail=1
    done
done
[ "$fail" -eq 0 ] && echo "golden: all models match transformers at 1, 2 and 4 ranks"
exit "$fail"
