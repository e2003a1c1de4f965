"""The permutation tests run single-threaded (tiny tensors; see ``one_thread`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):
    yield
