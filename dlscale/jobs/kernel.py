"""The lessons' Jupyter kernel: this environment registered as ``dlscale`` (the kernel the notebooks name).

On a JupyterHub the default ``python3`` kernel is the hub's own Python, which cannot import the kit. ``make kernel``
(``python -m dlscale.jobs.kernel``) registers this environment's Python under the name the notebooks carry. Where
the environment needs modules loaded first (NERSC's ``module load pytorch``, under which ``make`` built it), the
kernel starts through a helper script that loads them and then becomes the kernel, as NERSC documents for kernels
that need ``module load``.

Registering needs Jupyter (the notebooks extra); the module itself imports without it, so that the kit alone (an
image built with ``EXTRAS=``) installs, and ``--if-jupyter`` registers nothing there, saying so. Where
``NUMBA_CACHE_DIR`` is set, the kernel gets it too: K-Means's loops, compiled ahead into that cache
(``python -m dlscale.kmeans.compile_ahead``, which ``make kernel`` runs first), are then the ones its first fit finds.

A kernel inside the image (``--image IMAGE --runtime RUNTIME``, ``make kernel IMAGE=... RUNTIME=...``): the hub's
Jupyter, outside the image, starts the kernel through the site's container runtime, as NERSC documents for Shifter
(``shifter --image=IMAGE python -m ipykernel_launcher -f {connection_file}``); podman-hpc and podman run the image
with the host's network (Jupyter reaches the kernel's ports on this node) and the notebook's folder mounted where it
is; Apptainer (OLCF, ALCF) binds the home, the working folder and ``/tmp`` itself. The kernel's GPUs: podman-hpc's
``--gpu``, Shifter's ``gpu`` module, Apptainer's ``--nv`` (NVIDIA) or ``--rocm`` (AMD: Frontier). Registering it needs
only Python: run inside the image itself it writes to the user's own kernels folder, which the hub reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from dlscale.errors import DlscaleError, import_optional, importable

#: The kernel's name: the notebooks' ``kernelspec`` names it.
KERNEL_NAME = "dlscale"
#: The helper's file name in the kernel's folder.
HELPER = "kernel-helper.sh"
#: The image's Python: the venv the Containerfile installs the kit into, at this path on every base.
IMAGE_PYTHON = "/opt/venv/bin/python"
#: Container runtimes a kernel can start the image with, and each one's flags for the GPUs
RUNTIMES = ("podman-hpc", "shifter", "apptainer", "podman")
GPU_FLAGS = {
    "podman-hpc": {"nvidia": ["--gpu"]},  # (NERSC's module: the GPUs and NVIDIA's libraries)
    "shifter": {"nvidia": ["--module=gpu"]},
    "apptainer": {"nvidia": ["--nv"], "amd": ["--rocm"]},
    "podman": {"nvidia": ["--device", "nvidia.com/gpu=all"], "amd": ["--device", "/dev/kfd", "--device", "/dev/dri"]},
}
#: The GPUs a kernel of each runtime is given when none is named: Perlmutter's for NERSC's runtimes; elsewhere none
DEFAULT_GPU = {"podman-hpc": "nvidia", "shifter": "nvidia", "apptainer": "none", "podman": "none"}


def kernel_files(
    python: str, modules: list[str], display_name: str, env: dict[str, str] | None = None
) -> dict[str, str]:
    """{file name: text} of the kernel's folder: ``kernel.json`` (with ``env``, the variables the kernel is started
    with) and, with ``modules``, the helper that loads them."""
    launch = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec: dict = {"argv": launch, "display_name": display_name, "language": "python", "metadata": {"debugger": True}}
    if env:
        spec["env"] = dict(env)
    if not modules:
        return {"kernel.json": json.dumps(spec, indent=1) + "\n"}
    helper = "\n".join(
        [
            "#!/bin/bash",
            "# Written by `make kernel` (dlscale.jobs.kernel): load the modules this environment was built under, then",
            "# become the kernel. A kernel starts without a login shell, so the module command may need its "
            "init first.",
            "type module > /dev/null 2>&1 || source /etc/profile > /dev/null 2>&1",
            *[f"module load {shlex.quote(module)}" for module in modules],
            f'exec {shlex.quote(python)} -m ipykernel_launcher "$@"',
            "",
        ]
    )
    spec["argv"] = ["{resource_dir}/" + HELPER, "-f", "{connection_file}"]
    return {"kernel.json": json.dumps(spec, indent=1) + "\n", HELPER: helper}


def image_kernel_files(
    image: str,
    runtime: str,
    display_name: str,
    gpu: str | None = None,
    python: str = IMAGE_PYTHON,
    runtime_args: list[str] | None = None,
) -> dict[str, str]:
    """{file name: text} of the folder of a kernel that runs inside ``image``, started by ``runtime`` (one of
    :data:`RUNTIMES`) with ``gpu`` (``nvidia``, ``amd`` or ``none``; :data:`DEFAULT_GPU` when not named) and
    ``runtime_args`` (more of the runtime's options: ``--bind /lustre/orion`` for Apptainer, a mount for podman).

    Shifter and Apptainer keep the host's network, user, home and working folder, so ``kernel.json`` runs the image's
    Python directly; podman-hpc and podman need them named (``--net host``, the notebook's folder and the connection
    file's mounted at the same paths), which only a shell knows: their ``kernel.json`` runs a helper beside it. The
    user's own packages (``~/.local``, which Shifter and Apptainer see) are kept out of the image's Python, and
    Jupyter interrupts the kernel by a message, which no runtime has to pass on as a signal."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: one of {', '.join(RUNTIMES)}")
    gpu = gpu or DEFAULT_GPU[runtime]
    if gpu != "none" and gpu not in GPU_FLAGS[runtime]:
        known = ", ".join([*GPU_FLAGS[runtime], "none"])
        raise ValueError(f"--gpu {gpu}: {runtime} starts containers with the GPUs {known}")
    flags = [*GPU_FLAGS[runtime].get(gpu, []), *(runtime_args or [])]
    launch = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec: dict = {
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "env": {"PYTHONNOUSERSITE": "1"},
        "metadata": {"debugger": True, "dlscale": {"image": image, "runtime": runtime, "gpu": gpu}},
    }
    if runtime == "shifter":
        spec["argv"] = ["shifter", f"--image={image}", *flags, *launch]
        return {"kernel.json": json.dumps(spec, indent=1) + "\n"}
    if runtime == "apptainer":
        spec["argv"] = ["apptainer", "exec", *flags, image, *launch]
        return {"kernel.json": json.dumps(spec, indent=1) + "\n"}
    spec["argv"] = ["{resource_dir}/" + HELPER, "-f", "{connection_file}"]
    helper = "\n".join(
        [
            "#!/bin/bash",
            "# Written by `python -m dlscale.jobs.kernel --image` (dlscale.jobs.kernel): the lessons' kernel inside",
            f"# the image {image}, started by {runtime}, on the host's network (Jupyter reaches its ports on this",
            "# node), in the notebook's folder and with the connection file's folder mounted at the same paths (each",
            "# once: podman before 4.4 refuses two mounts at one place). Called: kernel-helper.sh -f CONNECTION_FILE",
            "set -eu",
            "mounts=()",
            'mount_here() { local m; for m in "${mounts[@]}"; do [ "$m" = "$1:$1" ] && return 0; done; '
            'mounts+=(-v "$1:$1"); }',
            'mount_here "$PWD"',
            'mount_here "$(dirname "$(realpath "$2")")"',
            'if [ -n "${SCRATCH:-}" ] && [ -d "$SCRATCH" ]; then mount_here "$SCRATCH"; fi',
            f"exec {shlex.join([runtime, 'run', '--rm', '--net', 'host', *flags])} "
            f'"${{mounts[@]}}" -w "$PWD" -e PYTHONNOUSERSITE=1 {shlex.quote(image)} {shlex.quote(python)} '
            '-m ipykernel_launcher "$@"',
            "",
        ]
    )
    return {"kernel.json": json.dumps(spec, indent=1) + "\n", HELPER: helper}


def _user_kernels_folder() -> Path:
    """Jupyter's kernels folder for this user, where no Jupyter is installed to say (Linux's)."""
    data = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter"
    )
    return Path(data) / "kernels"


