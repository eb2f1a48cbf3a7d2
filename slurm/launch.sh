#!/usr/bin/env bash
# The one launch body behind every submit script in slurm/:
#
#   launch.sh SITE JOB [ARGS...]      JOB = train | profile | kmeans | hpo | probe
#
# It reads the site's settings (sites/SITE.env, then $DLSCALE_SITE_ENV if you keep your own:
# account-free, path-free defaults live here, your choices live there), prepares the
# software environment, points the ranks at the first node of the job, and starts one task
# per GPU (or per CPU slot) with srun. ARGS go unchanged to `python -m dlscale.train`
# (or `dlscale kmeans`), e.g. `sbatch slurm/local/train.sbatch tiny epochs=2`.
#
# Preemption: the scripts ask Slurm for SIGUSR1 to this shell shortly before the time limit
# (--signal=B:USR1@...); it writes RUN_DIR/stop-requested, which rank 0 reads. The training
# checkpoints and exits with 75; this script then requeues the job, and the next run resumes
# from the checkpoint (resume=true, same run directory: the job id does not change). Ranks
# started otherwise (torchrun, a terminal) stop on SIGUSR1 or SIGTERM themselves.
set -euo pipefail

site=${1:?usage: launch.sh SITE train|profile|kmeans|hpo|probe [ARGS...]}
job=${2:?usage: launch.sh SITE train|profile|kmeans|hpo|probe [ARGS...]}
shift 2
# The repository (for the settings and .venv); runs and data go to the working directory,
# which is where sbatch was called (or its --chdir).
root=${DLSCALE_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}

# Defaults a site file may change.
DLSCALE_PYTHON=python
DLSCALE_PREFIX=()          # e.g. (shifter --image=...) or (podman-hpc run ...): put before python
DLSCALE_SRUN_FLAGS=()      # e.g. (--gpu-bind=closest)
DLSCALE_DEVICE=            # cuda on GPU sites: added as device= unless the job's arguments name one
DLSCALE_NCCL_NET=          # the NCCL net plugin's name, exported as NCCL_NET for jobs of several nodes
dlscale_environment() { :; }
# conda's activate scripts read variables that may be unset, which `set -u` turns into an abort.
# shellcheck disable=SC2317  # called from the site files
conda_activate() {
    set +u
    conda activate "$@"
    local status=$?
    set -u
    return "$status"
}

# DLSCALE_DRY_RUN=1 outside an allocation (a laptop, a login node): stand in for what Slurm would give
# the job, from its submit script's #SBATCH lines, so a site's srun line can be read before submitting.
# Site commands this machine lacks (module, conda, scontrol) are printed to stderr instead of run.
if [[ ${DLSCALE_DRY_RUN:-0} == 1 && -z ${SLURM_JOB_ID:-} ]]; then
    script=$(compgen -G "$root/slurm/$site/$job*.sbatch" | head -n 1 || true)
    header() { sed -n "s/^#SBATCH --$1=\([^ ]*\).*/\1/p" "${script:-/dev/null}" | tail -n 1; }
    SLURM_JOB_NAME=$(header job-name)
    SLURM_JOB_NUM_NODES=${DLSCALE_DRY_RUN_NODES:-$(header nodes)}
    export SLURM_JOB_ID=0 SLURM_JOB_NAME SLURM_JOB_NUM_NODES=${SLURM_JOB_NUM_NODES:-1} SLURM_JOB_NODELIST=dry-run-node
    tasks=$(header ntasks-per-node)
    export SLURM_NTASKS=$((SLURM_JOB_NUM_NODES * ${tasks:-1}))
    cpus=$(header cpus-per-task)
    [[ -z $cpus ]] || export SLURM_CPUS_PER_TASK=$cpus
    for tool in module conda; do
        if ! type "$tool" > /dev/null 2>&1; then
            eval "$tool() { echo \"dry run, not run here: $tool \$*\" >&2; }"
        fi
    done
    scontrol() { seq -f 'dry-run-node%g' "$SLURM_JOB_NUM_NODES"; }  # the node names, without a controller
    echo "launch.sh: a dry run outside an allocation: ${SLURM_JOB_NUM_NODES} node(s) and the CPUs per task" \
         "from ${script:-no submit script}" >&2
