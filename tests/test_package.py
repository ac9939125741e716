"""The package's public face: the names the README imports from `rmqstore`, its version, and the package as users
install it: the wheel and sdist `python -m build` makes, each installed into a clean virtualenv."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import rmqstore


def test_version_is_the_installed_distributions():
    assert rmqstore.__version__ == version("rmqstore")


def test_public_names_import_from_the_top():
    from rmqstore import (Message, MessageBatch, MessageStore, Producer, PullConsumer, PushConsumer,
                          StoreConfig)
    from rmqstore.store.store import MessageStore as M
    assert MessageStore is M
    assert {Message, MessageBatch, Producer, PullConsumer, PushConsumer, StoreConfig}
    assert set(rmqstore.__all__) <= set(dir(rmqstore))


def test_unknown_name_is_an_attribute_error():
    try:
        rmqstore.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:  # pragma: no cover
        raise AssertionError("rmqstore.NoSuchThing did not raise")


def test_import_is_cheap():
    """`import rmqstore` loads neither the store nor numpy: the names load on first use."""
    code = "import sys, rmqstore; print('numpy' in sys.modules, 'rmqstore.store.store' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --- built and installed as users install packages (issue 40 item 2) ----------------------------------
def _uv() -> list[str] | None:
    """uv (the Makefile installs it into the venv): venvs and installs from its cache, in seconds."""
    r = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True)
    return [sys.executable, "-m", "uv"] if r.returncode == 0 else None


def _checkout_copy(dst):
    """The checkout's files as a clone has them (tracked, and new files not ignored), copied to dst: the
    build sees neither .venv nor build leftovers, and writes nothing into the repository."""
    import shutil
    from conftest import REPO
    r = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    for name in filter(None, r.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`python -m build` of the checkout: its sdist, then the wheel built from that sdist (as users run it:
    in an isolated build environment, which uv installs from its cache)."""
    src = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", *(["--installer=uv"] if _uv() else []), "--outdir",
                        str(out), str(src)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


def _venv_with(tmp_path, what) -> Path:
    """A fresh virtualenv (no packages) with `what` installed: from uv's cache when it has the base
    dependencies (numpy, zlib-ng, tqdm; `make` put them there), else from PyPI. Returns its bin/."""
    venv = tmp_path / "venv"
    uv = _uv()
    if uv:
        subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=300)
        for offline in (["--offline"], []):
            r = subprocess.run([*uv, "pip", "install", "-q", *offline, "--python", str(venv / "bin" / "python"),
                                str(what)], capture_output=True, text=True, timeout=900)
            if r.returncode == 0:
                break
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(what)], capture_output=True, text=True,
                           timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv / "bin"


def _run(bin_dir, *argv, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin:/bin"
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_the_wheel_installs_into_a_clean_venv_and_runs(dist, tmp_path):
    import tomllib
    from conftest import REPO
    wheel, _ = dist
    bin_dir = _venv_with(tmp_path, wheel)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"rmqstore-{version}-py3-none-any.whl"
    r = _run(bin_dir, bin_dir / "rmqstore", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: rmqstore") and "load" in r.stdout, r.stderr
    assert _run(bin_dir, bin_dir / "rmqstore", "--version").stdout.strip() == f"rmqstore {version}"
    probe = ("import json, rmqstore, sys\nfrom importlib.metadata import metadata, entry_points\n"
             "m = metadata('rmqstore')\n"
             "print(json.dumps({'version': rmqstore.__version__, 'file': rmqstore.__file__, "
             "'meta': {k: m.get_all(k) for k in set(m.keys())}, "
             "'scripts': [e.value for e in entry_points(group='console_scripts', name='rmqstore')], "
             "'spark': 'pyspark' in sys.modules}))")
    got = json.loads(_run(bin_dir, bin_dir / "python", "-c", probe, cwd=tmp_path).stdout)
    assert got["version"] == version and str(tmp_path / "venv") in got["file"]     # the installed copy
    meta = got["meta"]
    assert meta["Version"] == [version] and meta["Name"] == ["rmqstore"] and meta["Requires-Python"] == [">=3.11"]
    assert meta["License-Expression"] == ["Apache-2.0"] and meta["Summary"]
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in meta["Classifier"])
    assert meta["Project-URL"] and meta["Description-Content-Type"] == ["text/markdown"]
    assert {e.split(";")[0].strip() for e in meta["Provides-Extra"]} == {"spark", "test", "bench", "grpc", "docs"}
    assert got["scripts"] == ["rmqstore.tools.cli:main"]
    first = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)[0]
    r = _run(bin_dir, bin_dir / "python", "-c", first, cwd=tmp_path)
    assert r.returncode == 0 and "PUT_OK" in r.stdout, r.stderr[-3000:]
    # the base install has no Spark: a command that needs it names the extra, as installed from a checkout
    store = tmp_path / "store"
    assert _run(bin_dir, bin_dir / "rmqstore", "load", store, cwd=tmp_path).returncode == 0
    r = _run(bin_dir, bin_dir / "rmqstore", "stats", store)
    assert r.returncode == 2 and "pip install '.[spark]' in rmqstore's checkout" in r.stderr, r.stderr


def test_the_sdist_installs_into_a_clean_venv(dist, tmp_path):
    import tarfile
    _, sdist = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"README.md", "pyproject.toml", "src/rmqstore/__init__.py", "tests/conftest.py", "Makefile",
            "mkdocs.yml", "docs/index.md"} <= names
    bin_dir = _venv_with(tmp_path, sdist)
    r = _run(bin_dir, bin_dir / "rmqstore", "--version")
    assert r.returncode == 0 and r.stdout.startswith("rmqstore "), r.stderr
