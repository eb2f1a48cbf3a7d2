"""The site settings behind slurm/launch.sh (slurm/sites/SITE.env), run with stand-ins for the site's commands.

A fake srun (and module, conda, scontrol) on the path records its arguments and the environment the tasks would get;
the repository is seen through a folder of its own, so that whether it has a .venv is the test's choice. The checks
are what the sites' documents say: OLCF's "PyTorch on Frontier" (NCCL_NET="OFI" between nodes; the job activates its
environment itself), and NERSC's podman-hpc, whose --nccl module sets every NCCL and libfabric setting but the
completion queue's size.
"""

from __future__ import annotations

import subprocess

from ..conftest import ROOT


def _launch(tmp_path, site: str, *, env: dict | None = None, venv: bool = True, nodes: int = 2) -> str:
    """Submit slurm/SITE/train.sbatch as Slurm would start its batch shell on `nodes` nodes; every recorded call."""
    root, fake, log = tmp_path / "root", tmp_path / "bin", tmp_path / "calls.log"
    (root / ".venv/bin").mkdir(parents=True)
    (root / "slurm").symlink_to(ROOT / "slurm")
    if venv:  # (what `make setup` leaves: a python and an activate script)
        (root / ".venv/bin/python").write_text("#!/bin/sh\n")
        (root / ".venv/bin/python").chmod(0o755)
        (root / ".venv/bin/activate").write_text(
            f'VIRTUAL_ENV="{root}/.venv"\nexport VIRTUAL_ENV\nPATH="$VIRTUAL_ENV/bin:$PATH"\n'
        )
    fake.mkdir()
    (tmp_path / "hosts").write_text("".join(f"nid00{i}\n" for i in range(nodes)))
    (fake / "scontrol").write_text(f'#!/bin/sh\n[ "$1" = show ] && cat "{tmp_path / "hosts"}"\nexit 0\n')
    for tool in ("module", "conda"):
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
    (fake / "srun").write_text(
        f'#!/bin/sh\necho "srun $*" >> "{log}"\n'
        f'env | grep -E "^(VIRTUAL_ENV|NCCL_NET|FI_CXI_DEFAULT_CQ_SIZE)=" | sed "s/^/  /" >> "{log}"\n'
        f'echo "  python: $(command -v python)" >> "{log}"\n'
    )
    for tool in fake.iterdir():
        tool.chmod(0o755)
    (tmp_path / "node-local").mkdir()
    environ = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USER": "someone",
        "TMPDIR": str(tmp_path / "node-local"),
        "DLSCALE_ROOT": str(root),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NAME": "t",
        "SLURM_JOB_NODELIST": f"nid[000-00{nodes - 1}]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(8 * nodes),  # (what sbatch sets for the job, and a nested srun would take)
        "SLURM_CPUS_PER_TASK": "7",
        **(env or {}),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "slurm" / site / "train.sbatch"), "tiny"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return log.read_text()


def _step(calls: str, needle: str) -> str:
    """The recorded srun call whose arguments hold `needle`, with the environment lines after it."""
    blocks = calls.split("srun ")[1:]
    return next(block for block in blocks if needle in block.splitlines()[0])


def test_frontier_runs_the_kits_venv_and_requires_the_plugin_by_olcfs_name(tmp_path):
    """frontier.env never activated the .venv that `make setup TORCH_INDEX=...` builds (perlmutter.env and local.env
    did): a job from a fresh shell ran another Python. Between nodes NCCL_NET is "OFI", as OLCF's guide sets it."""
    calls = _launch(tmp_path, "frontier")
    training = _step(calls, "-m dlscale.train")
    venv = tmp_path / "root/.venv"
    assert f"  VIRTUAL_ENV={venv}\n" in training and f"  python: {venv}/bin/python\n" in training
    assert "  NCCL_NET=OFI\n" in training
    # MIOpen's folder on every node, one task each: srun took SLURM_NTASKS (16) and made 8 folders a node
    mkdir = _step(calls, "mkdir -p").splitlines()[0]
    assert mkdir.startswith("-n 2 --ntasks-per-node=1 mkdir -p ")


def test_frontier_takes_a_named_conda_environment_instead_of_the_venv(tmp_path):
    calls = _launch(tmp_path, "frontier", env={"DLSCALE_CONDA_ENV": "/proj/env"})
    assert "module load miniforge3" in calls and "conda activate /proj/env" in calls
    assert "VIRTUAL_ENV" not in _step(calls, "-m dlscale.train")


def test_frontier_without_a_venv_runs_the_python_on_the_path_and_one_node_needs_no_plugin(tmp_path):
    calls = _launch(tmp_path, "frontier", venv=False, nodes=1)
    training = _step(calls, "-m dlscale.train")
    assert "VIRTUAL_ENV" not in training and "NCCL_NET" not in training
    assert "mkdir" not in calls  # (one node: the batch node's own folder is the only one)


def test_perlmutters_container_gets_the_completion_queue_size_that_podman_hpcs_nccl_module_leaves_out(tmp_path):
    calls = _launch(tmp_path, "perlmutter", env={"DLSCALE_ENV": "container", "DLSCALE_IMAGE": "registry/dlscale:1"})
    training = _step(calls, "-m dlscale.train")
    line = training.splitlines()[0]
    assert "podman-hpc run --rm --mpi --gpu --nccl " in line
    assert " -e FI_CXI_DEFAULT_CQ_SIZE " in line.split(" registry/dlscale:1 ")[0]
    assert "  FI_CXI_DEFAULT_CQ_SIZE=131072\n" in training and "  NCCL_NET=AWS Libfabric\n" in training
