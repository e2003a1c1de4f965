"""Test helpers: run the CLI in-process, find run directories, read W&B offline runs back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from lmc.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def run_cli(*args: str) -> None:
    """Run ``lmc`` in-process with ``args``."""
    main(list(args))


def run_dirs(root: Path) -> list[Path]:
    """Run directories (holding ``config.yaml``) under ``root``, oldest first."""
    return sorted((p.parent for p in root.rglob("config.yaml")), key=lambda p: p.stat().st_mtime)


def checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("*.ckpt"))


def wandb_run_dirs(root: Path) -> list[Path]:
    return sorted(root.rglob("offline-run-*"), key=lambda p: p.stat().st_mtime)


def read_wandb_summary(run: Path) -> dict[str, Any]:
    """The W&B run's state, config and latest metrics, read offline from its ``.wandb`` log."""
    exe = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    out = subprocess.run(
        [exe, "leet", "inspect", "--summary", "--json", str(run)],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    ).stdout
    return json.loads(out)


def read_wandb_records(run: Path) -> list[dict[str, Any]]:
    """Every record of the W&B offline run (history rows, tables, files, ...)."""
    exe = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    out = subprocess.run(
        [exe, "leet", "inspect", "--json", str(run)],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
