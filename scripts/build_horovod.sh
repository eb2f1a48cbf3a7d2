#!/usr/bin/env bash
# Build and install Horovod for the torch already installed in a Python environment.
#
#   scripts/build_horovod.sh [--wheel-only] [PYTHON]    (default: python3 on PATH; `make horovod` passes the venv's)
#
# --wheel-only builds the wheel into the cache below and leaves the environment as it was (the build's own
# tools go to a folder of their own): `make test` builds it while pip installs the extras, then installs it.
#
# Why a script: Horovod's last release (0.28.1, June 2023) ships no wheels, and its sdist
# asks CMake for C++14, while torch >= 2.1 headers need C++17, so a plain
# `pip install horovod` fails to compile. Horovod's master branch raised the standard to 17;
# this script applies that same change to the released sdist from PyPI and builds it with gloo
# (no MPI, TensorFlow or MXNet). With a CUDA build of torch and a CUDA toolkit (nvcc) it also
# builds Horovod's NCCL operations (HOROVOD_GPU_OPERATIONS=NCCL): without them the first
# all-reduce of a GPU tensor fails ("Requested ReadyEvent with GPU device but not compiled with
# CUDA"). Otherwise it builds for CPU tensors only, even with a CUDA build of torch.
# HOROVOD_GPU=nccl or cpu chooses; BUILD_HOROVOD_PLAN=1 only prints the choice; HOROVOD_SDIST=path builds from
# that sdist (horovod-0.28.1.tar.gz) without a package index.
# A few minutes on 2 cores (140 s of both cores alone; longer beside other work).
#
# On NERSC, OLCF and most sites, use PyTorch DDP (the kit's default) or the Horovod that
# the site's container or module provides; this build is for laptops and CI.
#
# The wheel is kept in $HOROVOD_WHEELS/torch-<version>/ (default .cache/horovod) and
# reused when the same torch asks again.
set -euo pipefail

wheel_only=0
if [[ ${1:-} == --wheel-only ]]; then wheel_only=1; shift; fi
PYTHON=${1:-${PYTHON:-python3}}
VERSION=0.28.1
root=$(cd "$(dirname "$0")/.." && pwd)
read -r torch_version torch_cuda < <("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda or "none")') \
    || true
if [[ -z ${torch_version:-} ]]; then
    echo "build_horovod: torch is not importable by $PYTHON; install torch first" >&2
    exit 1
fi
gpu=${HOROVOD_GPU:-$([[ $torch_cuda != none ]] && command -v nvcc > /dev/null && echo nccl || echo cpu)}
if [[ $gpu == nccl ]]; then
    # Horovod links NCCL statically unless told otherwise, and needs nccl.h. PyPI's torch brings its NCCL as
    # libnccl.so.2 in the nvidia-nccl wheel: link that one, shared (one NCCL in the process), through a folder with
    # its header and a libnccl.so link; HOROVOD_NCCL_HOME names another (a site's NCCL). A100 and H100 by default.
    nccl_home=${HOROVOD_NCCL_HOME:-$("$PYTHON" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null \
                                     || true)}
    cuda_archs=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}
    echo "build_horovod: NCCL from ${nccl_home:-nowhere} (linked shared), CUDA architectures $cuda_archs"
    echo "build_horovod: horovod $VERSION for torch $torch_version (CUDA $torch_cuda): gloo and NCCL (HOROVOD_GPU_OPERATIONS=NCCL)"
else
    echo "build_horovod: horovod $VERSION for torch $torch_version: gloo, CPU tensors only"
fi
[[ ${BUILD_HOROVOD_PLAN:-0} != 1 ]] || exit 0
suffix=""  # (a GPU build's wheels: torch-X-nccl)
[[ $gpu != nccl ]] || suffix=-nccl
wheels=${HOROVOD_WHEELS:-$root/.cache/horovod}/torch-$torch_version$suffix
mkdir -p "$wheels"

