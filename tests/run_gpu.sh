#!/usr/bin/env bash
# The GPU test suite (needs a CUDA GPU; `make CUDA=1 test-gpu` builds and runs it):
#   1. every backend op against the CPU reference (tests/gpu_ops) at the tiny configs and at
#      Kimi-K2.5's per-rank shapes for TP8 and TP2 (one GPU simulates one rank's slice), and an
#      expert id outside the model stopping the step with its error;
#   2. the golden tiny models through k25dec --backend cuda (f32 latent cache) against the transformers reference
#      logits (cosine >= 0.999 per row, >= 16 greedy tokens equal), with and without CUDA
#      graphs, with the shared-expert overlap off, on 1 rank and on 2 ranks when 2 GPUs are
#      visible (one-shot fused all-reduce + add + RMSNorm, and NCCL only);
#   3. a full-dimension synthetic Kimi-K2.5 (K25_FULL_LAYERS layers, default 8) decoding on one
#      GPU with finite logits, and its time per token and per MoE layer at batch 1; a kernel
#      trace of a tiny model's decode steps (k25bench --trace);
#   4. speculative decoding (every draft source, 1 and 2 ranks): the same greedy ids as plain;
#   5. pipeline stages: TP1 x PP2 gives the ids of TP2 and of one GPU (2 GPUs);
#   6. a rank SIGKILLed mid-decode, and SIGTERM, on two GPUs (tests/t_rank_kill.sh);
#   7. compute-sanitizer memcheck and racecheck over the op checks, a decode and the one-shot
#      all-reduce (K25_NO_SANITIZER=1 skips them).
# Each check prints one line ("ok"/"FAIL"); a failure does not stop the others. Logs of every
# check are appended to $K25_GPU_LOG (default $BUILD/gpu-tests.log). Ends with
# "N passed, N failed" and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOG=${K25_GPU_LOG:-$BUILD/gpu-tests.log}
K25=${K25_DEC:-./k25dec}
BENCH=${K25_BENCH:-./k25bench}
OPS=${K25_GPU_OPS:-$BUILD/tests/gpu_ops}
FULL_LAYERS=${K25_FULL_LAYERS:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0; failed=()
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "# GPUs visible: $ngpu; log: $LOG"

# check NAME TIMEOUT CMD...: runs CMD, logs its output, one result line.
# K25_GPU_ONLY=REGEX runs only the checks whose names match.
check() {
    local name=$1 limit=$2; shift 2
    if [ -n "${K25_GPU_ONLY:-}" ] && ! [[ $name =~ $K25_GPU_ONLY ]]; then return 0; fi
    local start=$(date +%s) out="$tmp/$name.out"
    { echo; echo "===== $name: $*"; } >>"$LOG"
    # --foreground: stay in the caller's process group, so a timeout around this whole script
    # also stops the command running now
    timeout --foreground "$limit" "$@" >"$out" 2>&1
    local rc=$?
    cat "$out" >>"$LOG"
    local secs=$(( $(date +%s) - start ))
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1)); echo "ok   $name (${secs}s) $(grep -E 'passed|worst cosine|per MoE layer' "$out" | tail -1)"
    else
        fail=$((fail + 1)); failed+=("$name")
        echo "FAIL $name (rc $rc, ${secs}s)"
        grep -E '^FAIL|error|Error' "$out" | head -12 | sed 's/^/     /'
        tail -4 "$out" | sed 's/^/     | /'
    fi
}

# selected NAME...: every named check passes K25_GPU_ONLY. A comparison of two runs' logits runs
# only with both runs (skipped, not failed on a missing file, when the filter leaves one out).
selected() {
    local n
    for n; do [ -z "${K25_GPU_ONLY:-}" ] || [[ $n =~ $K25_GPU_ONLY ]] || return 1; done
}

