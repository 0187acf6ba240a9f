"""The layer rules of the package, checked on its source with ``ast``.

mainspring is a stack: each package may use the ones below it and only through
what they export. The rules live here as data so that a reviewer reads them in one
place; ``tests/test_layers.py`` runs them on the package and on planted violations.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Rank of each part of the package: an import must point to a strictly lower rank,
# or stay inside its own part. Top-level ``mainspring._x`` modules are the kernel.
RANKS: dict[str, int] = {
    "kernel": 0,
    "serde": 1,  # mainspring/serde.py: the kernel's JSON forms, public
    "storage": 1,
    "models": 1,
    "journal": 2,
    "context": 2,
    "limits": 2,
    "tools": 3,
    "hitl": 3,
    "agent": 4,
    "observability": 4,
    "worker": 4,
    "app": 5,  # mainspring/_app.py and mainspring/__init__.py
    "testing": 6,
    "dashboard": 6,
    "server": 7,
    "lab": 7,
    "integrations": 7,  # mainspring/integrations/: other frameworks' agents, one extra each
    "cli": 8,
    "examples": 8,
    "main": 9,  # mainspring/__main__.py
}

# The outside edge: these reach the rest only through what ``mainspring`` and its
# public subpackages export, kernel modules included.
EDGES = frozenset({"server", "cli", "dashboard", "lab", "examples", "main", "integrations"})

# Imports allowed inside functions: optional extras and the CLI's lazily loaded
# subcommands, each (importing module prefix, imported module prefix) with why.
LAZY: dict[tuple[str, str], str] = {
    ("mainspring.models", "mainspring.models.openai"): "the openai SDK (extra [openai])",
    ("mainspring.models", "mainspring.models.anthropic"): "the anthropic SDK (extra [anthropic])",
    ("mainspring.storage", "mainspring.storage.postgres"): "psycopg (extra [postgres])",
    ("mainspring.cli._db", "mainspring.storage.postgres"): "psycopg (extra [postgres])",
    ("mainspring.cli._serve", "mainspring.server"): "FastAPI and uvicorn (extra [server])",
    ("mainspring.tools._mcp", "mainspring.tools._mcp_client"): "the mcp SDK (extra [mcp])",
}

MAX_LINES = 800

# Private attributes of another part that one part may read, each (reading part, name)
# with why: a subclass forwarding the hooks its base class declares abstract.
HOOKS: dict[tuple[str, str], str] = {
    (
        "testing",
        hook,
    ): "FaultyStore is a Store wrapping another: it forwards the dialect hook to it"
    for hook in ("_write", "_read", "_autocommit", "_notify")
} | {
    ("testing", name): "SimLoop is an asyncio loop that picks the next callback itself: it "
    "reads asyncio's own queues and handles, as asyncio's base loop does (the names are "
    "asyncio's, only spelled like private names of other parts)"
    for name in ("_ready", "_scheduled", "_cancelled", "_when", "_context", "_run")
}

# Each package's ``__init__`` names two lists: ``__all__``, what users (and the edges)
# may use, pinned in tests/data/public_exports.json; ``__internal__``, what the floors
# above may use besides, never the edges. A name in neither is not exported at all.
INTERNAL = "__internal__"

# Private attributes of the standard library (namedtuple's, os's) that anyone may use.
STDLIB_PRIVATE = frozenset({"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule at one place."""

    rule: str
    where: str  # path:line
    what: str

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.what}"


def part_of(module: str) -> str:
    """The part (key of :data:`RANKS`) that the dotted ``module`` belongs to."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "_app":
        return "app"
    if parts[1] == "__main__":
        return "main"
    if parts[1].startswith("_"):
        return "kernel"
    return parts[1]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True, slots=True)
class _Import:
    module: str  # the importing module
    target: str  # the imported module (dotted, absolute)
    names: tuple[str, ...]  # names taken from it (empty for ``import x``)
    line: int
    in_function: bool
    type_only: bool


def _imports(root: Path, path: Path, tree: ast.Module) -> Iterator[_Import]:
    module = _module_name(root, path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = tuple(a.name for a in node.names)
            targets = [target]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
            names = ()
        else:
            continue
        in_function = type_only = False
        up: ast.AST = node
        while up in parents:
            up = parents[up]
            if isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
                in_function = True
            if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
                type_only = True
        for target in targets:
            if target == root.name or target.startswith(root.name + "."):
                yield _Import(module, target, names, node.lineno, in_function, type_only)


@dataclass(frozen=True, slots=True)
class _Class:
    """What the private-attribute rule needs of one class: the private names it
    defines (methods, class attributes, ``self._x = ...``) and its bases' names."""

    privates: frozenset[str]
    bases: tuple[str, ...]


