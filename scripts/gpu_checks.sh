#!/usr/bin/env bash
# The checks a session with a GPU machine runs in one go (docs/benchmarks.md, "On a GPU machine"), risk first: what has
# never run on a GPU comes first, so that a 10-minute lease (scripts/gpu_lease.sh) tests it before anything else.
#
#     bash scripts/gpu_checks.sh [SECONDS]           (OUT=folder to choose where; default runs/gpu-checks-DATE-TIME)
#
# from the repository root, with a python3 that has torch (CUDA), numpy, scikit-learn and numba, the kit
# not installed (it runs from the checkout). Each step writes one file under $OUT and has its own time
# limit; a step that would not finish inside SECONDS (default 600: a 10-minute lease) is left out, and without a CUDA
# GPU every step is skipped: either way $OUT/log.txt says so in one line per step. In this order:
#   env.txt          the CPU (lscpu), the GPU (nvidia-smi), the versions
#   horovod.txt      ran once on a GPU (three fixes): the Horovod build with NCCL (scripts/build_horovod.sh; HOROVOD_SDIST without
#                    an index; cmake's and nvcc's versions first), its own limit (HOROVOD_LIMIT, 300 s), then an
#                    all-reduce of a GPU tensor
#   stop.txt         its resumed half unfinished on a GPU: dlscale train on CUDA stopped by the file slurm/launch.sh writes
#                    (RUN_DIR/stop-requested): exit 75 at a checkpoint, then resumed from it to its end
#   nccl_net.txt     ran once on a GPU: NCCL with NCCL_NET naming a network plugin this machine lacks ("AWS
#                    Libfabric", "OFI": the job scripts' names) must fail, not fall back to sockets; unset, it runs
#   probe.txt        NCCL's version as torch sees it, cmake and nvcc, nsys and nvtx, where nccl.h and libnccl* are
#   ddp.txt          recipe 05 under torchrun at world size 1 over NCCL (NCCL_DEBUG=INFO: "Init COMPLETE"),
#                    compiled and not, with --accumulate 2: the two runs' losses side by side
#   parity.txt       recipe stages 03 and 04 against the engine on CUDA (dlscale bench parity)
#   fsdp.txt         recipe 10 (FSDP2 and DCP) on one GPU for an epoch, then resumed from its DCP folder
#   pipeline.txt     recipe 13 (the pipeline) the same way: one rank, or PIPELINE_RANKS on a node of several GPUs
#   ddp_cost.txt     DDP's own cost on one GPU (NCCL, world size 1), torch's default copies into the buckets, two
#                    widths: its prices per bucket and per byte against the V100's published ones
#   compile.txt      dlscale train on the GPU with compile=true cuda_graphs=true, group and batch norm, MFU
#                    (240 s: each compile took over a minute on an H200 with 16 host cores)
#   nsys.txt         nsys on the engine and on recipe 04 (torch.profiler beside nsys: CPU tracing only)
#   gpu_tests.txt    pytest -m gpu: the tests that skip themselves without CUDA
#   kmeans_ahead.txt K-Means's loops compiled into numba's cache (inside the budget; only for the K-Means steps)
#   kmeans_gpu.txt   K-Means on the GPU at 1M × 3, 1M × 32 and 200k × 784 (scripts/kmeans_on_gpu.py)
#   profile.txt      lesson 04's profiler window on the GPU (is backward's device time attributed?)
#   kmeans2.txt      dlscale bench kmeans on two hardware threads (a 2-vCPU machine's share), CPU only
#   kmeans_all.txt   dlscale bench kmeans with every thread, the CUDA engine included
# STEPS names the steps to run (default: all, in that order); KINDS the kinds of data of kmeans2, and
# SIDE_BY_SIDE=0 runs them one after another (no other process beside each); ROUNDS the fits per engine.
# A step's rc in the log is its command's (pipefail: a failure is not hidden by the `head` that shortens its output).
set -uo pipefail
OUT=${OUT:-runs/gpu-checks-$(date +%Y%m%d-%H%M%S)}
BUDGET=${1:-600}
START=$SECONDS
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY=${PYTHON:-python3}
mkdir -p "$OUT"
echo "gpu_checks: writing to $OUT (within $BUDGET s)"
log() { echo "[$((SECONDS - START)) s] $*" | tee -a "$OUT/log.txt"; }
ALL="horovod stop nccl_net probe ddp parity heldout fsdp pipeline ddp_cost compile nsys gpu_tests kmeans_gpu profile kmeans2 kmeans_all"
STEPS=${STEPS:-$ALL}
# Without a CUDA GPU nothing here can show what it is for: every step says so and is skipped.
no_gpu=$("$PY" -c 'import torch; print("" if torch.cuda.is_available() else f"no CUDA GPU: torch {torch.__version__} sees none")' \
         2>&1 | tail -n 1)
