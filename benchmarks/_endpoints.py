"""Shared by the benchmarks: endpoints trained once with ``lmc fit`` and cached, and the data check.

Checkpoints land in ``benchmarks/.cache/<tag>_s<seed>_<key>.ckpt`` (git-ignored) with a
``.json`` record beside them; ``<key>`` (:func:`cache_key`) hashes the resolved training config
(:func:`training_config`: every argument of the run, defaults filled in, minus logging) and
the code version (:func:`code_version`: the contents of the ``lmc`` and ``callbacks`` sources),
so a change of either trains afresh instead of reusing a stale model. Older cache files (keyed by
tag and seed only) are never reused.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache"
CODE_DIRS = ("lmc", "callbacks")
"""Source folders whose ``.py`` files the code version covers (everything ``lmc fit`` runs)."""
MODEL_NEUTRAL = (
    ("trainer", "logger"),
    ("trainer", "enable_progress_bar"),
    ("trainer", "enable_model_summary"),
    ("trainer", "log_every_n_steps"),
    ("trainer", "default_root_dir"),
    ("test_after_fit",),
)
"""Config entries that do not shape the trained model (logging, where runs land): left out of
the key, so that e.g. the logger's ``save_dir`` does not defeat the cache."""
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def require_data(name: str, benchmark: str) -> Path:
    """``$LMC_DATA_DIR/<name>/raw`` if it holds the four idx files of ``name`` (``MNIST`` or
    ``FashionMNIST``, each ``.gz`` or decompressed); else stop with exit status 1 and a message
    naming ``LMC_DATA_DIR`` and the files expected. Benchmarks never fall back to other data."""
    root = os.environ.get("LMC_DATA_DIR")
    raw = Path(root or "$LMC_DATA_DIR").expanduser() / name / "raw"
    missing = [
        f for f in MNIST_FILES if not (raw / f).is_file() and not (raw / f"{f}.gz").is_file()
    ]
    if root and not missing:
        return raw
    expected = "\n".join(f"  {raw / f}.gz" for f in MNIST_FILES)
    why = "LMC_DATA_DIR is not set" if not root else f"missing {', '.join(missing)} in {raw}"
    sys.exit(
        f"{benchmark} needs {name}: {why}.\nSet LMC_DATA_DIR to a writable copy of the datasets "
        f"(e.g. of ../shared/datasets) holding (or the same decompressed, without .gz):\n"
        f"{expected}"
    )


def code_version(root: Path = ROOT, dirs: Sequence[str] = CODE_DIRS) -> str:
    """sha256 over the relative path and bytes of every ``.py`` file under ``root/<dirs>``.

    Content, not timestamps or git state: it works outside a git checkout, and touching or
    re-checking-out a file leaves it unchanged.
    """
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _drop(config: dict[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    for path in paths:
        node = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def training_config(config: Path, seed: int, overrides: Sequence[str]) -> dict[str, Any]:
    """The training config of :func:`cached_checkpoints` as ``lmc fit`` resolves it.

    ``lmc fit --print_config`` with the same files and arguments: the YAML files merged, the
    overrides applied and every default of the model, optimizer, data module and trainer filled
    in by the same parser that trains. The :data:`MODEL_NEUTRAL` entries are left out.
    """
    import yaml

    from lmc.cli import main

    out = io.StringIO()
    argv, sys.argv = sys.argv, sys.argv[:1]  # the calling script's options are not the CLI's
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*_fit_args(config, seed, overrides, CACHE / "unused"), "--print_config"])
    finally:
        sys.argv = argv
    resolved = yaml.safe_load(out.getvalue())
    if not isinstance(resolved, dict) or "model" not in resolved:
        raise RuntimeError(f"lmc fit --print_config gave no config for {config}:\n{out.getvalue()}")
    return _drop(resolved, MODEL_NEUTRAL)


def cache_key(config: Mapping[str, Any], code: str) -> str:
    """sha256 of the resolved training ``config`` (canonical JSON: key order does not matter),
    the ``code`` version and the installed torch and lightning versions."""
    record = {
        "config": config,
        "code": code,
        "versions": {p: version(p) for p in ("torch", "lightning")},
    }
    blob = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _fit_args(config: Path, seed: int, overrides: Sequence[str], root: Path) -> list[str]:
    return [
        "fit",
        "-c",
        str(config),
        "-c",
        str(ROOT / "configs" / "loggers" / "csv.yaml"),
        f"--seed_everything={seed}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--test_after_fit=false",
        f"--trainer.logger.init_args.save_dir={root}",
        *overrides,
    ]


def cached_checkpoints(
    config: Path, tag: str, seeds: list[int], overrides: list[str], dataset: str
) -> list[Path]:
    """Train ``config`` once per seed (CSV logger, no test) with ``overrides``; cache the
    checkpoints under a key of the resolved config and the code version (see module docstring).

    Needs ``LMC_DATA_DIR`` with ``dataset`` (``MNIST`` or ``FashionMNIST``) in it; stops with a
    message naming the files expected otherwise.
    """
    require_data(dataset, f"benchmarks ({tag} endpoints)")
    from lmc.cli import main
    from lmc.io import resolve_checkpoint

    code = code_version()
    out = []
    for seed in seeds:
        resolved = training_config(config, seed, overrides)
        key = cache_key(resolved, code)
        stem = f"{tag}_s{seed}_{key[:16]}"
        target = CACHE / f"{stem}.ckpt"
        if not target.exists():
            root = CACHE / f"fit_{stem}"
            shutil.rmtree(root, ignore_errors=True)  # what a killed run left
            main(_fit_args(config, seed, overrides, root))
            [folder] = {p.parent for p in root.rglob("*.ckpt")}  # the run's checkpoints/
            ckpt = resolve_checkpoint(folder)  # last.ckpt: the final weights
            record = {"key": key, "code": code, "config": resolved}
            tmp = CACHE / f".{stem}.json.tmp"
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
            os.replace(tmp, CACHE / f"{stem}.json")
            os.replace(ckpt, target)
        out.append(target)
    return out


def mnist_mlp_checkpoints(seeds: list[int], epochs: int = 3) -> list[Path]:
    """MNIST MLPs of ``configs/mnist/mlp.yaml`` trained ``epochs`` epochs, one per seed."""
    config = ROOT / "configs" / "mnist" / "mlp.yaml"
    return cached_checkpoints(
        config, f"mnist_mlp_e{epochs}", seeds, [f"--trainer.max_epochs={epochs}"], "MNIST"
    )


def fmnist_vgg_checkpoints(
    seeds: list[int], epochs: int = 3, limit_train: int = 12000
) -> list[Path]:
    """Fashion-MNIST VGG-11 x1/8 of ``configs/curves/fmnist_vgg11_endpoint.yaml``, shortened to
    ``epochs`` epochs (cosine decay over them) on ``limit_train`` training images."""
    config = ROOT / "configs" / "curves" / "fmnist_vgg11_endpoint.yaml"
    return cached_checkpoints(
        config,
        f"fmnist_vgg11_e{epochs}_n{limit_train}",
        seeds,
        [
            f"--trainer.max_epochs={epochs}",
            f"--model.init_args.lr_scheduler.init_args.T_max={epochs}",
            f"--data.init_args.limit_train={limit_train}",
        ],
        "FashionMNIST",
    )
