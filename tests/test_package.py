"""The package's public face: the names the README imports from `rmqstore`, and its version."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

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
