"""The layer rules of the package, checked on its source with ``ast``.

mainspring is a stack: each package may use the ones below it and only through
what they export. The rules live here as data so that a reviewer reads them in one
place; ``tests/test_layers.py`` runs them on the package and on planted violations.
"""

from __future__ import annotations

import ast
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
    "integrations": 6,  # other frameworks' agents on mainspring, behind extras
    "dashboard": 6,
    "server": 7,
    "lab": 7,
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


def _private_names(trees: dict[Path, tuple[str, ast.Module]]) -> dict[str, set[str]]:
    """Names starting with one underscore that each part defines (functions,
    classes, assignments, attributes it sets)."""
    defined: dict[str, set[str]] = {}
    for module, tree in trees.values():
        names = defined.setdefault(part_of(module), set())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                name = node.arg
            if name and name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return defined


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
    defined = _private_names(trees)
    for path, (module, tree) in trees.items():
        src = part_of(module)
        for imp in _imports(root, path, tree):
            found.extend(_check_import(src, imp, f"{path}:{imp.line}"))
        found.extend(_check_attributes(src, tree, defined, str(path)))
    return found


def _check_import(src: str, imp: _Import, where: str) -> Iterator[Violation]:
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
    for name in imp.names:
        if name.startswith("_") and not name.startswith("__"):
            yield Violation("private", where, f"{imp.module} imports {name} from {imp.target}")


def _check_attributes(
    src: str, tree: ast.Module, defined: dict[str, set[str]], path: str
) -> Iterator[Violation]:
    own = defined.get(src, set())
    others = set().union(*(names for part, names in defined.items() if part != src))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        name = node.attr
        if name.startswith("__") or not name.startswith("_") or name in STDLIB_PRIVATE:
            continue
        if name in others and name not in own:
            yield Violation(
                "private",
                f"{path}:{node.lineno}",
                f"{src} reads {ast.unparse(node)}, private to another part",
            )
