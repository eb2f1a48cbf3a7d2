"""The lessons' Jupyter kernel: this environment registered as ``dlscale`` (the kernel the notebooks name).

On a JupyterHub the default ``python3`` kernel is the hub's own Python, which cannot import the kit. ``make kernel``
(``python -m dlscale.jobs.kernel``) registers this environment's Python under the name the notebooks carry. Where
the environment needs modules loaded first (NERSC's ``module load pytorch``, under which ``make`` built it), the
kernel starts through a helper script that loads them and then becomes the kernel, as NERSC documents for kernels
that need ``module load``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

#: The kernel's name: the notebooks' ``kernelspec`` names it.
KERNEL_NAME = "dlscale"
#: The helper's file name in the kernel's folder.
HELPER = "kernel-helper.sh"


def kernel_files(python: str, modules: list[str], display_name: str) -> dict[str, str]:
    """{file name: text} of the kernel's folder: ``kernel.json`` and, with ``modules``, the helper that loads them."""
    launch = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": launch, "display_name": display_name, "language": "python", "metadata": {"debugger": True}}
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
    earlier one of the same name. Returns its folder."""
    from jupyter_client.kernelspec import KernelSpecManager

    modules = list(modules or [])
    display_name = display_name or f"dlscale ({Path(sys.prefix).resolve()})"
    with tempfile.TemporaryDirectory() as folder:
        for name, text in kernel_files(python, modules, display_name).items():
            path = Path(folder) / name
            path.write_text(text)
            if name == HELPER:
                path.chmod(0o755)
        return Path(KernelSpecManager().install_kernel_spec(folder, KERNEL_NAME, user=True, replace=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.jobs.kernel", description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", default=[], help="a module the kernel loads first (repeat)")
    parser.add_argument("--display-name", default=None)
    args = parser.parse_args(argv)
    folder = install_kernel(modules=args.module, display_name=args.display_name)
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
