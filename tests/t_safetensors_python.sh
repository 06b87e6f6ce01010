#!/usr/bin/env bash
# Files written by the Python safetensors library (the reference implementation) load in C
# with identical tensors:
# 1. numpy arrays of several dtypes (incl. a 0-rank and an empty tensor) saved with
#    safetensors.numpy.save_file: `test_safetensors --dump` lists the same names, dtypes,
#    shapes and CRC-32 of the bytes as Python computed from the arrays;
# 2. a k25-mkckpt checkpoint read in Python (header parsed there and cross-checked with
#    safetensors.deserialize) and written again by the library's serializer in another shard
#    layout: every shard dumps as Python expects, and the checkpoint plans at tp 1 and 2 to
#    tensors bit-identical to the synthetic weights of the seed it was made from.
# Skipped (exit 0) only when python3 lacks numpy or safetensors.
set -u
B=${K25_BUILD:-build}
TS=$B/tests/test_safetensors
TW=$B/tests/test_weights
for x in "$TS" "$TW" ./k25-mkckpt; do
    [ -x "$x" ] || { echo "missing $x (build first)"; exit 1; }
done
if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
    echo "skip: python3 with numpy and safetensors not available (pip install numpy safetensors)"
    exit 0
fi
tmp=$(mktemp -d /tmp/k25-stpy-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

python3 tests/py/st_python.py arrays "$tmp/np.safetensors" "$tmp/np.expected" || fail "python writer"
if "$TS" --dump "$tmp/np.safetensors" >"$tmp/np.got"; then
    diff "$tmp/np.expected" "$tmp/np.got" && echo "ok   numpy arrays: $(wc -l <"$tmp/np.got") tensors identical" ||
        fail "numpy arrays differ (expected < > C)"
else
    fail "C refuses the file written by safetensors.numpy"
fi

./k25-mkckpt --config config/tiny.ini --synthetic 77 --out "$tmp/src" --shards 2 2>/dev/null ||
    fail "k25-mkckpt"
python3 tests/py/st_python.py reshard "$tmp/src" "$tmp/py" 3 || fail "python reshard"
: >"$tmp/py.got"
for f in "$tmp"/py/*.safetensors; do
    "$TS" --dump "$f" | sed "s|^|$(basename "$f") |" >>"$tmp/py.got" || fail "dump $f"
done
sort -o "$tmp/py.got" "$tmp/py.got"
diff -q "$tmp/py/expected.txt" "$tmp/py.got" >/dev/null &&
    echo "ok   resharded checkpoint: $(wc -l <"$tmp/py.got") tensors dump as written" ||
    fail "resharded shards differ from what Python wrote"
out=$("$TW" --check "$tmp/py" 77 2>&1) && echo "ok   resharded checkpoint equals --synthetic 77: $out" ||
    fail "resharded checkpoint: $out"
# The comparison is sharp: the same files against another seed differ.
"$TW" --check "$tmp/py" 78 >/dev/null 2>&1 && fail "seed 78 compares equal"

[ $fails -eq 0 ] && echo "t_safetensors_python: ok" || echo "t_safetensors_python: $fails failure(s)"
[ $fails -eq 0 ]
