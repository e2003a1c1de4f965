"""Safe checkpoint reading: ``weights_only=True`` always, clear errors for bad files."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be used (corrupt, untrusted or of the wrong kind)."""


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    ``mmap=True`` memory-maps the tensors instead of reading them: a cheap validity and shape
    check of a file that is read in full later.

    Raises:
        FileNotFoundError: the path does not exist.
        CheckpointError: the file is truncated/corrupt, or holds pickled objects other than
            tensors and plain containers (which could execute code, so they are refused).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path} (give the path of a .ckpt written by `lmc fit`, "
            "usually <run dir>/checkpoints/*.ckpt)"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"refusing to load {path}: it contains pickled Python objects beyond tensors and plain "
            "containers, which could run arbitrary code. If you trust its origin, load it yourself "
            "and re-save only its state_dict with torch.save. Detail: "
            f"{str(err).splitlines()[0]}"
        ) from None
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(
            f"cannot read {path} as a PyTorch checkpoint (corrupt or truncated file?): {err}"
        ) from None
    if not isinstance(ckpt, Mapping):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dictionary")
    return dict(ckpt)


def model_state_dict(ckpt: Mapping[str, Any], prefix: str = "net.") -> dict[str, Tensor]:
    """The network's state dict from a Lightning checkpoint (keys under ``prefix``) or a plain one.

    A plain ``state_dict`` saved with ``torch.save(model.state_dict())`` is returned as is.
    """
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError("checkpoint has no tensor state_dict (expected a 'state_dict' entry)")
    if any(k.startswith(prefix) for k in state):
        return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return dict(state)


def save_net_checkpoint(
    state: Mapping[str, Tensor], path: str | Path, prefix: str = "net."
) -> None:
    """Write ``state`` as a checkpoint ``lmc`` tasks read back (``model_state_dict``'s inverse)."""
    torch.save({"state_dict": {f"{prefix}{k}": v for k, v in state.items()}}, path)
