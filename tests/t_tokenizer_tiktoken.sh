#!/usr/bin/env bash
# Token ids from our tokenizer == ids from the `tiktoken` package (PyPI), given the same rank
# file, pattern and special tokens, on the multilingual corpus, long runs and seeded random
# strings; for the Kimi pattern and tiktoken's own cl100k_base and o200k_base patterns. Also
# decode(encode(x)) == x, and decoding random id sequences (partial UTF-8, specials) matches
# tiktoken's decode.
#
# The C side is $K25_BUILD/tests/test_tokenizer in batch mode; when ./k25dec --help lists
# --tokenize, the whole corpus also goes through ./k25dec --tokenizer FILE --tokenize.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${K25_BUILD:-build}
TOOL=$BUILD/tests/test_tokenizer
DIR=tests/data/tokenizer
REF="python3 tests/py/tiktoken_ref.py"
python3 -c 'import tiktoken' || { echo "python3 cannot import tiktoken (pip install tiktoken)"; exit 1; }
[ -x "$TOOL" ] || { echo "$TOOL not built"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# First differing record between two id files (one line per record), for the log.
explain() {
    python3 - "$1" "$2" "$3" <<'EOF'
import sys
exp, got, cases = (open(p, "rb").read() for p in sys.argv[1:])
recs = cases.split(b"\0")
for i, (a, b) in enumerate(zip(exp.split(b"\n"), got.split(b"\n"))):
    if a != b:
        a, b = a.split(), b.split()
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"record {i} ({len(recs[i])} bytes): {recs[i][:120]!r}")
        print(f"  first difference at id #{k}: tiktoken {b' '.join(a[max(0, k - 3):k + 5]).decode()}"
              f" | ours {b' '.join(b[max(0, k - 3):k + 5]).decode()}")
        break
EOF
}

$REF cases >"$tmp/cases.bin"
n_cases=$(tr -cd '\0' <"$tmp/cases.bin" | wc -c)
fail=0
for pat in kimi cl100k o200k; do
    $REF pattern $pat >"$tmp/$pat.pat"
    $REF encode $DIR $pat <"$tmp/cases.bin" >"$tmp/$pat.exp"
    "$TOOL" encode-batch $DIR "$tmp/$pat.pat" <"$tmp/cases.bin" >"$tmp/$pat.got"
    if cmp -s "$tmp/$pat.exp" "$tmp/$pat.got"; then
        echo "ok: $pat pattern, $n_cases texts, $(wc -w <"$tmp/$pat.exp") ids identical to tiktoken"
    else
        echo "FAIL: $pat pattern: ids differ from tiktoken"
        explain "$tmp/$pat.exp" "$tmp/$pat.got" "$tmp/cases.bin"
        fail=1
    fi
    # decode(encode(x)) == x through the streaming decoder
    "$TOOL" decode-batch $DIR <"$tmp/$pat.got" >"$tmp/$pat.dec"
    if cmp -s "$tmp/$pat.dec" "$tmp/cases.bin"; then
        echo "ok: $pat pattern, decode(encode(x)) == x"
    else
        echo "FAIL: $pat pattern: decode(encode(x)) != x"
        fail=1
    fi
done

# Random id sequences (tokens ending mid-character, specials) decode like tiktoken's decode.
$REF random-ids $DIR >"$tmp/ids.txt"
$REF decode $DIR <"$tmp/ids.txt" >"$tmp/ids.exp"
"$TOOL" decode-batch $DIR <"$tmp/ids.txt" >"$tmp/ids.got"
if cmp -s "$tmp/ids.exp" "$tmp/ids.got"; then
    echo "ok: $(wc -l <"$tmp/ids.txt") random id sequences decode identically"
else
    echo "FAIL: decoding random id sequences differs from tiktoken"
    fail=1
fi

# The command-line tool, once main.c routes --tokenize to it.
if [ -x ./k25dec ] && ./k25dec --help 2>&1 | grep -q -- '--tokenize'; then
    $REF encode $DIR kimi < <(cat $DIR/corpus.txt; printf '\0') >"$tmp/corpus.exp"
    ./k25dec --tokenizer $DIR/tiktoken.model --tokenize <$DIR/corpus.txt >"$tmp/corpus.got"
    if cmp -s "$tmp/corpus.exp" "$tmp/corpus.got"; then
        echo "ok: ./k25dec --tokenize on the corpus"
    else
        echo "FAIL: ./k25dec --tokenize differs from tiktoken on the corpus"
        fail=1
    fi
    if ./k25dec --help 2>&1 | grep -q -- '--detokenize'; then
        ./k25dec --tokenizer $DIR/tiktoken.model --detokenize <"$tmp/corpus.got" >"$tmp/corpus.txt"
        if cmp -s "$tmp/corpus.txt" $DIR/corpus.txt; then
            echo "ok: ./k25dec --detokenize restores the corpus"
        else
            echo "FAIL: ./k25dec --detokenize does not restore the corpus"
            fail=1
        fi
    fi
    if ./k25dec --help 2>&1 | grep -q -- '--tokenizer-pattern'; then
        $REF encode $DIR o200k < <(cat $DIR/corpus.txt; printf '\0') >"$tmp/corpus.o200k.exp"
        ./k25dec --tokenizer $DIR/tiktoken.model --tokenizer-pattern "$(cat "$tmp/o200k.pat")" --tokenize \
            <$DIR/corpus.txt >"$tmp/corpus.o200k.got"
        if cmp -s "$tmp/corpus.o200k.exp" "$tmp/corpus.o200k.got"; then
            echo "ok: ./k25dec --tokenizer-pattern (o200k) on the corpus"
        else
            echo "FAIL: ./k25dec --tokenizer-pattern (o200k) differs from tiktoken"
            fail=1
        fi
    fi
else
    echo "note: ./k25dec has no --tokenize yet; compared through $TOOL only"
fi
exit $fail
