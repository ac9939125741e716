"""The shape of src/rmqstore, read from its source with `ast`: arrows point down the tree, classes stay small.

An import is every `import` / `from ... import` statement of a module, function-level ones included; only those
under `if TYPE_CHECKING:` are left out (they never run). Within every package, its children (sub-packages and
modules, each standing for everything under it) must not import each other in a circle: a cycle between two
folders is a cycle even when no two modules close it directly. The engine (store/) imports nothing of the layers
built on it. No class is longer than MAX_CLASS_LINES (from its `class` line to its last line).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import rmqstore

SRC = Path(rmqstore.__file__).resolve().parent
MAX_CLASS_LINES = 400
ABOVE_THE_ENGINE = ("messaging", "broker", "spark", "client", "proxy", "tools", "filter", "remoting", "acl", "common")


def _modules(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file (a package is its __init__.py)."""
    out = {}
    for p in sorted(src.rglob("*.py")):
        parts = list(p.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit_one(stmt)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        visit(node)

    visit(tree)
    return found


def import_graph(src: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within the package only."""
    mods = _modules(src)
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].setdefault(t, node.lineno)
    return graph


def _child(parent: str, module: str) -> str:
    return ".".join(module.split(".")[: len(parent.split(".")) + 1])


def sibling_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every cycle among the children of a package, each named by the module imports that close it."""
    edges: dict[str, dict[str, dict[str, set[str]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(set)))
    for a, targets in graph.items():
        for t, line in targets.items():
            pa, pt = a.split("."), t.split(".")
            k = 0
            while k < min(len(pa), len(pt)) and pa[k] == pt[k]:
                k += 1
            if k < len(pa) and k < len(pt):      # neither contains the other: two children of one package
                parent = ".".join(pa[:k])
                edges[parent][_child(parent, a)][_child(parent, t)].add(f"{a}:{line} -> {t}")
    found = []
    for parent, e in sorted(edges.items()):
        for comp in _strongly_connected(e):
            why = sorted(w for a in comp for b in comp for w in e[a].get(b, ()))
            found.append(f"cycle among {sorted(comp)} (in {parent}): " + "; ".join(why))
    return found


def _strongly_connected(e: dict[str, dict[str, set]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in e.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(e):
        if v not in index:
            strong(v)
    return out


def long_classes(src: Path = SRC, limit: int = MAX_CLASS_LINES) -> list[str]:
    out = []
    for name, path in _modules(src).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{name}.{node.name} ({path.relative_to(src.parent)}:{node.lineno}): "
                           f"{node.end_lineno - node.lineno + 1} lines")
    return out


def test_no_import_cycle_between_modules_or_folders():
    assert sibling_cycles(import_graph()) == []


def test_the_engine_imports_no_layer_above_it():
    upward = [f"{a}:{line} imports {t}" for a, targets in import_graph().items() if a.startswith("rmqstore.store")
              for t, line in targets.items() if t.split(".")[1] in ABOVE_THE_ENGINE]
    assert upward == []


def test_no_class_over_400_lines():
    assert long_classes() == []


def test_the_checks_see_a_cycle_a_function_level_import_and_a_long_class(tmp_path):
    """The checks themselves: a cycle closed by a function-level import between two folders is found, one
    under `if TYPE_CHECKING:` is not, and a long class is named."""
    pkg = tmp_path / "pkg"
    for d in ("low", "high"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from ..low import b\n")
    (pkg / "low" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from ..high.a import x\n")
    assert sibling_cycles(import_graph(pkg)) == []
    (pkg / "low" / "b.py").write_text("def f():\n    from ..high import a\n")
    cycles = sibling_cycles(import_graph(pkg))
    assert len(cycles) == 1 and "pkg.low.b:2 -> pkg.high.a" in cycles[0] and "pkg.high.a:1 -> pkg.low.b" in cycles[0]
    (pkg / "low" / "c.py").write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert long_classes(pkg) == [f"pkg.low.c.Big (pkg/low/c.py:1): {MAX_CLASS_LINES + 1} lines"]
