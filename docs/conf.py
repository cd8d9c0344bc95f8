"""Sphinx configuration for the torchrl_unilab documentation.

Build the HTML pages (warnings are errors) and run the examples::

    sphinx-build -W --keep-going -b html docs docs/_build/html
    sphinx-build -W --keep-going -b doctest docs docs/_build/doctest
"""

from __future__ import annotations

import doctest
import os
import sys
from pathlib import Path

# The package is installed editable; this keeps a plain checkout working too.
sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("MUJOCO_GL", "disable")
# torch 2.14 creates its inductor cache dir (``<tempdir>/torchinductor_<user>``) as soon as torch._dynamo is
# imported, here and in every process the examples start. The examples run with TMPDIR set to a directory that
# tests/test_docs.py checks for leftovers, and that cache is torch's, not an example's: keep it with the user's caches.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torchinductor"))

import torchrl_unilab  # noqa: E402

project = "torchrl_unilab"
author = "torchrl_unilab contributors"
copyright = "torchrl_unilab contributors"  # noqa: A001
release = version = torchrl_unilab.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]

# results/generated/: tables that benchmarks/report.py writes from benchmarks/results/, included by the results pages.
exclude_patterns = ["_build", "results/generated"]
# Figures quoted in prose (``|main_job_minutes|``), from the same results files.
rst_prolog = (Path(__file__).parent / "results" / "generated" / "figures.rst").read_text()
templates_path: list[str] = []

# -- HTML ---------------------------------------------------------------------
html_theme = "furo"
html_title = f"torchrl_unilab {release}"
html_static_path = ["_static"]

# -- autodoc / napoleon -------------------------------------------------------
autodoc_member_order = "bysource"
# Types go in the signature, one parameter per line when it is long. The
# argument lists stay napoleon's bullet lists, which also render entries that
# document several parameters at once ("td3_noise, td3_std: ...").
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_default_options = {"show-inheritance": True}
maximum_signature_line_length = 90
python_use_unqualified_type_names = True
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_param = False
napoleon_use_keyword = False
napoleon_use_rtype = False
napoleon_use_ivar = True

# References to TorchRL, tensordict, torch and gymnasium objects stay plain
# code (no intersphinx: the docs build offline); only our own names must resolve.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!torchrl_unilab).*"),
    # Private modules (``torchrl_unilab.collectors._worker``) are not documented; a docstring or a
    # documented class's bases (OffPolicyCollector's ``_in_process_api`` mixin) may still name their objects.
    (r"py:.*", r"torchrl_unilab\.(\w+\.)*_\w+\..*"),
]

# -- doctest ------------------------------------------------------------------
# Docstring examples (``>>>`` in the package) are run by tests/test_docs.py with
# the stdlib doctest module, in their module's namespace. Here only the
# ``.. doctest::`` / ``.. testcode::`` blocks of the pages run.
doctest_test_doctest_blocks = ""
# Exception messages are compared too (Sphinx ignores their detail by default).
doctest_default_flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
doctest_global_setup = """
# A page's examples are written as the user's script: ``__name__`` is
# ``"__main__"`` so that ``if __name__ == "__main__":`` blocks run, as they
# do for ``python my_script.py``. Worker processes use the spawn start method;
# everything they need from here (policy, env factory) is sent by value.
__name__ = "__main__"
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
"""


# -- short names ----------------------------------------------------------------
# Docstrings refer to re-exported names (``torchrl_unilab.OffPolicyCollector``);
# the API pages document each object once, in the module that defines it, and
# this resolves the short name to that entry.
def _resolve_reexport(app, env, node, contnode):
    target = node.get("reftarget", "")
    parts = target.split(".")
    if node.get("refdomain") != "py" or parts[0] != "torchrl_unilab" or len(parts) < 2:
        return None
    obj = getattr(torchrl_unilab, parts[1], None)
    if obj is None or parts[1] not in torchrl_unilab.__all__:
        return None
    domain = env.get_domain("py")
    for module in sorted(n for n in sys.modules if n.startswith("torchrl_unilab.")):
        if getattr(sys.modules[module], parts[1], None) is not obj:
            continue
        name = ".".join([module, *parts[1:]])  # also ``Class.member``
        entry = domain.objects.get(name)
        if entry is not None:
            from sphinx.util.nodes import make_refnode

            return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)
    return None


# ``Bases:`` lines name public classes only: a private base of ours
# (``_BoundedActionModule``) is replaced by its own bases.
def _public_bases(app, name, obj, options, bases):
    def expand(base):
        if base.__module__.startswith("torchrl_unilab") and base.__name__.startswith("_"):
            return [b for parent in base.__bases__ for b in expand(parent)]
        return [base]

    bases[:] = [b for base in list(bases) for b in expand(base)]


# TorchRL's collectors have a metaclass whose ``__call__`` takes
# ``(*args, sync=None, **kwargs)``; document the class's own ``__init__``.
def _init_signature(app, what, name, obj, options, signature, return_annotation):
    if what != "class" or type(obj) is type or not name.startswith("torchrl_unilab."):
        return None
    from sphinx.ext.autodoc.preserve_defaults import update_defvalue
    from sphinx.util import inspect as sphinx_inspect

    update_defvalue(app, obj.__init__, True)  # keep ``1_000_000`` as written (autodoc_preserve_defaults)
    sig = sphinx_inspect.signature(obj.__init__, bound_method=True, type_aliases=app.config.autodoc_type_aliases)
    return sphinx_inspect.stringify_signature(sig, show_return_annotation=False), None


# ``.. reexports::`` lists the package's top-level names (``torchrl_unilab.__all__``)
# with a link to where each is documented, so the table never goes stale.
def _documented_module(name: str, obj) -> str:
    import importlib
    import pkgutil

    # Modules before packages: a package's __all__ re-exports names its modules document.
    public = [name for _, name in sorted(
        (info.ispkg, info.name) for info in pkgutil.walk_packages(torchrl_unilab.__path__, "torchrl_unilab.")
        if not info.name.rsplit(".", 1)[1].startswith("_")
    )]
    home = getattr(obj, "__module__", None)
    candidates = ([home] if home in public else []) + public
    for module_name in candidates:
        module = importlib.import_module(module_name)
        if name in getattr(module, "__all__", ()) and getattr(module, name, None) is obj:
            return module_name
    raise ValueError(f"torchrl_unilab.{name} is in no public module's __all__; document it in docs/api")


def _reexports_directive():
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class Reexports(SphinxDirective):
        def run(self):
            lines = [".. list-table::", "   :header-rows: 1", "   :widths: 40 60", "", "   * - name",
                     "     - documented in"]
            for name in sorted(torchrl_unilab.__all__, key=str.lower):
                obj = getattr(torchrl_unilab, name)
                module = _documented_module(name, obj)
                role = "class" if isinstance(obj, type) else "func" if callable(obj) else "data"
                lines += [f"   * - :py:{role}:`~{module}.{name}`", f"     - :doc:`{module.split('.')[1]}`"]
            container = nodes.container()
            self.state.nested_parse(StringList(lines, source="reexports"), self.content_offset, container)
            return container.children

    return Reexports


def setup(app):
    app.add_directive("reexports", _reexports_directive())
    app.connect("autodoc-process-signature", _init_signature)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("autodoc-process-bases", _public_bases)
