"""The network side's import graph (issue 16): no import cycle through rmqstore.broker, rmqstore.client or
rmqstore.remoting (every import counted, function-level ones too), and the network client owns its models
(it imports neither the server nor the in-process messaging layer)."""
from __future__ import annotations

import ast
from pathlib import Path

import rmqstore

PKG = Path(rmqstore.__file__).parent
NETWORK = ("rmqstore.broker", "rmqstore.client", "rmqstore.remoting")


def import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (p, is_pkg) in mods.items():
        base = m if is_pkg else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                b = base
                for _ in range(max(0, node.level - 1)):
                    b = b.rpartition(".")[0]
                full = (b + ("." + node.module if node.module else "")) if node.level else (node.module or "")
                targets = [f"{full}.{a.name}" if f"{full}.{a.name}" in mods else full for a in node.names]
            for t in targets:
                r = resolve(t)
                if r and r != m:
                    graph[m].add(r)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_through_the_network_side():
    cycles = [c for c in strongly_connected(import_graph()) if any(m.startswith(NETWORK) for m in c)]
    assert cycles == []


def test_the_network_client_owns_its_models():
    g = import_graph()
    bad = sorted((a, b) for a, targets in g.items() if a.startswith("rmqstore.client")
                 for b in targets if b.startswith(("rmqstore.broker", "rmqstore.messaging")))
    assert bad == []


def test_the_checker_sees_a_cycle(tmp_path):
    """The graph walker on a known cycle (a guard against a checker that finds nothing)."""
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
