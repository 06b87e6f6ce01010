#!/usr/bin/env bash
# Faults during a long 2-rank CPU decode (the tiny model to the end of a 4096-token context,
# EOS disabled so nothing ends it early):
#   1. SIGKILL to rank 1: mpirun exits non-zero within 30 s, no rank is left running (rank 0
#      must not hang in a collective), and mpirun's message names rank 1 and the signal.
#   2. SIGTERM to mpirun: every process exits within 30 s and the ids generated so far were
#      printed as a finished line: what had been streamed before the signal, completed and
#      ended by "\n", equal to the first ids of an uninterrupted run (greedy decoding is
#      deterministic, so a run with -n <that many> is the reference).
#   3. SIGTERM to both ranks while they load the weights (what srun and scancel do): every
#      process exits within 5 s, non-zero, instead of loading on (a real checkpoint takes
#      minutes, and Slurm follows with SIGKILL after its KillWait).
# Rank processes are found by an environment tag passed with `mpirun -x` plus Open MPI's
# OMPI_COMM_WORLD_RANK, read from /proc/<pid>/environ.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=${K25DEC:-./k25dec}  # K25DEC: another binary, e.g. to check this test itself
# K25_RANK_KILL_ARGS: extra k25dec options, e.g. "--backend cuda" for the GPU case
read -r -a extra <<<"${K25_RANK_KILL_ARGS:-}"
[ -x "$bin" ] || { echo "missing $bin (make k25dec)"; exit 1; }
tmp=$(mktemp -d)
started=()
cleanup() {
    for p in "${started[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# shellcheck disable=SC2054  # 1,2,3 is one argument
args=(--config config/tiny.ini --synthetic 1 --tokens 1,2,3 -n 100000
      --set run.ctx_size=4096 --set tokens.eos_token_ids= "${extra[@]}")

# Running = exists and is not a zombie (an exited rank can stay a zombie until reaped).
alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# wait_gone SECONDS PID...: 0 when none of the PIDs runs any more within SECONDS.
wait_gone() {
    local limit=$1 p left
    shift
    for _ in $(seq $((limit * 10))); do
        left=0
        for p in "$@"; do alive "$p" && left=1; done
        [ $left -eq 0 ] && return 0
        sleep 0.1
    done
    return 1
}

# The PIDs given that still run, each after a space (for messages).
still_running() {
    local p
    for p in "$@"; do alive "$p" && echo -n " $p"; done
}

# PID of the rank with the given tag and world rank, or nothing.
rank_pid() {
    local tag=$1 rank=$2 p env
    for p in $(pgrep -f 'k25dec'); do
        env=$( { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
        grep -qx "K25_RANK_KILL_TAG=$tag" <<<"$env" && grep -qx "OMPI_COMM_WORLD_RANK=$rank" <<<"$env" &&
            echo "$p"
    done
}

n_ids() { { wc -w <"$1"; } 2>/dev/null || echo 0; }

# launch NAME READY ARGS...: k25dec ARGS on 2 tagged ranks in the background, then waits until
# `READY NAME` holds (at most 60 s, and only while mpirun runs); sets mp (mpirun PID), r0, r1.
launch() {
    local name=$1 ready=$2 tag="k25rk.$$.$1"
    shift 2
    mpirun -np 2 -x K25_RANK_KILL_TAG="$tag" "$bin" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    mp=$!
    started+=("$mp")
    for _ in $(seq 600); do
        "$ready" "$name" && break
        alive "$mp" || break
        sleep 0.1
    done
    r0=$(rank_pid "$tag" 0)
    r1=$(rank_pid "$tag" 1)
    for p in $r0 $r1; do started+=("$p"); done
}

# Mid-decode: a few ids have been streamed.
streaming() { [ "$(n_ids "$tmp/$1.out")" -ge 20 ]; }

# start NAME: launches the long decode and catches it mid-decode.
start() {
    launch "$1" streaming "${args[@]}"
    if [ -z "$r0" ] || [ -z "$r1" ] || ! alive "$mp" || ! streaming "$1"; then
        echo "could not catch the decode running (ranks '$r0' '$r1'):"
        cat "$tmp/$1.err"
        return 1
    fi
}

# ------------------------------------------------------------------------------------------
# 1. SIGKILL to rank 1
# ------------------------------------------------------------------------------------------
if start kill; then
    kill -KILL "$r1"
    if wait_gone 30 "$mp" "$r0" "$r1"; then
        wait "$mp"
        rc=$?
        [ "$rc" -ne 0 ] || bad "mpirun exited 0 after rank 1 was killed"
        # Open MPI 4: "mpirun noticed that process rank 1 with PID 0 on node vm exited on
        # signal 9 (Killed)." (PRRTE in Open MPI 5 says "prterun noticed ...").
        if grep -qE "noticed that process rank 1 with PID [0-9]+ on node [^ ]+ exited on signal 9" "$tmp/kill.err"; then
            echo "ok   SIGKILL of rank 1: all ranks gone, mpirun rc $rc, $(grep -oE 'process rank 1 .*exited on signal 9[^.]*' "$tmp/kill.err")"
        else
            bad "mpirun's output does not name the killed rank 1:"; cat "$tmp/kill.err"
        fi
    else
        bad "after SIGKILL of rank 1, still running after 30 s:$(still_running "$mp" "$r0") (mpirun $mp, rank 0 $r0)"
    fi
else
    bad "case 1 did not start"
fi

# ------------------------------------------------------------------------------------------
# 2. SIGTERM to mpirun
# ------------------------------------------------------------------------------------------
if start term; then
    before=$(cat "$tmp/term.out")
    kill -TERM "$mp"
    if wait_gone 30 "$mp" "$r0" "$r1"; then
        wait "$mp"
        rc=$?
        out=$(cat "$tmp/term.out")
        k=$(n_ids "$tmp/term.out")
        if [ "${out#"$before"}" = "$out" ] && [ -n "$before" ]; then
            bad "after SIGTERM the output no longer starts with what had been printed before it"
        elif [ "$(tail -c1 "$tmp/term.out" | od -An -c | tr -d ' ')" != '\n' ]; then
            bad "after SIGTERM the line of generated ids was not finished (no final newline; $k ids," \
                "the last one possibly cut): k25dec needs a SIGTERM/SIGINT handler that only sets a" \
                "flag, checked by the decode loop once per token and agreed on by all ranks (e.g." \
                "carried with rank 0's broadcast of the next token), after which rank 0 ends the" \
                "line of ids (\\n, fflush) and every rank exits (non-zero: the run was cut short). mpirun forwards SIGTERM to" \
                "the ranks 1 s after receiving it and sends SIGKILL 1 s later" \
                "(odls_base_sigkill_timeout), so the stop must complete within about a second."
            tail -5 "$tmp/term.err"
        elif ! grep -qxE '[0-9]+( [0-9]+)*' "$tmp/term.out" || [ "$(wc -l <"$tmp/term.out")" -ne 1 ]; then
            bad "after SIGTERM stdout is not one line of ids:"; head -c 300 "$tmp/term.out"
        else
            # The reference: the same run stopped by -n after k tokens.
            ref_args=("${args[@]}")
            ref_args[7]=$k  # the value of -n
            timeout 120 mpirun -np 2 "$bin" "${ref_args[@]}" >"$tmp/ref.out" 2>"$tmp/ref.err" ||
                { bad "reference run with -n $k failed"; tail -5 "$tmp/ref.err"; }
            if cmp -s "$tmp/ref.out" "$tmp/term.out"; then
                echo "ok   SIGTERM to mpirun: all processes gone, mpirun rc $rc, $k ids printed and equal to a -n $k run"
            else
                bad "the $k ids printed after SIGTERM differ from a run with -n $k"
            fi
        fi
    else
        bad "after SIGTERM to mpirun, still running after 30 s:$(still_running "$mp" "$r0" "$r1")"
    fi
else
    bad "case 2 did not start"
fi

# ------------------------------------------------------------------------------------------
# 3. SIGTERM to the ranks while loading
# ------------------------------------------------------------------------------------------
# A model whose synthetic weights take several seconds to build (about 1.2 GB a rank); the
# signal goes out once rank 0 has logged the line printed just before loading (the built-in
# model has no tokenizer, so a text prompt's bytes are its ids).
big=(--config config/tiny.ini --synthetic 1 -p abc -n 1 --set model.n_routed_experts=384
     --set model.moe_intermediate_size=512 --set model.hidden_size=1024
     --set model.num_hidden_layers=8 "${extra[@]}")
loading() { grep -q "no tokenizer" "$tmp/$1.err"; }
launch load loading "${big[@]}"
if [ -n "$r0" ] && [ -n "$r1" ] && ! grep -q "load time" "$tmp/load.err"; then
    kill -TERM "$r0" "$r1"
    if wait_gone 5 "$mp" "$r0" "$r1"; then
        wait "$mp"
        rc=$?
        if [ "$rc" -eq 0 ]; then
            bad "mpirun exited 0 after SIGTERM to the loading ranks"
        elif grep -q "load time" "$tmp/load.err"; then
            bad "the ranks finished loading after SIGTERM instead of stopping"
        else
            echo "ok   SIGTERM to both ranks while loading: all gone within 5 s, mpirun rc $rc"
        fi
    else
        bad "after SIGTERM to the loading ranks, still running after 5 s:$(still_running "$mp" "$r0" "$r1")"
    fi
else
    bad "case 3 did not catch the ranks loading (ranks '$r0' '$r1'):"; cat "$tmp/load.err"
fi

[ $fail -eq 0 ] && echo "t_rank_kill: ok"
exit $fail
