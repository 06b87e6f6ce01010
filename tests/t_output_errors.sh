#!/usr/bin/env bash
# Output that cannot be written is an error, never a silent exit 0, and a result file's name is
# never replaced by something else:
#   1. stdout on a full device (a /dev/full node): k25dec's tokens, --help, --dump-config, the
#      tokenizer tools and k25bench's table each exit non-zero naming standard output (k25dec
#      stops generating at the next step). Run without mpirun: under mpirun the ranks write
#      into mpirun's pipe, and a failure past it is mpirun's to report, so k25dec -o FILE on
#      a full device under mpirun fails every rank instead. -o to a regular file holds what
#      stdout would, and appears only when complete (or stopped by a signal).
#   2. --dump-logits and k25bench --json: a directory or an empty name is refused before the
#      model loads; a named pipe (cannot be rewound) is refused for the dump; a link stays a link and
#      its target gets the file; a device node stays a device node (the file used to be
#      renamed over it); k25bench --json on a full device fails the run, its table still out.
#   3. SIGINT while k25dec's write to stdout waits on a full pipe (a slow reader): the write
#      goes on once the reader reads, the run stops after that step with exit 130 and the text
#      of a run with -n <tokens printed> (the interrupted write failed: exit 1, text lost).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for b in ./k25dec ./k25bench; do [ -x "$b" ] || { echo "missing $b (make)"; exit 1; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tok=tests/data/tokenizer/tiktoken.model
bench=(--config config/tiny.ini --synthetic 1 --concurrency 1,2 --input-len 8 --output-len 4
       --profile-steps 1 --no-warmup)

# A full device of the test's own (as root), so that a binary that renames a file over its
# target replaces only this copy (an old k25bench turned /dev/full into a file that way); else
# the system's /dev/full, as stdout only.
full=
if [ "$(id -u)" -eq 0 ] && mknod "$tmp/full" c 1 7 2>/dev/null; then full=$tmp/full
elif [ -c /dev/full ]; then full=/dev/full; fi

# 1. stdout on a full device
if [ -n "$full" ]; then
    check_full() { # WHAT MESSAGE CMD...: CMD >$full exits non-zero with MESSAGE on stderr
        local what=$1 msg=$2 rc
        shift 2
        timeout 60 "$@" >"$full" 2>"$tmp/err" </dev/null
        rc=$?
        if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "$what on a full device: exit $rc"
        elif ! grep -qF -- "$msg" "$tmp/err"; then bad "$what on a full device: no '$msg' in: $(tail -2 "$tmp/err")"
        else echo "ok   $what on a full device: exit $rc, $(grep -m1 -F -- "$msg" "$tmp/err")"; fi
    }
    # k25dec stops at the step after the failure: 1 token of the 100000 asked for
    check_full "tokens" "writing standard output failed: No space left on device after 1 token" \
        ./k25dec -p hi -n 100000 --set tokens.eos_token_ids=
    check_full "--help" "writing standard output failed" ./k25dec --help
    check_full "--dump-config" "writing standard output failed" ./k25dec --dump-config
    printf 'hello' >"$tmp/text"
    printf '104 105' >"$tmp/ids"
    check_full "--tokenize" "--tokenize: writing the output failed" \
        sh -c './k25dec --tokenizer "$1" --tokenize <"$2"' sh "$tok" "$tmp/text"
    check_full "--detokenize" "--detokenize: writing the output failed" \
        sh -c './k25dec --tokenizer "$1" --detokenize <"$2"' sh "$tok" "$tmp/ids"
    check_full "k25bench's table" "writing standard output failed" ./k25bench "${bench[@]}"
    # -o on a full device under mpirun: rank 0 names the file, every rank exits non-zero
    timeout 60 mpirun -np 2 bash -c './k25dec -p hi -n 100000 --set tokens.eos_token_ids= -o "$1"
        echo "k25rc $OMPI_COMM_WORLD_RANK $?" >&2' sh "$full" >/dev/null 2>"$tmp/err"
    msg="writing the --output file $full failed: No space left on device after 1 token"
    if [ "$(grep -c '^k25rc [01] [1-9]' "$tmp/err")" -ne 2 ]; then
        bad "-o on a full device under mpirun: not every rank failed: $(grep k25rc "$tmp/err")"
    elif ! grep -qF -- "$msg" "$tmp/err"; then bad "-o on a full device: no '$msg'"
    else echo "ok   -o on a full device under mpirun: every rank exits non-zero, $msg"; fi
else
    echo "skip stdout checks: no full device (/dev/full missing, and not root to make one)"
fi

# 2. result files. refused_early WHAT MESSAGE CMD...: exits non-zero with MESSAGE, and before
# loading the model (k25dec logs each rank's backend memory once loaded, k25bench "model ready")
refused_early() {
    local what=$1 msg=$2 rc
    shift 2
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "$what: exit $rc"
    elif ! grep -qF -- "$msg" "$tmp/err"; then bad "$what: no '$msg' in: $(tail -2 "$tmp/err")"
    elif grep -qE "backend memory|model ready" "$tmp/err"; then bad "$what: refused only after loading"
    else echo "ok   $what: $(grep -m1 -F -- "$msg" "$tmp/err")"; fi
}
mkdir "$tmp/dir"
refused_early "--dump-logits DIR" "--dump-logits: $tmp/dir is a directory" \
    mpirun -np 2 ./k25dec -p hi -n 2 --dump-logits "$tmp/dir"
