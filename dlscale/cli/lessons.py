"""``dlscale exercises``, ``dlscale recipes`` and ``dlscale lessons reset``: the files written from the lessons,
and one lesson started over."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _generated(changed: list[Path], check: bool, kind: str, command: str) -> int:
    """What a generator wrote, or with ``check`` what is out of date (exit status 1 if anything is)."""
    if check:
        for path in changed:
            print(f"{path} is out of date: run `dlscale {command}`", file=sys.stderr)
        return 1 if changed else 0
    print(f"wrote {len(changed)} {kind}(s)" + "".join(f"\n  {p}" for p in changed))
    return 0


def _exercises(args: argparse.Namespace) -> int:
    from dlscale.lessons.exercises import generate

    return _generated(
        generate(args.solutions, args.exercises, check=args.check, lessons=args.notebooks),
        args.check,
        "exercise notebook",
        "exercises",
    )


def add_exercises(commands: Any) -> None:
    exercises = commands.add_parser(
        "exercises",
        help="generate exercises/ from solutions/",
        description="Replace each '# BEGIN SOLUTION ... # END SOLUTION' fence in "
        "solutions/*.ipynb by a stub and write exercises/.",
    )
    exercises.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    exercises.add_argument("--solutions", default="solutions")
    exercises.add_argument("--notebooks", default="notebooks", help="the lessons whose attendee cells it fills")
    exercises.add_argument("--exercises", default="exercises")
    exercises.set_defaults(handler=_exercises)


def _recipes(args: argparse.Namespace) -> int:
    from dlscale.lessons.recipes import write_recipes

    return _generated(
        write_recipes(Path(args.notebooks), Path(args.recipes), check=args.check), args.check, "recipe file", "recipes"
    )


def add_recipes(commands: Any) -> None:
    recipes = commands.add_parser(
        "recipes",
        help="write recipes/ from the lessons' recipe cells",
        description="Write each notebook cell tagged 'recipe' (first line "
        "'# recipes/NAME.py') to recipes/NAME.py, as a script.",
    )
    recipes.add_argument("--check", action="store_true", help="only report recipe files that are out of date")
    recipes.add_argument("--notebooks", default="notebooks")
    recipes.add_argument("--recipes", default="recipes")
    recipes.set_defaults(handler=_recipes)


def _lessons_reset(args: argparse.Namespace) -> int:
    from dlscale.lessons.reset import reset_lesson

    removed = reset_lesson(args.lesson, args.runs)
    for path in removed:
        print(f"removed {path}")
    print(
        f"lesson {args.lesson} starts over: {len(removed)} run folder(s) or file(s) removed from {args.runs}/ "
        f"(your own files, my_*, kept wherever they are)"
        if removed
        else f"lesson {args.lesson} has no runs in {args.runs}/"
    )
    return 0


def add_lessons(commands: Any) -> None:
    lessons = commands.add_parser(
        "lessons",
        help="the lessons' runs: start one over",
        description="Act on a lesson's runs (the folders runs/lessonNN and runs/lessonNN_*).",
    )
    actions = lessons.add_subparsers(dest="lessons_command", required=True, metavar="ACTION")
    reset = actions.add_parser(
        "reset",
        help="remove one lesson's runs, so that it starts over; nothing else",
        description="Remove runs/lessonNN and runs/lessonNN_* (the attendee's own files, "
        "my_*, are kept wherever they are in them); no other folder is touched.",
    )
    reset.add_argument("lesson", help="the lesson's two digits, e.g. 05")
    reset.add_argument("--runs", default="runs", help="the runs folder (default: runs)")
    reset.set_defaults(handler=_lessons_reset)