fi

# shellcheck source=/dev/null
source "$root/slurm/sites/$site.env"
if [[ -n ${DLSCALE_SITE_ENV:-} ]]; then
    # shellcheck source=/dev/null
    source "$DLSCALE_SITE_ENV"
fi
dlscale_environment

# The master is the first node of the allocation: never the login node, never localhost.
# (Read whole: `scontrol ... | head -n 1` can die of SIGPIPE under pipefail on a long node list.)
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
MASTER_ADDR=${nodes[0]:?scontrol gave no host for SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST}
export MASTER_ADDR
# One port per job, so two jobs that share a node (a shared QOS) do not collide: 10000-29999,
# unprivileged and below Linux's ephemeral range (32768-60999).
export MASTER_PORT=${MASTER_PORT:-$((10000 + SLURM_JOB_ID % 20000))}
# Since Slurm 22.05, srun does not inherit --cpus-per-task from the allocation (sbatch(1)):
# without this every rank, its threads and its loader workers would share one core.
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi
# Between nodes NCCL must use the site's network plugin: with NCCL_NET set, a node without the plugin
# fails at the first collective instead of sending everything over TCP sockets at a fraction of the
# bandwidth. (Not on one node: NVLink and xGMI need no plugin.)
if [[ -n $DLSCALE_NCCL_NET && ${SLURM_JOB_NUM_NODES:-1} -gt 1 && -z ${NCCL_NET:-} ]]; then
    export NCCL_NET=$DLSCALE_NCCL_NET
fi
run_dir=${DLSCALE_RUN_DIR:-runs/${SLURM_JOB_NAME:-dlscale}-${SLURM_JOB_ID}}
for argument in "$@"; do  # a run_dir=... of the job's own arguments is where the training writes
    [[ $argument != run_dir=* ]] || run_dir=${argument#run_dir=}
done
# A rank that dies ends the job step at once (--kill-on-bad-exit=1), instead of leaving the others stuck until
# dist_timeout_s. The tasks of an hpo job are workers of their own, one failing leaves the others be.
kill_on_bad_exit=1
# On a GPU site the training asks for the GPU outright: device=auto would train on the CPU, slowly and
# without a word, where the environment has a CPU-only torch.
device_arg=()
if [[ -n $DLSCALE_DEVICE && " $* " != *" device="* ]]; then
    device_arg=("device=$DLSCALE_DEVICE")
fi

case $job in
    train)
        command=("$DLSCALE_PYTHON" -m dlscale.train "$@" "${device_arg[@]}")
        if [[ " $* " != *" run_dir="* ]]; then
            # The job's own folder holds checkpoints only once the job ran and was requeued. Anything
            # else there is another job's run (a reused job id): never resume it, never clear it.
            if [[ ${SLURM_RESTART_COUNT:-0} -eq 0 && -n $(ls -A "$run_dir/checkpoints" 2>/dev/null) ]]; then
                echo "launch.sh: $run_dir already holds checkpoints of another job with id $SLURM_JOB_ID;" \
                     "pass run_dir=<a new folder> (or remove that one)" >&2
                exit 2
            fi
            command+=("run_dir=$run_dir")
        fi
        command+=(resume=true)  # a requeued job continues; a run_dir you named continues if its config matches
        ;;
    profile)  # one Nsight Systems report per rank, over the steps named by profile_steps=
        mkdir -p "$run_dir/nsys"  # nsys does not create the folder of its --output
        export DLSCALE_UNDER_NSYS=1  # the training then leaves the GPU counters (CUPTI) to nsys
        # Each task's own Python (inside the container too) becomes `nsys profile ... <itself> -m dlscale.train`:
        # a line built here would name this shell's Python, which a container does not have.
        command=("$DLSCALE_PYTHON" -m dlscale.profiling.profile_job "--output=$run_dir/nsys/rank_%q{SLURM_PROCID}"
                 "$@" "${device_arg[@]}" "run_dir=$run_dir")
        ;;
    probe)  # one line per task: what it was given (CPUs, affinity, threads, GPUs); checks a site's binding
        command=("$DLSCALE_PYTHON" -m dlscale info --task)
        ;;
    hpo)  # workers of a search (dlscale hpo): the study must exist (dlscale hpo start SPACE --dir D --workers 0)
        command=("$DLSCALE_PYTHON" -m dlscale hpo worker "$@" "${device_arg[@]}")
        # Each task is a worker of its own, one trial at a time on its own GPU or CPUs; with
        # DLSCALE_TRIAL_RANKS=all the tasks of this job train each trial together, data-parallel.
        if [[ ${DLSCALE_TRIAL_RANKS:-1} != all ]]; then
            export DLSCALE_LAUNCHER=single
            kill_on_bad_exit=0
        fi
        ;;
    kmeans)
        command=("$DLSCALE_PYTHON" -m dlscale kmeans "$@")
        [[ " $* " == *" --out "* ]] || command+=(--out "$run_dir")
        ;;
    *)
        echo "launch.sh: unknown job '$job' (train, profile, kmeans, hpo or probe)" >&2
        exit 2
        ;;
