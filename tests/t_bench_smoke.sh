#!/usr/bin/env bash
# k25bench end to end on 2 ranks with the tiny model: the '#' description, the markdown table
# and the JSON lines (every level present, request and token counts as asked, every metric
# positive, median <= p99, throughputs and latencies consistent with each other). No timing
# thresholds. Also: --profile-only (the decode-step table alone), the run.uniform_routing label,
# run.kv_cache_mb (with a draft's cache inside it too), run.prefill_chunk at its bound, and a
# bad command line fails on every rank with a message.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=./k25bench
[ -x "$bin" ] || { echo "missing $bin (build it first)"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

timeout 300 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 1,4 \
    --input-len 16 --output-len 8 --json "$tmp/out.jsonl" >"$tmp/stdout" 2>"$tmp/stderr" \
    || { cat "$tmp/stderr"; fail "k25bench exited non-zero"; }
cat "$tmp/stdout"

# The description comes first, then the table: 2 ranks, the git line, one row per level.
head -1 "$tmp/stdout" | grep -q '^# k25bench: ' || fail "first line is not the '# k25bench' line"
grep -q '^# ranks: 2 (tp 2, pp 1)' "$tmp/stdout" || fail "no '# ranks: 2' line"
for key in date hosts devices git model weights workload; do
    grep -q "^# $key: " "$tmp/stdout" || fail "no '# $key:' line"
done
first_table=$(grep -n '^|' "$tmp/stdout" | head -1 | cut -d: -f1)
last_hash=$(awk '/^\|/{exit} /^#/{n=NR} END{print n}' "$tmp/stdout")
[ "$last_hash" -lt "$first_table" ] || fail "description lines after the table"
# Rows: conc, reqs, in tok, out tok in columns 2..5 (column 1 is empty before the first '|').
rows=$(awk -F'|' '/^\| *[0-9]/ {gsub(/ /,""); print $2, $3, $4, $5}' "$tmp/stdout" | head -2)
[ "$rows" = $'1 5 80 40\n4 20 320 160' ] || fail "table rows (conc reqs in out): '$rows'"

[ -f "$tmp/out.jsonl.tmp" ] && fail "temporary JSON file left behind"
python3 - "$tmp/out.jsonl" <<'PY' || fail "JSON check"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [o["max_concurrency"] for o in lines] == [1, 4], [o["max_concurrency"] for o in lines]
for o in lines:
    c = o["max_concurrency"]
    n = 5 * c
    assert o["num_prompts"] == n and o["completed"] == n, (c, o["num_prompts"], o["completed"])
    assert o["total_input_tokens"] == n * 16, o["total_input_tokens"]
    assert o["total_output_tokens"] == n * 8, o["total_output_tokens"]
    assert o["ranks"] == 2 and o["tp"] == 2, (o["ranks"], o["tp"])
    d = o["duration"]
    assert d > 0
    for k, v in (("request_throughput", n / d), ("output_throughput", n * 8 / d),
                 ("total_token_throughput", n * 24 / d)):
        assert abs(o[k] - v) <= 1e-6 * v, (k, o[k], v)
    for m in ("ttft", "tpot", "itl", "e2el"):
        mean, med, p99 = (o[f"{s}_{m}_ms"] for s in ("mean", "median", "p99"))
        assert mean > 0 and med > 0 and p99 > 0, (c, m, mean, med, p99)
        assert med <= p99, (c, m, med, p99)
    # Per request E2EL = TTFT + 7 x TPOT (8 output tokens), so the means agree too; every
    # token after the first has one ITL: their mean is the TPOT mean when all lengths match.
    e2el = o["mean_ttft_ms"] + 7 * o["mean_tpot_ms"]
    assert abs(o["mean_e2el_ms"] - e2el) <= 1e-6 * e2el, (o["mean_e2el_ms"], e2el)
    assert abs(o["mean_itl_ms"] - o["mean_tpot_ms"]) <= 1e-6 * o["mean_tpot_ms"]
    assert o["mean_ttft_ms"] < o["mean_e2el_ms"] and o["p99_e2el_ms"] <= d * 1000 + 1e-6
    assert o["peak_mem_bytes"] > 0
    p = o["decode_profile"]
    assert p["batch"] == c and p["steps"] == 3, p
    total = sum(p["ms"].values())
    assert abs(total - p["step_ms"]) <= 1e-6 * p["step_ms"] + 1e-9, (total, p["step_ms"])
    # the same steps unprofiled: one token per sequence and step
    g = p["graph_step_ms"]
    assert g > 0 and abs(p["decode_tok_s"] - 1000 * c / g) <= 1e-6 * p["decode_tok_s"], p
print("json ok")
PY

# --profile-only: the decode-step table alone (no serving table), JSON without serving metrics.
timeout 300 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 1,4 \
    --input-len 16 --output-len 8 --profile-only --json "$tmp/po.jsonl" >"$tmp/po.out" 2>&1 \
    || { cat "$tmp/po.out"; fail "--profile-only run"; }
grep -q '| *reqs *|' "$tmp/po.out" && fail "--profile-only printed the serving table"
rows=$(awk -F'|' '/^\| *[0-9]/ {gsub(/ /,""); print $2, $3}' "$tmp/po.out")
[ "$rows" = $'1 16\n4 16' ] || fail "--profile-only decode rows (conc ctx): '$rows'"
python3 - "$tmp/po.jsonl" <<'PY' || fail "--profile-only JSON check"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [o["decode_profile"]["batch"] for o in lines] == [1, 4], lines
for o in lines:
    assert o["profile_only"] is True and "output_throughput" not in o, sorted(o)
    assert o["decode_profile"]["graph_step_ms"] > 0 and o["peak_mem_bytes"] > 0
PY

# run.uniform_routing: labelled in the description and the JSON.
timeout 120 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --set run.uniform_routing=1 \
    --concurrency 2 --input-len 8 --output-len 4 --profile-only --json "$tmp/ur.jsonl" >"$tmp/ur.out" 2>&1 \
    || { cat "$tmp/ur.out"; fail "uniform routing run"; }
grep -q "^# UNIFORM ROUTING: every row's experts drawn uniformly" "$tmp/ur.out" || fail "no uniform-routing label"
python3 -c "import json,sys; o=json.loads(open(sys.argv[1]).readline()); assert o['uniform_routing'] is True" \
    "$tmp/ur.jsonl" || fail "no uniform_routing in the JSON"
grep -q uniform_routing "$tmp/po.jsonl" && fail "uniform_routing in the JSON of a run without it"

# Bad command lines: every rank exits non-zero, with a message.
out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --profile-only \
    --spec-draft ngram 2>&1) && fail "--profile-only with --spec-draft accepted"
