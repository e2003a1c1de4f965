"""Safe checkpoint reading and writing: ``weights_only=True`` always, atomic writes, run folders
resolved to their final checkpoint by one stated rule, clear errors for bad files and for
non-finite weights."""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml
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


class _VersionedState(OrderedDict[str, Tensor]):
    """A state dict with torch's per-module metadata, which ``load_state_dict`` reads."""

    _metadata: dict[str, Any]


def load_state(module: torch.nn.Module, state: Mapping[str, Tensor]) -> None:
    """``module.load_state_dict(state)``, with the module's own state-dict metadata (the
    version of each submodule) where ``state`` carries none: lmc's states (interpolated,
    permuted, merged, from a checkpoint's ``net.`` entries) are plain dicts, and some modules
    refuse those (torchvision's MNASNet raises without its version)."""
    if getattr(state, "_metadata", None) is None:
        state = _VersionedState(state)
        meta = module.state_dict()._metadata  # type: ignore[attr-defined]  # not in torch's dict[str, Any]
        state._metadata = meta
    module.load_state_dict(state)


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
    """Write ``state`` as a checkpoint ``lmc`` tasks read back (``model_state_dict``'s inverse),
    atomically (:func:`atomic_write`); it carries Lightning's version, so ``lmc validate
    --ckpt_path`` of a task whose net is the state's architecture evaluates it."""
    from importlib.metadata import version

    payload = {
        "state_dict": {f"{prefix}{k}": v for k, v in state.items()},
        "pytorch-lightning_version": version("lightning"),
    }
    atomic_write(path, lambda f: torch.save(payload, f))


def _kept_mode(path: Path) -> int:
    """The mode of the file ``path`` replaces, else that of a new file under the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same folder and suffix) to write to; renamed onto
    ``path`` with ``os.replace`` when the block succeeds, removed in any case, so ``path`` holds
    the old file or the whole new one, never a part.

    Raises:
        OSError: the write or the rename failed; the message names the file and says the old one
            was kept.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent
        )
    except OSError as err:
        raise write_error(path, err) from err
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if tmp.exists():  # mkstemp makes it private (0600): give it a new file's mode
            os.chmod(tmp, _kept_mode(path))
        os.replace(tmp, path)
    except OSError as err:
        raise write_error(path, err) from err
    except RuntimeError as err:  # torch.save on a full disk: "[enforce fail at inline_container"
        if _free_bytes(path) >= FULL_DISK_BYTES:
            raise
        raise write_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from err
    finally:
        tmp.unlink(missing_ok=True)


def is_temporary(path: Path) -> bool:
    """A file :func:`atomic_path` writes before renaming it (``.<name>.<random>.tmp<suffix>``):
    a whole file only once renamed; one left over was a write a kill interrupted."""
    return path.name.startswith(".") and ".tmp" in path.name


def remove_orphans(folder: str | Path) -> list[Path]:
    """Remove the temporary files a killed write left in ``folder`` (:func:`is_temporary`);
    call it only where nothing writes now (a run about to resume). Returns what it removed."""
    gone = [p for p in Path(folder).glob(".*.tmp*") if p.is_file() and is_temporary(p)]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


#: free bytes below which a failed write is put down to a full disk (torch.save's own error
#: on a full disk does not say so)
FULL_DISK_BYTES = 1 << 20


def _free_bytes(path: Path) -> int:
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return FULL_DISK_BYTES  # unknown: not blamed on the disk


def write_error(path: Path, err: OSError) -> OSError:
    """What to say when ``path`` could not be written: a full disk, a read-only folder, or the
    system's reason, with the path, what to do, and that the previous file is unchanged."""
    kept = "the previous file, if any, is unchanged"
    if err.errno == errno.ENOSPC:
        free = _free_bytes(path)
        return OSError(
            errno.ENOSPC,
            f"no space left on device writing {path} ({free / 2**20:.1f} MiB free there): free "
            f"some space (or write elsewhere) and rerun; {kept}",
        )
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return OSError(
            err.errno,
            f"cannot write {path}: {path.parent} is read-only for this process "
            f"({err.strerror or err}); make it writable or write elsewhere; {kept}",
        )
    return OSError(err.errno, f"could not write {path} ({err.strerror or err}); {kept}")


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Write a file through ``write(file_object)`` atomically (:func:`atomic_path`), flushed to
    disk before the rename."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