# run_step NAME LIMIT COMMAND...: run it if LIMIT seconds are left, output to $OUT/NAME
run_step() {
    local name=$1 limit=$2 status; shift 2
    if [[ -n $no_gpu ]]; then log "skipped: $name ($no_gpu)"; return; fi
    if (( SECONDS - START + limit > BUDGET )); then log "left out: $name (needs up to $limit s)"; return; fi
    log "start: $name"
    timeout "$limit" "$@" > "$OUT/$name" 2>&1
    status=$?
    log "end: $name rc=$status"
}
# step NAME LIMIT COMMAND...: the same, for a step that STEPS names
step() {
    [[ " $STEPS " == *" ${1%.txt} "* ]] || return 0
    run_step "$@"
}

if [[ -n $no_gpu ]]; then  # (no versions to import: every step is skipped)
    { lscpu; echo; echo "$no_gpu"; } > "$OUT/env.txt" 2>&1
else
    { lscpu; echo; nvidia-smi; echo; nproc
      "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "SIMD",
torch.backends.cpu.get_cpu_capability(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
      for module in numpy sklearn numba threadpoolctl; do
          "$PY" -c "import $module; print('$module', $module.__version__)" 2>&1 | tail -n 1
      done
    } > "$OUT/env.txt" 2>&1
fi
log "env written"
work=$(mktemp -d)

# Horovod's build has never run with NCCL: first, with the most time. cmake and nvcc first, which the build needs.
# shellcheck disable=SC2016  # (each bash -c expands its own variables)
step horovod.txt "${HOROVOD_LIMIT:-300}" bash -o pipefail -c 'echo "cmake: $(cmake --version 2>&1 | head -n 1)"
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 1)"
    env HOROVOD_WHEELS="$1/horovod" bash scripts/build_horovod.sh "$0" &&
    "$0" -c "import torch, horovod.torch as hvd; hvd.init()
print(\"horovod all-reduce on cuda:\", hvd.allreduce(torch.arange(4.0, device=\"cuda\"), op=hvd.Sum).tolist())"' "$PY" "$work"

# The stop file (slurm/launch.sh writes it when only the batch shell gets the signal) on CUDA: rank 0 reads it within
# 5 s, the run checkpoints and exits 75, and the same command with resume=true continues from that step to its end
# (bounded on its own, so that its log's tail prints if it does not end: on the H200 the step ran out of its 90 s).
# shellcheck disable=SC2016
step stop.txt 150 bash -o pipefail -c 'run=$1/stop status=0
    "$0" -m dlscale train tiny device=cuda epochs=1000 progress=false plot=false run_dir="$run" > "$1/stop-1.log" 2>&1 &
    pid=$!
    for _ in $(seq 90); do [[ -e $run/metrics.csv ]] && break; kill -0 "$pid" 2> /dev/null || break; sleep 1; done
    ! kill -0 "$pid" 2> /dev/null || echo SIGUSR1 > "$run/stop-requested"
    wait "$pid" || status=$?
    tail -n 4 "$1/stop-1.log"
    echo "== stopped: rc $status (75: checkpointed and stopped); $(cat "$run/stopped-on-signal" 2>&1)"
    at=$(sed -n "s/.*checkpointed at step \([0-9]*\).*/\1/p" "$run/stopped-on-signal" 2> /dev/null)
    [[ $status == 75 && -n $at ]] || exit 1
    timeout 90 "$0" -m dlscale train tiny device=cuda epochs=1000 max_steps=$((at + 20)) progress=false plot=false \
        run_dir="$run" resume=true > "$1/stop-2.log" 2>&1 || status=$?
    tail -n 4 "$1/stop-2.log"
    echo "== resumed from step $at to step $((at + 20)): rc $status"' "$PY" "$work"

# NCCL_NET names the network plugin the job scripts require between nodes: on a machine without it NCCL must stop with
# "network ... not found" (else a job would quietly run over TCP sockets); unset, the same all-reduce runs.
nccl_snippet='import torch, torch.distributed as dist
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
print("all-reduce of one rank on cuda:", t.tolist())
dist.destroy_process_group()'
# shellcheck disable=SC2016
step nccl_net.txt 60 bash -o pipefail -c 'status=0
    for net in unset "AWS Libfabric" OFI; do
        if [[ $net == unset ]]; then unset NCCL_NET; else export NCCL_NET=$net; fi
        echo "== NCCL_NET=$net"
        NCCL_DEBUG=WARN timeout 40 "$0" -c "$2" > "$1/nccl_net.log" 2>&1
        rc=$?
        grep -E "all-reduce|not found|NCCL WARN|Error" "$1/nccl_net.log" | tail -n 4 || true
        if [[ $net == unset ]]; then expected=0; else expected=failure; fi
        echo "rc $rc (expected: $expected)"
        if [[ $net == unset ]]; then [[ $rc == 0 ]] || status=1; else [[ $rc != 0 ]] || status=1; fi
    done
    exit $status' "$PY" "$work" "$nccl_snippet"

# shellcheck disable=SC2016
step probe.txt 15 bash -o pipefail -c '"$0" -c "import torch; print(\"NCCL\", torch.cuda.nccl.version())"
    echo "cmake: $(cmake --version 2>&1 | head -n 1)"
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 1)"
    nsys --version || echo "no nsys"
    "$0" -c "import nvtx; print(\"nvtx\", nvtx.__file__)" || echo "no nvtx module"
    "$0" -c "import nvidia.nccl as n, glob; d = list(n.__path__)[0]; print(\"nvidia-nccl wheel:\", d, glob.glob(d + \"/include/*.h\"), glob.glob(d + \"/lib/libnccl*\"))" || echo "no nvidia-nccl wheel"
    { find / -name nccl.h -not -path "/proc/*" 2> /dev/null || true; } | head -n 5' "$PY"

