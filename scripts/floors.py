"""Print pip requirements that pin each of the kit's floors (``name>=X`` in pyproject.toml) to ``name==X``.

The oldest-Python run of ``make test`` (``make test-oldest``) installs these: the core of the kit,
scikit-learn for the K-Means estimator, and what its tests import, at the lowest versions that
``pyproject.toml`` says it supports. A floor that no longer installs or works there fails that run,
so the README's promise and the floors stay true.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # (Python 3.10: the same parser, from PyPI)
    import tomli as tomllib

#: What the oldest run installs beyond the base dependencies: (extra, package) pairs of pyproject.toml.
CORE = (
    ("kmeans", "scikit-learn"),
    ("kmeans", "numba"),
    ("kmeans", "scipy"),  # (the BLAS pass calls SciPy's BLAS from numba, its threads limited by threadpoolctl)
    ("kmeans", "threadpoolctl"),
    ("hpo", "optuna"),
    ("dev", "pytest"),
    ("dev", "pytest-timeout"),
    ("dev", "pytest-xdist"),
    ("dev", "psutil"),  # (tests/plugins/reaper.py reads what a session left running through it)
    ("dev", "pandas"),
    ("dev", "array-api-compat"),
)


def pins(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = list(project["dependencies"]) + [
        next(req for req in extras[extra] if re.match(rf"{name}\b", req)) for extra, name in CORE
    ]
    out = []
    for requirement in wanted:
        # (a cap beside the floor, "<4", is kept out of the pin: the floor is what the oldest run installs)
        match = re.fullmatch(
            r"\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][^,;\s]*)\s*(?:,\s*<\s*[0-9][^,;\s]*\s*)?", requirement
        )
        if not match:
            raise SystemExit(f"floors.py: {requirement!r} has no plain floor (name>=version) to pin")
        # (a floor that admits the pre-releases of its version, torch>=2.6.0a0 for NVIDIA's images, pins the release)
        floor = re.sub(r"(?:a|b|rc)\d+$", "", match[2])
        out.append(f"{match[1]}=={floor}")
    return out


if __name__ == "__main__":
    print("\n".join(pins(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
