"""What only the lessons use: one module per lesson (``lesson01.py`` … ``lesson12.py``: its questions, readings,
conclusions and exercise checks, on :mod:`~dlscale.lessons.lesson_tools`), each stage's record (``stages/``) and
its run, check and measurements, and the exercise generator (:mod:`~dlscale.lessons.exercises`). The engine never
imports it.

Importing it puts the repository's ``recipes/`` on the import path, as python does for a script run
from there: a lesson's recipe cell imports the stages' shared plumbing (``training_tools``) as the
stage's file does.
"""

from dlscale.lessons import recipes as _recipes  # noqa: F401  (for its one effect: recipes/ on the path)
