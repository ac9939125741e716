"""A griffe extension for the API pages: `rmqstore` exports its public names lazily (PEP 562: the `_EXPORTS`
table of src/rmqstore/__init__.py, name -> defining module), which static analysis cannot follow. This reads
that table and adds each name to the package as an alias of its definition, so that the pages name
`rmqstore.MessageStore` and never the module it lives in (modules move; the table follows them)."""
from __future__ import annotations

import ast

import griffe


class LazyExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.path != "rmqstore":
            return
        tree = ast.parse(pkg.filepath.read_text(encoding="utf-8"))
        table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets))
        for name, module in ast.literal_eval(table).items():
            pkg.set_member(name, griffe.Alias(name, f"rmqstore{module}.{name}", parent=pkg))
