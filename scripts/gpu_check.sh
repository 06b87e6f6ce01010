#!/usr/bin/env bash
# The one script to run on a GPU machine: prints the machine (nvidia-smi, versions), builds with
# CUDA, runs the GPU test suite (tests/run_gpu.sh: kernel checks against the CPU reference,
# golden models on 1 and 2 ranks, a full-dimension synthetic model) and the micro benchmarks
# (W4A16 MoE, MLA decode attention, NCCL all-reduce), writing every log and JSON file flat into
# ${OUT:-/tmp/k25out} (at most 8 files), and ends with a short summary table.
#
#   scripts/gpu_check.sh            # build + tests + benches (the compute-sanitizer section
#                                   # takes most of the time; K25_NO_SANITIZER=1 skips it)
#   K25_GPU_ONLY=REGEX ...          # only the test checks whose names match
#   K25_NO_BUILD=1 BUILD=dir ...    # use binaries already built in dir (and ./k25dec)
#   K25_QUICK=1 ...                 # shorter benchmark sweeps
# Exits non-zero when a step of the summary failed.
# NVLink multicast stays off: NCCL_NVLS_ENABLE is left as the environment sets it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/k25out}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
MAIN="$OUT/gpu_check.log"      # 1: everything printed here
TESTS="$OUT/gpu_tests.log"     # 2: test details
: >"$MAIN"
exec > >(tee -a "$MAIN") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
quick=(); [ -n "${K25_QUICK:-}" ] && quick=(--quick)
t0=$(date +%s)
declare -a SUMMARY
status=0
note() { SUMMARY+=("$1"); case $1 in *"| FAIL"*) status=1 ;; esac; }

echo "# ---- machine ----"
date -u
nvidia-smi || echo "nvidia-smi failed"
nvidia-smi topo -m 2>/dev/null | head -12
"${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version 2>/dev/null | tail -2
mpirun --version 2>/dev/null | head -1
grep -h 'define NCCL_M\|define NCCL_PATCH' "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" 2>/dev/null | tr '\n' ' '; echo
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

echo "# ---- build ----"
if [ -z "${K25_NO_BUILD:-}" ]; then
    if make -j16 CUDA=1 BUILD="$BUILD" >"$OUT/build.log" 2>&1; then
        note "| build | ok | $(( $(date +%s) - t0 )) s |"
    else
        tail -30 "$OUT/build.log"
        note "| build | FAIL | see build.log |"
    fi
    tail -3 "$OUT/build.log"
else
    note "| build | skipped (K25_NO_BUILD) | |"
fi

echo "# ---- tests ----"
ts=$(date +%s)
if BUILD="$BUILD" K25_GPU_LOG="$TESTS" K25_FULL_LAYERS=${K25_FULL_LAYERS:-10} tests/run_gpu.sh; then
    note "| tests | ok | $(grep -E "^[0-9]+ passed" "$MAIN" | tail -1) ($(( $(date +%s) - ts )) s) |"
else
    note "| tests | FAIL | $(grep -E '^[0-9]+ passed' "$MAIN" | tail -1) ($(( $(date +%s) - ts )) s) |"
fi

echo "# ---- benchmarks ----"
bench() { # bench NAME JSON CMD...
    local name=$1 json=$2; shift 2
    local bs=$(date +%s)
    rm -f "$OUT/$json"
    if timeout 300 "$@" --json "$OUT/$json" "${quick[@]}"; then
        note "| $name | ok | $(( $(date +%s) - bs )) s, $OUT/$json |"
    else
        note "| $name | FAIL (rc $?) | $(( $(date +%s) - bs )) s |"
    fi
}
bench micro_w4a16 bench_w4a16.jsonl "$BUILD/bench/micro_w4a16"     # 3
bench micro_mla bench_mla.jsonl "$BUILD/bench/micro_mla"           # 4
bench micro_matmul bench_matmul.jsonl "$BUILD/bench/micro_matmul"  # 5
bench "micro_matmul --wgmma" bench_matmul_wgmma.jsonl "$BUILD/bench/micro_matmul" --wgmma
bench micro_hop bench_hop.jsonl "$BUILD/bench/micro_hop"
if [ "$ngpu" -ge 2 ]; then
    bench "micro_allreduce np=$ngpu" bench_allreduce.jsonl mpirun -np "$ngpu" "$BUILD/bench/micro_allreduce"  # 6
else
    bench "micro_allreduce np=1" bench_allreduce.jsonl mpirun -np 1 "$BUILD/bench/micro_allreduce"
fi

echo
echo "# ---- summary ($(( $(date +%s) - t0 )) s) ----"
echo "| step | result | detail |"
echo "|---|---|---|"
for l in "${SUMMARY[@]}"; do echo "$l"; done
python3 - "$OUT" <<'PY' || true
import json, os, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
w = [r for r in rows("bench_w4a16.jsonl") if r.get("bench") == "w4a16_moe"]
if w:
    print("\n| TP | M | W4A16 us | % of copy | vs cuBLASLt |\n|---:|---:|---:|---:|---:|")
    for r in w:
        if r["M"] in (1, 16, 256):
            print(f"| {r['tp']} | {r['M']} | {r['us']:.1f} | {r['pct_copy']:.0f}% | {r['speedup']:.2f}x |")
m = [r for r in rows("bench_mla.jsonl") if r.get("bench") == "mla_decode"]
if m:
    print("\n| heads | batch | ctx | MLA us | % of copy |\n|---:|---:|---:|---:|---:|")
    for r in m:
        if r["ctx"] in (1024, 32768):
            print(f"| {r['heads']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | {r['pct_copy']:.0f}% |")
a = [r for r in rows("bench_allreduce.jsonl") if r.get("bench") == "allreduce"]
if a:
    print("\n| ranks | M | dtype | us | graph us | wrong |\n|---:|---:|---|---:|---:|---:|")
    for r in a:
        if r["M"] in (1, 8, 256):
            print(f"| {r['ranks']} | {r['M']} | {r['dtype']} | {r['us']:.1f} | {r['graph_us']:.1f} | {r['wrong']} |")
PY
exit $status
