#!/usr/bin/env bash
# A GPU lease on a machine that reaches no package index (docs/benchmarks.md, "GPU"), in two halves:
#
#     bash scripts/gpu_lease.sh fetch          here, with an index: the lessons' Jupyter stack and what Horovod's build
#                                              needs (setuptools, wheel, cloudpickle, psutil) as wheels for the lent
#                                              machine's Python (PY_VERSION, 3.12), and Horovod's sdist, in .whl/
#     OUT=folder bash scripts/gpu_lease.sh run there, .whl/ carried: install them beside its torch, then the steps of
#                                              gpu_checks.sh in its risk-first order (Horovod's NCCL build, the stop
#                                              file on CUDA, NCCL's network plugin error first; STEPS picks some) in
#                                              one call within CHECKS_BUDGET s (480), then the lessons (LESSONS) timed
#                                              one after another until DEADLINE s (560): a 10-minute lease. Everything
#                                              in $OUT/res.tgz, packed as it goes; LEASE_DIR (/tmp) holds the work.
set -uo pipefail
WHEELS="papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 ipython==9.18.1
ipython_pygments_lexers==1.1.1 jupyter_client==8.10.0 jupyter_core==5.9.1 traitlets==5.16.1 pyzmq==27.3.0
tornado==6.6.1 comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4 prompt_toolkit==3.0.53
wcwidth==0.9.4 jedi==0.20.1 parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 decorator==5.3.1 stack-data==0.6.3
executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 platformdirs==4.14.8 fastjsonschema==2.22.3 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 tenacity==9.2.1 entrypoints==0.4.2
ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17 nvtx==0.2.17 ipyparallel==9.2.0
setuptools==84.2.1 wheel==0.46.3 cloudpickle==3.1.3 psutil==7.2.2 cffi==2.0.0 pycparser==2.23"
# (the last six: what scripts/build_horovod.sh fetches when it can, and what Horovod's setup asks for (cffi); the
# versions this machine builds Horovod with)

fetch() {
    mkdir -p .whl
    local platforms=() n
    for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    # shellcheck disable=SC2086  # (one word per wheel)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
        --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl $WHEELS &&
    python3 -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d .whl &&
    echo "gpu_lease: $(find .whl -type f -name '*.whl' | wc -l) wheels and Horovod's sdist in .whl/ ($(du -sh .whl | cut -f1))"
}

run() {
    local start=$SECONDS tmp=${LEASE_DIR:-/tmp} res lesson left name
    res=$tmp/res
    mkdir -p "$res/checks"
    pack() { tar czf "$OUT/res.tgz" -C "$tmp" res 2> /dev/null; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$tmp/site" \
        .whl/*.whl > "$res/pip.txt" 2>&1 || { echo "gpu_lease: the wheels did not install ($res/pip.txt)"; return 1; }
    mkdir -p "$tmp/bin"  # (the lessons call `dlscale` and `python`; the kit runs from the checkout)
    printf '#!/bin/sh\nexec python3 -m dlscale "$@"\n' > "$tmp/bin/dlscale" && chmod +x "$tmp/bin/dlscale"
    command -v python > /dev/null || ln -sf "$(command -v python3)" "$tmp/bin/python"
    export PATH=$tmp/bin:/usr/local/cuda/bin:$PATH PYTHONPATH=$PWD:$tmp/site PYTHONUNBUFFERED=1 MPLBACKEND=Agg
    export HOROVOD_SDIST=$PWD/.whl/horovod-0.28.1.tar.gz
    # One call, one budget: Horovod's build (HOROVOD_LIMIT, 300 s) starts first, with the whole budget ahead of it.
    OUT=$res/checks bash scripts/gpu_checks.sh "${CHECKS_BUDGET:-480}"
    pack
    for lesson in ${LESSONS:-05 04 01 00 03 02}; do
        left=$((${DEADLINE:-560} - (SECONDS - start)))
        if ((left < 30)); then echo "lesson $lesson left out ($left s left)" | tee -a "$res/lessons.txt"; continue; fi
        name=$(basename notebooks/"$lesson"_*.ipynb)
        timeout "$left" python3 scripts/time_lessons.py "$name" >> "$res/lessons.txt" 2> "$res/lesson-$lesson.err"
        echo "lesson $name: rc=$? (limit $left s)"
        pack
    done
    cat "$res/checks/log.txt" "$res/lessons.txt" 2> /dev/null
}

case ${1:-} in
    fetch) fetch ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_lease.sh fetch|run (OUT=folder for run)" >&2; exit 2 ;;
esac
