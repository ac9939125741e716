"""Griffe extensions for the API pages (mkdocs.yml loads them; the pages are docs/api/*.md).

LazyExports: `rmqstore` exports its public names lazily (PEP 562: the `_EXPORTS` table of
src/rmqstore/__init__.py, name -> defining module), which static analysis cannot follow. This reads that
table and adds each name to the package as an alias of its definition, so that the pages name
`rmqstore.MessageStore` and never the module it lives in (modules move; the table follows them).

PlainTables: a docstring's table in reStructuredText's simple form (columns under a `=====  =====` rule,
closed by another) is shown as it is written, as preformatted text: as Markdown its lines would run into
one paragraph."""
from __future__ import annotations

import ast
import re

import griffe

RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


class LazyExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.path != "rmqstore":
            return
        tree = ast.parse(pkg.filepath.read_text(encoding="utf-8"))
        table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets))
        for name, module in ast.literal_eval(table).items():
            pkg.set_member(name, griffe.Alias(name, f"rmqstore{module}.{name}", parent=pkg))


def fence_tables(text: str) -> str:
    """Each run of lines from a table rule to the next one, inclusive, in a ```text fence."""
    lines, out, inside = text.split("\n"), [], False
    for line in lines:
        if RULE.match(line):
            out.extend(["", "```text", line] if not inside else [line, "```", ""])
            inside = not inside
        else:
            out.append(line)
    return "\n".join(out) if not inside else text       # an unclosed table: left as it was


class PlainTables(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and "==" in obj.docstring.value:
            obj.docstring.value = fence_tables(obj.docstring.value)
