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


def _net_state():
    return MLP(4, 2, width=3, depth=1).state_dict()


def test_a_run_folder_resolves_to_its_final_checkpoint_by_the_stated_rule(tmp_path):
    from lmc.io import resolve_checkpoint, save_net_checkpoint

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    for name in ("epoch=0-step=4.ckpt", "epoch=2-step=12.ckpt", "epoch=1-step=8.ckpt"):
        save_net_checkpoint(_net_state(), run / "checkpoints" / name)
    assert resolve_checkpoint(run).name == "epoch=2-step=12.ckpt"  # highest step
    save_net_checkpoint(_net_state(), run / "checkpoints" / "last.ckpt")
    assert resolve_checkpoint(run).name == "last.ckpt"  # last.ckpt wins
    assert resolve_checkpoint(run / "checkpoints").name == "last.ckpt"
    other = tmp_path / "other"
    other.mkdir()
    save_net_checkpoint(_net_state(), other / "a.ckpt")
    save_net_checkpoint(_net_state(), other / "b.ckpt")
    with pytest.raises(ValueError, match=r"a\.ckpt, b\.ckpt.*give the file"):
        resolve_checkpoint(other)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_checkpoint(tmp_path / "empty")


def test_a_run_folder_resolves_to_its_newest_checkpoint_by_the_step_recorded_inside(tmp_path):
    """A resume that wrote ``last-v1.ckpt`` beside a stale ``last.ckpt`` (issue 46): the reader
    takes the newer state by its recorded step, whatever the names say."""
    from lmc.io import resolve_checkpoint

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)

    def save(name: str, step: int, epoch: int) -> None:
        ckpt = {"global_step": step, "epoch": epoch, "state_dict": {"w": torch.full((2,), step)}}
        torch.save(ckpt, folder / name)

    save("last.ckpt", 8, 0)  # the first attempt's, never rewritten
    save("last-v1.ckpt", 24, 2)  # the resumed run's
    save("epoch=2-step=24.ckpt", 24, 2)
    assert resolve_checkpoint(folder.parent).name == "last-v1.ckpt"
    save("last-v2.ckpt", 24, 2)  # equal steps: the last-named copy
    assert resolve_checkpoint(folder.parent).name == "last-v2.ckpt"
    save("epoch=3-step=32.ckpt", 32, 3)  # newer than every last*.ckpt
    assert resolve_checkpoint(folder.parent).name == "epoch=3-step=32.ckpt"
    save("best.ckpt", 32, 3)  # two newest files, neither a last.ckpt nor ordered by name
    with pytest.raises(ValueError, match=r"best\.ckpt, epoch=3-step=32\.ckpt.*give the file"):
        resolve_checkpoint(folder.parent)


def test_endpoints_refuse_nan_weights_duplicates_and_a_wrong_count(tmp_path):
    from lmc.io import load_endpoints, save_net_checkpoint

    good, bad = _net_state(), _net_state()
    key = next(k for k, v in bad.items() if v.is_floating_point())
    bad[key] = bad[key].clone()
    bad[key].view(-1)[0] = float("nan")
    save_net_checkpoint(good, tmp_path / "a.ckpt")
    save_net_checkpoint(_net_state(), tmp_path / "b.ckpt")
    save_net_checkpoint(bad, tmp_path / "nan.ckpt")
    files, states = load_endpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], expected=2)
    assert files == [str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")] and len(states) == 2
    with pytest.raises(CheckpointError, match=rf"nan\.ckpt has non-finite weights in {key} \(1 of"):
        load_endpoints([tmp_path / "a.ckpt", tmp_path / "nan.ckpt"])
    with pytest.raises(ValueError, match="same checkpoint"):
        load_endpoints([tmp_path / "a.ckpt", tmp_path / ".." / tmp_path.name / "a.ckpt"])
    with pytest.raises(ValueError, match="got 3 models but this mode takes exactly 2"):
        load_endpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "nan.ckpt"], 2)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    from lmc.io import atomic_write

    path = tmp_path / "x.bin"
    atomic_write(path, lambda f: f.write(b"old"))

    def full_disk(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match=r"no space left on device writing .*x\.bin .*unchanged"):
        atomic_write(path, full_disk)
    assert path.read_bytes() == b"old"
    assert not list(tmp_path.glob(".x.bin.*"))  # no temporary file left


def test_torch_save_on_a_full_disk_is_said_to_be_a_full_disk(tmp_path, monkeypatch):
    """torch.save's own error on a full disk is an 'enforce fail' RuntimeError (issue 31): with
    under 1 MiB free it is reported as no space left, naming the file; otherwise it is raised
    as it is."""
    import lmc.io
    from lmc.io import atomic_write

    path = tmp_path / "w.ckpt"

    def torch_full(f):
        f.write(b"\0" * 64)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(lmc.io, "_free_bytes", lambda p: 4096)
    with pytest.raises(OSError, match=r"no space left on device writing .*w\.ckpt \(0\.0 MiB"):
        atomic_write(path, torch_full)
    monkeypatch.setattr(lmc.io, "_free_bytes", lambda p: 10 * 2**30)
    with pytest.raises(RuntimeError, match="enforce fail"):
        atomic_write(path, torch_full)
    assert not path.exists() and not list(tmp_path.glob(".w.ckpt.*"))


def test_a_read_only_folder_is_named_in_one_line(tmp_path, monkeypatch):
    import errno
    import tempfile

    from lmc.io import atomic_write

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(OSError, match=r"cannot write .*r\.json: .* is read-only .*writable"):
        atomic_write(tmp_path / "r.json", lambda f: f.write("{}"), mode="w")


def test_atomic_write_gives_a_new_file_the_umask_mode_and_keeps_an_old_files(tmp_path):
    import os
    import stat

    from lmc.io import atomic_write

    umask = os.umask(0o022)
    try:
        new = atomic_write(tmp_path / "new.txt", lambda f: f.write("a"), mode="w")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644  # readable by others, as open() makes it
        os.chmod(new, 0o600)
        atomic_write(new, lambda f: f.write("b"), mode="w")
        assert stat.S_IMODE(new.stat().st_mode) == 0o600 and new.read_text() == "b"
    finally:
        os.umask(umask)


def test_a_root_holding_one_run_resolves_to_it_and_two_runs_are_named(tmp_path):
    """The README's barrier recipe gives the roots of two `lmc fit` runs (issue 46: its
    `$(ls -d OUT0/lmc/*/)` broke once a root held two runs)."""
    from lmc.io import resolve_checkpoint, save_net_checkpoint

    first = tmp_path / "OUT0" / "lmc" / "a1" / "checkpoints"
    first.mkdir(parents=True)
    save_net_checkpoint(_net_state(), first / "last.ckpt")
    assert resolve_checkpoint(tmp_path / "OUT0") == first / "last.ckpt"
    second = tmp_path / "OUT0" / "lmc" / "b2" / "checkpoints"
    second.mkdir(parents=True)
    save_net_checkpoint(_net_state(), second / "last.ckpt")
    with pytest.raises(ValueError, match=r"holds 2 runs \(.*a1, .*b2\): give the run folder"):
        resolve_checkpoint(tmp_path / "OUT0")
