"""Small assertion helpers (``torch.testing.assert_close`` costs seconds on its first call)."""

from __future__ import annotations

import torch


def assert_close(
    got: torch.Tensor, want: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-6
) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    assert torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol), f"max |diff| {err}"
