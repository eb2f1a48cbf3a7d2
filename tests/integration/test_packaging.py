"""The install story stays true: pyproject and environment.yml agree, the README's commands are CI's."""

import os
import re
import sys

import yaml

from ..conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: conda-forge names that differ from PyPI's
CONDA_NAMES = {"torch": "pytorch", "impi-rt": "impi_rt"}
#: PyPI dependencies that environment.yml leaves out on purpose, and why
NOT_IN_CONDA = {
    "horovod": "needs a patched build (see the README)",
    "sphinx-revealjs": "pip installs it there (the slides use only the reveal.js it ships, not Sphinx)",
}


def _requirement(spec: str) -> tuple[str, str]:
    """(name, version bound) of a requirement, without extras or environment markers."""
    match = re.match(r"^([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)$", spec.split(";")[0].strip())
    return match.group(1).lower(), match.group(2).replace(" ", "")


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pypi = dict(_requirement(s) for s in project["dependencies"])
    for extra, specs in project["optional-dependencies"].items():
        pypi.update(_requirement(s) for s in specs if not s.startswith("dlscale"))
    expected = {CONDA_NAMES.get(name, name): bound for name, bound in pypi.items() if name not in NOT_IN_CONDA}

    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = dict(_requirement(s) for s in environment["dependencies"] if isinstance(s, str))
    conda.pop("python"), conda.pop("pip")
    assert conda == expected
    pip = next(d for d in environment["dependencies"] if isinstance(d, dict))["pip"]
    assert {"--no-deps", "-e .", f"sphinx-revealjs{pypi['sphinx-revealjs']}"} <= set(pip)


def test_extras_cover_every_optional_import():
    from dlscale.jobs.environment import OPTIONAL

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in OPTIONAL.items():  # (an extra, or the command that installs it: make horovod)
        assert extra in extras or extra.startswith("make "), f"{module} points at a missing extra {extra}"
    assert "all" in extras and "dev" in extras


def test_readme_quick_start_is_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)```", quick, re.S)[0].strip().splitlines()
    commands = [c for c in commands if c.strip() and not c.strip().startswith("#")]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test$", ci, re.M), ".ci/run must run the README's test command unchanged"
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "lab", "kernel", "exercises"):
        assert re.search(rf"^{target}:", makefile, re.M), target
        assert f"make {target}" in readme, f"README does not mention make {target}"


def test_shipped_configs_travel_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "configs/*.yaml" in package_data["dlscale.config"]


#: torch APIs the package may use, with the first release that has them. A new use of a newer API
#: must raise the floor in pyproject.toml (and environment.yml, which the test above keeps equal).
TORCH_APIS = {
    "torch.amp.GradScaler": (2, 3),  # before: torch.cuda.amp.GradScaler, CUDA only
    "torch.utils.flop_counter": (2, 1),
    "torch.compile": (2, 0),
    "torch.distributed.fsdp.fully_shard": (2, 6),
    "torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard": (2, 6),  # how parallel.py imports it
    "torch.distributed.tensor": (2, 5),
    "torch.nn.attention": (2, 2),
}


def test_the_torch_floor_covers_every_api_the_code_uses():
    code = "\n".join(path.read_text() for path in (ROOT / "dlscale").rglob("*.py"))
    used = {api: version for api, version in TORCH_APIS.items() if api in code}
    assert "torch.amp.GradScaler" in used  # the table is checked against something real
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bound = dict(_requirement(s) for s in project["dependencies"])["torch"]
    floor = tuple(int(part) for part in re.match(r">=(\d+)\.(\d+)", bound).groups())
    newest = max(used, key=used.get)
    assert floor >= used[newest], f"torch{bound} is below {newest}, which needs torch {used[newest]}"


def test_the_readme_layout_lists_exactly_what_is_in_the_package():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed = {
        line.split()[0].rstrip("/")
        for line in block.splitlines()
        if line.startswith("  ")
        and not line.startswith("   ")  # (deeper lines continue an entry)
        and not line.lstrip().startswith("#")
    }  # (a tier's heading)
    present = {path.name for path in (ROOT / "dlscale").iterdir() if path.name not in ("__pycache__", "__init__.py")}
    assert listed == present, (
        f"README lists {sorted(listed - present)} that are not there, misses {sorted(present - listed)}"
    )


def test_under_a_sites_pytorch_module_setup_keeps_the_modules_torch(tmp_path):
    """NERSC's `module load pytorch`: make setup used to pip a second torch over the module's (issue 45)."""
    import subprocess

    lines = {}
    for modules in ("", "craype-x86-milan:gpu:pytorch/2.6.0"):
        done = subprocess.run(
            ["make", "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / 'venv'}"],
            env={**os.environ, "LOADEDMODULES": modules},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        lines[modules] = done.stdout
    assert '"torch==' in lines[""] and "--system-site-packages" not in lines[""]
    with_module = lines["craype-x86-milan:gpu:pytorch/2.6.0"]
    assert "-m venv --system-site-packages" in with_module and '"torch==' not in with_module


def test_the_workshop_paths_add_up_and_are_at_least_40_percent_hands_on():
    """The README's schedule: each lesson's talk + hands-on + compute is its total, the totals are the paths'."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("**A workshop of 4 hours, or a day.**", 1)[1].split("\n\n", 2)[1]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    for path in (1, 2):
        minutes = hands_on = optional = 0
        for row in rows[:-1]:
            split = re.match(r"(\d+) \+ (\d+) \+ (\d+) = (\d+) min", row[path])
            if split:
                talk, work, compute, total = map(int, split.groups())
                assert talk + work + compute == total, row
                minutes, hands_on = minutes + total, hands_on + work
                optional += total if "optional" in row[path] else 0
            elif re.fullmatch(r"\d+ min", row[path]):  # breaks
                minutes += int(row[path].split()[0])
        stated = re.match(r"\*\*(\d+) min .*?, (\d+) of them hands-on \((\d+)%\)", rows[-1][path])
        assert stated, rows[-1][path]
        assert (minutes, hands_on) == (int(stated[1]), int(stated[2])), (path, minutes, hands_on)
        assert round(100 * hands_on / minutes) == int(stated[3]) and hands_on >= 0.4 * minutes
        if optional:
            assert f"{minutes - optional} min without 06 and 08" in rows[-1][path]