refused_early "--dump-logits ''" "--dump-logits: the path is empty" \
    mpirun -np 2 ./k25dec -p hi -n 2 --dump-logits ""
refused_early "k25bench --json DIR" "--json: $tmp/dir is a directory" \
    mpirun -np 2 ./k25bench "${bench[@]}" --json "$tmp/dir"
refused_early "k25bench --json ''" "--json: the path is empty" \
    mpirun -np 2 ./k25bench "${bench[@]}" --json ""
refused_early "-o DIR" "--output: $tmp/dir is a directory" \
    mpirun -np 2 ./k25dec -p hi -n 2 -o "$tmp/dir"
refused_early "-o and --dump-logits on one file" "--output and --dump-logits name one file" \
    mpirun -np 2 ./k25dec -p hi -n 2 -o "$tmp/one" --dump-logits "$tmp/./one"
[ -z "$(ls -A "$tmp/dir")" ] || bad "a refused run left files in $tmp/dir: $(ls "$tmp/dir")"
[ -e "$tmp/one" ] && bad "a refused run left $tmp/one"

# -o to a regular file under mpirun: what stdout gets, byte for byte, no .tmp left, nothing on
# stdout; text through a tokenizer, and ids
for form in "--tokenizer $tok --set model.vocab_size=6512 -p Hello" "--tokens 1,2,3"; do
    read -ra a <<<"$form"
    timeout 60 mpirun -np 2 ./k25dec "${a[@]}" -n 12 >"$tmp/stdout.ref" 2>/dev/null
    timeout 60 mpirun -np 2 ./k25dec "${a[@]}" -n 12 -o "$tmp/gen.out" >"$tmp/stdout.o" 2>"$tmp/err"
    rc=$?
    if [ $rc -ne 0 ] || [ -s "$tmp/stdout.o" ] || ! [ -s "$tmp/stdout.ref" ] ||
        ! cmp -s "$tmp/stdout.ref" "$tmp/gen.out" || [ -e "$tmp/gen.out.tmp" ]; then
        bad "-o FILE ($form): exit $rc, file $(wc -c <"$tmp/gen.out" 2>/dev/null) bytes, stdout run $(wc -c <"$tmp/stdout.ref") bytes"
    else
        echo "ok   -o FILE ($form): the $(wc -c <"$tmp/gen.out") bytes stdout gets, nothing on stdout"
    fi
    rm -f "$tmp/gen.out"
done
# SIGINT during a run with -o: the file gets what was generated, in place, and the exit is 130
long=(--tokens 1,2,3 --set tokens.eos_token_ids= -c 4096 --set model.max_position_embeddings=4096)
./k25dec "${long[@]}" -n 100000 -o "$tmp/sig.ids" 2>"$tmp/err" &
pid=$!
for _ in $(seq 600); do [ -s "$tmp/sig.ids.tmp" ] && break; sleep 0.05; done
kill -INT $pid
wait $pid
rc=$?
n=$(grep -oE 'stopped by a signal after [0-9]+ tokens' "$tmp/err" | grep -oE '[0-9]+')
if [ $rc -ne 130 ] || [ -z "$n" ] || [ -e "$tmp/sig.ids.tmp" ] ||
    [ "$(wc -w <"$tmp/sig.ids")" != "$n" ]; then
    bad "SIGINT with -o: exit $rc, $(wc -w <"$tmp/sig.ids" 2>/dev/null) ids in the file, stopped after ${n:-?}"
elif ! timeout 60 ./k25dec "${long[@]}" -n "$n" 2>/dev/null | cmp -s - "$tmp/sig.ids"; then
    bad "SIGINT with -o: the file differs from a -n $n run's output"
else
    echo "ok   SIGINT with -o: exit 130, the file holds the $n ids of a -n $n run"
fi

# a named pipe, with a reader so that opening it does not wait
mkfifo "$tmp/fifo"
timeout 60 cat "$tmp/fifo" >/dev/null &
refused_early "--dump-logits FIFO" "cannot be rewound" \
    mpirun -np 2 ./k25dec -p hi -n 2 --dump-logits "$tmp/fifo"
timeout 5 sh -c ': >"$1"' sh "$tmp/fifo" # the reader's end of file, when nothing opened it
wait

