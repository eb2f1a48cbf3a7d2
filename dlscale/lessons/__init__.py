"""What only the lessons use: the exercise generator (:mod:`~dlscale.lessons.exercises`) and the
check functions the exercises call (:mod:`~dlscale.lessons.checks`). The engine never imports it.

Importing it puts the repository's ``recipes/`` on the import path, as python does for a script run
from there: a lesson's recipe cell imports the stages' shared plumbing (``training_tools``) as the
stage's file does.
"""

from dlscale.lessons import recipes as _recipes  # noqa: F401  (for its one effect: recipes/ on the path)
