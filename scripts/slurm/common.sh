# Helpers shared by the scripts in scripts/slurm/ (sourced, not run): the job banner, the
# model arguments from the environment, the srun line, the resolved configuration, and the
# sweep-file format. The caller sets K25_ROOT (the repository) first. The job helpers run
# inside a Slurm job (the job scripts check SLURM_JOB_ID before sourcing this); the sweep
# helpers also serve submit-sweep.sh on the login node.
#
# Environment understood by every job script:
#   K25_MODEL=DIR        checkpoint directory             -> --model DIR
#   K25_CONFIG=FILE.ini  model configuration              -> --config FILE.ini
#   K25_SYNTHETIC=SEED   synthetic weights (with CONFIG)  -> --synthetic SEED
#   K25_BACKEND=cpu|cuda compute backend (default: cuda when the job has GPUs, else the config's)
#   K25_ARGS="..."       more arguments for the program, quoted as on a shell command line
#   K25_SRUN_ARGS="..."  more arguments for srun (e.g. -l to label lines with the rank)
#   K25_DEC, K25_BENCH   the binaries (default ./k25dec, ./k25bench at the repository root)
#   K25_ROOT             the repository (default: found from the submitted script's path)
#
# The scripts run under `set -u` and expand arrays as ${a[@]+"${a[@]}"}: bash before 4.4
# (RHEL/Rocky 7, still on some clusters' nodes) calls "${a[@]}" of an empty array unbound.

# ---------------------------------------------------------------------------------------------
# Environment of the ranks
# ---------------------------------------------------------------------------------------------

# Open MPI refuses to start as root unless told twice; CI and containers run as root.
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
K25_DEC=${K25_DEC:-$K25_ROOT/k25dec}
K25_BENCH=${K25_BENCH:-$K25_ROOT/k25bench}

# CPUs each rank may use: what the job holds on this node divided by its ranks here. srun in
# Slurm 22.05 does not take --cpus-per-task from sbatch; without it a cluster that binds tasks
# to CPUs pins each rank, and all its OpenMP threads, to one core.
k25_cpus_per_task() {
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then echo "$SLURM_CPUS_PER_TASK"; return; fi
    local cpus=${SLURM_CPUS_ON_NODE:-1}
    local tasks=${SLURM_NTASKS_PER_NODE:-${SLURM_NTASKS:-1}}
    tasks=${tasks%%(*}   # "8(x2)" -> 8
    local c=$((cpus / tasks))
    [ "$c" -ge 1 ] || c=1
    echo "$c"
}

# srun with PMIx (so Open MPI ranks find each other; plain srun can start N singletons). No
# per-task GPU binding: a step that asks for no GPUs of its own gets all of the job's, so every
# rank sees all GPUs of its node and the program picks one by its node-local rank.
k25_srun() {
    local extra=()
    k25_words extra "${K25_SRUN_ARGS:-}" K25_SRUN_ARGS
    srun --mpi=pmix --cpus-per-task="$(k25_cpus_per_task)" ${extra[@]+"${extra[@]}"} "$@"
}

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

# Fills the array K25_MODEL_ARGS from K25_MODEL / K25_CONFIG / K25_SYNTHETIC / K25_BACKEND.
k25_model_args() {
    K25_MODEL_ARGS=()
    [ -n "${K25_MODEL:-}" ] && K25_MODEL_ARGS+=(--model "$K25_MODEL")
    [ -n "${K25_CONFIG:-}" ] && K25_MODEL_ARGS+=(--config "$K25_CONFIG")
    [ -n "${K25_SYNTHETIC:-}" ] && K25_MODEL_ARGS+=(--synthetic "$K25_SYNTHETIC")
    local backend=${K25_BACKEND:-}
    if [ -z "$backend" ] && [ "${SLURM_GPUS_ON_NODE:-0}" != 0 ]; then backend=cuda; fi
    [ -n "$backend" ] && K25_MODEL_ARGS+=(--backend "$backend")
    return 0
}

# Whether text $1 splits into words under shell quoting; parsed by a separate shell, so
# nothing in it runs.
k25_words_ok() { bash -n -c "_words=($1)" 2>/dev/null; }
# Fills the array named $1 with the words of text $2 under shell quoting (so -p "two words" is
# two words); stops, naming $3 (where the text came from), when it does not split.
k25_words() {
    if ! k25_words_ok "$2"; then
        echo "error: $3: not shell words (a quote or parenthesis left open?): $2" >&2
        exit 2
    fi
    eval "$1=($2)"
}

# Fills the array K25_EXTRA_ARGS from K25_ARGS.
k25_extra_args() {
    K25_EXTRA_ARGS=()
    k25_words K25_EXTRA_ARGS "${K25_ARGS:-}" K25_ARGS
}

# The words quoted so that the printed line can be pasted back into a shell.
k25_quoted() {
    local q
    q=$(printf '%q ' "$@")
    echo "${q% }"
}

# ---------------------------------------------------------------------------------------------
# What the log shows before the run
# ---------------------------------------------------------------------------------------------

k25_banner() {
    echo "# $(date -Is) job ${SLURM_JOB_ID}${SLURM_ARRAY_JOB_ID:+ (array ${SLURM_ARRAY_JOB_ID} task ${SLURM_ARRAY_TASK_ID})} name ${SLURM_JOB_NAME:-?}"
    echo "# repository: $K25_ROOT (git $(git -C "$K25_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
    echo "# nodes (${SLURM_JOB_NUM_NODES:-1}): $(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" | paste -sd ' ')"
    echo "# tasks: ${SLURM_NTASKS:-1}${SLURM_NTASKS_PER_NODE:+ (${SLURM_NTASKS_PER_NODE} per node)}, $(k25_cpus_per_task) CPUs each"
    if command -v nvidia-smi >/dev/null; then
        if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
            srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" \
                bash -c 'nvidia-smi -L | sed "s/^/# gpu $(hostname -s): /"' || true
        else
            nvidia-smi -L | sed "s/^/# gpu $(hostname -s): /" || true
        fi
    else
        echo "# gpus: none (no nvidia-smi on $(hostname -s))"
    fi
}

# The configuration the program will run with, resolved by the program itself on the same
# ranks with the same arguments. $1: the k25dec binary; the rest: its model/run arguments.
k25_show_config() {
    local bin=$1; shift
    echo "# resolved configuration: $(k25_quoted "$bin" "$@" --dump-config)"
    k25_srun "$bin" "$@" --dump-config | sed 's/^/#   /'
}

# ---------------------------------------------------------------------------------------------
# Sweep files: one task per line; blank lines and lines starting with '#' do not count.
# ---------------------------------------------------------------------------------------------

k25_sweep_lines() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1" || true; }
k25_sweep_count() { k25_sweep_lines "$1" | wc -l; }
# Line $2 (0-based, the array task id) of sweep file $1.
k25_sweep_line() { k25_sweep_lines "$1" | sed -n "$(($2 + 1))p"; }
# Results of one sweep: DIR/<sweep name>_<array job id>.
k25_sweep_results() {
    local name
    name=$(basename "$1"); name=${name%.*}
    echo "${K25_RESULTS_ROOT:-$K25_ROOT/bench/results}/${name}_$2"
}
