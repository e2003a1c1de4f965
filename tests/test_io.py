"""Checkpoints load only with weights_only=True and bad files give clear errors."""

import pytest
import torch

from lmc.io import CheckpointError, load_checkpoint, model_state_dict
from lmc.models import MLP


def test_roundtrip_lightning_style_checkpoint(tmp_path):
    net = MLP(4, 2, width=3, depth=1)
    path = tmp_path / "a.ckpt"
    torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}, path)
    state = model_state_dict(load_checkpoint(path))
    assert state.keys() == net.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_plain_state_dict_is_accepted(tmp_path):
    net = MLP(4, 2, width=3, depth=1)
    torch.save(net.state_dict(), tmp_path / "s.pt")
    assert model_state_dict(load_checkpoint(tmp_path / "s.pt")).keys() == net.state_dict().keys()


def test_missing_checkpoint_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        load_checkpoint(tmp_path / "nope.ckpt")


def test_corrupt_checkpoint(tmp_path):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(b"this is not a zip file")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_untrusted_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": _Evil()}, path)
    with pytest.raises(CheckpointError, match="arbitrary code"):
        load_checkpoint(path)