# Links, to an existing file and to a new one (relative): the link stays, its target is the dump
# (a K25LOGIT file: 24-byte header + 2 prompt rows and 2 generated x (8 + 512 x 4) bytes).
want=$((24 + 4 * (8 + 512 * 4)))
echo old >"$tmp/existing.bin"
ln -s "$tmp/existing.bin" "$tmp/link1"
ln -s new.bin "$tmp/link2"
for l in link1:existing.bin link2:new.bin; do
    timeout 60 mpirun -np 2 ./k25dec -p hi -n 3 --dump-logits "$tmp/${l%%:*}" >/dev/null 2>"$tmp/err"
    rc=$?
    size=$(stat -c %s "$tmp/${l#*:}" 2>/dev/null || echo none)
    if [ $rc -ne 0 ] || [ ! -L "$tmp/${l%%:*}" ] || [ "$size" != "$want" ] ||
        [ "$(head -c 8 "$tmp/${l#*:}")" != K25LOGIT ] || ls "$tmp"/*.tmp >/dev/null 2>&1; then
        bad "--dump-logits through ${l%%:*}: exit $rc, link kept: $([ -L "$tmp/${l%%:*}" ] && echo yes || echo no), ${l#*:} $size bytes (want $want)"
    else
        echo "ok   --dump-logits through a link to ${l#*:}: the link stays, the target holds $size bytes"
    fi
done

# A device node stays one (as root only: making a node needs it). The null device takes the
# dump in place.
if [ "$(id -u)" -eq 0 ] && mknod "$tmp/null" c 1 3 2>/dev/null; then
    timeout 60 mpirun -np 2 ./k25dec -p hi -n 2 --dump-logits "$tmp/null" >/dev/null 2>"$tmp/err"
    rc=$?
    timeout 60 mpirun -np 2 ./k25bench "${bench[@]}" --json "$tmp/null" >/dev/null 2>>"$tmp/err"
    rc2=$?
    if [ $rc -ne 0 ] || [ $rc2 -ne 0 ] || [ ! -c "$tmp/null" ] || ls "$tmp"/null.* >/dev/null 2>&1; then
        bad "a device node as --dump-logits / --json: exit $rc / $rc2, still a device: $([ -c "$tmp/null" ] && echo yes || echo no)"
        tail -3 "$tmp/err"
    else
        echo "ok   a null device node as --dump-logits and --json: written in place, still a device"
    fi
else
    echo "skip device node check: not root"
fi

# k25bench --json on a full device: the run fails at its end, naming the file; the table is out
if [ "$full" = "$tmp/full" ]; then
    timeout 120 mpirun -np 2 ./k25bench "${bench[@]}" --json "$full" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "k25bench --json on a full device: exit $rc"
    elif ! grep -qF -- "--json: writing $full failed: No space left on device" "$tmp/err"; then
        bad "k25bench --json on a full device: message: $(grep error "$tmp/err")"
    elif [ "$(grep -cE '^\| +[12] \| +[0-9]+ \| +[0-9]+ \| ' "$tmp/out")" -ne 2 ]; then
        bad "k25bench --json on a full device: the table lacks a level:"; cat "$tmp/out"
    else
        echo "ok   k25bench --json on a full device: exit $rc, both levels in the table, $(grep -m1 -F -- '--json: writing' "$tmp/err")"
    fi
else
    echo "skip k25bench --json on a full device: not root (the system's /dev/full is not risked)"
fi

# 3. A signal while stdout is a full pipe: the write must not fail with EINTR (the text in
# stdio's buffer would be dropped and the run would end in a write error instead of the stop).
tokargs=(--tokenizer "$tok" --set model.vocab_size=6512 --set tokens.bos_token_id=6256
         --set tokens.eos_token_ids= --set tokens.pad_token_id=6511 -p Hello -c 4096)
python3 - "$tmp" ./k25dec "${tokargs[@]}" -n 4000 <<'EOF'
import fcntl, os, signal, subprocess, sys, time
tmp, cmd = sys.argv[1], sys.argv[2:]
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: a pipe that fills after a few hundred tokens
with open(tmp + "/sig.err", "wb") as err:
    p = subprocess.Popen(cmd, stdout=w, stderr=err)
os.close(w)
deadline = time.time() + 60
while time.time() < deadline:  # until k25dec waits in write(2) on the full pipe
    try:
        if open(f"/proc/{p.pid}/syscall").read().split()[0] == "1":
            break
    except (OSError, IndexError):
        pass
    time.sleep(0.05)
p.send_signal(signal.SIGINT)
time.sleep(0.5)
with open(tmp + "/sig.out", "wb") as out:
    while chunk := os.read(r, 65536):
        out.write(chunk)
sys.exit(p.wait())
EOF
rc=$?
n=$(grep -oE 'stopped by a signal after [0-9]+ tokens' "$tmp/sig.err" | grep -oE '[0-9]+')
if [ $rc -ne 130 ] || [ -z "$n" ]; then
    bad "SIGINT with stdout a full pipe: exit $rc (want 130): $(grep -m1 -E 'error|stopped' "$tmp/sig.err")"
elif ! timeout 60 ./k25dec "${tokargs[@]}" -n "$n" >"$tmp/sig.ref" 2>/dev/null ||
    ! cmp -s "$tmp/sig.ref" "$tmp/sig.out"; then
    bad "SIGINT with stdout a full pipe: the $(wc -c <"$tmp/sig.out") bytes printed differ from a -n $n run"
else
    echo "ok   SIGINT with stdout a full pipe: exit 130, the text of $n tokens, as a -n $n run"
fi

[ $fail -eq 0 ] && echo "t_output_errors: ok"
exit $fail