grep -q -- "--profile-only times plain decode steps" <<<"$out" || fail "no message about --profile-only: $out"
out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini 2>&1) && fail "--config without --synthetic accepted"
grep -q -- "--synthetic" <<<"$out" || fail "no hint about --synthetic: $out"
out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 0 2>&1) \
    && fail "--concurrency 0 accepted"
# Two outputs on one file are refused before loading (--json was lost under the plot's PNG).
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --json "$tmp/same.png" \
      --plot "$tmp/./same.png" 2>&1) && fail "--json and --plot on one file accepted"
grep -q -- "--json and --plot name one file" <<<"$out" || fail "no message about one file: $out"

# --json into a named pipe: opened once, so its reader gets every level's line and the run ends
# (a pipe reopened per level handed the reader an end of file after the first, then hung).
mkfifo "$tmp/pipe"
cat "$tmp/pipe" >"$tmp/piped" &
reader=$!
timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 1,2 --input-len 8 \
    --output-len 4 --no-warmup --profile-steps 0 --json "$tmp/pipe" >/dev/null 2>"$tmp/pipe.err" ||
    { cat "$tmp/pipe.err"; fail "--json into a pipe: exit $?"; }
wait $reader
[ "$(grep -c '"max_concurrency"' "$tmp/piped")" -eq 2 ] || fail "--json into a pipe: $(cat "$tmp/piped")"

# A plot that fails fails the run, naming --plot; the results are still on stdout and in --json.
# (python3 here stands in for one with matplotlib; plot.py for one that fails, then works.)
mkdir -p "$tmp/py"
printf '#!/bin/sh\n[ "$1" = -c ] && exit 0\nexec %s "$@"\n' "$(command -v python3)" >"$tmp/py/python3"
chmod +x "$tmp/py/python3"
echo 'import sys; sys.exit("plot.py: no plot today")' >"$tmp/badplot.py"
echo 'import sys; assert open(sys.argv[3]).read(); open(sys.argv[2], "w").write("png")' \
    >"$tmp/goodplot.py"