# shellcheck disable=SC2016
step ddp.txt 120 bash -o pipefail -c 'status=0
    for compiled in --compile --no-compile; do
        echo "== recipe 05 $compiled --accumulate 2"
        NCCL_DEBUG=INFO "$0" -m torch.distributed.run --standalone --nproc-per-node 1 recipes/05_ddp.py --device cuda \
            --epochs 1 --workers 2 --accumulate 2 --precision bf16 $compiled --checkpoint "$1/ddp$compiled.pt" \
            > "$1/ddp$compiled.log" 2>&1 || status=$?
        { grep -E "Init COMPLETE|step [0-9]+:|epoch|Error|error|sizes\(\)" "$1/ddp$compiled.log" || true; } | head -n 40
    done
    exit $status' "$PY" "$work"

step parity.txt 150 "$PY" -m dlscale bench parity --stages 03,04 --config tiny --epochs 1 --rounds 1

# The held-out answers of stage 02 on the GPU: pinned memory and the copy show there (docs/stage-checks.md)
step heldout.txt 120 "$PY" scripts/check_heldout.py --stages 02 --device cuda --out "$OUT/heldout.json"

# shellcheck disable=SC2016
step fsdp.txt 120 bash -o pipefail -c '"$0" -m torch.distributed.run --standalone --nproc-per-node 1 \
        recipes/10_fsdp_tp.py --device cuda --epochs 1 --workers 2 --checkpoint "$1/dcp" &&
    "$0" -m torch.distributed.run --standalone --nproc-per-node 1 recipes/10_fsdp_tp.py \
        --device cuda --epochs 2 --workers 2 --checkpoint "$1/dcp" --resume && ls -R "$1/dcp"' "$PY" "$work"

# The pipeline stage on CUDA (one rank: a pipeline of one stage; its sends need a GPU per rank), resumed from its DCP
# folder (the optimizer's settings per parameter); on a node of several GPUs, PIPELINE_RANKS=2 or 4
# shellcheck disable=SC2016
step pipeline.txt 120 bash -o pipefail -c '"$0" -m torch.distributed.run --standalone --nproc-per-node "$2" \
        recipes/13_pipeline.py --device cuda --epochs 1 --workers 2 --checkpoint "$1/pp" &&
    "$0" -m torch.distributed.run --standalone --nproc-per-node "$2" recipes/13_pipeline.py \
        --device cuda --epochs 2 --workers 2 --checkpoint "$1/pp" --resume && ls -R "$1/pp"' \
    "$PY" "$work" "${PIPELINE_RANKS:-1}"

# DDP's own cost over NCCL at world size 1 (docs/benchmarks.md, "Where the efficiency goes"): the engine's step as it
# is and wrapped at three bucket caps, two widths, torch's default gradient_as_bucket_view=false
step ddp_cost.txt 120 "$PY" -m dlscale bench ddp-cost gpu device=cuda gradient_as_bucket_view=false --widths 64,128 \
    --out "$work/ddp_cost"