_STEP = re.compile(r"step=(\d+)")


def _recorded_step(path: Path) -> tuple[int, int] | None:
    """A Lightning checkpoint's ``(global_step, epoch)``, read without loading its tensors;
    ``None`` for a file that records no step (a bare state dict)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None  # read again, with its error, by whoever loads it
    if not isinstance(ckpt, Mapping) or not isinstance(ckpt.get("global_step"), int):
        return None
    return ckpt["global_step"], int(ckpt.get("epoch") or 0)


_LAST = re.compile(r"last(?:-v(\d+))?\.ckpt")


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint file a path names: a file as is; a root (``--trainer.default_root_dir``)
    holding one run as that run; a run folder (or its ``checkpoints/``) by one rule: its newest checkpoint by the step recorded inside (``global_step``, then
    ``epoch``), among equals a ``last.ckpt`` (then ``last-vN.ckpt``, highest N: Lightning's
    name for a newer copy beside a ``last.ckpt`` it did not know); where no file records a
    step (bare state dicts), ``last.ckpt``, else the highest ``step=N`` in the names.

    Raises:
        FileNotFoundError: nothing there, or a folder without checkpoints.
        ValueError: several checkpoints that the rule cannot order (names the files).
    """
    path = Path(path)
    if path.is_file() or not path.is_dir():
        return path  # load_checkpoint reports a missing file
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = sorted(p for p in folder.glob("*.ckpt") if not is_temporary(p))
    runs = sorted(p.parent.parent for p in path.glob("*/*/checkpoints/*.ckpt"))
    if not found and runs:  # a root (--trainer.default_root_dir) holding runs
        runs = list(dict.fromkeys(runs))
        if len(runs) == 1:
            return resolve_checkpoint(runs[0])
        raise ValueError(
            f"{path} holds {len(runs)} runs ({', '.join(str(r) for r in runs)}): give the run "
            "folder you mean (`lmc fit` prints it at the end)"
        )
    if not found:
        raise FileNotFoundError(
            f"no checkpoint in {folder}: give a run folder written by `lmc fit` (with "
            "checkpoints/*.ckpt) or a .ckpt file"
        )
    if len(found) == 1:
        return found[0]
    recorded = {f: step for f in found if (step := _recorded_step(f)) is not None}
    if recorded:
        newest = max(recorded.values())
        top = [f for f, step in recorded.items() if step == newest]
        lasts = {f: int(m.group(1) or 0) for f in top if (m := _LAST.fullmatch(f.name))}
        if lasts:
            return max(lasts, key=lasts.__getitem__)
        if len(top) == 1:
            return top[0]
        found = top
    elif (folder / "last.ckpt").is_file():
        return folder / "last.ckpt"
    steps = {f: int(m.group(1)) for f in found if (m := _STEP.search(f.name))}
    if len(steps) == len(found) and len(set(steps.values())) == len(found):
        return max(found, key=steps.__getitem__)
    raise ValueError(
        f"{folder} holds several checkpoints ({', '.join(f.name for f in found)}) that neither "
        "their recorded step nor their names order: give the file you mean"
    )


def check_finite(state: Mapping[str, Tensor], source: str) -> None:
    """Refuse a state dict with NaN or infinite values, naming the file and the keys.

    Raises:
        CheckpointError: some floating-point entry is not finite.
    """
    bad = [
        f"{k} ({int((~torch.isfinite(v)).sum())} of {v.numel()})"
        for k, v in state.items()
        if v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]
    if bad:
        raise CheckpointError(
            f"{source} has non-finite weights in {', '.join(bad[:5])}"
            f"{' and more' if len(bad) > 5 else ''}: a diverged run? Its barriers and merges would "
            "be NaN; use a checkpoint from before the divergence"
        )


