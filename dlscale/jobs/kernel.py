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
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from dlscale.errors import DlscaleError, import_optional, importable

#: The kernel's name: the notebooks' ``kernelspec`` names it.
KERNEL_NAME = "dlscale"
#: The helper's file name in the kernel's folder.
HELPER = "kernel-helper.sh"


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


def install_kernel(
    python: str = sys.executable, modules: list[str] | None = None, display_name: str | None = None
) -> Path:
    """Register the kernel for this user (where ``JUPYTER_DATA_DIR`` says, else Jupyter's user folder); replaces an
    earlier one of the same name. Returns its folder. Without Jupyter, a :class:`~dlscale.errors.DlscaleError`
    naming the extra that installs it."""
    kernelspec = import_optional("jupyter_client.kernelspec", "notebooks", "registering the lessons' Jupyter kernel")

    modules = list(modules or [])
    display_name = display_name or f"dlscale ({Path(sys.prefix).resolve()})"
    # (numba's cache, where compile_ahead put K-Means's loops: the kernel is started without this shell's variables)
    env = {"NUMBA_CACHE_DIR": os.environ["NUMBA_CACHE_DIR"]} if os.environ.get("NUMBA_CACHE_DIR") else None
    with tempfile.TemporaryDirectory() as folder:
        for name, text in kernel_files(python, modules, display_name, env).items():
            path = Path(folder) / name
            path.write_text(text)
            if name == HELPER:
                path.chmod(0o755)
        return Path(kernelspec.KernelSpecManager().install_kernel_spec(folder, KERNEL_NAME, user=True, replace=True))


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
    args = parser.parse_args(argv)
    if args.if_jupyter and not importable("jupyter_client"):
        print("no kernel registered: Jupyter (the notebooks extra) is not installed here, only the kit")
        return
    try:
        folder = install_kernel(modules=args.module, display_name=args.display_name)
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
