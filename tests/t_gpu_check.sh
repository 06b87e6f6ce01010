#!/usr/bin/env bash
# scripts/gpu_check.sh on stand-ins (no GPU needed): its exit status says whether a step of its
# summary failed (it exited 0 after failed tests or benchmarks, as a caller's `&&` reads a pass).
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
printf '#!/bin/sh\nexit 0\n' >"$tmp/ok"
printf '#!/bin/sh\necho "FAIL stand-in"; exit 1\n' >"$tmp/bad"
chmod +x "$tmp/ok" "$tmp/bad"
mkdir -p "$tmp/build/bench"
for b in micro_w4a16 micro_mla micro_matmul micro_hop micro_allreduce; do
    cp "$tmp/ok" "$tmp/build/bench/$b"
done
# run OPS MLA: the tests' op check and the MLA benchmark as given, everything else passing
run() {
    cp "$tmp/$2" "$tmp/build/bench/micro_mla"
    OUT="$tmp/out" BUILD="$tmp/build" K25_NO_BUILD=1 K25_GPU_ONLY='^ops_tiny$' K25_GPU_OPS="$tmp/$1" \
        K25_DEC="$tmp/ok" K25_BENCH="$tmp/ok" timeout 120 scripts/gpu_check.sh >"$tmp/log" 2>&1
}
for c in "ok ok 0" "bad ok 1" "ok bad 1"; do
    read -r ops mla want <<<"$c"
    run "$ops" "$mla"
    rc=$?
    if [ $((rc != 0)) -ne "$want" ]; then
        echo "FAIL gpu_check.sh with the op check $ops and micro_mla $mla: exit $rc"
        grep '^|' "$tmp/log"
        fail=1
    else
        echo "ok   gpu_check.sh with the op check $ops and micro_mla $mla: exit $rc"
    fi
done
[ $fail -eq 0 ] && echo "t_gpu_check: ok"
exit $fail
