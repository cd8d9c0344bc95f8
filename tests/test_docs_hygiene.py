"""README and the docs speak to a user with a checkout of this repository, not to the machine that measured.

:func:`problems` names what such a reader cannot use: an absolute path of some machine (a command's ``--out``
directory, a checkout's location), and prose about the project's own history or how its machines came about
(``so far``, ``the development machine``, a page that does not exist, an issue number or a branch-like
``issue43``, a machine that was lent). The tests run it over README.md and every page under ``docs/``, generated
ones included (``benchmarks/report.py`` writes them from the results files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (what is wrong, the pattern that finds it), each matched case-insensitively
PATTERNS = [
    ("an absolute path of a machine", re.compile(r"(?<![\w.~/<-])/(?:work|tmp|root|home|Users|mnt|scratch)/")),
    ("'so far'", re.compile(r"\bso far\b", re.I)),
    ("'the development machine'", re.compile(r"\bdevelopment machine\b", re.I)),
    ("a 'Performance page' (there is none)", re.compile(r"\bPerformance page\b", re.I)),
    ("an issue number or a branch-like name", re.compile(r"(?<![a-z])issues?[ _#-]*\d+", re.I)),
    ("how a machine was provided", re.compile(r"\b(?:been |was |were )?lent\b|\bthe GPU machine\b", re.I)),
    ("when a run was made relative to others", re.compile(r"\b(?:a|the) (?:later|earlier) session\b|"
                                                          r"\bon another day\b", re.I)),
]


def problems(text: str) -> list[str]:
    """Each line of ``text`` that a reader with only a checkout cannot use, as ``'<line>: <what>: <excerpt>'``.

    Examples:
        >>> problems("python benchmarks/learning.py --out /work/scratch/wc --reuse")
        ["1: an absolute path of a machine: '...s/learning.py --out /work/scratch/wc --reuse...'"]
        >>> problems("the store under /dev/shm, ``--out benchmarks/results/x.json``, the run's longest stall")
        []
    """
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS:
            for match in pattern.finditer(line):
                excerpt = line[max(0, match.start() - 20):match.end() + 20]
                found.append(f"{number}: {what}: '...{excerpt}...'")
    return found


def pages() -> list[Path]:
    """README.md and the docs' pages (their reStructuredText), not a built copy of them."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.rst") if "_build" not in p.relative_to(docs).parts)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_no_machine_and_no_history(page):
    found = problems(page.read_text())
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)


@pytest.mark.parametrize("line, what", [
    ("measured on a 2-core x86-64 CPU, no GPU (the development machine)", "'the development machine'"),
    ("torch 2.13 (CPU build), as the Performance page recorded", "a 'Performance page' (there is none)"),
    ("one screening seed so far", "'so far'"),
    ("Data: ``benchmarks/results/collector/before_after_issue43_final.json``", "an issue number or a branch-like name"),
    ("since issue 45", "an issue number or a branch-like name"),
    ("No GPU has been lent to this project yet.", "how a machine was provided"),
    ("It has not run yet: it needs the GPU machine.", "how a machine was provided"),
    ("the script's ran in a later session on a machine of the same kind", "when a run was made relative to others"),
    ("(A from ``/tmp/before``, B from ``/tmp/after``)", "an absolute path of a machine"),
    ("--soak-json /root/soak.log", "an absolute path of a machine"),
    ("``python benchmarks/sota_dropin.py --rl-root /home/me/rl``", "an absolute path of a machine"),
])
def test_each_pattern_finds_what_it_names(line, what):
    assert {found.split(": ")[1] for found in problems(line)} == {what}


@pytest.mark.parametrize("line", [
    "a dead worker's ``/dev/shm`` blocks and ``/proc`` entries",
    "``python benchmarks/learning.py --suite robot --out <dir> --reuse``",
    "``--rl-root <pytorch/rl checkout>``; ``resume=<run dir>``",
    "``python benchmarks/report.py`` writes ``docs/results/generated/gpu.rst``",
    "the run's longest stall from one update to the next, up to that row",
    "https://github.com/pytorch/rl/tree/main/sota-implementations",
])
def test_ordinary_prose_passes(line):
    assert problems(line) == []


def test_the_generated_pages_as_report_py_writes_them_pass():
    """What ``benchmarks/report.py`` computes from the results files, before it is written to disk."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    found = {path.name: problems(text) for path, text in report.outputs().items()}
    assert not any(found.values()), {name: lines for name, lines in found.items() if lines}