def load_endpoints(
    paths: Sequence[str | Path], expected: int | None = None, what: str = "checkpoints"
) -> tuple[list[str], list[dict[str, Tensor]]]:
    """Read the models a task compares: run folders resolved (:func:`resolve_checkpoint`),
    each file read safely; the same file twice, identical weights under two names and
    non-finite weights are refused.

    Args:
        paths: ``.ckpt`` files or run folders.
        expected: the exact number of models the task's mode takes, if fixed.
        what: how the config calls the list, for messages.

    Returns:
        The resolved file paths and the network state dicts, in order.
    """
    if expected is not None and len(paths) != expected:
        raise ValueError(
            f"{what}: got {len(paths)} models but this mode takes exactly {expected}: "
            f"{', '.join(map(str, paths)) or 'none'}"
        )
    files = [resolve_checkpoint(p) for p in paths]
    seen: dict[Path, str] = {}
    for given, f in zip(paths, files):
        key = f.resolve()
        if key in seen:
            raise ValueError(
                f"{what}: {given} and {seen[key]} are the same checkpoint ({f}); a barrier or "
                "merge of a model with itself says nothing - give distinct models"
            )
        seen[key] = str(given)
    states: list[dict[str, Tensor]] = []
    for given, f in zip(paths, files):
        state = model_state_dict(load_checkpoint(f))
        check_finite(state, str(f))
        for other, prev in zip(paths, states):
            if prev.keys() == state.keys() and all(torch.equal(prev[k], state[k]) for k in state):
                raise ValueError(
                    f"{what}: {given} and {other} hold identical weights (the same checkpoint "
                    "under two names, e.g. a run's last.ckpt and its epoch file); a barrier or "
                    "merge of a model with itself says nothing - give distinct models"
                )
        states.append(state)
    return [str(f) for f in files], states


SPAWN_DIR = "spawn"


def spawn_point(run: str | Path, epoch: int) -> Path:
    """The checkpoint a run saved after ``epoch`` epochs (0: before training) for other runs
    to start from (``lmc fit --spawn_points`` / ``--spawn_from``)."""
    return Path(run) / "checkpoints" / SPAWN_DIR / f"epoch={epoch}.ckpt"


#: how jsonargparse dumps a default it cannot write (torchvision's ViT: ``norm_layer`` is a
#: ``functools.partial``); read back, the text is refused as the value
UNSERIALIZABLE = "Unable to serialize instance"


def drop_unserializable(cfg: Any) -> Any:
    """``cfg`` without the values jsonargparse could not write: such a value is a class's own
    default (a config can only give what YAML holds), which applies again when the key is
    absent, so a saved config parses back and reruns the same model."""
    if isinstance(cfg, dict):
        return {
            k: drop_unserializable(v)
            for k, v in cfg.items()
            if not (isinstance(v, str) and v.startswith(UNSERIALIZABLE))
        }
    if isinstance(cfg, list):
        return [drop_unserializable(v) for v in cfg]
    return cfg


def config_to_save(text: str) -> str:
    """A run's ``config.yaml`` from the parser's dump ``text``: the loggers' ``save_dir`` that the
    CLI derived from the trainer's ``default_root_dir`` set back to ``null``, so a rerun from the
    saved config follows its own ``--trainer.default_root_dir``; values that could not be
    written (class defaults) left out (:func:`drop_unserializable`)."""
    cfg = drop_unserializable(yaml.safe_load(text))
    trainer = cfg.get("trainer") or {}
    root = os.path.abspath(trainer.get("default_root_dir") or "runs")
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init = logger.get("init_args") if isinstance(logger, dict) else None
        if not isinstance(init, dict):
            continue
        save_dir = init.get("save_dir")
        if isinstance(save_dir, str) and os.path.abspath(save_dir) == root:
            init["save_dir"] = None
        if init.get("id") is not None and init.get("resume"):
            init["id"] = init["resume"] = None  # never write into the resumed run again
    return yaml.safe_dump(cfg, sort_keys=False)