def _install(files: dict[str, str], name: str, sys_prefix: bool = False, need_jupyter: bool = True) -> Path:
    """Write ``files`` as kernel ``name``: this user's (where ``JUPYTER_DATA_DIR`` says, else Jupyter's user folder),
    or with ``sys_prefix`` this environment's (``share/jupyter/kernels`` under ``sys.prefix``, seen by a Jupyter of
    this environment run by any user); replaces an earlier one of the same name. Without Jupyter, a kernel of an image
    goes into the user's folder directly; a kernel of this environment needs Jupyter (a
    :class:`~dlscale.errors.DlscaleError` naming the extra)."""
    if need_jupyter or importable("jupyter_client"):
        kernelspec = import_optional(
            "jupyter_client.kernelspec", "notebooks", "registering the lessons' Jupyter kernel"
        )
    else:
        kernelspec = None
    with tempfile.TemporaryDirectory() as folder:
        for file_name, text in files.items():
            path = Path(folder) / file_name
            path.write_text(text)
            if file_name == HELPER:
                path.chmod(0o755)
        if kernelspec is not None:
            where = {"prefix": sys.prefix} if sys_prefix else {"user": True}
            return Path(kernelspec.KernelSpecManager().install_kernel_spec(folder, name, **where))
        target = (Path(sys.prefix) / "share/jupyter/kernels" if sys_prefix else _user_kernels_folder()) / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
        return target


