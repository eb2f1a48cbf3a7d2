#!/usr/bin/env bash
# A weak- and a strong-scaling series of the same training, one job per size:
#
#   slurm/sweep.sh SITE "1 2 4 8" PER_RANK_BATCH [ARGS...]
#   dlscale report runs/sweep-...                    (the table and plot, when the jobs are done)
#
# SIZES are node counts (tasks on a one-node "local" cluster; nodes on a local cluster of several). Weak scaling keeps each rank's
# batch (global batch = PER_RANK_BATCH x ranks); strong scaling keeps the first size's global
# batch, so PER_RANK_BATCH must divide by the largest size over the first. Each run writes to
# SWEEP/{weak,strong}-n<SIZE> (at the first size the two are one run: strong-n<SIZE> is a link to
# weak-n<SIZE>); each job starts after the previous one ends (afterany), so
# the runs do not compete for the same nodes or file system (DLSCALE_SWEEP_CHAIN=0 submits
# them side by side). sbatch flags such as -A and -q go in SBATCH_ACCOUNT, SBATCH_QOS, ...
# Each job's output goes to SWEEP/slurm-<mode>-n<SIZE>-<JOBID>.out, beside its run (SBATCH_OUTPUT to choose).
set -euo pipefail

site=${1:?usage: sweep.sh SITE "SIZES" PER_RANK_BATCH [ARGS...]}
sizes=${2:?usage: sweep.sh SITE "SIZES" PER_RANK_BATCH [ARGS...]}
per_rank=${3:?usage: sweep.sh SITE "SIZES" PER_RANK_BATCH [ARGS...]}
shift 3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
script=$root/slurm/$site/train.sbatch
[[ -f $script ]] || { echo "sweep.sh: no $script" >&2; exit 2; }
tasks_per_node=$(sed -n 's/^#SBATCH --ntasks-per-node=//p' "$script")
sweep=${DLSCALE_SWEEP_DIR:-runs/sweep-$(date +%Y%m%d-%H%M%S)}
read -r -a counts <<< "$sizes"
by_tasks=0  # a one-node local cluster grows by tasks, every other cluster by nodes
if [[ $site == local ]] && (( $(sinfo -h -N -o %N | sort -u | wc -l) <= 1 )); then
    by_tasks=1
fi
ranks_of() {  # the ranks of a job of size $1
    if (( by_tasks )); then echo "$1"; else echo $(( $1 * tasks_per_node )); fi
}
strong_batch=$(( per_rank * $(ranks_of "${counts[0]}") ))
mkdir -p "$sweep"
previous=""
for n in "${counts[@]}"; do
    shape=("--nodes=$n")
    (( by_tasks )) && shape=(--nodes=1 "--ntasks-per-node=$n")
    ranks=$(ranks_of "$n")
    for mode in weak strong; do
        batch=$strong_batch
        [[ $mode == weak ]] && batch=$(( per_rank * ranks ))
        if [[ $mode == strong && $n == "${counts[0]}" ]]; then
            # at the first size both series train the same global batch on the same ranks: one run, not two
            # (strong-n<SIZE> names weak-n<SIZE>'s folder), one job less to wait for
            ln -sfn "weak-n$n" "$sweep/strong-n$n"
            echo "strong scaling, size $n: the same run as weak scaling's (global batch $batch): $sweep/strong-n$n"
            continue
        fi
        after=()
        if [[ -n $previous && ${DLSCALE_SWEEP_CHAIN:-1} == 1 ]]; then
            after=("--dependency=afterany:$previous")
        fi
        previous=$(sbatch --parsable "${shape[@]}" "${after[@]}" --job-name="$mode-n$n" \
                   --output="${SBATCH_OUTPUT:-$sweep/slurm-%x-%j.out}" "$script" "$@" \
                   "global_batch_size=$batch" "run_dir=$sweep/$mode-n$n")
        echo "$mode scaling, size $n ($ranks ranks, global batch $batch): job $previous"
    done
done
echo "when the jobs are done: dlscale report $sweep"
