"""The curve tests run single-threaded: their tensors are tiny, and a second intra-op thread
only adds synchronisation cost, which grows sharply when other jobs share the cores."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
