"""The recipe's job scripts for each site (recipes/jobs/), rendered here with stand-ins for the site's commands.

Only a site runs them for real; what is checked is what they would start there: the launcher's line (tasks,
cores, GPU binding, the stage and its arguments), the software they load, and the network settings. The
generic Slurm script (recipes/09_job.sbatch) runs on the local cluster in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

SITE_COMMANDS = ("srun", "mpiexec", "module", "conda", "podman-hpc")
#: A Python without the kit (the one the test environment was made from), as `python` on the stand-ins' path
BARE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"
#: Run by the stand-in launcher the way a rank runs the recipe (a script, its folder first on sys.path): where the
#: rank's `python` finds the kit, if it does
KIT_PROBE = 'import importlib.util as u; s = u.find_spec("dlscale"); print("  kit:", s.origin if s else None)\n'


def _start(
    tmp_path,
    script: str,
    *args: str,
    env: dict | None = None,
    nodes: int = 2,
    hosts: tuple[str, ...] = (),
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run a job script as its scheduler would start it, with the site's commands recorded in calls.log instead of
    run. The launcher also runs `python` as the ranks would, and records where it finds the kit (not in a container:
    the image's Python is not here)."""
    fake, log = tmp_path / "bin", tmp_path / "calls.log"
    fake.mkdir(exist_ok=True)
    hosts = "\n".join(hosts or [f"nid00{i}" for i in range(nodes)]) + "\n"
    (tmp_path / "nodes").write_text(hosts)
    (fake / "scontrol").write_text(f"#!/bin/sh\ncat {tmp_path / 'nodes'}\n")
    (fake / "python").write_text(f'#!/bin/sh\nexec "{BARE_PYTHON}" "$@"\n')
    (tmp_path / "probe").mkdir(exist_ok=True)
    (tmp_path / "probe" / "kit_probe.py").write_text(KIT_PROBE)
    for tool in SITE_COMMANDS:  # each records its arguments and the environment the ranks would see
        (fake / tool).write_text(
            f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n'
            f'[ "{tool}" = module ] || env | grep -E '
            '"^((NCCL|FI|MASTER|OMP|MIOPEN)_|LD_LIBRARY_PATH=|CUDA_VISIBLE_DEVICES=|PYTHONPATH=|VIRTUAL_ENV=)" | '
            f'sed "s/^/  /" >> "{log}"\n'
            f'case "{tool} $*" in srun*.py\\ --device*|mpiexec*.py\\ --device*) case "$*" in *podman-hpc*) ;; '
            f'*) python "{tmp_path / "probe" / "kit_probe.py"}" >> "{log}" 2>&1 ;; esac ;; esac\n'
        )
    for tool in fake.iterdir():
        tool.chmod(0o755)
    environ = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USER": "someone",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "nid[000-001]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_CPUS_PER_TASK": "32",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "PBS_NODEFILE": str(tmp_path / "nodes"),
        "PBS_JOBID": "4242.polaris-pbs-01",
        "PBS_O_WORKDIR": str(ROOT),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(ROOT / "recipes" / script), *args],
        cwd=cwd or tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _render(tmp_path, script: str, *args: str, stage: str = "05_ddp.py", **how) -> tuple[str, str]:
    """Returns (the launcher's line, the one that starts `stage`; every recorded call)."""
    done = _start(tmp_path, script, *args, **how)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.log").read_text()
    launcher = next(
        line for line in calls.splitlines() if line.startswith(("srun -", "mpiexec")) and f"/{stage} --device" in line
    )
    return launcher, calls


