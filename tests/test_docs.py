"""The documentation: docstring examples run, every public name is in the API reference, the docs build.

* ``test_docstring_examples``: the ``Examples:`` (``>>>``) of every module of
  ``torchrl_unilab`` run with the stdlib :mod:`doctest`, in the module's namespace,
  and leave nothing in the temp dir.
* ``test_api_reference_lists_every_public_name``: each name of the package's
  ``__all__`` and of each public submodule's ``__all__`` is documented by the
  rst sources of ``docs/api*`` (an ``automodule`` with ``:members:`` of a module
  that lists it, or an explicit ``auto*`` directive).
* ``test_docs_build``: ``sphinx-build -W --keep-going`` (warnings are errors)
  builds the HTML pages, whose inventory must hold every public name, and the
  ``doctest`` builder runs the examples of the pages, which leave nothing in the temp dir.
"""

from __future__ import annotations

import doctest
import gc
import importlib
import importlib.util
import io
import multiprocessing.util
import os
import pkgutil
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import needs_extra

import torchrl_unilab

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

ALL_MODULES = sorted(
    info.name for info in pkgutil.walk_packages(torchrl_unilab.__path__, prefix="torchrl_unilab.")
)
PUBLIC_MODULES = [name for name in ALL_MODULES if not name.rsplit(".", 1)[1].startswith("_")]


def public_names() -> dict[str, object]:
    """``{"module.Name": object}`` for the package's ``__all__`` and each public submodule's ``__all__``."""
    out = {f"torchrl_unilab.{name}": getattr(torchrl_unilab, name) for name in torchrl_unilab.__all__}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            out[f"{module_name}.{name}"] = getattr(module, name)
    return out


# ----------------------------------------------------------------- docstrings
@pytest.fixture
def examples_tempdir(monkeypatch) -> Iterator[Path]:
    """A temp dir of the test's own, for ``tempfile`` here and in the processes the examples start.

    Users copy the examples, so an example must remove what it creates: the
    test fails on what is left in this dir afterwards. Its path is short: the
    workers' sockets live under it, and AF_UNIX paths stop at 107 bytes.
    """
    tmp = Path(tempfile.mkdtemp(prefix="tul_examples_"))
    # multiprocessing keeps one temp dir for the whole interpreter and removes it at exit: made now, it is
    # not this test's to remove.
    multiprocessing.util.get_temp_dir()
    # Ray does not follow TMPDIR here: $RAY_TMPDIR (conftest.ray_temp_dir) keeps its logs and sockets.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


#: Modules whose examples run an extra's package: ``{module: (import name, extra)}``.
EXAMPLE_EXTRAS = {"torchrl_unilab.collectors.ray_collector": ("ray", "ray")}


@pytest.mark.parametrize("module_name", ALL_MODULES)
def test_docstring_examples(module_name, examples_tempdir):
    if module_name in EXAMPLE_EXTRAS:
        needs_extra(*EXAMPLE_EXTRAS[module_name])
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    for test in finder.find(module, module_name, globs=vars(module).copy()):
        runner.run(test, out=report.write)  # clears the example's globals afterwards
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} failing docstring example(s) in {module_name}:\n{report.getvalue()}"
    gc.collect()  # a replay buffer removes its own scratch dir when it is collected
    left = sorted(os.listdir(examples_tempdir))
    assert not left, f"the examples of {module_name} left these in the temp dir: {left}"


# ------------------------------------------------------------ API reference
_DIRECTIVE = re.compile(r"^\.\. (auto\w+):: +(\S+)[ \t]*$")
_OPTION = re.compile(r"^ +:([\w-]+):[ \t]*(.*)$")


