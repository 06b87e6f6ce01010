#!/usr/bin/env bash
# The A/B comparison of two builds' decode steps: bench/ab_steps.py on hand-written results (the
# change of the mean step and tok/s against values computed here, a level one build lacks named,
# clear errors for a file without decode profiles and for a step that is not positive), then
# bench/run_h200.sh's ab job driving two stand-in benchmarks (each writes the results k25bench
# would) through its alternation, its file names and its table.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

line() { # line CONTEXT ROWS STEP_MS: one level as k25bench --profile-only writes it
    printf '{"bench":"k25bench","decode_profile":{"batch":%d,"context":%d,"steps":3,"graph_step_ms":%s}}\n' "$2" "$1" "$3"
}
{ line 1024 8 10.0; line 1024 16 20.0; } >"$tmp/b1.jsonl"
{ line 1024 8 10.2; line 1024 16 20.4; } >"$tmp/b2.jsonl"
{ line 1024 8 9.0; line 1024 16 21.0; line 256 64 30.0; } >"$tmp/n1.jsonl"
{ line 1024 8 9.2; line 1024 16 21.4; } >"$tmp/n2.jsonl"

# the expected rows, computed here from the same numbers: change of the means, rows / mean new
want_row() { # want_row CTX ROWS "base runs" "new runs"
    awk -v c="$1" -v r="$2" -v b="$3" -v n="$4" 'BEGIN {
        nb = split(b, B, " "); nn = split(n, N, " "); sb = 0; sn = 0; fb = ""; fn = "";
        for (i = 1; i <= nb; i++) { sb += B[i]; fb = fb (i > 1 ? " / " : "") sprintf("%.3f", B[i]) }
        for (i = 1; i <= nn; i++) { sn += N[i]; fn = fn (i > 1 ? " / " : "") sprintf("%.3f", N[i]) }
        mb = sb / nb; mn = sn / nn;
        printf "| %d | %d | %s | %s | %+.1f%% | %.0f |\n", c, r, fb, fn, 100 * (mn - mb) / mb, 1000 * r / mn }'
}
out=$(python3 bench/ab_steps.py --base "$tmp/b1.jsonl" "$tmp/b2.jsonl" \
      --new "$tmp/n1.jsonl" "$tmp/n2.jsonl" --out "$tmp/t.md" 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] && ok "ab_steps.py exits 0" || bad "ab_steps.py rc $rc: $(cat "$tmp/err")"
for w in "$(want_row 1024 8 "10.0 10.2" "9.0 9.2")" "$(want_row 1024 16 "20.0 20.4" "21.0 21.4")"; do
    grep -qxF -- "$w" <<<"$out" && ok "table has: $w" || { bad "table lacks: $w"; echo "$out"; }
done
grep -q -- "-9.9%" <<<"$out" && grep -q -- "+5.0%" <<<"$out" && ok "faster and slower signed" ||
    bad "the changes' signs: $out"
cmp -s <(echo "$out") "$tmp/t.md" && ok "--out holds the printed table" || bad "--out differs"
grep -qx "ab_steps: context 256, 64 rows: only in new's results" "$tmp/err" &&
    ok "a level only new has is named" || bad "one-sided level: $(cat "$tmp/err")"
grep -q "^| 256 | 64 " <<<"$out" && bad "a one-sided level has a row" || ok "and left out"

echo '{"bench":"k25bench","median_tpot_ms":5.0}' >"$tmp/noprof.jsonl"
if python3 bench/ab_steps.py --base "$tmp/noprof.jsonl" --new "$tmp/n1.jsonl" >/dev/null 2>"$tmp/err"; then
    bad "a file without decode profiles was accepted"
else
    grep -q "noprof.jsonl: no decode profile" "$tmp/err" && ok "a file without profiles named" ||
        bad "no-profile error: $(cat "$tmp/err")"
fi
{ line 1024 8 10.0; line 1024 16 0; } >"$tmp/zero.jsonl"
if python3 bench/ab_steps.py --base "$tmp/zero.jsonl" --new "$tmp/n1.jsonl" >/dev/null 2>"$tmp/err"; then
    bad "a zero step was accepted"
else
    grep -q "zero.jsonl:2: graph_step_ms 0 is not a positive number" "$tmp/err" &&
        ok "a zero step named with its line" || bad "zero-step error: $(cat "$tmp/err")"
fi

# the ab job without BASE: a clear refusal
if OUT="$tmp/o0" bash bench/run_h200.sh ab >"$tmp/err" 2>&1; then
    bad "the ab job ran without BASE"
else
    grep -q "BASE=path/to/the/other/k25bench is not set" "$tmp/err" && ok "ab without BASE refused" ||
        bad "ab without BASE: $(cat "$tmp/err")"
fi

# the ab job with two stand-ins: base's steps take 10 ms at every level, new's 8, and each run
# records its order; REPS=2 must alternate base, new, base, new
for who in base new; do
    cat >"$tmp/bench-$who" <<EOF
#!/usr/bin/env bash
json=""; len=0; conc=""
while [ \$# -gt 0 ]; do
    case \$1 in --json) json=\$2; shift ;; --input-len) len=\$2; shift ;; --concurrency) conc=\$2; shift ;; esac
    shift
done
echo "$who \$len" >>"$tmp/order"
for c in \${conc//,/ }; do
    printf '{"decode_profile":{"batch":%d,"context":%d,"graph_step_ms":%s}}\n' "\$c" "\$len" \
        "$([ $who = base ] && echo 10.0 || echo 8.0)" >>"\$json"
done
echo "| stand-in table |"
EOF
    chmod +x "$tmp/bench-$who"
done
OUT="$tmp/o1" BASE="$tmp/bench-base" NEW="$tmp/bench-new" NAME=t REPS=2 LOW=8 HIGH=64 \
    bash bench/run_h200.sh ab >"$tmp/ab.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "ab job exits 0" || { bad "ab job rc $rc"; cat "$tmp/ab.log"; }
order=$(tr '\n' ',' <"$tmp/order")
[ "$order" = "base 1024,base 256,new 1024,new 256,base 1024,base 256,new 1024,new 256," ] &&
    ok "ab alternates the builds" || bad "ab's order: $order"
for f in tp8sim-k61-h200x1-1k-profile-t-uni-base-1 tp8sim-k61-h200x1-256-profile-t-uni-new-2; do
    [ -s "$tmp/o1/$f.jsonl" ] && ok "ab wrote $f.jsonl" || bad "ab did not write $f.jsonl"
done
for w in "$(want_row 1024 8 "10.0 10.0" "8.0 8.0")" "$(want_row 256 64 "10.0 10.0" "8.0 8.0")"; do
    grep -qxF -- "$w" "$tmp/o1/ab-t.md" && ok "ab-t.md has: $w" ||
        { bad "ab-t.md lacks: $w"; cat "$tmp/o1/ab-t.md" "$tmp/ab.log"; }
done
exit $fail