def test_perlmutter_runs_a_task_per_gpu_with_32_cores_the_module_and_the_gpu_order(tmp_path):
    launcher, calls = _render(tmp_path, "jobs/perlmutter.sbatch", "--epochs", "2")
    assert "module load pytorch" in calls
    # -c: srun (Slurm >= 22.05) does not inherit --cpus-per-task, and --cpu-bind=cores would give one core
    assert launcher.startswith("srun -c 32 --cpu-bind=cores --gpu-bind=none --kill-on-bad-exit=1 bash -c")
    assert "CUDA_VISIBLE_DEVICES=3,2,1,0 exec python" in launcher
    assert launcher.endswith(f"{ROOT}/recipes/05_ddp.py --device cuda --epochs 2")
    assert "#SBATCH --cpus-per-task=32" in (ROOT / "recipes/jobs/perlmutter.sbatch").read_text()
    for setting in (
        "NCCL_NET=AWS Libfabric",
        "FI_MR_CACHE_MONITOR=userfaultfd",
        "NCCL_SOCKET_IFNAME=hsn",
        "MASTER_ADDR=nid000",
        "MASTER_PORT=14242",
        "OMP_NUM_THREADS=32",
    ):
        assert f"  {setting}\n" in calls, setting


def test_perlmutter_on_one_node_does_not_ask_for_the_network_plugin_and_runs_an_image_with_podman_hpc(tmp_path):
    launcher, calls = _render(tmp_path, "jobs/perlmutter.sbatch", env={"PM_IMAGE": "nersc/pytorch:24.08.01"}, nodes=1)
    assert "module load" not in calls and "NCCL_NET=" not in calls
    assert "podman-hpc run --rm --mpi --gpu --nccl" in launcher and "nersc/pytorch:24.08.01 bash -c" in launcher
    # the image holds torch, not the kit: the clone mounted and on the path; the site's settings passed in
    assert f"-v {ROOT}:{ROOT}" in launcher and f"-e PYTHONPATH={ROOT}" in launcher
    for name in ("NCCL_NET", "FI_CXI_DEFAULT_CQ_SIZE", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME"):
        assert f" -e {name} " in launcher, name


def test_frontier_binds_each_of_8_tasks_to_its_closest_gcd_with_rccls_plugin_and_miopens_cache(tmp_path):
    launcher, calls = _render(tmp_path, "jobs/frontier.sbatch", "--epochs", "2")
    # OLCF's module names, ROCm before the plugin built against it (rocm/6.4.1 and aws-ofi-rccl ended the job)
    assert calls.index("module load PrgEnv-gnu craype-accel-amd-gfx90a rocm") < calls.index(
        "module load rccl-net-plugin"
    )
    for flag in ("--ntasks-per-node=8", "-c7", "--gpus-per-node=8", "--gpu-bind=closest", "--kill-on-bad-exit=1"):
        assert f" {flag} " in launcher, flag
    assert launcher.endswith("recipes/05_ddp.py --device cuda --epochs 2")
    # on the allocation, with alt_read, for RCCL at scale (OLCF); two nodes: the plugin required, not TCP
    assert "#SBATCH --network=disable_rdzv_get" in (ROOT / "recipes/jobs/frontier.sbatch").read_text()
    for setting in (
        "NCCL_SOCKET_IFNAME=hsn0",
        "MIOPEN_USER_DB_PATH=/tmp/someone-miopen-cache-4242",
        "MIOPEN_CUSTOM_CACHE_DIR=/tmp/someone-miopen-cache-4242",
        "OMP_NUM_THREADS=7",
        "FI_CXI_RDZV_PROTO=alt_read",
        "NCCL_NET=OFI",  # (the name OLCF's guide sets)
    ):
        assert f"  {setting}\n" in calls, setting
    # MIOpen does not make it; one task per node (-n: srun would take SLURM_NTASKS's count)
    assert "srun -n 2 --ntasks-per-node=1 mkdir -p /tmp/someone-miopen-cache-4242" in calls


def test_polaris_starts_4_ranks_per_node_with_mpiexec_bound_by_depth_and_alcfs_nccl_settings(tmp_path):
    launcher, calls = _render(tmp_path, "jobs/polaris.pbs", env={"ARGS": "--epochs 2 --config demo"})
    assert "module load conda" in calls and "conda activate base" in calls
    assert launcher.startswith("mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth --env OMP_NUM_THREADS=8 python")
    assert launcher.endswith("recipes/05_ddp.py --device cuda --epochs 2 --config demo")
    for setting in (
        "NCCL_NET=AWS Libfabric",
        "NCCL_NET_GDR_LEVEL=PHB",
        "NCCL_CROSS_NIC=1",
        "MASTER_ADDR=nid000",
        "MASTER_PORT=14242",
        "CUDA_VISIBLE_DEVICES=3,2,1,0",
    ):  # (ALCF's GPUs in reverse order)
        assert f"  {setting}\n" in calls, setting
    # the forced plugin found: ALCF's aws-ofi-nccl and hwloc folders on the library path
    assert "  LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib" in calls


def test_polaris_takes_the_master_from_the_nodefiles_first_line_as_pals_places_rank_0(tmp_path):
    """PALS's mpiexec puts rank 0 on the nodefile's first host; sorted, MASTER_ADDR named another node."""
    launcher, calls = _render(tmp_path, "jobs/polaris.pbs", env={"ARGS": "--epochs 1"}, hosts=("x3002", "x1001"))
    assert "  MASTER_ADDR=x3002\n" in calls and launcher.startswith("mpiexec -n 8 ")


#: Each site's job script and its GPUs (GCDs on Frontier) per node
SITES = [("jobs/perlmutter.sbatch", 4), ("jobs/frontier.sbatch", 8), ("jobs/polaris.pbs", 4)]


def _per_node(script: str, launcher: str, calls: str) -> tuple[int, int]:
    """(tasks, GPUs) per node that the script starts: on the launcher's line, else in the #SBATCH header srun
    inherits; Polaris's GPUs are those CUDA_VISIBLE_DEVICES lists to every rank."""
    header = (ROOT / "recipes" / script).read_text()

    def number(pattern: str) -> int:
        found = re.search(f" {pattern}", launcher) or re.search(f"^#SBATCH {pattern}$", header, re.M)
        assert found, pattern
        return int(found[1])

    if script.endswith(".pbs"):
        gpus = len(re.search(r"^  CUDA_VISIBLE_DEVICES=(\S+)$", calls, re.M)[1].split(","))
        return number(r"--ppn (\d+)"), gpus
    return number(r"--ntasks-per-node=(\d+)"), number(r"--gpus-per-node=(\d+)")


@pytest.mark.parametrize(("script", "gpus"), SITES)
def test_the_pipeline_stage_runs_with_one_tp_group_of_consecutive_ranks_filling_each_node(script, gpus, tmp_path):
    """STAGE=13_pipeline.py with --tp <GPUs per node>: the launcher starts that stage, --device cuda and the user's
    arguments unchanged, one task per GPU and no distribution but the block one (consecutive ranks on a node), so
    each tp group is exactly one node and the pipeline's stages are the nodes."""
    recipes = tmp_path / "recipes"  # (a stand-in folder: RECIPES and STAGE together; the stage is not run here)
    recipes.mkdir()
    (recipes / "13_pipeline.py").touch()
    args = ["--tp", str(gpus), "--schedule", "interleaved-1f1b", "--microbatches", "8", "--stages-per-rank", "2"]
    env = {"STAGE": "13_pipeline.py", "RECIPES": str(recipes), "ARGS": " ".join(args)}
    argv = [] if script.endswith(".pbs") else args  # (qsub passes no arguments: Polaris's come in ARGS)
    launcher, calls = _render(tmp_path, script, *argv, env=env, nodes=2, stage="13_pipeline.py")
    assert launcher.endswith(f" {recipes}/13_pipeline.py --device cuda {' '.join(args)}")
    assert "05_ddp" not in calls
    assert _per_node(script, launcher, calls) == (gpus, gpus)
    assert not re.search(r" (-m|--distribution)[ =]", launcher)  # (cyclic would split a tp group across nodes)
    if script.endswith(".pbs"):
        assert launcher.startswith(f"mpiexec -n {2 * gpus} --ppn {gpus} ")


@pytest.mark.parametrize("script", [script for script, _ in SITES])
def test_an_unknown_stage_stops_the_job_before_anything_is_loaded_or_launched(script, tmp_path):
    for stage in ("13_pipelin.py", "../pyproject.toml"):  # (a typo; a file outside recipes/)
        done = _start(tmp_path, script, env={"STAGE": stage, "ARGS": "--tp 4"})
        assert done.returncode == 2
        assert done.stderr == f"{ROOT}/recipes/{stage}: no such stage; STAGE names a file of recipes/\n"
        assert not (tmp_path / "calls.log").exists()  # no module, no srun or mpiexec


@pytest.mark.parametrize("script", ["jobs/polaris.pbs", "jobs/perlmutter.sbatch", "jobs/frontier.sbatch"])
def test_the_ranks_import_the_kit_from_its_venv_or_else_from_the_clone(script, tmp_path):
    """Polaris's job activated conda's base and nothing else: every rank failed with ModuleNotFoundError (ALCF's base
    is read-only, their route is a venv on top; qsub passes no environment without -V). The same on Perlmutter's
    module route and Frontier's: the venv (KIT_VENV, default the clone's .venv), else the clone on PYTHONPATH."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'VIRTUAL_ENV="{venv}"\nexport VIRTUAL_ENV\nPATH="{venv}/bin:$PATH"\n')
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # (the kit installed)
    (venv / "bin" / "python").chmod(0o755)
    kit = str(ROOT / "dlscale" / "__init__.py")
    _, calls = _render(tmp_path, script, env={"KIT_VENV": str(venv), "ARGS": "--epochs 1"})
    assert f"  VIRTUAL_ENV={venv}\n" in calls and "PYTHONPATH" not in calls
    assert f"  kit: {kit}\n" in calls
    (tmp_path / "calls.log").unlink()
    _, calls = _render(tmp_path, script, env={"KIT_VENV": str(tmp_path / "none"), "ARGS": "--epochs 1"})
    assert f"  PYTHONPATH={ROOT}\n" in calls and "VIRTUAL_ENV" not in calls
    assert f"  kit: {kit}\n" in calls  # (a Python without the kit finds it in the clone)


def test_perlmutter_mounts_the_clone_once_when_submitted_from_it(tmp_path):
    """From the repository root the two -v mounts were the same folder; podman before 4.4 refuses a duplicate mount
    destination (podman#4217, allowed since podman#16165)."""
    launcher, _ = _render(tmp_path, "jobs/perlmutter.sbatch", env={"PM_IMAGE": "dlscale"}, nodes=1, cwd=ROOT)
    assert launcher.count(" -v ") == 1 and f"-v {ROOT}:{ROOT} -w {ROOT}" in launcher
    assert f"-e PYTHONPATH={ROOT}" in launcher and " -e FI_CXI_DEFAULT_CQ_SIZE " in launcher
    (tmp_path / "calls.log").unlink()
    launcher, _ = _render(tmp_path, "jobs/perlmutter.sbatch", env={"PM_IMAGE": "dlscale"}, nodes=1)
    assert launcher.count(" -v ") == 2 and f"-v {tmp_path}:{tmp_path} -v {ROOT}:{ROOT}" in launcher


def test_the_recipe_reads_its_rank_from_each_launcher(monkeypatch):
    """torchrun, srun and Polaris's mpiexec (PALS) name the ranks differently; the first one set wins."""
    import importlib

    from dlscale.lessons.recipe_folder import RECIPES  # noqa: F401  (puts recipes/ on the path)

    from_launcher = importlib.import_module("training_tools").from_launcher

    for name in ("RANK", "SLURM_PROCID", "PMI_RANK", "WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert from_launcher("WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", default=1) == 1
    monkeypatch.setenv("PMI_RANK", "5")
    assert from_launcher("RANK", "SLURM_PROCID", "PMI_RANK") == 5
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert from_launcher("RANK", "SLURM_PROCID", "PMI_RANK") == 3


@pytest.mark.parametrize(
    "script", ["jobs/perlmutter.sbatch", "jobs/frontier.sbatch", "jobs/polaris.pbs", "09_job.sbatch"]
)
def test_every_job_script_cites_the_guide_it_follows_and_ends_the_job_when_a_rank_dies(script):
    text = (ROOT / "recipes" / script).read_text()
    assert script == "09_job.sbatch" or "docs." in text  # the site's documentation, by address
    assert "--kill-on-bad-exit=1" in text or "mpiexec" in text  # (PALS ends the job when a rank fails)
    commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("| head" in line for line in commands)  # no SIGPIPE under pipefail
