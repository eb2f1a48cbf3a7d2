"""pyproject.toml for every platform the README names, and constraints.txt inside its ranges (#58)."""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ..conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # (Python 3.10)
    import tomli as tomllib

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def _requirements() -> list[Requirement]:
    return [Requirement(text) for text in PROJECT["dependencies"]] + [
        Requirement(text) for name, extra in EXTRAS.items() for text in extra if not text.startswith("dlscale")
    ]


def _environment(machine: str, system: str) -> dict[str, str]:
    return {
        "platform_machine": machine,
        "sys_platform": system,
        "python_version": "3.12",
        "os_name": "posix",
        "python_full_version": "3.12.0",
        "implementation_name": "cpython",
        "platform_system": system.title(),
    }


@pytest.mark.parametrize("machine, system", [("arm64", "darwin"), ("aarch64", "linux"), ("x86_64", "linux")])
def test_intels_packages_are_asked_for_on_x86_64_only(machine, system):
    """impi-rt and scikit-learn-intelex have no ARM wheels: `pip install -e '.[all]'` failed on Apple silicon."""
    asked = {
        req.name for req in _requirements() if req.marker is None or req.marker.evaluate(_environment(machine, system))
    }
    assert ({"impi-rt", "scikit-learn-intelex"} <= asked) == (machine == "x86_64")
    assert {"torch", "scikit-learn", "numba", "mpi4py", "optuna"} <= asked  # the rest everywhere


def test_the_metadata_is_current_and_what_ci_runs_with_is_pinned_or_capped():
    assert PROJECT["license"] == "BSD-3-Clause" and PROJECT["license-files"] == ["LICENSE"]  # (PEP 639)
    assert "horovod" not in EXTRAS  # (no wheels: make horovod builds it)
    by_name = {req.name: req for req in _requirements()}
    assert str(by_name["ruff"].specifier).startswith("==")
    assert Version("4.0") not in by_name["pytest-xdist"].specifier  # (tests/plugins/scheduling.py uses its private API)
    assert Version("2024.7") not in by_name["scikit-learn-intelex"].specifier  # (2025+ brings daal4py inside it)


def test_the_constraints_lie_inside_pyprojects_ranges():
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            pinned[requirement.name.lower().replace("_", "-")] = next(iter(requirement.specifier)).version
    assert len(pinned) > 50 and "torch" not in pinned  # (torch is the Makefile's TORCH)
    # on the Python that ran it, to its patch level: a pin may need a later one
    # (soupsieve 4.1: 3.11.5; Debian 12: 3.11.2)
    markers = {
        str(Requirement(line).marker)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert len(markers) == 1 and re.fullmatch(r'python_full_version == "\d+\.\d+\.\d+"', markers.pop())
    for requirement in _requirements():
        name = requirement.name.lower()
        if name in pinned:
            assert Version(pinned[name]) in requirement.specifier, (name, pinned[name], str(requirement.specifier))
    assert re.search(r"\$\(PIP_CONSTRAINTS\) -e \.", (ROOT / "Makefile").read_text())  # make installs with them


def test_the_containerfile_installs_the_kit_and_the_lessons_on_a_base_of_the_instructors_choice():
    """An image built once for a room: the base a build argument, the kit and the lessons' extras installed from the
    clone, the kernel registered, and what the lessons and job scripts need copied in (#58)."""
    text = (ROOT / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=\S+\nFROM \$\{BASE\}$", text, re.M)
    assert re.search(r"^ARG EXTRAS=notebooks,kmeans,hpo,tracking,profiling$", text, re.M)
    copied = set(re.findall(r"^COPY (\S+) ", text, re.M))
    assert {"dlscale", "recipes", "notebooks", "slurm"} <= copied
    for name in re.findall(r"^COPY ([^.\n][^\n]*) \./$", text, re.M)[0].split():
        assert (ROOT / name).exists(), name
    assert '-m pip install $PIP_OPTIONS -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"' in text
    assert "-m dlscale.jobs.kernel" in text