def documented_in_rst() -> tuple[dict[str, set[str] | None], set[str]]:
    """What the API rst sources document.

    Returns ``(modules, objects)``: ``modules`` maps each ``automodule`` given
    ``:members:`` to the names it documents (``None``: its whole ``__all__``,
    less ``:exclude-members:``); ``objects`` holds the targets of the other
    ``auto*`` directives.
    """
    modules: dict[str, set[str] | None] = {}
    objects: set[str] = set()
    sources = sorted(DOCS.glob("api*.rst")) + sorted(DOCS.glob("api/**/*.rst"))
    assert sources, f"no API reference sources (docs/api*.rst or docs/api/*.rst) under {DOCS}"
    for path in sources:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if not match:
                continue
            kind, target = match.groups()
            options = {}
            for option_line in lines[i + 1 :]:
                option = _OPTION.match(option_line)
                if not option:
                    break
                options[option.group(1)] = option.group(2).strip()
            if kind != "automodule":
                objects.add(target)
            elif "members" in options:
                listed = {m.strip() for m in options["members"].split(",") if m.strip()}
                excluded = {m.strip() for m in options.get("exclude-members", "").split(",") if m.strip()}
                module = importlib.import_module(target)
                names = listed or set(getattr(module, "__all__", ()))
                modules[target] = names - excluded
    return modules, objects


def documented_at(qualified: str, obj: object, modules: dict[str, set[str]], objects: set[str]) -> str | None:
    """The documented name under which ``obj`` (public as ``qualified``) appears, or ``None``."""
    module_name, name = qualified.rsplit(".", 1)
    if qualified in objects or name in modules.get(module_name, ()):
        return qualified
    # A re-export (``torchrl_unilab.OffPolicyCollector``) is documented where
    # the same object is documented.
    for other, names in modules.items():
        if name in names and getattr(importlib.import_module(other), name, None) is obj:
            return f"{other}.{name}"
    for target in objects:
        other, _, other_name = target.rpartition(".")
        if other_name == name and getattr(importlib.import_module(other), name, None) is obj:
            return target
    return None


def test_api_reference_lists_every_public_name():
    modules, objects = documented_in_rst()
    missing = sorted(q for q, obj in public_names().items() if documented_at(q, obj, modules, objects) is None)
    assert not missing, (
        f"public names missing from the API reference (docs/api/*.rst): {missing}; add an "
        "'.. automodule:: <module>' with ':members:' for their module, or an explicit '.. autoclass::' etc."
    )


def test_public_modules_have_an_api_page():
    modules, _ = documented_in_rst()
    undocumented = sorted(set(PUBLIC_MODULES) - set(modules))
    assert not undocumented, f"public modules without '.. automodule:: ... :members:' in docs/api: {undocumented}"


# ------------------------------------------------------------------- build
def sphinx(builder: str, out: Path, doctrees: Path, tempdir: Path | None = None) -> tuple[int, str, float]:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "disable"), PYTHONUNBUFFERED="1")
    if tempdir is not None:
        env["TMPDIR"] = str(tempdir)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-d", str(doctrees),
         str(DOCS), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


@pytest.mark.timeout(600)
def test_docs_build(tmp_path, examples_tempdir):
    needs_extra("sphinx", "docs")
    needs_extra("furo", "docs")
    # The two builders run side by side (each its own doctrees): the html one is one busy process, the
    # doctest one mostly waits for the examples' worker processes to start. 92 s one after the other, here.
    with ThreadPoolExecutor(2) as pool:
        html = pool.submit(sphinx, "html", tmp_path / "html", tmp_path / "doctrees-html")
        examples = pool.submit(sphinx, "doctest", tmp_path / "doctest", tmp_path / "doctrees-doctest",
                               tempdir=examples_tempdir)
        (rc, log, _), (doctest_rc, doctest_log, _) = html.result(), examples.result()
    assert rc == 0, f"sphinx-build -W -b html failed:\n{log[-20000:]}"
    assert doctest_rc == 0, f"sphinx-build -b doctest failed (an example in docs/*.rst):\n{doctest_log[-20000:]}"
    left = sorted(os.listdir(examples_tempdir))
    assert not left, f"the examples of the pages left these in the temp dir: {left}"

    from sphinx.util.inventory import InventoryFile

    with open(tmp_path / "html" / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath.join)
    inventory = inventory.data if hasattr(inventory, "data") else inventory
    built = {name for kind, entries in inventory.items() if kind.startswith("py:") for name in entries}
    modules, objects = documented_in_rst()
    missing = sorted(
        q for q, obj in public_names().items() if documented_at(q, obj, modules, objects) not in built
    )
    assert not missing, f"public names absent from the built API reference (objects.inv): {missing}"
