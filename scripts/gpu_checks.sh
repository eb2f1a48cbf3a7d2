#!/usr/bin/env bash
# The checks a session with a GPU machine runs in one go (docs/benchmarks.md, "On a GPU machine"):
#
#     OUT=folder bash scripts/gpu_checks.sh [SECONDS]
#
# from the repository root, with a python3 that has torch (CUDA), numpy, scikit-learn and numba, the kit
# not installed (it runs from the checkout). Each step writes one file under $OUT and has its own time
# limit; a step that would not finish inside SECONDS (default 480) is left out, named in $OUT/log.txt.
#   env.txt          the CPU (lscpu), the GPU (nvidia-smi), the versions
#   gpu_tests.txt    pytest -m gpu: the tests that skip themselves without CUDA
#   kmeans2.txt      dlscale bench kmeans on two hardware threads (taskset), one kind of data per process,
#                    side by side on threads of their own: the CPU-family comparison with a 2-vCPU machine
#   kmeans_all.txt   dlscale bench kmeans with every thread, the CUDA engine included
#   kmeans_gpu.txt   K-Means on the GPU at 1M × 3, 1M × 32 and 200k × 784 (scripts/kmeans_on_gpu.py)
#   profile.txt      lesson 04's profiler window on the GPU (is backward's device time attributed?)
# STEPS names the steps to run (default: all, in that order); KINDS the kinds of data of kmeans2, and
# SIDE_BY_SIDE=0 runs them one after another (no other process beside each); ROUNDS the fits per engine.
set -u
OUT=${OUT:?name the output folder in OUT}
BUDGET=${1:-480}
START=$SECONDS
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY=${PYTHON:-python3}
mkdir -p "$OUT"
log() { echo "[$((SECONDS - START)) s] $*" | tee -a "$OUT/log.txt"; }
# step NAME LIMIT COMMAND...: run it if LIMIT seconds are left, output to $OUT/NAME
STEPS=${STEPS:-kmeans2 gpu_tests kmeans_all kmeans_gpu profile}
step() {
    local name=$1 limit=$2; shift 2
    [[ " $STEPS " == *" ${name%.txt} "* ]] || return 0
    if (( SECONDS - START + limit > BUDGET )); then log "left out: $name (needs up to $limit s)"; return; fi
    log "start: $name"
    timeout "$limit" "$@" > "$OUT/$name" 2>&1
    log "end: $name rc=$?"
}

{ lscpu; echo; nvidia-smi; echo; nproc
  "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "SIMD",
torch.backends.cpu.get_cpu_capability(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
  for module in numpy sklearn numba threadpoolctl; do
      "$PY" -c "import $module; print('$module', $module.__version__)" 2>&1 | tail -n 1
  done
} > "$OUT/env.txt" 2>&1
log "env written"

log "compile ahead"; timeout 120 "$PY" -m dlscale.kmeans.compile_ahead >> "$OUT/log.txt" 2>&1

# The CPU-family comparison: each kind of data on two hardware threads of its own (a 2-vCPU machine's share),
# the kinds side by side so that they fit a short lease; every engine of a kind takes turns on the same threads.
export KINDS=${KINDS:-noise mixture blobs china flower} SIDE_BY_SIDE=${SIDE_BY_SIDE:-1} ROUNDS=${ROUNDS:-3}
# shellcheck disable=SC2016  # (expanded by the inner bash)
step kmeans2.txt 300 bash -c '
    threads=(); while read -r cpu core; do threads+=("$cpu"); done < <(lscpu -p=CPU,CORE | grep -v "^#" | sort -t, -k2n -k1n | tr , " ")
    i=0
    for kind in $KINDS; do
        n=${#threads[@]}; pair="${threads[$((i % n))]},${threads[$(((i + 1) % n))]}"; i=$((i + 2))  # (wraps round on a small machine)
        echo "== $kind on hardware threads $pair"
        OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES= \
            taskset -c "$pair" "$0" -m dlscale bench kmeans --procs "" --kinds "$kind" --n "${KMEANS_N:-1000000}" \
            --rounds "$ROUNDS" --out "/tmp/kmeans2-$kind" > "/tmp/kmeans2-$kind.txt" 2>&1 &
        [[ $SIDE_BY_SIDE == 1 ]] || wait
    done
    wait
    for kind in $KINDS; do echo "== $kind"; cat "/tmp/kmeans2-$kind.txt"; done' "$PY"

step gpu_tests.txt 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/integration/test_on_a_gpu.py -o addopts=""

step kmeans_all.txt 200 "$PY" -m dlscale bench kmeans --procs "" --n "${KMEANS_N:-1000000}" --rounds 3 --out /tmp/kmeans_all

step kmeans_gpu.txt 120 "$PY" scripts/kmeans_on_gpu.py

# shellcheck disable=SC2016
step profile.txt 120 bash -c '"$0" -m dlscale train gpu device=cuda profile_steps=20,30 max_steps=40 run_dir=/tmp/profile &&
    cat /tmp/profile/profile_summary.json' "$PY"
log "done"
