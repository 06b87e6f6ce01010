#!/usr/bin/env bash
# Pipeline parallelism end to end on the tiny model (4 layers):
#   - k25dec at (tp, pp) = (1,1), (2,1), (1,2), (2,2), (1,4), and pp 2 with uneven layers
#     (run.pp_layers = 1,3) and a chunked prefill: the same greedy tokens and the same logits
#     (--dump-logits, within 1e-5 of the row's largest logit) as one rank; sampling with a seed
#     gives the one-rank tokens too;
#   - tests/test_pipeline.c on 1, 2 and 4 ranks: batched model_step (micro-batches over the
#     stages), captured hidden states and the engine against a one-rank reference;
#   - k25bench --pp 2 on 2 and 4 ranks: the stage layout in the description and a table row
#     with every request completed per concurrency level;
#   - --dump-config shows the stage layout;
#   - bad splits (--pp 3 on 4 ranks, more stages than layers, pp_layers that do not add up)
#     stop every rank with status 1 and a message naming the problem, for k25dec and k25bench;
#   - run.sim_tp with stages: a notice that the outputs are not the model's, no logits dump.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
BUILD=${K25_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PROMPT=3,1,4,1,5,9,2,6,5,3,5,8,9,7

dec() { # np out args...
    local np=$1 out=$2
    shift 2
    timeout 120 mpirun -np "$np" ./k25dec "$@" >"$out" 2>"$out.err" ||
        { cat "$out.err"; fail "k25dec failed: mpirun -np $np ./k25dec $*"; }
}

# compare A.bin A.txt B.bin B.txt: same tokens, same dump rows, logits within 1e-5 relative.
compare() {
    python3 - "$@" <<'EOF'
import sys
sys.path.insert(0, 'tests/py')
import numpy as np
from k25logits import read
a, b = read(sys.argv[1]), read(sys.argv[3])
ta, tb = open(sys.argv[2]).read().split(), open(sys.argv[4]).read().split()
assert ta == tb, 'tokens differ: %s vs %s' % (ta, tb)
assert len(a.pos) > 0 and np.array_equal(a.pos, b.pos) and np.array_equal(a.tok, b.tok), \
    'dump rows differ'
x, y = a.logits.astype(np.float64), b.logits.astype(np.float64)
worst = float((np.abs(x - y).max(axis=1) / np.abs(x).max(axis=1)).max())
assert worst <= 1e-5, 'logits differ by %.3g of the row maximum' % worst
print('  %s: %d tokens, %d rows, worst relative difference %.2e' % (sys.argv[3].split('/')[-1], len(tb), len(b.pos), worst))
EOF
}

# ---- k25dec: every (tp, pp) against one rank ----
common=(--config config/tiny.ini --synthetic 1 --tokens "$PROMPT" -n 12 --temp 0)
dec 1 "$tmp/ref.txt" "${common[@]}" --dump-logits "$tmp/ref.bin"
[ "$(wc -w <"$tmp/ref.txt")" -eq 12 ] || fail "expected 12 tokens from one rank"
runs=("2 tp2 --pp 1" "2 pp2 --pp 2" "4 tp2pp2 --pp 2" "4 pp4 --pp 4"
      "2 pp2_13 --pp 2 --set run.pp_layers=1,3" "4 pp4_chunk --pp 4 --set run.prefill_chunk=5"
      "4 tp2pp2_chunk --pp 2 --set run.prefill_chunk=3 --set run.pp_layers=3,1")
for r in "${runs[@]}"; do
    read -r np name args <<<"$r"
    # shellcheck disable=SC2086
    dec "$np" "$tmp/$name.txt" "${common[@]}" $args --dump-logits "$tmp/$name.bin"
    compare "$tmp/ref.bin" "$tmp/ref.txt" "$tmp/$name.bin" "$tmp/$name.txt"
done
grep -q "k25dec: pipeline stage 1: layers 2-3 (2) + final norm, lm_head; ranks 2-3" "$tmp/tp2pp2.txt.err" ||
    { cat "$tmp/tp2pp2.txt.err"; fail "no stage layout in the start-up summary"; }

# Sampling: the same tokens as one rank, and not the greedy ones.
samp=(--config config/tiny.ini --synthetic 1 --tokens "$PROMPT" -n 12 --temp 0.8 --top-k 20 --seed 3)
dec 1 "$tmp/s1.txt" "${samp[@]}"
dec 4 "$tmp/s4.txt" "${samp[@]}" --pp 4
cmp -s "$tmp/s1.txt" "$tmp/s4.txt" || fail "sampled tokens differ: $(cat "$tmp/s1.txt") vs $(cat "$tmp/s4.txt")"
! cmp -s "$tmp/s1.txt" "$tmp/ref.txt" || fail "sampling gave the greedy tokens"
echo "ok   k25dec: tokens and logits equal at tp x pp = 1x1, 2x1, 1x2, 2x2, 1x4 (chunked, uneven)"

# ---- batched steps and the engine against a one-rank reference ----
for np in 1 2 4; do
    timeout 300 mpirun -np "$np" "$BUILD/tests/test_pipeline" >"$tmp/tp.$np" 2>&1 ||
        { cat "$tmp/tp.$np"; fail "test_pipeline on $np ranks"; }
    tail -1 "$tmp/tp.$np"
done

# ---- k25bench ----
for np in 2 4; do
    timeout 300 mpirun -np "$np" ./k25bench --config config/tiny.ini --synthetic 1 --pp 2 \
        --concurrency 1,4 --input-len 12 --output-len 6 --profile-steps 1 >"$tmp/bench" \
        2>"$tmp/bench.err" || { cat "$tmp/bench.err"; fail "k25bench --pp 2 on $np ranks"; }
    grep -q "^# ranks: $np (tp $((np / 2)), pp 2)" "$tmp/bench" || fail "k25bench: no ranks line"
    grep -q "^# pipeline stage 0: layers 0-1 (2) + embedding" "$tmp/bench" ||
        fail "k25bench: no stage layout"
    rows=$(awk -F'|' '/^\| *[0-9]/ {gsub(/ /,""); print $2, $3, $5}' "$tmp/bench" | head -2)
    [ "$rows" = $'1 5 30\n4 20 120' ] || { cat "$tmp/bench"; fail "k25bench rows (conc reqs out): '$rows'"; }
done
echo "ok   k25bench --pp 2 on 2 and 4 ranks"

# ---- --dump-config shows the stage layout ----
timeout 60 mpirun -np 4 ./k25dec --pp 2 --set run.pp_layers=3,1 --dump-config >"$tmp/dump" 2>&1 ||
    { cat "$tmp/dump"; fail "--dump-config"; }
grep -q '^pp_layers = 3,1$' "$tmp/dump" && grep -q '^; pipeline: 2 stages$' "$tmp/dump" &&
    grep -q '^;   stage 0: layers 0-2 (3) + embedding$' "$tmp/dump" &&
    grep -q '^;   stage 1: layer 3 + final norm, lm_head$' "$tmp/dump" ||
    { cat "$tmp/dump"; fail "--dump-config: no stage layout"; }
echo "ok   --dump-config shows the stages"

# ---- bad splits: status 1 on every rank, a message, no hang ----
bad() { # program np expected-message args...
    local prog=$1 np=$2 want=$3
    shift 3
    local rc=0
    timeout 60 mpirun -np "$np" "$prog" "$@" >"$tmp/bad" 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || { cat "$tmp/bad"; fail "$prog $*: status $rc, expected 1"; }
    grep -q -- "$want" "$tmp/bad" || { cat "$tmp/bad"; fail "$prog $*: no '$want' message"; }
    echo "ok   $prog $* on $np ranks: $(grep -m1 'error' "$tmp/bad")"
}
bad ./k25dec 4 "run.pp = 3 pipeline stages cannot split the 4 MPI ranks" "${common[@]}" --pp 3
bad ./k25dec 4 "run.pp (4) exceeds the 2 layers" "${common[@]}" --pp 4 --set model.num_hidden_layers=2
bad ./k25dec 2 "run.pp_layers adds up to 3 layers, the model has 4" "${common[@]}" --pp 2 --set run.pp_layers=2,1
bad ./k25dec 2 "run.pp_layers lists 3 stages but run.pp is 2" "${common[@]}" --pp 2 --set run.pp_layers=1,1,2
bad ./k25bench 4 "run.pp = 3 pipeline stages cannot split the 4 MPI ranks" --config config/tiny.ini \
    --synthetic 1 --pp 3 --concurrency 1 --input-len 4 --output-len 2
bad ./k25bench 2 "run.pp_layers: stages 0..1 get more than the 4 layers" --config config/tiny.ini --synthetic 1 \
    --pp 2 --set run.pp_layers=4,1 --concurrency 1 --input-len 4 --output-len 2
# run.sim_tp (a benchmark shard) with stages: the summary says that the tokens are not the
# model's, and logits it computes only part of are not dumped (it ran silently, and the dump's
# rows held the other ranks' share of the vocabulary unwritten)
dec 2 "$tmp/sim.txt" "${common[@]}" --pp 2 --set run.sim_tp=2
grep -q "run.sim_tp = 2: .*outputs are not the model's" "$tmp/sim.txt.err" ||
    { cat "$tmp/sim.txt.err"; fail "no run.sim_tp notice"; }
bad ./k25dec 2 "--dump-logits: run.sim_tp = 2" "${common[@]}" --pp 2 --set run.sim_tp=2 \
    --dump-logits "$tmp/sim.bin"
# A tensor that only the second stage loads is broken: every rank stops with its message (the
# first stage went on into the model's first collective and the job hung).
./k25-mkckpt --config config/tiny.ini --synthetic 5 --out "$tmp/ck" >/dev/null 2>&1 || fail "k25-mkckpt"
python3 - "$tmp/ck" <<'PY' || fail "could not retype the tensor"
import glob, json, struct, sys
name = "language_model.model.layers.3.self_attn.q_a_layernorm.weight"
for p in glob.glob(sys.argv[1] + "/*.safetensors"):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    if name in h:
        h[name]["dtype"] = "F16"  # same size: only the header changes
        j = json.dumps(h).encode()
        j += b" " * ((8 - len(j) % 8) % 8)
        open(p, "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:])
        sys.exit(0)
sys.exit(1)
PY
bad ./k25dec 2 "rank 1: .*layers.3.self_attn.q_a_layernorm.weight': dtype F16" --model "$tmp/ck" \
    --tokens 1,2,3 -n 3 --pp 2
echo "pipeline ok"
