#!/usr/bin/env bash
# Write constraints.txt from the environment a green `make test` left (.venv): every installed version but torch's
# (the Makefile's TORCH), CUDA's libraries and Horovod's (scripts/build_horovod.sh), for the Python that ran it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
{
    sed -n '1,/^# green run/p' constraints.txt
    "$python" -m pip freeze --exclude-editable | grep -viE '^(torch|triton|nvidia-[a-z0-9-]*|horovod|dlscale)==' |
        grep '==' | sed "s/\$/; python_version == \"$version\"/"
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) versions for Python $version"
