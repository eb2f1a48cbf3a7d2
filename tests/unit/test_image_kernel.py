"""A hub starts the lessons' kernel inside the image (issue 77): ``python -m dlscale.jobs.kernel --image IMAGE
--runtime RUNTIME`` (``make kernel IMAGE=... RUNTIME=...``) writes a kernel whose ``argv`` runs the image's Python
with ``ipykernel_launcher`` through Shifter, Apptainer, podman-hpc or podman, as NERSC documents for Shifter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dlscale.jobs.kernel as kernel
from dlscale.jobs.kernel import HELPER, IMAGE_PYTHON, image_kernel_files, install_image_kernel

from ..conftest import ROOT

LAUNCH = [IMAGE_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def _spec(files: dict[str, str]) -> dict:
    return json.loads(files["kernel.json"])


@pytest.mark.parametrize(
    "runtime, gpu, argv",
    [
        ("shifter", None, ["shifter", "--image=reg/dlscale:1", "--module=gpu", *LAUNCH]),
        ("shifter", "none", ["shifter", "--image=reg/dlscale:1", *LAUNCH]),
        ("apptainer", None, ["apptainer", "exec", "reg/dlscale:1", *LAUNCH]),
        ("apptainer", "nvidia", ["apptainer", "exec", "--nv", "reg/dlscale:1", *LAUNCH]),
        ("apptainer", "amd", ["apptainer", "exec", "--rocm", "reg/dlscale:1", *LAUNCH]),  # (Frontier)
    ],
)
def test_shifter_and_apptainer_kernels_run_the_images_python_directly(runtime, gpu, argv):
    files = image_kernel_files("reg/dlscale:1", runtime, "dlscale (test)", gpu)
    spec = _spec(files)
    assert list(files) == ["kernel.json"]
    assert spec["argv"] == argv
    assert spec["display_name"] == "dlscale (test)" and spec["language"] == "python"
    assert spec["env"] == {"PYTHONNOUSERSITE": "1"}  # (the user's ~/.local, which both runtimes see, stays out)
    assert spec["interrupt_mode"] == "message"  # (no runtime has to pass SIGINT on)


@pytest.mark.parametrize("runtime, gpu_flags", [("podman-hpc", ["--gpu"]), ("podman", [])])
def test_podman_kernels_run_a_helper_that_mounts_the_notebooks_folder_once(tmp_path, runtime, gpu_flags):
    """The helper's command line, run with a stand-in runtime that prints it: host network, the notebook's folder
    as the working folder, each folder mounted once (podman before 4.4 refuses two mounts at one place)."""
    files = image_kernel_files("dlscale", runtime, "dlscale (test)", runtime_args=["--ulimit=nofile=1024:1024"])
    assert _spec(files)["argv"] == ["{resource_dir}/" + HELPER, "-f", "{connection_file}"]
    helper = tmp_path / HELPER
    helper.write_text(files[HELPER])
    helper.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / runtime).write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / runtime).chmod(0o755)
    notebooks, runtime_dir, scratch = (tmp_path / name for name in ("notebooks", "runtime", "scratch"))
    for folder in (notebooks, runtime_dir, scratch):
        folder.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SCRATCH": str(scratch)}
    for connection_folder, mounted in ((runtime_dir, [notebooks, runtime_dir, scratch]), (notebooks, [notebooks])):
        connection = connection_folder / "kernel-1.json"
        done = subprocess.run(
            [str(helper), "-f", str(connection)], cwd=notebooks, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        words = done.stdout.splitlines()
        mounts = [words[i + 1] for i, word in enumerate(words) if word == "-v"]
        expected = [f"{folder}:{folder}" for folder in dict.fromkeys([*mounted, scratch])]
        assert mounts == expected
        assert words[:4] == ["run", "--rm", "--net", "host"] and words[4 : 4 + len(gpu_flags)] == gpu_flags
        assert "--ulimit=nofile=1024:1024" in words
        assert words[words.index("-w") + 1] == str(notebooks)
        assert words[-6:] == ["dlscale", *LAUNCH[:-1], str(connection)]


def test_a_runtime_without_the_gpus_asked_for_is_refused():
    with pytest.raises(ValueError, match="podman-hpc starts containers with the GPUs nvidia, none"):
        image_kernel_files("dlscale", "podman-hpc", "dlscale", "amd")
    with pytest.raises(ValueError, match="runtime 'docker'"):
        image_kernel_files("dlscale", "docker", "dlscale")


def test_the_kernel_of_an_image_is_registered_in_the_users_folder_without_jupyter(tmp_path, monkeypatch):
    """Run inside a Shifter or Apptainer image (the user's home mounted), or by a bare Python on a login node: the
    kernel lands in the user's own kernels folder, the one the hub reads; an Apptainer SIF named relative to here
    is named by its whole path (the kernel starts in the notebook's folder)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kernel, "importable", lambda name: False)  # (no Jupyter here)
    folder = install_image_kernel("dlscale.sif", "apptainer", gpu="amd")
    assert folder == tmp_path / "jupyter/kernels/dlscale"
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["argv"][:4] == ["apptainer", "exec", "--rocm", str(tmp_path / "dlscale.sif")]
    assert spec["display_name"] == f"dlscale (apptainer: {tmp_path / 'dlscale.sif'})"
    folder = install_image_kernel("dlscale", "podman-hpc", name="dlscale-image")
    assert os.access(folder / HELPER, os.X_OK) and folder.name == "dlscale-image"


def test_jupyter_renders_the_kernels_command_with_the_connection_file(tmp_path, monkeypatch):
    """jupyter_client, as a hub's server does, fills in the connection file and the helper's folder."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    for runtime in ("shifter", "podman-hpc"):
        kernel.main(["--image", "reg/dlscale:1", "--runtime", runtime, "--name", f"dlscale-{runtime}"])
        manager = KernelManager(
            kernel_name=f"dlscale-{runtime}",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter/kernels")]),
        )
        manager.connection_file = str(tmp_path / "kernel-abc.json")
        command = manager.format_kernel_cmd()
        assert command[-2:] == ["-f", str(tmp_path / "kernel-abc.json")]
        if runtime == "podman-hpc":
            assert command[0] == str(tmp_path / f"jupyter/kernels/dlscale-{runtime}" / HELPER)
        assert manager.kernel_spec.interrupt_mode == "message"


def test_make_kernel_with_an_image_needs_no_venv_and_names_a_missing_runtime(tmp_path):
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"), "PYTHON": sys.executable}
    done = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT),
            "kernel",
            "IMAGE=reg/dlscale:1",
            "RUNTIME=shifter",
            "GPU=none",
            "VENV=/nonexistent",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "jupyter/kernels/dlscale/kernel.json").read_text())
    assert spec["argv"] == ["shifter", "--image=reg/dlscale:1", *LAUNCH]
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "kernel", "IMAGE=reg/dlscale:1"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "name the runtime, RUNTIME=podman-hpc" in done.stdout + done.stderr


def test_the_images_python_is_the_venv_the_containerfile_installs_into():
    text = (ROOT / "Containerfile").read_text()
    venv = str(Path(IMAGE_PYTHON).parents[1])
    assert f"RUN python3 -m venv --system-site-packages --without-pip {venv}" in text
    assert f"PATH={venv}/bin:$PATH" in text
    assert 'dlscale info --require "$EXTRAS"' in text  # (every engine the lessons use, checked last)