if ! ls "$wheels"/horovod-$VERSION-*.whl >/dev/null 2>&1; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # The build's tools in a folder of their own, not the environment: a build beside another pip install into
    # the same environment (make test's) would have two pips writing the same packages.
    # (A node without a package index, as many compute nodes are: HOROVOD_SDIST names the sdist, and the tools
    # already in the environment are used; with an index they go to a folder of their own, as said above.)
    if [[ -z ${HOROVOD_SDIST:-} ]] || ! "$PYTHON" -c 'import setuptools, wheel, cloudpickle, psutil, yaml, packaging'; then
        "$PYTHON" -m pip install --quiet --target "$work/tools" setuptools wheel cloudpickle psutil pyyaml packaging
    fi
    sdist=${HOROVOD_SDIST:-$work/horovod-$VERSION.tar.gz}
    [[ -n ${HOROVOD_SDIST:-} ]] ||
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
    tar -xzf "$sdist" -C "$work"
    src=$work/horovod-$VERSION
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
        # Fail loudly if the sdist ever changes, rather than build something unpatched.
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$src/$f" || {
            echo "build_horovod: no C++14 setting in $f; the sdist changed, check the patch" >&2; exit 1; }
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
    done
    # A CPU-only build: Horovod would compile its CUDA parts whenever torch is a CUDA build and torch
    # guesses a CUDA_HOME, as PyPI's torch for Linux does on a laptop without the CUDA toolkit, and then
    # fail to find cudart. Tell its CMake that this torch has no CUDA.
    find=$src/cmake/Modules/FindPytorch.cmake
    if [[ $gpu == cpu ]]; then
        grep -q 'print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)' "$find" || {
            echo "build_horovod: FindPytorch.cmake changed; check the CPU-only patch" >&2; exit 1; }
        sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' "$find"
    else
        if [[ ! -f ${nccl_home:-/nonexistent}/include/nccl.h ]]; then
            echo "build_horovod: no nccl.h in ${nccl_home:-the nvidia-nccl wheel}: set HOROVOD_NCCL_HOME to an NCCL" \
                 "with its headers (the one torch uses: a site's nccl module, or NVIDIA's package of the same version)" >&2
            exit 1
        fi
        mkdir -p "$work/nccl/lib"
        ln -s "$nccl_home/include" "$work/nccl/include"
        for library in "$nccl_home"/lib/libnccl.so*; do
            ln -sf "$library" "$work/nccl/lib/$(basename "$library")"
        done
        [[ -e $work/nccl/lib/libnccl.so ]] || ln -s "$nccl_home/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$work/nccl HOROVOD_NCCL_LINK=SHARED
        export HOROVOD_BUILD_CUDA_CC_LIST=$cuda_archs
    fi
    # CMake 4 refuses projects that ask for CMake < 3.5, as Horovod's gloo does; this tells it to carry on (CMake 3
    # ignores the variable).
    export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
    # GCC 13 and later no longer include <string>, <stdexcept> and <cstdint> through other headers, and Horovod
    # 0.28.1's common.h and group_table.h rely on that (seen with GCC 13.3 beside CUDA 13, in g++ and nvcc units
    # alike): include them at the top of both.
    for f in horovod/common/common.h horovod/common/group_table.h; do
        sed -i '0,/^#include/s//#include <cstdint>\n#include <stdexcept>\n#include <string>\n#include/' "$src/$f"
    done
    echo "build_horovod: compiling (several minutes)"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS=-j$(nproc) PYTHONPATH="$work/tools${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps -w "$wheels" "$src"
fi
if [[ $wheel_only == 1 ]]; then
    echo "build_horovod: the wheel is in $wheels"
    exit 0
fi

"$PYTHON" -c 'import cloudpickle, psutil, yaml, packaging' 2> /dev/null ||
    "$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheels"/horovod-$VERSION-*.whl
"$PYTHON" - "$gpu" <<'PY'
import sys

import horovod
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without gloo"
assert sys.argv[1] != "nccl" or hvd.nccl_built(), "horovod was built without NCCL"
print(f"build_horovod: horovod {horovod.__version__} ready (gloo{', NCCL' if hvd.nccl_built() else ''})")
PY
