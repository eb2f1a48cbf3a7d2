"""A base image's own torch stays: NVIDIA's NGC images carry a pre-release torch (``2.6.0a0+ecf3bae40a.nv25.01`` in
``nvcr.io/nvidia/pytorch:25.01-py3``) and pin it in the file ``PIP_CONSTRAINT`` names. The kit's torch requirement
must admit that pre-release, or pip refuses to resolve (the pin against the requirement) or, without the pin,
replaces NVIDIA's torch with PyPI's (issue 77).

The stand-in for a 20-GB image: a venv holding a tiny distribution named ``torch`` of NVIDIA's version, a constraint
file pinning it, and a stand-in of the kit whose requirements are pyproject.toml's own. pip resolves the kit the way
the Containerfile installs it (``-c`` a constraint file of the kit's beside the base's ``PIP_CONSTRAINT``), with no
index: it must keep the installed torch. The same resolution with the former ``torch>=2.6`` fails, so the test can.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ..conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The torch of NVIDIA's PyTorch image 25.01 (``python -c "import torch; print(torch.__version__)"`` there)
NGC_TORCH = "2.6.0a0+ecf3bae40a.nv25.01"


def _pyproject_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _torch_requirement() -> Requirement:
    return next(r for r in map(Requirement, _pyproject_dependencies()) if r.name == "torch")


def test_the_torch_requirement_admits_nvidias_pre_release_and_the_releases_only_from_the_floor():
    specifier = _torch_requirement().specifier
    for admitted in (NGC_TORCH, "2.6.0", "2.13.0+cpu", "2.13.0+cu130"):
        assert specifier.contains(admitted), admitted
    for refused in ("2.5.1", "2.5.1+cu124", "2.6.0.dev20241112"):  # (a nightly before 2.6's alpha is not 2.6)
        assert not specifier.contains(refused, prereleases=True), refused


def _wheel(folder: Path, name: str, version: str, requires: list[str] = (), module: str | None = None) -> Path:
    """A minimal wheel: the metadata pip reads, and a module (``module``) that says its version."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": "\n".join(
            [
                "Metadata-Version: 2.1",
                f"Name: {name}",
                f"Version: {version}",
                *(f"Requires-Dist: {r}" for r in requires),
            ]
        )
        + "\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if module:
        files[f"{module}/__init__.py"] = f"__version__ = {version!r}\n"
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name_in_wheel, text in files.items():
            wheel.writestr(name_in_wheel, text)
    return path


def _pip(python: Path, *args: str, constraint: Path | None = None) -> subprocess.CompletedProcess:
    """This environment's pip acting on the stand-in venv, with no configuration, index or folder of the machine's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    if constraint:
        env["PIP_CONSTRAINT"] = str(constraint)
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def base_image(tmp_path_factory):
    """A venv standing in for NGC's image: NVIDIA's torch installed, and pinned by a ``PIP_CONSTRAINT`` file."""
    folder = tmp_path_factory.mktemp("ngc")
    venv.EnvBuilder(with_pip=False).create(folder / "venv")
    python = folder / "venv" / "bin" / "python"
    wheels = folder / "wheels"
    wheels.mkdir()
    # installed as pip installs a pure wheel: its files unpacked into the venv's site-packages
    site_packages = next((folder / "venv" / "lib").glob("python3*/site-packages"))
    zipfile.ZipFile(_wheel(wheels, "torch", NGC_TORCH, module="torch")).extractall(site_packages)
    constraint = folder / "constraint.txt"  # (NGC's /etc/pip/constraint.txt pins its torch this way)
    constraint.write_text(f"torch=={NGC_TORCH}\n")
    # The kit's other requirements at their floors, so that the resolution is the whole of the kit's base install
    for requirement in map(Requirement, _pyproject_dependencies()):
        if requirement.name != "torch":
            floor = next(s.version for s in requirement.specifier if s.operator == ">=")
            _wheel(wheels, requirement.name, floor)
    return python, wheels, constraint


def _resolve(base_image, tmp_path, torch_requirement: str) -> subprocess.CompletedProcess:
    python, wheels, constraint = base_image
    kit = tmp_path / "kit"
    kit.mkdir()
    requires = [torch_requirement if Requirement(r).name == "torch" else r for r in _pyproject_dependencies()]
    _wheel(kit, "dlscale", "0.1.0", requires, module="dlscale")
    kits_constraints = tmp_path / "constraints.txt"  # (the Containerfile's -c constraints.txt: pins of other names)
    kits_constraints.write_text("pyyaml>=6.0\n")
    return _pip(
        python,
        *("install", "--dry-run", "--report", str(tmp_path / "report.json"), "--quiet"),
        *("--find-links", str(wheels), "--find-links", str(kit), "-c", str(kits_constraints), "dlscale"),
        constraint=constraint,
    )


def test_pip_keeps_the_base_images_pre_release_torch_pinned_by_pip_constraint(base_image, tmp_path):
    done = _resolve(base_image, tmp_path, str(_torch_requirement()))
    assert done.returncode == 0, done.stdout + done.stderr
    installs = {
        item["metadata"]["name"]: item["metadata"]["version"]
        for item in json.loads((tmp_path / "report.json").read_text())["install"]
    }
    assert "dlscale" in installs and "numpy" in installs
    assert "torch" not in installs, f"pip would replace the base image's torch {NGC_TORCH} by {installs['torch']}"
    kept = subprocess.run(
        [str(base_image[0]), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    assert Version(kept.stdout.strip()) == Version(NGC_TORCH)


def test_with_the_former_requirement_pip_refuses_the_pinned_pre_release(base_image, tmp_path):
    """The control: ``torch>=2.6`` excludes 2.6.0a0, so the pin and the requirement cannot both hold."""
    done = _resolve(base_image, tmp_path, "torch>=2.6")
    assert done.returncode != 0
    # (the pin and the requirement in conflict: had pip not read PIP_CONSTRAINT beside -c, it would look for another
    # torch instead, and say it found none)
    assert "ResolutionImpossible" in done.stdout + done.stderr, done.stdout + done.stderr
