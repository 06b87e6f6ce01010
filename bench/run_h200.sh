#!/usr/bin/env bash
# The k25bench runs behind bench/results/*-h200*: full-dimension synthetic Kimi-K2.5 (real
# shapes, synthetic weights) on one or two H200s. Each job writes NAME.jsonl (one JSON object
# per level) and NAME.md (the console table with its '#' description) into $OUT.
#
#   bench/run_h200.sh pipeline   # 4 layers: 1 GPU, TP2, TP1 x PP2 (pipelined steps and one
#                                #   stage at a time) across concurrency (2 GPUs)
#   bench/run_h200.sh spec       # 4 layers, TP2: plain vs an EAGLE-3 head at Kimi dimensions,
#                                #   controlled acceptance alpha in {0.5, 0.7, 0.8, 0.9}
#   bench/run_h200.sh tp8sim     # all 61 layers as one TP8 rank's share on one GPU (run.sim_tp)
#   bench/run_h200.sh tp8sim-uni # the same share with uniform routing: x4's sweep 1..256 on one
#                                #   GPU (per-rank work only, no all-reduce)
#   bench/run_h200.sh overlap    # 4 layers, 1 GPU: shared expert overlapped or not
#   bench/run_h200.sh layers     # us per MoE layer at batch 1, TP8 share: (8 layers - 4 layers)
#                                #   / 4, two runs each; BASE=other/k25bench alternates a second
#                                #   binary with ./k25bench (an A/B in one job)
#   bench/run_h200.sh ab         # BASE=other/k25bench [NEW=./k25bench NAME=ab REPS=2 LOW=1,2,8,16
#                                #   HIGH=16,64,256]:
#                                #   the decode steps of two builds alternated in one job, one
#                                #   TP8 rank's share, uniform routing -> ab-NAME.md (ab_steps.py)
#   bench/run_h200.sh ncu        # 4 layers as one TP8 rank's share: one decode step kernel by
#                                #   kernel (ncu, isolated kernel times) -> ncu-step-*.md
#   bench/run_h200.sh x4         # 4 GPUs, each one TP8 rank's share (run.sim_tp=8), all 61
#                                #   layers, all-reduces across the 4: the sweep 1..256 with the
#                                #   per-operation breakdown, then spec vs plain at 1 and 16;
#                                #   x4-low, x4-high, x4-spec run its parts one at a time
#   bench/run_h200.sh x8         # 8 GPUs, TP8, all 61 layers: the sweep 1..256 (1K in / 128
#                                #   out) with the per-operation breakdown, then spec vs plain
#                                #   (EAGLE-3 head at Kimi dimensions, controlled acceptance);
#                                #   x8-low, x8-high, x8-spec run its three parts one at a time
#                                #   (one sweep: cat the halves' .jsonl; bench/plot.py plots it)
#                                # x4 and x8 route uniformly (run.uniform_routing=1)
# Binaries: ./k25bench and ./k25-mkeagle (make CUDA=1). NVLink multicast stays off.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/k25out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
KIMI=(--config config/kimi_k25.ini --synthetic 1 --backend cuda)

bench() { # bench NAME NP ARGS...: one k25bench run, table to NAME.md, progress to NAME.log
    local name=$1 np=$2; shift 2
    local t0=$(date +%s)
    # --foreground: a timeout around this script also stops the run in progress
    timeout --foreground 400 mpirun -np "$np" "${K25BENCH:-./k25bench}" "$@" --json "$OUT/$name.jsonl" \
        >"$OUT/$name.md" 2>>"$OUT/bench.log"
    local rc=$?
    echo "== $name: rc $rc, $(( $(date +%s) - t0 )) s"
    grep -E '^\| +[0-9]' "$OUT/$name.md" | cut -d'|' -f2,7,10,13,16 | head -40
}

# eagle DIR ARGS...: a synthetic EAGLE-3 head written afresh (k25-mkeagle refuses a directory
# holding one: a second job on the machine benchmarked the head an earlier run had left there)
eagle() {
    local dir=$1; shift
    rm -rf "$dir"
    ./k25-mkeagle "$@" --out "$dir" 2>>"$OUT/bench.log" || echo "k25-mkeagle failed"
}

