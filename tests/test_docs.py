"""The documentation site: mkdocs.yml and docs/ build with `mkdocs build --strict` (a broken link or anchor
between pages, a page left out of the navigation, a docstring mkdocstrings cannot render: each fails it),
offline (no plugin fetches anything; the build runs with every proxy variable pointing at a closed port);
the API pages name only public names, which stay while modules move; the README, the repository's front
page, links every page by its relative path (GitHub renders those links; the strict build does not read the
README). The pages' code runs in tests/test_readme.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from importlib import import_module

import pytest
import yaml

from conftest import REPO

pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra: pip install -e '.[docs]'")

DOCS = REPO / "docs"
# the packages an API page may document as a whole (their __all__ names its members); else rmqstore.NAME
PUBLIC_PACKAGES = {"rmqstore.spark", "rmqstore.client", "rmqstore.filter", "rmqstore.acl"}
CLOSED = "http://127.0.0.1:9"          # the discard port: nothing listens there


def test_the_site_builds_strictly_offline(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", NO_PROXY="", no_proxy="",
               **{k: CLOSED for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")})
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    assert not re.search(r"^(WARNING|ERROR)\b", r.stderr, re.M), r.stderr[-5000:]
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).with_suffix("")
        html = site / ("index.html" if rel == rel.parent / "index" else rel / "index.html")
        assert html.is_file(), f"{page.relative_to(REPO)} is not in the site"
    api = (site / "api" / "rmqstore" / "index.html").read_text(encoding="utf-8")
    for name in ("MessageStore.put_message", "MessageStore.get_message", "StoreConfig", "MessageBatch"):
        assert f'id="rmqstore.{name}"' in api, name          # generated from the docstrings
    spark = (site / "api" / "spark" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<code>=+ +=+\nmode +queue", spark), "the options table, preformatted (PlainTables)"


def _api_directives() -> list[tuple[str, str, dict]]:
    """(page, identifier, options) of every `::: identifier` of docs/api."""
    found = []
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for ident, opts in re.findall(r"^::: (\S+)\n((?:[ \t]+.*\n)*)", text, re.M):
            options = (yaml.safe_load(textwrap.dedent(opts)) or {}).get("options", {})
            found.append((page.name, ident, options))
    return found


def test_api_pages_name_only_public_names():
    """`rmqstore.NAME` with NAME exported by rmqstore, or a public package with members from its __all__:
    never a module path (rmqstore.store.index_file ...), which moves when the engine's folders do."""
    import rmqstore
    directives = _api_directives()
    assert directives
    for page, ident, options in directives:
        if ident in PUBLIC_PACKAGES:
            exported = set(import_module(ident).__all__)
            members = set(options.get("members", []))
            assert members and members <= exported, (page, ident, sorted(members - exported))
        else:
            package, _, name = ident.rpartition(".")
            assert package == "rmqstore" and name in rmqstore.__all__, (page, ident)


def test_readme_links_every_page_by_its_relative_path():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = {link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in link}
    assert {t for t in targets if not (REPO / t).exists()} == set()
    pages = {str(p.relative_to(REPO)) for p in DOCS.glob("*.md")}
    assert pages - targets == set(), "pages the front page does not link"
