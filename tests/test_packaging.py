"""What ``pyproject.toml`` declares matches the code and the checks: imports, extras, version, licence, Pythons."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import torchrl_unilab

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: Where each folder's imports must be declared: the package and the recipes in the dependencies, the tests and
#: benchmarks in the dependencies or an extra.
FOLDERS = {"torchrl_unilab": ("",), "recipes": ("",), "hydra_plugins": ("",),
           "tests": ("", "test", "docs", "ray", "bench"), "benchmarks": ("", "test", "docs", "ray", "bench"),
           "docs": ("", "docs")}
#: Modules the benchmarks import from the pytorch/rl checkout given as ``--rl-root``, not from an installed package.
FROM_RL_CHECKOUT = {"bench_collectors"}
#: Imports of an extra inside the package, each imported where it is used (not at the module's top).
PACKAGE_EXTRAS = {"ray": "ray"}


def declared() -> dict[str, set[str]]:
    """``{extra: {normalised distribution names}}``, ``""`` for the dependencies."""
    groups = {"": PYPROJECT["dependencies"], **PYPROJECT["optional-dependencies"]}
    return {extra: {re.sub(r"[-_.]+", "-", Requirement(r).name).lower() for r in reqs}
            for extra, reqs in groups.items()}


def third_party_imports(folder: Path) -> dict[str, set[str]]:
    """``{top-level module: {files}}`` of the absolute imports under ``folder`` that are neither the standard library
    nor this repository's own modules (the package, the benchmark scripts, the test modules)."""
    local = {p.stem for p in ROOT.glob("benchmarks/*.py")} | {p.stem for p in ROOT.glob("tests/*.py")}
    local |= {"torchrl_unilab", "hydra_plugins", "recipes"} | FROM_RL_CHECKOUT
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        if "_build" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # an import in an except handler (the fallback of ``except ImportError:``) is not a requirement
        fallbacks = {id(n) for handler in ast.walk(tree) if isinstance(handler, ast.ExceptHandler)
                     for statement in handler.body for n in ast.walk(statement)}
        for node in ast.walk(tree):
            if id(node) in fallbacks:
                continue
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_every_third_party_import_is_declared_where_it_is_needed(folder):
    groups, owners = declared(), importlib.metadata.packages_distributions()
    allowed = set().union(*(groups[extra] for extra in FOLDERS[folder]))
    if folder == "torchrl_unilab":
        allowed |= {dist for dist in PACKAGE_EXTRAS.values()}
    missing = {}
    for module, files in third_party_imports(ROOT / folder).items():
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(module, [module])}
        if not dists & allowed:
            missing[module] = sorted(files)[:3]
    assert not missing, (f"imported under {folder}/ but not declared in pyproject.toml's "
                         f"{' / '.join(e or 'dependencies' for e in FOLDERS[folder])}: {missing}")


def test_the_package_imports_its_extras_only_where_they_are_used():
    """``import torchrl_unilab`` and every subpackage work without Ray: its imports sit inside the functions."""
    for module, dist in PACKAGE_EXTRAS.items():
        for path in (ROOT / "torchrl_unilab").rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module and not n.level}
            assert module not in names, f"{path.relative_to(ROOT)} imports {module} (the [{dist}] extra) at its top"


def test_the_version_has_one_source():
    assert PYPROJECT["dynamic"] == ["version"] and "version" not in PYPROJECT
    assert importlib.metadata.version("torchrl-unilab") == torchrl_unilab.__version__
    assert f"version: {torchrl_unilab.__version__}" in (ROOT / "CITATION.cff").read_text()
    assert f"## [{torchrl_unilab.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_the_licence_is_declared_and_shipped():
    assert PYPROJECT["license"] == "MIT" and PYPROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    assert not any(c.startswith("License ::") for c in PYPROJECT["classifiers"]), "SPDX `license` replaces these"


def test_the_python_versions_declared_are_those_the_check_passed():
    """``requires-python`` and the classifiers name exactly the versions ``benchmarks/python_versions.py`` passed."""
    data = json.loads((ROOT / "benchmarks" / "results" / "install" / "python_versions.json").read_text())
    passed = set(data["passing"])
    assert passed and all(data["runs"][v]["passes"] for v in passed)
    classified = {c.rsplit(" ", 1)[1] for c in PYPROJECT["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert classified == passed
    spec = SpecifierSet(PYPROJECT["requires-python"])
    admitted = {f"3.{minor}" for minor in range(8, 16) if f"3.{minor}.0" in spec}
    assert admitted == passed, f"requires-python {spec} admits {sorted(admitted)}; the check passed {sorted(passed)}"
    assert data["install_line"] in (ROOT / "README.md").read_text()
