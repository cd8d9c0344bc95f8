"""The package's shape, read from its source: no circle of imports between ``torchrl_unilab``'s modules."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import torchrl_unilab

PACKAGE_DIR = Path(torchrl_unilab.__file__).parent


def module_name(path: Path) -> str:
    """``torchrl_unilab/a/b.py`` -> ``torchrl_unilab.a.b``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of ``torchrl_unilab`` by its dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def run_time_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every ``import`` statement that runs, at module level or inside a function, outside ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                yield from run_time_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from run_time_imports(node)


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that the module ``name`` at ``path`` imports, as each statement names them.

    ``from package import name`` imports the submodule ``package.name`` if there is one, else the package.
    """
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in run_time_imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = name.split(".")
            anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            targets.add(sub if sub in modules else base)
    return {target for target in targets if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports at run time."""
    modules = package_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_sees_a_loop_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = "import os\nif TYPE_CHECKING:\n    import x.hidden\ndef f():\n    from x import later\n"
    found = {alias.name for node in run_time_imports(ast.parse(source)) for alias in node.names}
    assert found == {"os", "later"}


def test_the_package_has_no_circle_of_imports() -> None:
    graph = import_graph()
    assert len(graph) > 50, f"only {len(graph)} modules found under {PACKAGE_DIR}"
    loops = cycles(graph)
    assert not loops, (
        "modules that import each other, directly or around a circle (function-level imports count; "
        f"move what they share to a module both import): {loops}"
    )
