"""Where the recipe lives: the repository's ``recipes/`` folder, on the path so that its stages find their plumbing.

The recipes are not part of the installed package: they are the files an attendee copies, in a clone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dlscale.errors import DlscaleError

#: The repository's recipes/ folder (the recipes are not part of the installed package).
RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# The stages import their shared plumbing (recipes/training_tools.py) from their own folder, which python
# puts first on the path for a script it runs; a kernel that runs a stage's cell (any lesson imports
# dlscale.lessons first), or a test that loads a stage, finds it here.
if str(RECIPES) not in sys.path:
    sys.path.append(str(RECIPES))


class RecipeError(DlscaleError, ValueError):
    """A recipe cell or file is missing or malformed; the message names it."""


def recipe_path(name: str) -> Path:
    """The file of one stage, e.g. ``recipe_path("05_ddp.py")``."""
    path = RECIPES / name
    if not path.is_file():
        raise RecipeError(
            f"{path} does not exist: the recipes live in the repository's recipes/ folder "
            f"(clone it, or run `dlscale recipes` in it)"
        )
    return path