# shellcheck disable=SC2016
step compile.txt 240 bash -o pipefail -c 'status=0
    for norm in group batch; do
        echo "== norm=$norm compile=true cuda_graphs=true"
        "$0" -m dlscale train gpu device=cuda compile=true cuda_graphs=true norm=$norm max_steps=60 progress=false \
            plot=false run_dir="$1/compile-$norm" | tail -n 3 || status=$?
        "$0" -c "import json, sys; s = json.load(open(sys.argv[1])); print({k: v for k, v in s.items() if k in
            (\"samples_per_s\", \"mfu\", \"hardware_utilisation\", \"peak_flops\", \"flops_per_sample\")})" \
            "$1/compile-$norm/summary.json" || status=$?
    done
    exit $status' "$PY" "$work"

# shellcheck disable=SC2016
step nsys.txt 150 bash -o pipefail -c 'status=0
    nsys profile --capture-range=cudaProfilerApi -o "$1/engine" --force-overwrite true \
        "$0" -m dlscale train gpu device=cuda profile_steps=20,30 max_steps=40 run_dir="$1/nsys-engine" progress=false \
        plot=false && nsys stats --report nvtx_sum --format csv "$1/engine.nsys-rep" > "$1/nvtx.csv" &&
        "$0" -c "import sys; from dlscale.profiling.nsys import parse_nvtx_sum
for row in parse_nvtx_sum(open(sys.argv[1]).read()): print(row)" "$1/nvtx.csv" || status=$?
    nsys profile --capture-range=cudaProfilerApi -o "$1/recipe04" --force-overwrite true \
        "$0" recipes/04_compile.py --device cuda --epochs 1 --workers 2 --profile-steps 10,15 \
        --checkpoint "$1/recipe04.pt" > "$1/recipe04.log" 2>&1 || status=$?
    { grep -iE "cupti|subscriber|error|Self CPU" "$1/recipe04.log" || true; } | head -n 20
    exit $status' "$PY" "$work"

step gpu_tests.txt 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/integration/test_on_a_gpu.py -o addopts=""

# K-Means's loops into numba's cache once, before the steps that fit (inside the budget, like every step)
if [[ " $STEPS " == *" kmeans"* ]]; then
    run_step kmeans_ahead.txt 120 "$PY" -m dlscale.kmeans.compile_ahead
fi

step kmeans_gpu.txt 120 "$PY" scripts/kmeans_on_gpu.py

# shellcheck disable=SC2016
step profile.txt 120 bash -o pipefail -c '"$0" -m dlscale train gpu device=cuda profile_steps=20,30 max_steps=40 \
        run_dir="$1/profile" && cat "$1/profile/profile_summary.json"' "$PY" "$work"

# The CPU-family comparison: each kind of data on two hardware threads of its own (a 2-vCPU machine's share),
# the kinds side by side so that they fit a short lease; every engine of a kind takes turns on the same threads.
export KINDS=${KINDS:-noise mixture blobs china flower} SIDE_BY_SIDE=${SIDE_BY_SIDE:-1} ROUNDS=${ROUNDS:-3}
# shellcheck disable=SC2016  # (expanded by the inner bash)
step kmeans2.txt 300 bash -o pipefail -c 'status=0 pids=()
    threads=(); while read -r cpu core; do threads+=("$cpu"); done < <(lscpu -p=CPU,CORE | grep -v "^#" | sort -t, -k2n -k1n | tr , " ")
    i=0
    for kind in $KINDS; do
        n=${#threads[@]}; pair="${threads[$((i % n))]},${threads[$(((i + 1) % n))]}"; i=$((i + 2))  # (wraps round on a small machine)
        echo "== $kind on hardware threads $pair"
        OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES= \
            taskset -c "$pair" "$0" -m dlscale bench kmeans --procs "" --kinds "$kind" --n "${KMEANS_N:-1000000}" \
            --rounds "$ROUNDS" --out "$1/kmeans2-$kind" > "$1/kmeans2-$kind.txt" 2>&1 &
        if [[ $SIDE_BY_SIDE == 1 ]]; then pids+=("$!"); else wait "$!" || status=$?; fi
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    for kind in $KINDS; do echo "== $kind"; cat "$1/kmeans2-$kind.txt"; done
    exit $status' "$PY" "$work"

step kmeans_all.txt 200 "$PY" -m dlscale bench kmeans --procs "" --n "${KMEANS_N:-1000000}" --rounds 3 \
    --out "$work/kmeans_all"
rm -rf "$work"
log "done"