for v in bad good; do
    PATH="$tmp/py:$PATH" K25_PLOT_PY="$tmp/${v}plot.py" timeout 60 "$bin" --config config/tiny.ini \
        --synthetic 1 --concurrency 1 --input-len 8 --output-len 4 --no-warmup --profile-steps 0 \
        --json "$tmp/p.jsonl" --plot "$tmp/$v.png" >"$tmp/plot.out" 2>&1
    rc=$?
    case $v in
    bad) [ $rc -ne 0 ] && grep -q -- "--plot $tmp/bad.png: plotting failed" "$tmp/plot.out" &&
             [ -s "$tmp/p.jsonl" ] || fail "a failed plot: exit $rc, $(cat "$tmp/plot.out")";;
    good) [ $rc -eq 0 ] && [ -s "$tmp/good.png" ] || fail "a plot: exit $rc, $(cat "$tmp/plot.out")";;
    esac
done
# With --json into a pipe the plot reads the lines from a file of its own (reading the pipe
# back waited forever).
cat "$tmp/pipe" >/dev/null &
reader=$!
PATH="$tmp/py:$PATH" K25_PLOT_PY="$tmp/goodplot.py" timeout 60 "$bin" --config config/tiny.ini \
    --synthetic 1 --concurrency 1 --input-len 8 --output-len 4 --no-warmup --profile-steps 0 \
    --json "$tmp/pipe" --plot "$tmp/piped.png" >"$tmp/plot.out" 2>&1
rc=$?
wait $reader
[ $rc -eq 0 ] && [ -s "$tmp/piped.png" ] || fail "--json into a pipe with --plot: exit $rc, $(cat "$tmp/plot.out")"

out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --profile-only --plot "$tmp/po.png" 2>&1) &&
    fail "--profile-only with --plot accepted"
grep -q -- "--profile-only runs none" <<<"$out" || fail "no message about --plot with --profile-only: $out"

# An empty item of a list is refused, not skipped.
for v in "--concurrency 1,,2" "--concurrency 1," "--spec-accept 0.5,"; do
    out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --spec-draft ngram $v 2>&1) &&
        fail "$v accepted"
    grep -q -- "${v%% *}: '' is not" <<<"$out" || fail "$v: no message about the empty item: $out"
done
# A context past the model's is named: run.ctx_size when it was set there, else the lengths
# (and the breakdown's decode steps when they are what does not fit).
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --input-len 8 --output-len 4 \
      --set run.ctx_size=5000 2>&1) && fail "run.ctx_size 5000 accepted"
grep -q "run.ctx_size (5000) exceeds model.max_position_embeddings (4096)" <<<"$out" ||
    fail "no message naming run.ctx_size: $out"
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --input-len 4094 --output-len 1 2>&1) \
    && fail "4094 + the breakdown's 9 tokens accepted"
grep -q "input 4094 + output 9 tokens (the breakdown's decode steps) exceed" <<<"$out" ||
    fail "no message naming the breakdown: $out"
# A block table of every sequence slot's whole context past int (128 x 2^24 one-token blocks)
# was left unallocated and the first step crashed; it is refused before the load.
big=(--set run.ctx_size=16777216 --set model.max_position_embeddings=16777216
     --set run.kv_block_size=1)
out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 "${big[@]}" \
      --concurrency 128 --input-len 4 --output-len 2 --profile-only 2>&1) &&
    fail "a block table of 2^31 entries accepted"
grep -q "for 128 sequences makes a block table of 2147483648 entries, more than 2147483647" \
    <<<"$out" || fail "no block table message: $out"
grep -q "model ready" <<<"$out" && fail "the block table refused after the load"
# The same refusal when the requests' lengths, not run.ctx_size, make the table: the block count
# for 256 slots x 16777208 positions overflowed int on its way there (an abort under SAN=1).
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 "${big[@]:2}" --concurrency 256 \
      --input-len 16777200 --output-len 1 2>&1) && fail "a block table of 256 x 16777208 accepted"
