#!/usr/bin/env bash
# Damaged checkpoints are refused with a message naming what is wrong. A good checkpoint is
# written with k25-mkckpt, copied, and each copy damaged one way: missing shard, truncated
# shard, corrupt header JSON, wrong dtype, unsupported dtype, wrong shape, tensor missing from
# its shard or from the index, flipped data byte (CRC manifest), missing manifest, unlisted
# shard; and a manifest asked for a directory without shards. Loading goes through
# `test_weights --load` (checkpoint_open + weights_plan), CRC checks through
# `test_weights --verify`; when ./k25dec is built, 2-rank runs on the damaged copies must exit
# non-zero (no rank left hanging) with the same message. The writers refuse what would lose or
# mix data: a directory that already holds a checkpoint (k25-mkckpt and k25-mkeagle both), a
# checkpoint larger than the free disk, a missing model or flags that contradict each other; a
# seed means the same weights in every tool (decimal, no sign).
set -u
B=${K25_BUILD:-build}
TW=$B/tests/test_weights
MK=./k25-mkckpt
for x in "$TW" "$MK"; do
    [ -x "$x" ] || { echo "missing $x (build first)"; exit 1; }
done
tmp=$(mktemp -d /tmp/k25-ckpt-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

good=$tmp/good
"$MK" --config config/tiny.ini --synthetic 5 --out "$good" --shards 4 2>"$tmp/mk.log" ||
    { cat "$tmp/mk.log"; echo "FAIL k25-mkckpt"; exit 1; }
"$TW" --load "$good" >/dev/null || fail "good checkpoint does not load"
"$TW" --verify "$good" >/dev/null || fail "good checkpoint does not verify"
"$TW" --check "$good" 5 >/dev/null || fail "good checkpoint differs from --synthetic 5"

# expect MODE DIR WHAT PATTERN...: `test_weights --MODE DIR` fails, its message has every pattern.
expect() {
    local mode=$1 dir=$2 what=$3 out rc
    shift 3
    out=$(timeout 30 "$TW" --"$mode" "$dir" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then fail "$what: accepted by --$mode"; return; fi
    if [ $rc -eq 124 ]; then fail "$what: --$mode hung"; return; fi
    for p in "$@"; do
        grep -qF -- "$p" <<<"$out" || fail "$what: --$mode message lacks '$p': $out"
    done
    echo "ok   $what ($mode): $out"
}
copy() { rm -rf "$tmp/$1"; cp -r "$good" "$tmp/$1"; echo "$tmp/$1"; }
shard_of() { grep -l -F -- "\"$2\"" "$1"/*.safetensors | head -1; }
# put FILE OFFSET TEXT: overwrite bytes in place.
put() { printf '%s' "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# Byte offset in FILE just after the first occurrence of PATTERN.
after() { local o; o=$(grep -obUaF -- "$2" "$1" | head -1 | cut -d: -f1); echo $((o + ${#2})); }

P=language_model.model.layers
S2=model-00002-of-00004.safetensors

d=$(copy missing)
rm "$d/$S2"
expect load "$d" "missing shard" "$S2" "No such file"
expect verify "$d" "missing shard" "$S2" "missing"

d=$(copy truncated)
truncate -s -100 "$d/$S2"
expect load "$d" "truncated shard" "$S2" "truncated" "tensor '"
expect verify "$d" "truncated shard" "$S2" "bytes"

d=$(copy badjson)
f=$(shard_of "$d" "$P.0.self_attn.q_a_proj.weight")
put "$f" "$(($(after "$f" "\"$P.0.self_attn.q_a_proj.weight\"") ))" ";"
expect load "$d" "corrupt header JSON" "$(basename "$f")" "not valid JSON"

d=$(copy dtype)
t="$P.1.mlp.gate.e_score_correction_bias"
f=$(shard_of "$d" "$t")
put "$f" "$(after "$f" "\"$t\":{\"dtype\":\"")" "I32"
expect load "$d" "wrong dtype" "$t" "dtype I32, expected F32" "$(basename "$f")"

d=$(copy f16)
t="$P.2.self_attn.kv_a_layernorm.weight"
f=$(shard_of "$d" "$t")
put "$f" "$(after "$f" "\"$t\":{\"dtype\":\"")" "F16\" "
expect load "$d" "unsupported dtype" "$t" "F16 is not supported"

d=$(copy shape)
t="$P.0.self_attn.q_a_proj.weight"
f=$(shard_of "$d" "$t")
put "$f" "$(after "$f" "\"$t\":{\"dtype\":\"BF16\",\"shape\":[")" "128,64]"
expect load "$d" "wrong shape" "$t" "shape [128, 64], expected [64, 128]"

d=$(copy weightshape)
t="$P.1.mlp.experts.0.down_proj.weight_shape"
python3 - "$(shard_of "$d" "$t")" "$t" <<'PY' || fail "could not patch $t"
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
off = 8 + n + json.loads(b[8:8 + n])[name]["data_offsets"][0]
b[off:off + 8] = struct.pack("<2i", 128, 256)
open(path, "wb").write(b)
PY
# named as the file stores it (with its prefix), not by the canonical name
expect load "$d" "wrong weight_shape" "tensor '$t': (128, 256), expected (128, 128)"

d=$(copy notinshard)
t="$P.3.self_attn.q_a_layernorm.weight"
f=$(shard_of "$d" "$t")
put "$f" "$(($(after "$f" "\"$t") - 7))" "X"
expect load "$d" "tensor missing from its shard" "$t" "$(basename "$f")" "does not contain it"

d=$(copy notinindex)
t="$P.3.self_attn.q_a_layernorm.weight"
sed -i "s/\"$t\"/\"${t}X\"/" "$d/model.safetensors.index.json"
expect load "$d" "tensor missing from the index" "model.layers.3.self_attn.q_a_layernorm.weight" "not found"

# A weight_map shard in a subdirectory or of another suffix is refused: --verify lists the
# directory's *.safetensors files only, so the loader read it unchecked (a changed byte passed).
d=$(copy subdir)
mkdir "$d/s" && mv "$d/$S2" "$d/s/"
sed -i "s#\"$S2\"#\"s/$S2\"#" "$d/model.safetensors.index.json"
expect load "$d" "shard in a subdirectory" "'s/$S2' is not a shard file name"
d=$(copy suffix)
mv "$d/$S2" "$d/model-00002.bin"
sed -i "s#\"$S2\"#\"model-00002.bin\"#" "$d/model.safetensors.index.json"
expect load "$d" "shard of another suffix" "'model-00002.bin' is not a shard file name"

d=$(copy packed)
t="$P.2.mlp.experts.7.down_proj.weight_packed"
f=$(shard_of "$d" "$t")
put "$f" "$(after "$f" "\"$t\":{\"dtype\":\"I32\",\"shape\":[")" "16,128"
expect load "$d" "wrong INT4 packed shape" "$t" "shape [16, 128], expected [128, 16]"

d=$(copy crc)
size=$(stat -c %s "$d/$S2")
put "$d/$S2" $((size - 3)) "Z"
"$TW" --load "$d" >/dev/null || fail "a flipped data byte must still load (only --verify sees it)"
expect verify "$d" "data byte changed" "$S2" "CRC-32" "corrupted"
cp -r "$d" "$tmp/remanifest"
"$MK" --manifest "$tmp/remanifest" 2>/dev/null || fail "k25-mkckpt --manifest"
"$TW" --verify "$tmp/remanifest" >/dev/null || fail "a regenerated manifest does not verify"

# A directory with no shards: --manifest refuses it rather than writing an empty manifest.
mkdir "$tmp/noshards"
out=$("$MK" --manifest "$tmp/noshards" 2>&1)
rc=$?
if [ $rc -eq 0 ] || [ -e "$tmp/noshards/k25-manifest.crc32" ]; then
    fail "k25-mkckpt --manifest on a directory with no shards: exit $rc"
elif ! grep -qF -- "no *.safetensors files" <<<"$out"; then
    fail "k25-mkckpt --manifest on a directory with no shards: message: $out"
else
    echo "ok   no shards (mkckpt --manifest): $out"
fi

# A shard count that is not a positive integer (atoi read "2x" as 2 and 99999999999 as garbage).
for n in 2x 0 99999999999 ''; do
    out=$("$MK" --config config/tiny.ini --synthetic 5 --out "$tmp/badshards" --shards "$n" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || [ -e "$tmp/badshards" ]; then
        fail "k25-mkckpt --shards '$n': exit $rc"
    elif ! grep -qF -- "k25-mkckpt: error: --shards: '$n' is not a positive integer" <<<"$out"; then
        fail "k25-mkckpt --shards '$n': message: $out"
    fi
done
echo "ok   bad --shards values (mkckpt)"

# k25-mkckpt and k25-mkeagle refuse a directory that holds a checkpoint: the head's
# config.json written over a model's made the model unloadable.
mkdir -p "$tmp/parent"
EG=./k25-mkeagle
if [ -x "$EG" ]; then
    sum=$(cat "$good/config.json" | md5sum)
    out=$("$EG" --config config/tiny.ini --synthetic 1 --out "$good" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || [ "$(cat "$good/config.json" | md5sum)" != "$sum" ]; then
        fail "k25-mkeagle over a checkpoint: exit $rc, config.json changed or not"
    elif ! grep -qF -- "$good already holds a checkpoint" <<<"$out"; then
        fail "k25-mkeagle over a checkpoint: message: $out"
    else
        echo "ok   k25-mkeagle over a checkpoint: $out"
    fi
    # a new directory, parents included, then the same refusal from k25-mkckpt over the head
    "$EG" --config config/tiny.ini --synthetic 1 --out "$tmp/parent/a/eagle" 2>/dev/null ||
        fail "k25-mkeagle into a new nested directory"
    out=$("$MK" --config config/tiny.ini --synthetic 1 --out "$tmp/parent/a/eagle" 2>&1)
    [ $? -ne 0 ] && grep -qF -- "already holds a checkpoint" <<<"$out" ||
        fail "k25-mkckpt over an EAGLE head: $out"
    # an empty item of --aux-layers is refused, not skipped (it wrote the head with [1, 2])
    for v in 1,,2 ,1 1,; do
        out=$("$EG" --config config/tiny.ini --synthetic 1 --aux-layers "$v" --out "$tmp/aux" 2>&1)
        [ $? -eq 2 ] && [ ! -e "$tmp/aux" ] && grep -qF -- "--aux-layers: '$v'" <<<"$out" ||
            fail "k25-mkeagle --aux-layers '$v': $out"
    done
fi

# Missing, empty or contradicting options: a line naming the problem, exit 2, nothing written.
refused() { # TOOL "message" args...
    local tool=$1 msg=$2 out rc
    shift 2
    out=$("$tool" "$@" 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || [ -e "$tmp/parent/x" ] || ! grep -qF -- "$(basename "$tool"): $msg" <<<"$out"; then
        fail "$(basename "$tool") $*: exit $rc, message: $(head -1 <<<"$out")"
    fi
}
refused "$MK" "error: no model: give --config" --synthetic 5 --out "$tmp/parent/x"
refused "$MK" "error: missing --synthetic SEED" --config config/tiny.ini --out "$tmp/parent/x"
refused "$MK" "error: missing --out DIR" --config config/tiny.ini --synthetic 5
refused "$MK" "error: --single writes one file: it takes no --shards" --config config/tiny.ini \
    --synthetic 5 --single --shards 2 --out "$tmp/parent/x"
refused "$MK" "error: --manifest DIR takes no other option" --manifest "$good" --out "$tmp/parent/x"
refused "$MK" "error: --manifest: the path is empty" --manifest ""
refused "$MK" "error: --config: the path is empty" --config "" --synthetic 5 --out "$tmp/parent/x"
refused "$MK" "error: --out: the path is empty" --config config/tiny.ini --synthetic 5 --out ""
refused "$EG" "error: give one of --config FILE.ini and --model DIR" --synthetic 5 --out "$tmp/parent/x"
refused "$EG" "error: missing --out DIR" --config config/tiny.ini --synthetic 5
refused "$EG" "error: --model: the path is empty" --model "" --synthetic 5 --out "$tmp/parent/x"
refused "$EG" "unknown option '--bogus'" --config config/tiny.ini --synthetic 5 --bogus
echo "ok   missing, empty or contradicting k25-mkckpt and k25-mkeagle options"

# A checkpoint larger than the free space is refused before the first byte (the full model:
# 594 GB). Skipped where that much is free.
free_kb=$(df -Pk "$tmp" | awk 'NR == 2 {print $4}')
if [ "${free_kb:-0}" -lt $((590 * 1000 * 1000)) ]; then
    out=$("$MK" --config config/kimi_k25.ini --synthetic 1 --out "$tmp/parent/full" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || ! grep -qE -- "the checkpoint needs 594\.[0-9]+ GB, the file system has [0-9.]+ GB free" <<<"$out"; then
        fail "k25-mkckpt of the full model on a small disk: exit $rc, $out"
    elif [ -n "$(ls -A "$tmp/parent/full")" ]; then
        fail "k25-mkckpt of the full model on a small disk wrote files"
    else
        echo "ok   full model on a small disk: $out"
    fi
else
    echo "skip free-space check: ${free_kb} kB free"
fi

# A seed is decimal in every tool: 010 is 10 (k25-mkckpt read it as octal 8); a sign is refused.
"$MK" --config config/tiny.ini --synthetic 010 --out "$tmp/seed010" 2>/dev/null &&
    "$TW" --check "$tmp/seed010" 10 >/dev/null || fail "k25-mkckpt --synthetic 010 is not seed 10"
for s in -1 +5 " 5" 0x10 18446744073709551616; do
    out=$("$MK" --config config/tiny.ini --synthetic "$s" --out "$tmp/parent/s" 2>&1)
    [ $? -ne 0 ] && grep -qF -- "--synthetic: '$s' is not a non-negative integer seed" <<<"$out" ||
        fail "k25-mkckpt --synthetic '$s': $out"
done
echo "ok   seeds: 010 is 10, signs, spaces, hex and 2^64 refused"

d=$(copy nomanifest)
rm "$d/k25-manifest.crc32"
expect verify "$d" "no manifest" "k25-manifest.crc32" "k25-mkckpt --manifest"

d=$(copy extra)
cp "$d/$S2" "$d/model-extra.safetensors"
expect verify "$d" "shard not in the manifest" "model-extra.safetensors" "not listed"

d=$(copy indextail)
printf 'xyz' >>"$d/model.safetensors.index.json"
expect load "$d" "data after the index's JSON object" "model.safetensors.index.json: data after the JSON object"

# A named pipe in a shard's place is refused (the open waited for a writer: the load hung).
d=$(copy fifo)
rm "$d/$S2" && mkfifo "$d/$S2"
expect load "$d" "a named pipe as a shard" "$S2: not a regular file"

# A named pipe or a directory in the manifest's place is refused (the open of the pipe waited for
# a writer: --verify hung; a directory read as an empty manifest).
for kind in fifo dir; do
    d=$(copy "manifest$kind")
    rm "$d/k25-manifest.crc32"
    if [ $kind = fifo ]; then mkfifo "$d/k25-manifest.crc32"; else mkdir "$d/k25-manifest.crc32"; fi
    expect verify "$d" "a $kind as the manifest" "k25-manifest.crc32: not a regular file"
done

d=$(copy noindex)
rm "$d/model.safetensors.index.json"
expect load "$d" "no index" "model.safetensors.index.json"

# The decoder: every rank exits non-zero (mpirun returns, no hang) with the message.
if [ -x ./k25dec ]; then
    for c in missing:"$S2" dtype:"e_score_correction_bias" shape:"q_a_proj" crc:"CRC-32"; do
        name=${c%%:*}
        pat=${c#*:}
        extra=()
        [ "$name" = crc ] && extra=(--verify)
        out=$(timeout 120 mpirun -np 2 ./k25dec --model "$tmp/$name" "${extra[@]}" --tokens 1,2 \
              -n 1 --backend cpu 2>&1)
        rc=$?
        if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
            fail "k25dec on $name: exit $rc"
        elif ! grep -qF -- "$pat" <<<"$out"; then
            fail "k25dec on $name: message lacks '$pat': $out"
        else
            echo "ok   k25dec -np 2 on $name exits $rc"
        fi
    done
    # The tokenizer: a tiktoken.model link whose target is gone (a download that stopped) fails
    # instead of passing for no tokenizer (byte ids); a pattern with no tokenizer to apply it to.
    d=$(copy danglingtok)
    ln -s "$tmp/nonexistent/tiktoken.model" "$d/tiktoken.model"
    for c in "$d:tiktoken.model: cannot open" "$good:has no tiktoken.model to apply it to"; do
        dir=${c%%:*}
        pat=${c#*:}
        out=$(timeout 120 mpirun -np 2 ./k25dec --model "$dir" -p Hello -n 1 \
              $([ "$dir" = "$good" ] && echo --tokenizer-pattern '\w+') 2>&1)
        rc=$?
        if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF -- "$pat" <<<"$out"; then
            fail "k25dec on $(basename "$dir") with -p: exit $rc: $out"
        else
            echo "ok   k25dec -np 2 -p on $(basename "$dir"): $(grep -m1 -o 'error: .*' <<<"$out")"
        fi
    done
else
    echo "skip k25dec checks: ./k25dec not built"
fi

[ $fails -eq 0 ] && echo "t_checkpoint: ok" || echo "t_checkpoint: $fails failure(s)"
[ $fails -eq 0 ]
