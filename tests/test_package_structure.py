"""The package's shape, read from its source: no circle of imports between ``torchrl_unilab``'s modules, TorchRL's
private names used through one module only, and each object of ``collectors/`` the owner of its state."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import textwrap
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




# ------------------------------------------------------------------ TorchRL's private names
LIBRARIES = ("torchrl", "tensordict")
PACKAGE = "torchrl_unilab"
PRIVATE_MODULE = "torchrl_unilab._torchrl_private"
#: Private names of other libraries that share a name with one of TorchRL's: the expression, and whose it is.
OTHER_LIBRARIES = {
    "mp.current_process()._config": "multiprocessing's process config",
    "process_obj._name": "multiprocessing's process name",
    "m._buffers": "torch.nn.Module's buffers",
    "module._buffers": "torch.nn.Module's buffers",
    "m._non_persistent_buffers_set": "torch.nn.Module's non-persistent buffer names",
    "os._exit": "os's exit without clean-up, a documented function",
    "value._metadata": "the version metadata torch.nn.Module.state_dict() sets on its OrderedDict",
    "out._metadata": "the version metadata torch.nn.Module.state_dict() sets on its OrderedDict",
    "pool._action_keys": "EnvPool's action keys",
    "self._pools[lane]._reset": "EnvPool's raw reset",
    "self._pools[lane]._send": "EnvPool's raw send",
    "self._pools[lane]._recv": "EnvPool's raw receive",
}


def is_private(name: str) -> bool:
    """A leading underscore, not a dunder."""
    return name.startswith("_") and not name.startswith("__")


def from_library(obj: object) -> bool:
    """Whether ``obj`` (a class) is TorchRL's or tensordict's."""
    return getattr(obj, "__module__", "").split(".")[0] in LIBRARIES


@functools.cache
def library_private_names() -> frozenset[str]:
    """Every private name TorchRL and tensordict define: attributes they assign, functions, classes."""
    import tensordict
    import torchrl

    names: set[str] = set()
    for package in (torchrl, tensordict):
        for path in Path(package.__path__[0]).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
    return frozenset(name for name in names if is_private(name))


def class_definition(cls: type) -> ast.AST:
    """The ``class`` statement of a class, found in the file that defines its methods (TorchRL sets some
    classes' ``__module__`` to the package that re-exports them); an empty module if there is none."""
    files = {inspect.getsourcefile(value) for value in vars(cls).values() if inspect.isfunction(value)}
    for path in sorted(f for f in files if f and Path(f).is_file()):
        for node in ast.walk(ast.parse(Path(path).read_text(), filename=path)):
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
                return node
    return ast.Module(body=[], type_ignores=[])


@functools.cache
def declared_names(cls: type) -> frozenset[str]:
    """The names a class itself defines: its class attributes, and the fields its methods set on ``self``."""
    names = set(vars(cls))
    for node in ast.walk(class_definition(cls)):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return frozenset(names)


@functools.cache
def library_class_names(cls: type) -> frozenset[str]:
    """The names a class's TorchRL/tensordict bases define: their class attributes and the fields they set on self."""
    return frozenset().union(*(declared_names(base) for base in cls.__mro__ if from_library(base)))


def subclass_hooks(cls: type) -> set[str]:
    """The hooks of :data:`~torchrl_unilab._torchrl_private.SUBCLASS_HOOKS` that ``cls`` may define."""
    from torchrl_unilab._torchrl_private import SUBCLASS_HOOKS

    hooks: set[str] = set()
    for path, names in SUBCLASS_HOOKS.items():
        module, name = path.rsplit(".", 1)
        if issubclass(cls, getattr(importlib.import_module(module), name)):
            hooks.update(names)
    return hooks


def on_self(value: ast.expr) -> bool:
    """Whether ``value`` (the object of ``value.x``) is ``self``, ``cls`` or ``super()``."""
    return (isinstance(value, ast.Name) and value.id in ("self", "cls")) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")


def attribute_uses(tree: ast.AST) -> Iterator[tuple[ast.expr, str, int, str]]:
    """Every private attribute read or written: ``(the object, the name, line, as written)``, with ``getattr``,
    ``setattr``, ``hasattr`` and ``delattr`` of a constant name counted as one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            yield node.value, node.attr, node.lineno, ast.unparse(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and is_private(node.args[1].value)):
            yield node.args[0], node.args[1].value, node.lineno, f"{ast.unparse(node.args[0])}.{node.args[1].value}"


def library_imports(tree: ast.AST) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Names bound to TorchRL/tensordict imports (``{name: dotted path}``), and the imports of private names."""
    bound: dict[str, str] = {}
    uses: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = path
                if any(is_private(part) for part in path.split(".")):
                    uses.append((node.lineno, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
                    if any(is_private(part) for part in alias.name.split(".")):
                        uses.append((node.lineno, f"import {alias.name}"))
    return bound, uses


def own_private_names(trees: dict[str, ast.Module], namespaces: dict[str, dict]) -> set[str]:
    """Private names the package defines for itself: module-level functions and classes, and the methods and
    fields of its classes that derive from no TorchRL/tensordict class."""
    names: set[str] = set()
    for module, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            if not isinstance(node, ast.ClassDef):
                continue
            cls = namespaces[module].get(node.name)
            if isinstance(cls, type) and any(from_library(base) for base in cls.__mro__):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and on_self(sub.value):
                    names.add(sub.attr)
    return names


def torchrl_private_uses(trees: dict[str, ast.Module], namespaces: dict[str, dict]) -> dict[str, list[str]]:
    """Every use of a TorchRL/tensordict private name, by module: ``["line: what", ...]``.

    A use is: importing a private name (or from a private module); ``name._x`` on a name bound to a TorchRL
    import; ``self._x`` / ``super()._x``, or a method ``_x``, in a class (or a mixin of it) whose TorchRL bases
    define ``_x``; and ``obj._x`` where ``_x`` is one of TorchRL's private names the package does not define.
    ``getattr(obj, "_x")`` (``setattr``, ``hasattr``, ``delattr``) counts as ``obj._x``.
    """
    own = own_private_names(trees, namespaces)
    classes = {(module, node.name): node for module, tree in trees.items() for node in tree.body
               if isinstance(node, ast.ClassDef)}
    found: dict[str, set[tuple[int, str]]] = {module: set() for module in trees}
    for (module, name), node in classes.items():
        cls = namespaces[module].get(name)
        if not isinstance(cls, type) or not any(from_library(base) for base in cls.__mro__):
            continue
        theirs = {n for n in library_class_names(cls) if is_private(n)} - subclass_hooks(cls)
        for ours in cls.__mro__:
            body = classes.get((ours.__module__, ours.__name__))
            if body is None:
                continue
            for value, attr, line, text in attribute_uses(body):
                if attr in theirs and on_self(value):
                    found[ours.__module__].add((line, f"{text} ({name}'s TorchRL base)"))
            for sub in ast.walk(body):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name in theirs:
                    found[ours.__module__].add((sub.lineno, f"def {sub.name} (overrides {name}'s TorchRL base)"))
    for module, tree in trees.items():
        bound, imports = library_imports(tree)
        found[module].update(imports)
        for value, attr, line, text in attribute_uses(tree):
            if on_self(value):
                continue
            if isinstance(value, ast.Name) and value.id in bound:
                found[module].add((line, text))
            elif attr in library_private_names() and attr not in own and text not in OTHER_LIBRARIES:
                found[module].add((line, text))
    return {module: [f"{line}: {what}" for line, what in sorted(uses)] for module, uses in found.items() if uses}


def package_sources() -> tuple[dict[str, ast.Module], dict[str, dict]]:
    """The parsed source and the namespace of every package module."""
    trees, namespaces = {}, {}
    for name, path in package_modules().items():
        trees[name] = ast.parse(path.read_text(), filename=str(path))
        namespaces[name] = vars(importlib.import_module(name))
    return trees, namespaces


def test_the_private_name_finder_sees_each_kind_of_use() -> None:
    source = textwrap.dedent('''
        from torchrl.collectors import MultiAsyncCollector, _constants
        from torchrl.collectors.utils import _traj_ingest

        class Collector(MultiAsyncCollector):
            def __init__(self):
                self._weight_updater = None
                self._mine = 1

            def _get_devices(self):
                return super()._read_compile_kwargs

        def limit(rb):
            return _constants._TIMEOUT, MultiAsyncCollector._get_devices, rb._writer, rb._mine

        def lock(rb):
            return getattr(rb, "_write_lock", None), getattr(rb, "_mine", None)
        ''')
    namespace: dict = {"__name__": "example"}
    exec(compile(source, "example", "exec"), namespace)
    found = torchrl_private_uses({"example": ast.parse(source)}, {"example": namespace})["example"]
    assert [use.split(": ", 1)[1].split(" (")[0] for use in found] == [
        "from torchrl.collectors import _constants", "from torchrl.collectors.utils import _traj_ingest",
        "self._weight_updater", "def _get_devices", "super()._read_compile_kwargs",
        "MultiAsyncCollector._get_devices", "_constants._TIMEOUT", "rb._writer", "rb._write_lock"], found


def test_no_module_but_one_uses_a_torchrl_private_name() -> None:
    trees, namespaces = package_sources()
    uses = torchrl_private_uses(trees, namespaces)
    assert len(trees) > 50, f"only {len(trees)} modules found under {PACKAGE_DIR}"
    assert set(uses) <= {PRIVATE_MODULE}, (
        f"TorchRL's private names go through {PRIVATE_MODULE} only (add a function there, with why it is used "
        f"and what breaks if it changes): {({m: u for m, u in uses.items() if m != PRIVATE_MODULE})}")


def resolve_dotted(path: str) -> bool:
    """Whether ``path`` (``module.Class.name`` or ``module.name``) names something in the installed library: an
    attribute, or a field a class of it sets on ``self``."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, part in enumerate(parts[cut:]):
            if hasattr(obj, part):
                obj = getattr(obj, part)
            elif isinstance(obj, type) and i == len(parts) - cut - 1:
                return part in library_class_names(obj)
            else:
                return False
        return True
    return False


def test_each_torchrl_private_name_the_package_uses_exists_in_torchrl() -> None:
    from torchrl.collectors import MultiAsyncCollector

    from torchrl_unilab._torchrl_private import PARENT_FIELDS, SUBCLASS_HOOKS, TORCHRL_PRIVATE

    hooks = [f"{base}.{hook}" for base, names in SUBCLASS_HOOKS.items() for hook in names]
    missing = sorted(path for path in [*TORCHRL_PRIVATE, *hooks] if not resolve_dotted(path))
    assert not missing, f"TorchRL no longer has these private names torchrl_unilab uses: {missing}"
    fields = library_class_names(MultiAsyncCollector)
    gone = sorted(set(PARENT_FIELDS) - fields)
    assert not gone, f"MultiAsyncCollector no longer has these fields OffPolicyCollector sets in its place: {gone}"
    assert not resolve_dotted("torchrl.collectors.MultiAsyncCollector._no_such_field")


def test_each_private_name_the_module_uses_is_listed() -> None:
    from torchrl_unilab._torchrl_private import PARENT_FIELDS, TORCHRL_PRIVATE

    listed = {part for path in [*TORCHRL_PRIVATE, *PARENT_FIELDS] for part in path.split(".")}
    trees, namespaces = package_sources()
    unlisted = [use for use in torchrl_private_uses(trees, namespaces)[PRIVATE_MODULE]
                if not set(re.findall(r"\b_[A-Za-z]\w*", use.split(": ", 1)[1].split(" (")[0])) <= listed]
    assert not unlisted, (f"{PRIVATE_MODULE} uses these TorchRL private names without their line in TORCHRL_PRIVATE "
                          f"(why it is used, what breaks if it changes): {unlisted}")


# ------------------------------------------------------------------ owned state in collectors/
def defined_names(node: ast.ClassDef) -> set[str]:
    """The names a class statement defines for its instances: its methods and class attributes, and the
    attributes its methods assign on ``self``."""
    names: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(target.id for target in statement.targets if isinstance(target, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
            sub, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    names.add(leaf.attr)
    return names


def private_accesses(tree: ast.Module) -> Iterator[tuple[ast.ClassDef | None, ast.expr, str, int]]:
    """Every access to a private attribute: ``(enclosing class statement, the object, the name, line)``, with
    ``getattr``/``setattr``/``hasattr`` of a constant name counted as one."""
    def visit(node: ast.AST, cls: ast.ClassDef | None) -> Iterator:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, ast.Attribute) and is_private(child.attr):
                yield cls, child.value, child.attr, child.lineno
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                  and child.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(child.args) >= 2
                  and isinstance(child.args[1], ast.Constant) and isinstance(child.args[1].value, str)
                  and is_private(child.args[1].value)):
                yield cls, child.args[0], child.args[1].value, child.lineno
            yield from visit(child, inner)

    yield from visit(tree, None)


def foreign_private_accesses(module: str, tree: ast.Module, namespace: dict,
                             classes: dict[tuple[str, str], ast.ClassDef]) -> list[str]:
    """The private attributes ``module`` reads or writes on an object of another module's class.

    ``self._x`` (``cls._x``, ``super()._x``) is the class's own where the class, or a base class defined in the same
    module, defines ``_x``; an inherited name (from a mixin, a base in another module, TorchRL's) is another's.
    Names a base class from another library defines are that library's (TorchRL's are held to
    :data:`PRIVATE_MODULE` by the test above). On any other object ``_x`` counts as the module's own where a class
    of the module defines it.
    """
    mine = set().union(*(defined_names(node) for (where, _), node in classes.items() if where == module))
    found = []
    for cls, value, name, line in private_accesses(tree):
        own_object = (isinstance(value, ast.Name) and value.id in ("self", "cls")) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")
        if own_object and cls is not None:
            runtime = namespace.get(cls.name)
            mro = getattr(runtime, "__mro__", ())
            bases = [base for base in mro if base.__module__ == module and (module, base.__name__) in classes]
            if isinstance(value, ast.Call) and bases:
                bases = bases[1:]  # super() starts after the class itself
            if any(name in defined_names(classes[(module, base.__name__)]) for base in bases):
                continue
            if any(name in declared_names(base) for base in mro if not base.__module__.startswith(PACKAGE)):
                continue  # a library base's (TorchRL's go through PRIVATE_MODULE, checked above)
        elif not own_object and (name in mine or ast.unparse(value) + "." + name in OTHER_LIBRARIES):
            continue
        found.append(f"{line}: {ast.unparse(value)}.{name}")
    return found


def test_the_owner_check_sees_a_mixin_and_another_modules_object() -> None:
    source = textwrap.dedent('''
        class Mixin:
            def pace(self):
                return self._control.allowed

        class Owner(Mixin):
            def __init__(self, other):
                self._control = other
                self._mine = other._theirs

            def read(self):
                return self._mine, getattr(self, "_missing", None), super()._mine
        ''')
    namespace: dict = {"__name__": "example"}
    exec(compile(source, "example", "exec"), namespace)
    tree = ast.parse(source)
    classes = {("example", node.name): node for node in tree.body if isinstance(node, ast.ClassDef)}
    found = foreign_private_accesses("example", tree, namespace, classes)
    assert found == ["4: self._control", "9: other._theirs", "12: self._missing", "12: super()._mine"], found


def test_no_collector_module_touches_another_modules_private_attributes() -> None:
    trees, namespaces = package_sources()
    classes = {(module, node.name): node for module, tree in trees.items() for node in tree.body
               if isinstance(node, ast.ClassDef)}
    found = {module: uses for module, tree in trees.items() if module.startswith("torchrl_unilab.collectors")
             and (uses := foreign_private_accesses(module, tree, namespaces[module], classes))}
    assert not found, ("each object of collectors/ owns its state: reach another module's object (a mixin's "
                       f"self included) through its public methods: {found}")