@dataclass(slots=True)
class _Part:
    """The private names one part defines, and its classes by name."""

    privates: set[str]
    classes: dict[str, _Class]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return node.attr
    if isinstance(node, ast.arg | ast.keyword) and node.arg:
        return node.arg
    return None


def _class_of(node: ast.ClassDef) -> _Class:
    names: set[str] = set()
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        for target in _targets(stmt):
            if isinstance(target, ast.Name):
                names.add(target.id)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and _is_self_attr(sub):
            names.add(sub.attr)
    bases = tuple(ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in node.bases)
    return _Class(frozenset(n for n in names if _is_private(n)), bases)


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    return []


def _parts(trees: dict[Path, tuple[str, ast.Module]]) -> dict[str, _Part]:
    """What each part defines: private names (functions, classes, assignments,
    attributes it sets, parameters) and classes."""
    parts: dict[str, _Part] = {}
    for module, tree in trees.values():
        part = parts.setdefault(part_of(module), _Part(set(), {}))
        for node in ast.walk(tree):
            name = _defined_name(node)
            if name and _is_private(name):
                part.privates.add(name)
            if isinstance(node, ast.ClassDef):
                part.classes[node.name] = _class_of(node)
    return parts


def _exports(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """The literal ``__all__`` and ``__internal__`` lists a module assigns."""
    found: dict[str, tuple[str, ...]] = {}
    for stmt in tree.body:
        for target in _targets(stmt):
            value = getattr(stmt, "value", None)
            named = isinstance(target, ast.Name) and target.id in ("__all__", INTERNAL)
            if named and isinstance(value, ast.List | ast.Tuple):
                assert isinstance(target, ast.Name)
                found[target.id] = tuple(e.value for e in value.elts if isinstance(e, ast.Constant))
    return found


def _bound(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (imports, definitions, assignments)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.If):  # TYPE_CHECKING imports, served by __getattr__
            names.update(_bound(ast.Module(body=stmt.body, type_ignores=[])))
        for target in _targets(stmt):
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def check(root: Path) -> list[Violation]:
    """Every violation of the layer rules in the package at ``root``."""
    trees: dict[Path, tuple[str, ast.Module]] = {}
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        trees[path] = (_module_name(root, path), ast.parse(text, str(path)))
        lines = text.count("\n")
        if lines > MAX_LINES:
            found.append(Violation("size", f"{path}:1", f"{lines} lines (at most {MAX_LINES})"))
    parts = _parts(trees)
    exports = {module: _exports(tree) for module, tree in trees.values()}
    for path, (module, tree) in trees.items():
        found.extend(_check_lists(module, tree, exports[module], f"{path}:1"))
    for path, (module, tree) in trees.items():
        src = part_of(module)
        imported: dict[str, str] = {}  # local name -> the module it came from
        for imp in _imports(root, path, tree):
            found.extend(_check_import(src, imp, f"{path}:{imp.line}", exports))
            imported.update({name: imp.target for name in imp.names})
        found.extend(_check_attributes(src, tree, parts, imported, str(path)))
        found.extend(_check_module_aliases(src, tree, exports, str(path)))
    return found


def _check_lists(
    module: str, tree: ast.Module, lists: dict[str, tuple[str, ...]], where: str
) -> Iterator[Violation]:
    public, internal = set(lists.get("__all__", ())), set(lists.get(INTERNAL, ()))
    if internal and not module.split(".")[-1].startswith("_") and part_of(module) != "kernel":
        bound = _bound(tree)
        for name in sorted(internal & public):
            yield Violation("exports", where, f"{module} lists {name} as public and internal")
        for name in sorted((internal | public) - bound):
            yield Violation("exports", where, f"{module} exports {name} but never binds it")
    elif internal:
        yield Violation("exports", where, f"{module} is private: it has no {INTERNAL} list")


def _check_import(
    src: str, imp: _Import, where: str, exports: dict[str, dict[str, tuple[str, ...]]]
) -> Iterator[Violation]:
    dst = part_of(imp.target)
    if imp.in_function and not any(
        imp.module.startswith(a) and imp.target.startswith(b) for a, b in LAZY
    ):
        yield Violation("lazy", where, f"{imp.module} imports {imp.target} inside a function")
    if dst == src:
        return
    if RANKS[dst] >= RANKS[src]:
        how = "for types only " if imp.type_only else ""
        yield Violation("layer", where, f"{src} imports {how}{dst} ({imp.target}): upwards")
    segments = imp.target.split(".")[1:]
    hidden = [s for s in segments if s.startswith("_") and s != "__init__"]
    if hidden and not (dst == "kernel" and src not in EDGES):
        yield Violation("private", where, f"{imp.module} imports private module {imp.target}")
    lists = exports.get(imp.target, {})
    for name in imp.names:
        if _is_private(name):
            yield Violation("private", where, f"{imp.module} imports {name} from {imp.target}")
        elif "__all__" in lists and f"{imp.target}.{name}" not in exports:
            yield from _check_name(src, imp.module, imp.target, name, lists, where)


def _check_name(
    src: str, module: str, target: str, name: str, lists: dict[str, tuple[str, ...]], where: str
) -> Iterator[Violation]:
    """A name taken from another part: public, or internal and taken by a floor."""
    if name in lists["__all__"]:
        return
    if name in lists.get(INTERNAL, ()):
        if src in EDGES:
            yield Violation(
                "internal", where, f"{module} (an edge) uses {target}.{name}, internal to floors"
            )
        return
    yield Violation("exports", where, f"{module} uses {target}.{name}, which it does not export")


def _check_module_aliases(
    src: str, tree: ast.Module, exports: dict[str, dict[str, tuple[str, ...]]], path: str
) -> Iterator[Violation]:
    """``import mainspring as ms`` then ``ms.journal.Engine``: the same rule as a
    ``from`` import, on each attribute taken from a package of another part."""
    aliases = {
        a.asname or a.name: a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name.split(".")[0] in ("mainspring",) and (a.asname or "." not in a.name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        dotted = ast.unparse(node.value)
        if dotted.split(".")[0] not in aliases:
            continue
        target = ".".join([aliases[dotted.split(".")[0]], *dotted.split(".")[1:]])
        lists = exports.get(target, {})
        if "__all__" not in lists or part_of(target) == src or node.attr.startswith("_"):
            continue
        if f"{target}.{node.attr}" not in exports:
            yield from _check_name(src, src, target, node.attr, lists, f"{path}:{node.lineno}")


def _check_attributes(
    src: str,
    tree: ast.Module,
    parts: dict[str, _Part],
    imported: dict[str, str],
    path: str,
) -> Iterator[Violation]:
    """Reads of a private attribute that another part defines.

    A name only another part defines is that part's. A name the reader's part defines
    too is its own only where the object read is shown to be the reader's: ``self``
    in a class whose own chain defines it (or that extends nothing of another part),
    or a receiver whose annotation or constructor names a class of the reader's part
    that defines it. Anything else (another part's class, or a receiver nobody can
    tell) is a violation: the same spelling is no licence to read someone else's.
    """
    own = parts.get(src, _Part(set(), {}))
    others = set().union(*(p.privates for name, p in parts.items() if name != src))
    scopes = _scopes(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        name = node.attr
        if not _is_private(name) or name in STDLIB_PRIVATE or name not in others:
            continue
        if name in own.privates and _owned(node, scopes, own, imported):
            continue
        if (src, name) in HOOKS:
            continue
        yield Violation(
            "private",
            f"{path}:{node.lineno}",
            f"{src} reads {ast.unparse(node)}, private to another part",
        )


def _scopes(tree: ast.Module) -> dict[ast.AST, list[ast.AST]]:
    """For each node, the enclosing functions and classes, innermost last."""
    chain: dict[ast.AST, list[ast.AST]] = {tree: []}
    for node in ast.walk(tree):
        inner = chain[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = [*inner, node]
        for child in ast.iter_child_nodes(node):
            chain[child] = inner
    return chain


def _owned(
    node: ast.Attribute,
    scopes: dict[ast.AST, list[ast.AST]],
    own: _Part,
    imported: dict[str, str],
) -> bool:
    """Whether the object ``node`` reads a private attribute of is shown to be one of
    the reading part's own classes, defining that attribute."""
    enclosing = scopes[node]
    cls = next((s for s in reversed(enclosing) if isinstance(s, ast.ClassDef)), None)
    func = next((s for s in reversed(enclosing) if not isinstance(s, ast.ClassDef)), None)
    receiver = node.value
    if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and cls is not None:
        return _defines(own, cls.name, node.attr, imported) is not False
    if isinstance(receiver, ast.Name) and isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
        kinds = _local_kinds(func, receiver.id, cls)
    elif _is_self_attr(receiver) and cls is not None:
        assert isinstance(receiver, ast.Attribute)
        kinds = _attribute_kinds(cls, receiver.attr)
    else:
        return False
    return any(_defines(own, kind, node.attr, imported) is True for kind in kinds)


def _defines(own: _Part, cls: str, name: str, imported: dict[str, str]) -> bool | None:
    """True: the part's class ``cls`` (or an ancestor of its part) defines ``name``;
    False: it does not, and extends a class of another part (which may); None: it does
    not, and extends nothing of another part (a mixin's sibling defines it)."""
    seen: set[str] = set()
    todo, foreign = [cls], False
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        info = own.classes.get(current)
        if info is None:
            foreign = foreign or current in imported or current == cls
            continue
        if name in info.privates:
            return True
        todo.extend(info.bases)
    return False if foreign else None


def _is_self_attr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("self", "cls")
    )


def _kinds(annotation: ast.expr | None) -> set[str]:
    """The class names an annotation or a constructor call mentions."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Call):
        annotation = annotation.func
    found: set[str] = set()
    for sub in ast.walk(annotation):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            with contextlib.suppress(SyntaxError):  # a docstring-like constant, no type
                found |= _kinds(ast.parse(sub.value, mode="eval").body)
    return found


def _local_kinds(
    func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, cls: ast.ClassDef | None
) -> set[str]:
    """The classes a local name of ``func`` is annotated or constructed with."""
    args = func.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.arg == name:
            return _kinds(arg.annotation)
    found: set[str] = set()
    for stmt in ast.walk(func):
        for target in _targets(stmt) if isinstance(stmt, ast.stmt) else []:
            if not (isinstance(target, ast.Name) and target.id == name):
                continue
            if isinstance(stmt, ast.AnnAssign):
                found |= _kinds(stmt.annotation)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                found |= _kinds(stmt.value)
            elif isinstance(stmt, ast.Assign) and _is_self_attr(stmt.value) and cls is not None:
                assert isinstance(stmt.value, ast.Attribute)
                found |= _attribute_kinds(cls, stmt.value.attr)
    return found


def _attribute_kinds(cls: ast.ClassDef, attr: str) -> set[str]:
    """The classes ``self.<attr>`` is annotated or constructed with in ``cls``."""
    found: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and ast.unparse(stmt.target) == attr:
            found |= _kinds(stmt.annotation)
    for func in cls.body:
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for stmt in ast.walk(func):
            for target in _targets(stmt) if isinstance(stmt, ast.stmt) else []:
                if not (_is_self_attr(target) and getattr(target, "attr", None) == attr):
                    continue
                if isinstance(stmt, ast.AnnAssign):
                    found |= _kinds(stmt.annotation)
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                    found |= _kinds(stmt.value)
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name):
                    found |= _local_kinds(func, stmt.value.id, None)
    return found