grep -q "for 256 sequences makes a block table of 4294965504 entries, more than 2147483647" \
    <<<"$out" || fail "no block table message for the requests' lengths: $out"
# An unknown word is named as unknown, also as the last argument; a known flag there lacks its value.
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --bogus 2>&1) && fail "--bogus accepted"
grep -q "unknown option '--bogus'" <<<"$out" || fail "no 'unknown option' message: $out"
out=$(timeout 60 "$bin" --config config/tiny.ini --synthetic 1 --seed 2>&1) && fail "--seed without value accepted"
grep -q -- "--seed: missing value" <<<"$out" || fail "no 'missing value' message: $out"
out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --json /nonexistent/x.jsonl 2>&1) \
    && fail "an unwritable --json path accepted"
grep -q "cannot create /nonexistent/x.jsonl.tmp" <<<"$out" || fail "no message about the --json path: $out"

# run.kv_cache_mb caps the cache: a tiny-model block of 16 tokens takes 4 layers x 16 x 40 values
# x 4 bytes = 10 KiB, so 1 MiB holds 102 blocks where 8 requests of 256 + 16 tokens want 8 x 17.
# Requests wait for blocks and all complete; a request that cannot fit alone, or a breakdown
# whose whole batch cannot, is refused before the weights load.
cap=(--config config/tiny.ini --synthetic 1 --no-warmup --set run.kv_block_size=16 --set run.kv_cache_mb=1)
timeout 120 mpirun -np 2 "$bin" "${cap[@]}" --concurrency 8 --input-len 256 --output-len 16 \
    --profile-steps 0 --json "$tmp/cap.jsonl" >"$tmp/cap.out" 2>"$tmp/cap.err" || { cat "$tmp/cap.err"; fail "capped run"; }
grep -q "^model: 102 cache blocks of 16 tokens, capped from 136" "$tmp/cap.err" || fail "no cap line: $(cat "$tmp/cap.err")"
grep -q "^# CACHE CAP: at most 1 MiB" "$tmp/cap.out" || fail "no CACHE CAP label"
python3 -c "import json, sys; o = json.loads(open(sys.argv[1]).readline())
assert o['kv_cache_mb'] == 1 and o['completed'] == o['num_prompts'] == 40, o" "$tmp/cap.jsonl" || fail "capped run's JSON"
# A draft's cache shares the cap block for block: config/tiny_draft.ini adds 2 layers x 24 values
# a token, so a block takes 16 x (160 + 48) x 4 bytes and 1 MiB holds 78.
timeout 120 mpirun -np 2 "$bin" "${cap[@]}" --concurrency 8 --input-len 256 --output-len 16 \
    --profile-steps 0 --spec-draft model:config/tiny_draft.ini --spec-k 3 --json "$tmp/capd.jsonl" \
    >"$tmp/capd.out" 2>"$tmp/capd.err" || { cat "$tmp/capd.err"; fail "capped run with a draft"; }
grep -q "^model: 78 cache blocks of 16 tokens, capped from 136" "$tmp/capd.err" ||
    fail "no cap line with a draft: $(cat "$tmp/capd.err")"
grep -q "^# CACHE CAP: at most 1 MiB of latent cache a rank (run.kv_cache_mb, the draft's included)" \
    "$tmp/capd.out" || fail "no CACHE CAP label with a draft"
python3 -c "import json, sys
(o,) = [json.loads(l) for l in open(sys.argv[1])]
sp = o['speculative'][0]
assert o['completed'] == o['num_prompts'] == 40 and o['total_output_tokens'] == 640, o
assert sp['rounds'] > 0 and round(sp['output_throughput'] * sp['duration']) == 640, sp" \
    "$tmp/capd.jsonl" || fail "capped run with a draft: not every token out, plain or speculative"
# run.prefill_chunk at its bound (2^24): a step prefills at most the level's prompts (4 x 16), so
# the buffers stop there, for the target and a draft alike (2^24 rows ran out of memory); the
# setting is reported as given.
timeout 120 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --no-warmup --concurrency 4 \
    --input-len 16 --output-len 4 --profile-steps 0 --spec-draft model:config/tiny_draft.ini \
    --set run.prefill_chunk=16777216 >"$tmp/chunk.out" 2>"$tmp/chunk.err" ||
    { cat "$tmp/chunk.err"; fail "run.prefill_chunk = 2^24 with a draft"; }