# ---- 1. ops against the CPU reference ----
if [ -x "$OPS" ]; then
    check ops_tiny 300 "$OPS" --config config/tiny.ini
    check ops_tiny_tp2_r1 300 "$OPS" --config config/tiny.ini --tp 2 --rank 1 --rows 1,5,33
    check ops_tiny_tp4_r3 300 "$OPS" --config config/tiny.ini --tp 4 --rank 3 --rows 1,7
    check ops_group_tp2_r0 300 "$OPS" --config config/tiny_group.ini --tp 2 --rank 0 --rows 1,9,40
    check ops_kimi_tp8_r3 600 "$OPS" --config config/kimi_k25.ini --tp 8 --rank 3 \
        --set model.num_hidden_layers=2 --rows 1,5,16,67 --ctx 600
    # run.uniform_routing: the router's ids replaced on the device exactly as on the CPU: drawn
    # by the warp top-k's warps (up to 16 rows before its routing sort, whose moe then follows;
    # 16 of 16 experts: fewer distinct candidates than choices, the warp's fallback), and by the
    # block top-k's thread (K25_ROUTER_BLOCK=1)
    check ops_kimi_tp8_uniform_routing 300 "$OPS" --config config/kimi_k25.ini --tp 8 --rank 3 \
        --set model.num_hidden_layers=2 --set run.uniform_routing=1 --rows 1,5,16,67 --ctx 600 \
        --only router
    check ops_tiny_uniform_routing_every_expert 300 "$OPS" --config config/tiny.ini \
        --set model.num_experts_per_tok=16 --set run.uniform_routing=1 --rows 1,5,33 --only router
    check ops_kimi_tp8_uniform_routing_block 300 env K25_ROUTER_BLOCK=1 "$OPS" \
        --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2 \
        --set run.uniform_routing=1 --rows 1,5 --ctx 600 --only router
    # above 16 rows the grouped GEMM runs items of up to 16 slots on its 2-tile instantiation;
    # K25_MOE_PASS=32 keeps items of up to 32 on the 4-tile one
    check ops_kimi_tp8_moe_pass32 300 env K25_MOE_PASS=32 "$OPS" --config config/kimi_k25.ini \
        --tp 8 --rank 3 --set model.num_hidden_layers=2 --rows 17,67 --ctx 600 --only moe
    # the down GEMM's row groups (from 128 rows, one-chunk tiles of TP8): 4 row-blocks a unit
    # at 128 and 256 rows of random choices, 2 at 128 rows on the same 8 experts (64 items)
    check ops_kimi_tp8_moe_row_groups 300 "$OPS" --config config/kimi_k25.ini --tp 8 --rank 3 \
        --set model.num_hidden_layers=2 --rows 128,256 --ctx 600 --only moe
    # split plans: above 8 rows every step over-splits (K25_MOE_OVER_ROWS); the plans of
    # every step from 1 row, and of none but long items' steps
    check ops_kimi_tp8_moe_over_rows0 300 env K25_MOE_OVER_ROWS=0 "$OPS" \
        --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2 \
        --rows 1,5,16 --ctx 600 --only moe
    check ops_kimi_tp8_moe_over_rows_never 300 env K25_MOE_OVER_ROWS=100000 "$OPS" \
        --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2 \
        --rows 12,17,67 --ctx 600 --only moe
    # the down GEMM waiting for the whole of gate+up, not for each item's rows (K25_MOE_FLOW_ROWS
    # 0), and taking items as they finish from 2 rows (the default starts at 5)
    check ops_kimi_tp8_moe_flow_never 300 env K25_MOE_FLOW_ROWS=0 "$OPS" \
        --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2 \
        --rows 5,16,67 --ctx 600 --only moe
    check ops_kimi_tp8_moe_flow_from2 300 env K25_MOE_FLOW_ROWS=2 "$OPS" \
        --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2 \
        --rows 2,3 --ctx 600 --only moe
    # the grouped W4A16 GEMM is compiled apart for bf16 activations (no hi/lo split)
    check ops_kimi_tp8_moe_bf16act 300 env K25_BF16_ACTIVATIONS=1 "$OPS" --config config/kimi_k25.ini \
        --tp 8 --rank 3 --set model.num_hidden_layers=2 --rows 1,5,16,67 --ctx 600 --only moe
    # an expert id outside [0, E) stops the step with the error, at one row (whose GEMMs skip the
    # item no id made) and at five; under compute-sanitizer memcheck where it runs (section 7's
    # tool), so that the way there reads and writes nothing outside the buffers
    bad=("$OPS" --config config/kimi_k25.ini --tp 8 --rank 3 --set model.num_hidden_layers=2
         --set model.vocab_size=32768 --set tokens.bos_token_id=1 --set tokens.eos_token_ids=2
         --set tokens.pad_token_id=3 --ctx 100 --only moe_bad_id)
    san=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
    if [ -x "$san" ] && [ -z "${K25_NO_SANITIZER:-}" ]; then
        bad=("$san" --tool memcheck --report-api-errors no "${bad[@]}")
    fi
    for r in 1 5; do
        check ops_kimi_tp8_moe_bad_id_r$r 300 bash -c '"$@" >"$0" 2>&1; rc=$?; cat "$0"
            [ $rc -ne 0 ] && grep -q "moe: an expert index outside" "$0" &&
                { ! grep -q "ERROR SUMMARY" "$0" || grep -q "ERROR SUMMARY: 0 errors" "$0"; }' \
            "$tmp/bad_id_r$r.out" "${bad[@]}" --rows $r
    done
    check ops_mla_f32cache 300 env K25_KV_F32=1 "$OPS" --config config/kimi_k25.ini --tp 8 --rank 0 \
        --set model.num_hidden_layers=2 --rows 1 --ctx 400 --only mla
    check ops_mla_64heads 300 "$OPS" --config config/kimi_k25.ini --tp 1 \
        --set model.num_hidden_layers=1 --set model.vocab_size=32768 --set tokens.bos_token_id=1 \
        --set tokens.eos_token_ids=2 --set tokens.pad_token_id=3 --rows 1 --ctx 600 --only mla
    # an odd head count: prefill chunks of an odd row count at one chunk a row leave the merge's
    # partials off 16-byte alignment (its 4-dims-a-thread path must not take them)
    check ops_mla_3heads 300 "$OPS" --config config/tiny.ini --set model.num_attention_heads=3 \
        --rows 1 --only mla
    check ops_golden_group_file 300 "$OPS" --model tests/data/golden_group --rows 1,24
    check ops_kimi_tp2_r1 600 "$OPS" --config config/kimi_k25.ini --tp 2 --rank 1 \
        --set model.num_hidden_layers=2 --set model.vocab_size=32768 --set tokens.bos_token_id=1 \
        --set tokens.eos_token_ids=2 --set tokens.pad_token_id=3 --rows 1,4 --ctx 300
