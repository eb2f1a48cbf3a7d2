#!/usr/bin/env bash
# Write constraints.txt from the environment a green `make test` left (.venv): every installed version but torch's
# (the Makefile's TORCH), CUDA's libraries and Horovod's (scripts/build_horovod.sh), for the Python that ran it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
# (the full version: a release may need a later patch level than another Python of the same minor one has, as
# soupsieve 4.1 needs 3.11.5 and Debian 12's python3 is 3.11.2)
version=$("$python" -c 'import platform; print(platform.python_version())')
{
    sed -n '1,/^# green run/p' constraints.txt
    "$python" -m pip freeze --exclude-editable | grep -viE '^(torch|triton|nvidia-[a-z0-9-]*|horovod|dlscale)==' |
        grep '==' | sed "s/\$/; python_full_version == \"$version\"/"
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) versions for Python $version"