grep -q "run.prefill_chunk 16777216: steps hold at most the largest level's prompts, 64 rows" \
    "$tmp/chunk.err" || fail "no note of the rows a step holds: $(cat "$tmp/chunk.err")"
grep -q "^# engine: ctx 512, kv_block 64, prefill_chunk 16777216," "$tmp/chunk.out" ||
    fail "run.prefill_chunk not reported as given: $(grep '^# engine' "$tmp/chunk.out")"
out=$(timeout 120 mpirun -np 2 "$bin" "${cap[@]}" --concurrency 8 --input-len 256 --output-len 16 2>&1) \
    && fail "a breakdown past the cap accepted"
grep -q "holds 102 cache blocks of 16 tokens; the breakdown, 8 sequences at once .*, needs 136" <<<"$out" ||
    fail "no breakdown cap message: $out"
grep -q "model ready" <<<"$out" && fail "the breakdown's cap refused after the load"
out=$(timeout 120 mpirun -np 2 "$bin" "${cap[@]}" --concurrency 1 --input-len 2000 --output-len 8 \
      --profile-steps 0 --set run.ctx_size=2048 2>&1) && fail "a request past the cap accepted"
grep -q "run.kv_cache_mb=1 holds 102 cache blocks of 16 tokens; a request of 2007 positions needs 126" <<<"$out" ||
    fail "no request cap message: $out"

# run.sim_tp=2: one rank holds what rank 0 of a real 2-rank run holds (less than a whole model)
# and says that it simulates; on 2 ranks, sim_tp=4 gives each what a rank of a real 4-rank run
# holds; a sim_tp that is not a larger multiple of the ranks is refused.
gib() { grep -o '[0-9.]* GiB per rank' "$1" | head -1 | cut -d' ' -f1; }
timeout 120 mpirun -np 1 "$bin" --config config/tiny.ini --synthetic 1 --set run.sim_tp=2 \
    --concurrency 2 --input-len 8 --output-len 4 >"$tmp/sim.out" 2>&1 || { cat "$tmp/sim.out"; fail "sim_tp run"; }
grep -q "^# SIMULATED SHARD: one rank runs rank 0's share of tp 2" "$tmp/sim.out" || fail "no simulated-shard label"
timeout 120 mpirun -np 1 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 2 \
    --input-len 8 --output-len 4 >"$tmp/one.out" 2>&1 || fail "tp 1 run"
python3 -c "import sys; s, w = float(sys.argv[1]), float(sys.argv[2]); assert s < w, (s, w)" \
    "$(gib "$tmp/sim.out")" "$(gib "$tmp/one.out")" || fail "sim_tp weights not smaller than tp 1's"
grep -q "$(gib "$tmp/stdout") GiB per rank" "$tmp/sim.out" || fail "sim_tp=2 per-rank weights differ from a real tp 2 rank's"
timeout 120 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --set run.sim_tp=4 \
    --concurrency 2 --input-len 8 --output-len 4 >"$tmp/sim4.out" 2>&1 || { cat "$tmp/sim4.out"; fail "sim_tp=4 on 2 ranks"; }
grep -q "^# SIMULATED SHARD: 2 TP ranks run ranks 0..1's shares of tp 4" "$tmp/sim4.out" || fail "no 2-rank simulated-shard label"
timeout 120 mpirun -np 4 "$bin" --config config/tiny.ini --synthetic 1 --concurrency 2 \
    --input-len 8 --output-len 4 >"$tmp/four.out" 2>&1 || { cat "$tmp/four.out"; fail "tp 4 run"; }
grep -q "$(gib "$tmp/four.out") GiB per rank" "$tmp/sim4.out" || fail "sim_tp=4 per-rank weights on 2 ranks differ from a real tp 4 rank's"
for bad in 2 3; do
    out=$(timeout 60 mpirun -np 2 "$bin" --config config/tiny.ini --synthetic 1 --set run.sim_tp=$bad 2>&1) \
        && fail "run.sim_tp=$bad on 2 ranks accepted"
    grep -q "run.sim_tp = $bad simulates a larger run than the 2 TP ranks" <<<"$out" || fail "no message about sim_tp=$bad on 2 ranks: $out"
done
echo "t_bench_smoke: ok"
