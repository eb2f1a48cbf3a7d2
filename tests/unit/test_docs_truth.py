"""Every make target, path and dlscale command the README and docs/ name exists (#60): a newcomer who types what
the documentation says meets the thing it describes."""

from __future__ import annotations

import re

from ..conftest import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOLDERS = "scripts|recipes|slurm|docs|tests|dlscale|notebooks|exercises|solutions"
#: A capitalized word in a path stands for one of several (slurm/SITE/train.sbatch): it must match one at least.
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]+|NN")


def _named(pattern: str) -> list[tuple[str, str]]:
    return [(path.name, found) for path in DOCUMENTS for found in re.findall(pattern, path.read_text())]


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert [(doc, target) for doc, target in _named(r"`make ([a-z][\w-]*)") if target not in targets] == []


def test_every_path_the_docs_name_exists():
    missing = []
    for doc, reference in _named(rf"`((?:{FOLDERS})/[\w./-]+)"):
        reference = reference.rstrip(".").split("::")[0]
        if PLACEHOLDER.search(reference):
            if not list(ROOT.glob(PLACEHOLDER.sub("*", reference))):
                missing.append((doc, reference))
        elif not (ROOT / reference).exists():
            missing.append((doc, reference))
    assert missing == []


def test_every_dlscale_command_the_docs_name_exists():
    from dlscale.cli import build_parser

    commands = next(action for action in build_parser()._actions if action.dest == "command").choices
    named = {command for _, command in _named(r"`dlscale ([a-z][\w-]*)")}
    assert sorted(named - set(commands)) == []
