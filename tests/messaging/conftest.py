"""What the tests of the in-process messaging layer share."""
from __future__ import annotations

import pytest

from rmqstore.store.store import MessageStore


@pytest.fixture
def store(request, tmp_path):
    """A MessageStore over a fresh directory, configured by the requesting module's cfg(); closed after."""
    s = MessageStore.open(tmp_path / "store", request.module.cfg())
    yield s
    s.close()