for job in "$@"; do
    case $job in
    pipeline)
        W=(--set model.num_hidden_layers=4 --set run.ctx_size=2048 --input-len 256
           --output-len 64 --concurrency 1,4,16,64,256 --profile-steps 0)
        bench pp-k4-h200x1-tp1 1 "${KIMI[@]}" "${W[@]}"
        bench pp-k4-h200x2-tp2 2 "${KIMI[@]}" "${W[@]}"
        bench pp-k4-h200x2-tp1pp2 2 "${KIMI[@]}" "${W[@]}" --pp 2
        bench pp-k4-h200x2-tp1pp2-sync 2 "${KIMI[@]}" "${W[@]}" --pp 2 --set run.pp_async=0
        ;;
    spec)
        # aux layers 0, 1, 2: the published heads read early, middle and late layers (2, L/2,
        # L-3 of 61); with 4 target layers these are the first three
        eagle /tmp/k25-eagle-kimi --config config/kimi_k25.ini --set model.num_hidden_layers=4 \
            --synthetic 5 --intermediate 12288 --aux-layers 0,1,2
        S=(--set model.num_hidden_layers=4 --set run.ctx_size=2048 --input-len 256 --output-len 64
           --spec-draft eagle3:/tmp/k25-eagle-kimi --spec-k 3 --profile-steps 0)
        bench spec-k4-h200x2-tp2 2 "${KIMI[@]}" "${S[@]}" --concurrency 1,4,16,64 \
            --spec-accept 0.5,0.7,0.8,0.9
        bench spec-k4-h200x2-tp2-c256 2 "${KIMI[@]}" "${S[@]}" --concurrency 256 --spec-accept 0.8
        ;;
    tp8sim)
        T=(--set run.sim_tp=8 --set run.ctx_size=4096)
        bench tp8sim-k61-h200x1-1k 1 "${KIMI[@]}" "${T[@]}" --input-len 1024 --output-len 128 \
            --concurrency 1,16 --profile-steps 3
        bench tp8sim-k61-h200x1-256 1 "${KIMI[@]}" "${T[@]}" --input-len 256 --output-len 64 \
            --concurrency 64,256 --profile-steps 3
        ;;
    overlap)
        O=(--set model.num_hidden_layers=4 --set run.ctx_size=2048 --input-len 256
           --output-len 64 --concurrency 1,16 --profile-steps 0)
        bench overlap-k4-h200x1-on 1 "${KIMI[@]}" "${O[@]}"
        K25_NO_OVERLAP=1 bench overlap-k4-h200x1-off 1 "${KIMI[@]}" "${O[@]}"
        ;;
    layers)
        L=(--set run.sim_tp=8 --set run.ctx_size=2048 --input-len 1024 --output-len 64
           --concurrency 1 --profile-steps 0)
        for rep in 1 2; do for nl in 4 8; do for v in new ${BASE:+base}; do
            K25BENCH=$([ "$v" = base ] && echo "$BASE" || echo ./k25bench) \
                bench "tp8sim-k$nl-h200x1-$v-r$rep" 1 "${KIMI[@]}" "${L[@]}" \
                --set model.num_hidden_layers=$nl
        done; done; done
        python3 - "$OUT" <<'PY'
import json, sys
tpot = lambda f: json.loads(open(f"{sys.argv[1]}/{f}.jsonl").readline())["median_tpot_ms"] * 1000
for v in ("new", "base"):
    try:
        per = [(tpot(f"tp8sim-k8-h200x1-{v}-r{r}") - tpot(f"tp8sim-k4-h200x1-{v}-r{r}")) / 4 for r in (1, 2)]
    except OSError:
        continue
    print(f"== {v}: us per MoE layer, runs 1 and 2: {per[0]:.1f} {per[1]:.1f}")