def install_kernel(
    python: str = sys.executable,
    modules: list[str] | None = None,
    display_name: str | None = None,
    sys_prefix: bool = False,
) -> Path:
    """Register the kernel for this user (where ``JUPYTER_DATA_DIR`` says, else Jupyter's user folder), or with
    ``sys_prefix`` in this environment; replaces an earlier one of the same name. Returns its folder. Without
    Jupyter, a :class:`~dlscale.errors.DlscaleError` naming the extra that installs it."""
    import_optional("jupyter_client.kernelspec", "notebooks", "registering the lessons' Jupyter kernel")
    modules = list(modules or [])
    display_name = display_name or f"dlscale ({Path(sys.prefix).resolve()})"
    # (numba's cache, where compile_ahead put K-Means's loops: the kernel is started without this shell's variables)
    env = {"NUMBA_CACHE_DIR": os.environ["NUMBA_CACHE_DIR"]} if os.environ.get("NUMBA_CACHE_DIR") else None
    return _install(kernel_files(python, modules, display_name, env), KERNEL_NAME, sys_prefix=sys_prefix)


def install_image_kernel(
    image: str,
    runtime: str,
    gpu: str | None = None,
    display_name: str | None = None,
    name: str = KERNEL_NAME,
    python: str = IMAGE_PYTHON,
    runtime_args: list[str] | None = None,
) -> Path:
    """Register, for this user, a kernel that runs inside ``image`` (:func:`image_kernel_files`); returns its folder.
    Needs no Jupyter here: in the image itself (``shifter --image=IMAGE /opt/venv/bin/python -m dlscale.jobs.kernel
    --image IMAGE --runtime shifter``) it writes to the user's folder, which the hub outside reads."""
    if runtime == "apptainer" and "://" not in image and not image.startswith("instance:"):
        image = os.path.abspath(image)  # (a SIF file: the kernel starts in the notebook's folder)
    display_name = display_name or f"dlscale ({runtime}: {image})"
    files = image_kernel_files(image, runtime, display_name, gpu, python, runtime_args)
    return _install(files, name, need_jupyter=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.jobs.kernel", description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", default=[], help="a module the kernel loads first (repeat)")
    parser.add_argument("--display-name", default=None)
    parser.add_argument(
        "--if-jupyter",
        action="store_true",
        help="where Jupyter (the notebooks extra) is not installed, say so and register nothing (the image's "
        "EXTRAS= builds the kit alone)",
    )
    parser.add_argument(
        "--sys-prefix",
        action="store_true",
        help="register in this environment (share/jupyter under its prefix: a Jupyter of this environment finds it for "
        "every user, as in the image) instead of this user's folder",
    )
    image = parser.add_argument_group("a kernel inside the image (the Containerfile's), started by the hub's Jupyter")
    image.add_argument("--image", help="the image: podman's or Shifter's name, or Apptainer's SIF file")
    image.add_argument("--runtime", choices=RUNTIMES, help="the container runtime that starts it")
    image.add_argument(
        "--gpu",
        choices=("nvidia", "amd", "none"),
        default=None,
        help="the GPUs the kernel is given (default: nvidia for podman-hpc and shifter, none for apptainer and "
        "podman; Frontier: amd, Apptainer's --rocm)",
    )
    image.add_argument("--name", default=KERNEL_NAME, help=f"the kernel's name (default {KERNEL_NAME!r}: the lessons')")
    image.add_argument("--image-python", default=IMAGE_PYTHON, help=f"the Python in the image ({IMAGE_PYTHON})")
    image.add_argument(
        "--runtime-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="another option for the runtime (repeat; one word each: --runtime-arg=--bind=/lustre/orion)",
    )
    args = parser.parse_args(argv)
    if args.image or args.runtime:
        if not (args.image and args.runtime):
            parser.error("a kernel inside an image needs both --image and --runtime")
        try:
            folder = install_image_kernel(
                args.image, args.runtime, args.gpu, args.display_name, args.name, args.image_python, args.runtime_arg
            )
        except ValueError as err:
            parser.error(str(err))
        spec = json.loads((folder / "kernel.json").read_text())
        gpu = spec["metadata"]["dlscale"]["gpu"]
        print(
            f"kernel {args.name!r} registered in {folder}: it runs {args.image_python} inside {args.image} through "
            f"{args.runtime} ({'no GPU' if gpu == 'none' else gpu + ' GPUs'}); on a JupyterHub, restart your server "
            f"if it is not listed yet"
        )
        return
    if args.if_jupyter and not importable("jupyter_client"):
        print("no kernel registered: Jupyter (the notebooks extra) is not installed here, only the kit")
        return
    try:
        folder = install_kernel(modules=args.module, display_name=args.display_name, sys_prefix=args.sys_prefix)
    except DlscaleError as err:
        raise SystemExit(f"{parser.prog}: {err}") from None
    loads = f", loading {' '.join(args.module)} first ({folder / HELPER})" if args.module else ""
    print(
        f"kernel {KERNEL_NAME!r} registered in {folder}{loads}: the lessons open with it; on a JupyterHub, "
        f"restart your server if it is not listed yet"
    )
    if os.environ.get("LOADEDMODULES") and not args.module:
        print(
            "(modules are loaded here, but none was named: if the kernel cannot import torch, run "
            "`make kernel` again with the module loaded)"
        )


if __name__ == "__main__":
    main()
