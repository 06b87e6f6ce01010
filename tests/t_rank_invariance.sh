#!/usr/bin/env bash
# Tensor parallelism does not change the result: the tiny models (plain and group-limited
# routing) give the same greedy tokens and the same logits (within 1e-5 of the row's largest
# logit) at 1, 2 and 4 ranks, and with a chunked prefill; temperature + top-k sampling with a
# seed gives the same tokens at 1, 2 and 4 ranks, and so does run.uniform_routing. Also checks
# the --dump-logits layout (common_formats item 1) against the printed tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PROMPT=3,1,4,1,5,9,2,6,5,3,5,8,9,7

dec() { # np out args...
    local np=$1 out=$2
    shift 2
    if ! timeout 120 mpirun -np "$np" ./k25dec "$@" >"$out" 2>"$out.err"; then
        echo "k25dec failed: mpirun -np $np ./k25dec $*"
        cat "$out.err"
        exit 1
    fi
}

# compare_dumps A.bin A.txt B.bin B.txt: same positions/tokens, logits within 1e-5 relative,
# and A's layout matches its printed tokens.
compare_dumps() {
    python3 - "$@" "$PROMPT" <<'EOF'
import sys
sys.path.insert(0, 'tests/py')
import numpy as np
from k25logits import read
a, b = read(sys.argv[1]), read(sys.argv[3])
assert a.reserved == 0 and b.reserved == 0, 'bad header'
ta = [int(x) for x in open(sys.argv[2]).read().split()]
tb = [int(x) for x in open(sys.argv[4]).read().split()]
prompt = [int(x) for x in sys.argv[5].split(',')]
assert ta == tb, 'tokens differ: %s vs %s' % (ta, tb)
fed = prompt + ta[:-1]
assert a.pos.tolist() == list(range(len(fed))), 'dump positions are not 0..%d' % (len(fed) - 1)
assert a.tok.tolist() == fed, 'dump tokens are not the prompt + the fed-back generated tokens'
# the greedy token at each generated position is the argmax of the row before it (the first
# index of the maximum)
for i, t in enumerate(ta):
    assert int(np.argmax(a.logits[len(prompt) - 1 + i])) == t, 'token %d is not the argmax' % i
assert np.array_equal(a.pos, b.pos) and np.array_equal(a.tok, b.tok), 'dump rows differ'
x, y = a.logits.astype(np.float64), b.logits.astype(np.float64)
worst = float((np.abs(x - y).max(axis=1) / np.abs(x).max(axis=1)).max())
assert worst <= 1e-5, 'logits differ by %.3g of the row maximum' % worst
print('  %s vs %s: %d tokens, %d rows, worst relative difference %.2e' % (sys.argv[1].split('/')[-1], sys.argv[3].split('/')[-1], len(ta), len(a.pos), worst))
EOF
}

for cfg in tiny tiny_group; do
    for np in 1 2 4; do
        dec "$np" "$tmp/$cfg.$np.txt" --config "config/$cfg.ini" --synthetic 1 --tokens "$PROMPT" \
            -n 16 --temp 0 --dump-logits "$tmp/$cfg.$np.bin"
    done
    dec 2 "$tmp/$cfg.chunk.txt" --config "config/$cfg.ini" --synthetic 1 --tokens "$PROMPT" \
        -n 16 --temp 0 --set run.prefill_chunk=5 --dump-logits "$tmp/$cfg.chunk.bin"
    [ "$(wc -w <"$tmp/$cfg.1.txt")" -eq 16 ] || { echo "$cfg: expected 16 tokens"; exit 1; }
    for other in 2 4 chunk; do
        compare_dumps "$tmp/$cfg.1.bin" "$tmp/$cfg.1.txt" "$tmp/$cfg.$other.bin" "$tmp/$cfg.$other.txt"
    done
done

# run.uniform_routing (benchmarks): the experts follow (layer, sequence, position) alone, so
# ranks and prefill chunks still agree; the tokens are not the router's.
for v in 1 2 chunk; do
    np=$v extra=()
    [ "$v" = chunk ] && np=2 extra=(--set run.prefill_chunk=5)
    dec "$np" "$tmp/u.$v.txt" --config config/tiny.ini --synthetic 1 --tokens "$PROMPT" -n 16 \
        --temp 0 --set run.uniform_routing=1 "${extra[@]}" --dump-logits "$tmp/u.$v.bin"
done
for other in 2 chunk; do
    compare_dumps "$tmp/u.1.bin" "$tmp/u.1.txt" "$tmp/u.$other.bin" "$tmp/u.$other.txt"
done
! cmp -s "$tmp/u.1.txt" "$tmp/tiny.1.txt" || { echo "uniform routing gave the router's tokens"; exit 1; }
grep -q "run.uniform_routing: every row's experts are drawn uniformly" "$tmp/u.1.txt.err" ||
    { echo "no uniform-routing notice"; exit 1; }

# Sampling: the same tokens at every rank count, and not the greedy ones.
for np in 1 2 4; do
    dec "$np" "$tmp/s.$np.txt" --config config/tiny.ini --synthetic 1 --tokens "$PROMPT" -n 16 \
        --temp 0.8 --top-k 20 --seed 3
done
cmp -s "$tmp/s.1.txt" "$tmp/s.2.txt" && cmp -s "$tmp/s.1.txt" "$tmp/s.4.txt" ||
    { echo "sampled tokens differ: $(cat "$tmp"/s.{1,2,4}.txt)"; exit 1; }
! cmp -s "$tmp/s.1.txt" "$tmp/tiny.1.txt" || { echo "sampling gave the greedy tokens"; exit 1; }
echo "  sampled (temp 0.8, top-k 20, seed 3): $(cat "$tmp/s.1.txt") at 1, 2, 4 ranks"
echo "rank invariance ok"