PY
        ;;
    ab)
        # two builds side by side: $BASE ("base") and $NEW ("new", default ./k25bench)
        # alternated REPS times, each the decode step of one TP8 rank's share under uniform
        # routing (decode alone: the served graph replay), LOW rows at 1K context and HIGH rows
        # at 256 (either set empty: none); then their table. BASE and NEW may be scripts that
        # run one k25bench with a knob set (K25_*=... exec k25bench "$@")
        [ -n "${BASE:-}" ] || { echo "ab: BASE=path/to/the/other/k25bench is not set"; exit 2; }
        T=(--set run.sim_tp=8 --set run.ctx_size=4096 --set run.uniform_routing=1 --profile-only
           --output-len 64)
        for rep in $(seq 1 "${REPS:-2}"); do for v in base new; do
            for part in "1k 1024 ${LOW-1,2,8,16}" "256 256 ${HIGH-16,64,256}"; do
                read -r ctx len conc <<<"$part"
                [ -n "${conc:-}" ] || continue
                K25BENCH=$([ "$v" = base ] && echo "$BASE" || echo "${NEW:-./k25bench}") \
                    bench "tp8sim-k61-h200x1-$ctx-profile-${NAME:-ab}-uni-$v-$rep" 1 "${KIMI[@]}" \
                    "${T[@]}" --input-len "$len" --concurrency "$conc"
            done
        done; done
        python3 bench/ab_steps.py --out "$OUT/ab-${NAME:-ab}.md" \
            --base "$OUT"/tp8sim-k61-h200x1-*-profile-"${NAME:-ab}"-uni-base-*.jsonl \
            --new "$OUT"/tp8sim-k61-h200x1-*-profile-"${NAME:-ab}"-uni-new-*.jsonl
        ;;
    ncu)
        NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
        timeout --foreground 300 "$NCU" --clock-control none --cache-control none \
            --graph-profiling node --metrics gpu__time_duration.sum --csv \
            --log-file "$OUT/ncu-step-k4-tp8sim.csv" ./k25dec "${KIMI[@]}" --set run.sim_tp=8 \
            --set run.ctx_size=2048 --set model.num_hidden_layers=4 \
            --tokens "$(seq -s, 1000 2023)" -n 4 >"$OUT/ncu-run.log" 2>&1
        echo "== ncu: rc $?"
        python3 bench/ncu_step.py "$OUT/ncu-step-k4-tp8sim.csv" --markdown \
            >"$OUT/ncu-step-k4-tp8sim-h200.md" && tail -12 "$OUT/ncu-step-k4-tp8sim-h200.md"
        ;;
    x4|x4-low|x4-high|x4-spec|tp8sim-uni)
        # uniform routing: the spread of a load-balanced router over the 384 experts (the
        # synthetic router concentrates a batch on fewer, bench/README.md); tp8sim-uni: the
        # sweep's two parts on one GPU
        T=(--set run.sim_tp=8 --set run.ctx_size=4096 --set run.uniform_routing=1)
        n=$([ "$job" = tp8sim-uni ] && echo 1 || echo 4)
        case $job in x4|x4-low|tp8sim-uni)
            bench tp8sim-k61-h200x$n-uni-1k $n "${KIMI[@]}" "${T[@]}" --input-len 1024 \
                --output-len 128 --concurrency 1,2,4,8,16 --profile-steps 3 ;; esac
        case $job in x4|x4-high|tp8sim-uni)
            bench tp8sim-k61-h200x$n-uni-256 $n "${KIMI[@]}" "${T[@]}" --input-len 256 \
                --output-len 64 --concurrency 32,64,128,256 --profile-steps 3 ;; esac
        case $job in x4|x4-spec)
            eagle /tmp/k25-eagle-k61 --config config/kimi_k25.ini --synthetic 5 \
                --intermediate 12288 --aux-layers 2,30,58
            bench spec-tp8sim-k61-h200x4-uni 4 "${KIMI[@]}" "${T[@]}" --input-len 1024 \
                --output-len 128 --concurrency 1,16 --spec-draft eagle3:/tmp/k25-eagle-k61 \
                --spec-k 3 --spec-accept 0.7,0.8 --profile-steps 0 ;; esac
        ;;
    x8|x8-low|x8-high|x8-spec)
        # x8 = the three parts; each part alone fits a 10-minute job limit (each run
        # generates the 73 GiB per rank of synthetic weights again, ~1 minute)
        # uniform routing, as in x4
        X=(--set run.ctx_size=4096 --set run.uniform_routing=1 --input-len 1024 --output-len 128)
        case $job in x8|x8-low)
            bench k61-h200x8-tp8-uni-low 8 "${KIMI[@]}" "${X[@]}" --concurrency 1,2,4,8,16 \
                --profile-steps 3 ;; esac
        case $job in x8|x8-high)
            bench k61-h200x8-tp8-uni-high 8 "${KIMI[@]}" "${X[@]}" --concurrency 32,64,128,256 \
                --profile-steps 3 ;; esac
        case $job in x8|x8-spec)
            eagle /tmp/k25-eagle-k61 --config config/kimi_k25.ini --synthetic 5 \
                --intermediate 12288 --aux-layers 2,30,58
            bench spec-k61-h200x8-tp8-uni 8 "${KIMI[@]}" "${X[@]}" --concurrency 1,4,16,64,256 \
                --spec-draft eagle3:/tmp/k25-eagle-k61 --spec-k 3 --spec-accept 0.7,0.8 \
                --profile-steps 0 ;; esac
        ;;
    *) echo "unknown job $job"; exit 2 ;;
    esac
done