esac

echo "dlscale: job ${SLURM_JOB_ID} on ${SLURM_JOB_NUM_NODES:-1} node(s), ${SLURM_NTASKS:-1} task(s), master" \
     "${MASTER_ADDR}:${MASTER_PORT}, writing to ${run_dir}"
read -r -a extra_flags <<< "${DLSCALE_SRUN_EXTRA:-}"  # per-job srun flags, e.g. --mpi=pmi2 for MPI codes
cpus_flag=()
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    cpus_flag=(--cpus-per-task="$SLURM_CPUS_PER_TASK")  # (SRUN_CPUS_PER_TASK says the same, for nested sruns)
fi
if [[ ${DLSCALE_DRY_RUN:-0} == 1 ]]; then  # print what would run (tests, and checking a site's settings)
    { env | grep -E '^(MASTER_|SRUN_|OMP_|NCCL_|FI_|MIOPEN_|CUDA_VISIBLE|DLSCALE_UNDER|DLSCALE_GPU_ORDER|DLSCALE_LAUNCHER)' || true; } | sort | sed 's/^/env: /'
    printf '%q ' srun --kill-on-bad-exit=$kill_on_bad_exit "${cpus_flag[@]}" "${DLSCALE_SRUN_FLAGS[@]}" "${extra_flags[@]}" \
        "${DLSCALE_PREFIX[@]}" "${command[@]}"
    echo
    exit 0
fi
# A run stopped on a signal checkpoints, leaves its marker (rank 0) and exits 75 on every rank; srun then kills
# ranks still exiting (--kill-on-bad-exit), so its status can be theirs, not 75: the marker says it all the same.
stopped=$run_dir/stopped-on-signal
stop_file=$run_dir/stop-requested
rm -f "$stopped" "$stop_file"  # (a marker, or a request, from an earlier stop of this run)
# The scripts ask Slurm to signal this shell (--signal=B:USR1@...): a container's task wrapper (podman-hpc --mpi)
# does not forward signals to the ranks, so the shell writes the request where rank 0 looks for it (a few s later).
# srun runs in the background so that the trap runs at once: bash runs a trap only after a foreground command ends.
# shellcheck disable=SC2317  # (called from the traps below)
request_stop() { echo "$1" > "$stop_file"; }
trap 'request_stop SIGUSR1' USR1
trap 'request_stop SIGTERM' TERM
srun --kill-on-bad-exit="$kill_on_bad_exit" "${cpus_flag[@]}" "${DLSCALE_SRUN_FLAGS[@]}" "${extra_flags[@]}" \
    "${DLSCALE_PREFIX[@]}" "${command[@]}" &
step=$!
status=0
while true; do
    wait "$step" && status=0 || status=$?
    kill -0 "$step" 2> /dev/null || break  # (wait also returns when a trapped signal arrives: srun still runs)
done
trap - USR1 TERM

if [[ $status -eq 75 || -e $stopped ]]; then  # preempted: checkpointed; run again from the checkpoint
    echo "dlscale: stopped on a signal at a checkpoint; requeueing job ${SLURM_JOB_ID}"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
exit "$status"