else
    fail=$((fail + 1)); failed+=(gpu_ops); echo "FAIL gpu_ops: $OPS not built (make CUDA=1)"
fi

# ---- 2. golden models ----
golden() { # golden NAME DIR NP [ENV...]
    local name=$1 dir=$2 np=$3; shift 3
    local prompt n_gen n_prompt
    prompt=$(awk '$1 == "prompt" { $1 = ""; print }' "$dir/tokens.txt" | xargs | tr ' ' ',')
    n_prompt=$(awk '$1 == "prompt" { print NF - 1 }' "$dir/tokens.txt")
    n_gen=$(awk '$1 == "continuation" { print NF - 1 }' "$dir/tokens.txt")
    check "$name" 300 env "$@" bash -c "mpirun -np $np $K25 --model $dir --backend cuda --tokens $prompt \
        -n $n_gen --temp 0 --threads 1 --dump-logits $tmp/$name.k25logits >$tmp/$name.stdout && \
        python3 tests/py/compare_gpu.py $dir/reference.k25logits $tmp/$name.k25logits \
        --n-prompt $n_prompt --min-cos 0.999 --min-gen 16 --label $name"
}
if [ -x "$K25" ]; then
    for d in tests/data/golden_tiny tests/data/golden_group; do
        [ -f "$d/reference.k25logits" ] || continue
        n=$(basename "$d")
        # f32 latent cache: the reference is float32 and routing flips on near-ties amplify the
        # bf16 cache's rounding at these tiny sizes (K25_KV_F32 is the backend's exact mode)
        golden "${n}_np1_graph" "$d" 1 K25_KV_F32=1
        golden "${n}_np1_nograph" "$d" 1 K25_KV_F32=1 K25_NO_GRAPH=1
        # the shared expert on the main stream (default: a side stream beside the routed experts)
        golden "${n}_np1_no_overlap" "$d" 1 K25_KV_F32=1 K25_NO_OVERLAP=1
        # same kernels on the same inputs, only the streams differ: the logits must be the same
        # bits (a race between the branches would show here first)
        selected "${n}_np1_graph" "${n}_np1_no_overlap" &&
            check "${n}_overlap_same_bits" 30 cmp "$tmp/${n}_np1_graph.k25logits" \
            "$tmp/${n}_np1_no_overlap.k25logits"
        # kernels launched without programmatic dependent launch: a kernel that reads or writes
        # before its griddepcontrol.wait would race with the previous kernel and change bits
        golden "${n}_np1_no_pdl" "$d" 1 K25_KV_F32=1 K25_NO_PDL=1
        selected "${n}_np1_graph" "${n}_np1_no_pdl" &&
            check "${n}_pdl_same_bits" 30 cmp "$tmp/${n}_np1_graph.k25logits" \
            "$tmp/${n}_np1_no_pdl.k25logits"
        # the router's block-per-row top-k (the fallback for large shapes) against the warp one
        golden "${n}_np1_router_block" "$d" 1 K25_KV_F32=1 K25_ROUTER_BLOCK=1
        selected "${n}_np1_graph" "${n}_np1_router_block" &&
            check "${n}_router_block_same_bits" 30 cmp "$tmp/${n}_np1_graph.k25logits" \
            "$tmp/${n}_np1_router_block.k25logits"
        if [ "$ngpu" -ge 2 ]; then
            golden "${n}_np2_graph" "$d" 2 K25_KV_F32=1
            golden "${n}_np2_nccl_only" "$d" 2 K25_KV_F32=1 K25_ONESHOT=0
        fi
    done

    # ---- the one-shot NVLink all-reduce against NCCL and the host ----
    AR=$BUILD/tests/gpu_allreduce
    if [ "$ngpu" -ge 2 ] && [ -x "$AR" ]; then
        check gpu_allreduce 300 mpirun -np 2 "$AR"
        check gpu_allreduce_timeout 120 mpirun -np 2 "$AR" --timeout-check
    fi

    # ---- 3. full-dimension synthetic model ----
    full() {
        local name=$1; shift
        check "$name" 600 bash -c "$K25 --config config/kimi_k25.ini --synthetic 1 --backend cuda \
            --set model.num_hidden_layers=$FULL_LAYERS --set run.ctx_size=1024 $* \
            --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 32 --temp 0 --print-ids \
            --dump-logits $tmp/$name.k25logits 2>&1 && python3 - $tmp/$name.k25logits $FULL_LAYERS <<'PY'
import sys, numpy as np
sys.path.insert(0, 'tests/py')
from k25logits import read
d = read(sys.argv[1]); n = len(d.pos)
bad = int((~np.isfinite(d.logits).all(axis=1)).sum())
print(f'{n} logit rows, {bad} with NaN/Inf')
sys.exit(1 if bad or n == 0 else 0)
PY"
    }
    full "full_${FULL_LAYERS}layers_graph"
    # every kernel at Kimi shapes (clusters, tensor-core MLA, W4A16) with and without
    # programmatic dependent launch: same bits
    K25_NO_PDL=1 full "full_${FULL_LAYERS}layers_no_pdl"
    selected "full_${FULL_LAYERS}layers_graph" "full_${FULL_LAYERS}layers_no_pdl" &&
        check "full_${FULL_LAYERS}layers_pdl_same_bits" 30 cmp "$tmp/full_${FULL_LAYERS}layers_graph.k25logits" \
        "$tmp/full_${FULL_LAYERS}layers_no_pdl.k25logits"
    [ -f "$tmp/full_${FULL_LAYERS}layers_graph.out" ] && grep -h 'eval time' "$tmp/full_${FULL_LAYERS}layers_graph.out" | tail -1 | awk -v L="$FULL_LAYERS" '{
        for (i = 1; i <= NF; i++) if ($i == "ms" && $(i+1) == "per") ms = $(i-1);
        if (ms != "") printf "     full model, batch 1: %s ms per token over %d layers (%.3f ms per layer incl. lm_head share)\n", ms, L, ms / L }'

    # the kernel trace (k25bench --trace, CUPTI) of a tiny model's decode steps as served: three
    # marked steps a level, each with its kernels, read back by bench/trace_summary.py
    check bench_trace 120 bash -c "$BENCH --config config/tiny.ini --synthetic 1 --backend cuda \
        --concurrency 1,2 --input-len 16 --output-len 8 --profile-only --trace $tmp/trace.csv \
        >$tmp/trace-bench.md && python3 bench/trace_summary.py $tmp/trace.csv --top 100 >$tmp/trace.md && \
        grep '^## ' $tmp/trace.md && grep -q '^## 1 rows: 3 steps' $tmp/trace.md && \
        grep -q '^## 2 rows: 3 steps' $tmp/trace.md && grep -q '^| \`embed_kernel\` | 1 |' $tmp/trace.md"

    # ---- 4. speculative decoding: greedy output equals plain greedy decoding ----
    # Tokens must be identical; logits are compared with a tolerance (a verification step
    # multiplies K+1 rows per sequence, so GEMMs may sum in another order than a 1-row step).
    spec_eq() { # spec_eq NAME NP SRC K MODEL-ARGS...
        local name=$1 np=$2 src=$3 k=$4; shift 4
        check "$name" 300 bash -c "mpirun -np $np $K25 $* --backend cuda -n 32 --temp 0 --print-ids \
            --dump-logits $tmp/$name.plain >$tmp/$name.plain.ids && \
            mpirun -np $np $K25 $* --backend cuda -n 32 --temp 0 --print-ids --spec-draft $src \
            --spec-k $k --dump-logits $tmp/$name.spec >$tmp/$name.spec.ids && \
            cmp $tmp/$name.plain.ids $tmp/$name.spec.ids && echo ids equal: \$(wc -w <$tmp/$name.spec.ids) && \
            python3 tests/py/compare_gpu.py $tmp/$name.plain $tmp/$name.spec --min-cos 0.99999 \
            --min-gen 31 --label $name"
    }
    EAGLE=$tmp/eagle
    ./k25-mkeagle --config config/tiny.ini --synthetic 5 --aux-layers 0,1,2 --out "$EAGLE" >/dev/null 2>&1
    TINY="--config config/tiny.ini --synthetic 1 --tokens 11,12,13,14,11,12,13,14,11,12"
    for np in 1 2; do
        [ "$np" -le "$ngpu" ] || continue
        spec_eq "spec_ngram_np$np" $np ngram 3 $TINY
        spec_eq "spec_model_np$np" $np model:config/tiny_draft.ini@7 2 $TINY
        spec_eq "spec_self_np$np" $np model:config/tiny.ini@1 3 $TINY
        spec_eq "spec_eagle3_np$np" $np "eagle3:$EAGLE" 3 $TINY
    done
    spec_eq spec_ngram_kimi4 1 ngram 3 --config config/kimi_k25.ini --synthetic 1 \
        --set model.num_hidden_layers=4 --set run.ctx_size=1024 --tokens 5,6,7,8,5,6,7,8,5,6,7
    # A draft's cache inside run.kv_cache_mb, served: the target's cache and the draft's hold the
    # same few blocks (1 MiB of bf16: ~160 of 16 tokens; 8 requests of 528 positions want 264),
    # so requests wait for them; both runs, plain and speculative, give all 40 x 16 tokens (a
    # draft whose cache ran short would stop the run).
    for src in model:config/tiny_draft.ini@7 "eagle3:$EAGLE"; do
        check "spec_cap_${src%%:*}" 120 bash -c "$BENCH --config config/tiny.ini --synthetic 1 \
            --backend cuda --no-warmup --set run.ctx_size=1024 --set run.kv_block_size=16 \
            --set run.kv_cache_mb=1 --concurrency 8 --input-len 512 --output-len 16 \
            --profile-steps 0 --spec-draft $src --spec-k 3 --json $tmp/cap.jsonl >$tmp/cap.md && \
            python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
(o,) = rows
sp = o[\"speculative\"][0]
assert o[\"completed\"] == o[\"num_prompts\"] == 40 and o[\"total_output_tokens\"] == 640, o
assert sp[\"rounds\"] > 0 and round(sp[\"output_throughput\"] * sp[\"duration\"]) == 640, sp
print(\"40 requests, 640 tokens plain and speculative,\", sp[\"rounds\"], \"verifications\")' $tmp/cap.jsonl"
    done

    # ---- 5. pipeline stages: TP1 x PP2 against TP2 and one GPU ----
    # PP2 cuts the 8-token prompt into micro-batches of 4 rows (src/pipeline.c), and the grouped
    # MoE's bits depend on a step's rows (its split plan follows the step's work items, and up to
    # 4 slots an expert's hi and lo products share one MMA tile): the one-GPU reference prefills
    # in chunks of 4, the same steps, so the stages' hand-off must give its logits bit for bit.
    # The last stage runs the lm_head once on the step's 8 rows where the reference runs it on 4:
    # both runs keep projections of up to 8 rows on the GEMV (K25_GEMV_MAX_T=8), whose rows do
    # not depend on the other rows of a call (cuBLASLt's do).
    if [ "$ngpu" -ge 2 ]; then
        pp_eq() { # pp_eq NAME MODEL-ARGS...: np 2 --pp 2 and np 2 TP against np 1
            local name=$1; shift
            check "$name" 300 bash -c "K25_GEMV_MAX_T=8 $K25 $* --backend cuda -n 24 --temp 0 --print-ids \
                --set run.prefill_chunk=4 --dump-logits $tmp/$name.one >$tmp/$name.one.ids && \
                K25_GEMV_MAX_T=8 mpirun -np 2 $K25 $* --backend cuda -n 24 --temp 0 --print-ids --pp 2 \
                --dump-logits $tmp/$name.pp >$tmp/$name.pp.ids && \
                mpirun -np 2 $K25 $* --backend cuda -n 24 --temp 0 --print-ids \
                --dump-logits $tmp/$name.tp >$tmp/$name.tp.ids && \
                cmp $tmp/$name.one.ids $tmp/$name.pp.ids && cmp $tmp/$name.tp.ids $tmp/$name.pp.ids && \
                echo 'ids equal (1 GPU, TP1xPP2, TP2)' && cmp $tmp/$name.one $tmp/$name.pp && \
                echo 'PP2 logits bit-identical to 1 GPU (prompt in chunks of 4)' && \
                python3 tests/py/compare_gpu.py $tmp/$name.tp $tmp/$name.pp --min-cos 0.99999 \
                --min-gen 23 --label $name"
        }
        pp_eq pp2_tiny --config config/tiny.ini --synthetic 1 --tokens 3,1,4,1,5,9,2,6
        pp_eq pp2_kimi4 --config config/kimi_k25.ini --synthetic 1 --set model.num_hidden_layers=4 \
            --set run.ctx_size=1024 --tokens 3,1,4,1,5,9,2,6

        # ---- 6. a rank killed mid-decode on the GPUs; SIGTERM keeps the streamed ids ----
        check rank_kill_gpu 240 env K25_RANK_KILL_ARGS="--backend cuda" tests/t_rank_kill.sh
    fi

    # ---- step buffers past the GPU's memory (the logits of 1M rows: 640 GiB) fail the run,
    # naming the setting that sizes them ----
    m1=1048576
    check step_buffers_past_gpu_memory 120 bash -c '"$@" >"$0" 2>&1; rc=$?; cat "$0"
        [ $rc -ne 0 ] && grep -q "cannot allocate .* GiB for a buffer, the step buffers of up \
to 1048576 rows (run.prefill_chunk 1048576)" "$0"' "$tmp/step_oom.out" \
        $K25 --config config/tiny.ini --synthetic 1 --backend cuda -p hi -n 2 \
        --set model.vocab_size=163840 --set model.max_position_embeddings=$m1 -c $m1 \
        --set run.prefill_chunk=$m1

    # ---- 7. compute-sanitizer on every kernel (memcheck, racecheck) ----
    SAN=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
    # NCCL probes kernel images for other architectures (cudaErrorNoKernelImageForDevice, which
    # it handles itself), so API errors are not reported. racecheck also reports hazards inside
    # cuBLASLt's own kernels (nvjet_*: asynchronous TMA / mbarrier shared-memory traffic it cannot
    # order); those are listed but only hazards in this project's kernels fail the check
    # (excluding the library kernels by name would skip running them and break the results).
    SANF=(--print-limit 200 --report-api-errors no)
    race() { # race NAME CMD...: racecheck, failing on hazards outside nvjet_* or a failed run
        local name=$1; shift
        check "$name" 600 bash -c '"$@" >"$0.out" 2>&1; rc=$?; cat "$0.out"
            ours=$(grep -E "Race reported|Internal Sanitizer Error" "$0.out" | grep -vc "nvjet_")
            lib=$(grep -E "Race reported" "$0.out" | grep -c "nvjet_")
            echo "racecheck: $ours hazard line(s) in project kernels, $lib in cuBLASLt (nvjet_*), rc $rc"
            [ "$rc" -eq 0 ] && [ "$ours" -eq 0 ]' "$tmp/$name" "$SAN" --tool racecheck "${SANF[@]}" "$@"
    }
    if [ -x "$SAN" ] && [ -z "${K25_NO_SANITIZER:-}" ] && [ -x "$OPS" ]; then
        for tool in memcheck; do
            f=(--error-exitcode 9 "${SANF[@]}")
            check "sanitizer_${tool}_ops" 600 "$SAN" --tool $tool "${f[@]}" \
                "$OPS" --config config/tiny.ini --rows 1,5,33
            check "sanitizer_${tool}_kimi_tp8" 600 "$SAN" --tool $tool "${f[@]}" \
                "$OPS" --config config/kimi_k25.ini --tp 8 --rank 3 \
                --set model.num_hidden_layers=2 --rows 1,16 --ctx 200
            check "sanitizer_${tool}_decode" 600 "$SAN" --tool $tool "${f[@]}" \
                $K25 --config config/tiny.ini --synthetic 1 --backend cuda \
                --tokens 1,2,3,4,5,6,7,8,9 -n 8 --temp 0.8 --top-p 0.9 --spec-draft ngram
        done
        race sanitizer_racecheck_ops "$OPS" --config config/tiny.ini --rows 1,5,33
        # at Kimi shapes one op group at a time (racecheck instruments every shared-memory
        # access: the 195 KB MLA tiles make a whole run take many minutes). Under racecheck each
        # kernel launch costs tens of milliseconds, and the synthetic upload is a few launches
        # per expert tensor (~2 minutes for 384 experts): groups that do not depend on the
        # expert count run with 16 experts and a 32K vocabulary, at the same per-rank shapes.
        small=(--set model.n_routed_experts=16 --set model.vocab_size=32768 --set tokens.bos_token_id=1
               --set tokens.eos_token_ids=2 --set tokens.pad_token_id=3)
        for o in mla matmul sample gather rmsnorm embed moe router; do
            case $o in moe|router) sz=(--set model.vocab_size=32768 "${small[@]:4}") ;; *) sz=("${small[@]}") ;; esac
            race "sanitizer_racecheck_kimi_tp8_$o" "$OPS" --config config/kimi_k25.ini --tp 8 \
                --rank 3 --set model.num_hidden_layers=2 "${sz[@]}" --rows 1,5 --ctx 100 --only $o
        done
        race sanitizer_racecheck_decode $K25 --config config/tiny.ini --synthetic 1 --backend cuda \
            --tokens 1,2,3,4,5,6,7,8,9 -n 8 --temp 0.8 --top-p 0.9 --spec-draft ngram
        if [ "$ngpu" -ge 2 ] && [ -x "$BUILD/tests/gpu_allreduce" ]; then
            check sanitizer_memcheck_allreduce 300 mpirun -np 2 "$SAN" --tool memcheck \
                --error-exitcode 9 "${SANF[@]}" "$BUILD/tests/gpu_allreduce"
        fi
    fi
else
    fail=$((fail + 1)); failed+=(k25dec); echo "FAIL k25dec: $K25 not built"
fi

echo "$pass passed, $fail failed${failed[*]:+ (${failed[*]})}"
[ "$fail" -eq 0 ]
