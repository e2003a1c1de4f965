"""Logger defaults: W&B offline unless asked otherwise, so no run ever waits for a login."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

from lmc.engine.seam import wandb_init, wandb_offline


def wandb_offline_default() -> bool:
    """Offline unless ``WANDB_MODE=online`` is set in the environment."""
    return os.environ.get("WANDB_MODE", "offline").lower() != "online"


class WandbLogger(_LightningWandbLogger):
    """Lightning's ``WandbLogger`` with ``lmc`` defaults.

    * ``offline=None`` means offline unless the environment says ``WANDB_MODE=online``; set
      ``offline: false`` in the config (and run ``wandb login`` once) to sync to the cloud.
    * ``save_dir=None`` is resolved by ``lmc``'s CLI to ``trainer.default_root_dir`` before the
      logger is built, so everything of a run lands under one explicit directory.
    * No entity or project is hard-coded beyond the project name ``lmc``.
    * ``group`` and ``job_type`` are W&B's; ``lmc study run`` sets them to the study's name and
      the job's stage when the config leaves them empty.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | None = None,
        project: str = "lmc",
        offline: bool | None = None,
        log_model: bool = False,
        tags: list[str] | None = None,
        group: str | None = None,
        job_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        if offline is None:
            offline = wandb_offline_default()
        if save_dir is None:
            save_dir = "runs"
        os.makedirs(save_dir, exist_ok=True)
        super().__init__(
            name=name,
            save_dir=save_dir,
            project=project,
            offline=offline,
            log_model=log_model,
            tags=tags,
            group=group,
            job_type=job_type,
            **kwargs,
        )


class CSVLogger(_LightningCSVLogger):
    """Lightning's ``CSVLogger`` whose ``save_dir`` may be left out: ``lmc``'s CLI then sets it to
    ``trainer.default_root_dir``, as for :class:`WandbLogger` (``runs`` outside the CLI)."""

    def __init__(self, save_dir: str | None = None, name: str | None = "lmc", **kwargs: Any):
        super().__init__(save_dir if save_dir is not None else "runs", name=name, **kwargs)


def offline_segments(save_dir: str | Path, run_id: str) -> list[Path]:
    """The offline W&B run folders of run ``run_id`` under ``save_dir`` (``wandb/offline-run-
    <time>-<id>``), oldest first: one per attempt of a run that was resumed."""
    return sorted((Path(save_dir) / "wandb").glob(f"offline-run-*-{run_id}"))


def inspect_offline(folder: str | Path, *flags: str) -> str:
    """``wandb leet inspect --json [flags] <folder>``: an offline W&B run's records (one JSON
    object a line; ``--summary``: its state, config and latest metrics as one object), read
    without a login or a network."""
    exe = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    return subprocess.run(
        [exe, "leet", "inspect", *flags, "--json", str(folder)],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    ).stdout


def _segment_rows(folder: Path) -> list[dict[str, Any]]:
    """The history rows of one offline W&B run folder."""
    rows = []
    for line in inspect_offline(folder).splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("type") == "history":
            rows.append(record["history"]["item"])
    return rows


def offline_history(save_dir: str | Path, run_id: str) -> list[dict[str, Any]]:
    """The history of the offline W&B run ``run_id`` as one uninterrupted run logged it: each
    attempt's rows up to the step the next attempt starts at (rows a killed attempt logged after
    its checkpoint are superseded by the resumed attempt's, which carry the same ``_step``s).

    Raises:
        FileNotFoundError: no offline run of that id under ``save_dir``.
    """
    segments = offline_segments(save_dir, run_id)
    if not segments:
        raise FileNotFoundError(f"no offline W&B run {run_id} under {Path(save_dir) / 'wandb'}")
    rows: list[dict[str, Any]] = []
    for segment in segments:
        new = _segment_rows(segment)
        start = new[0]["_step"] if new else None
        rows = [r for r in rows if start is None or r["_step"] < start] + new
    return rows


def continue_offline_history(logger: Any, before_step: int) -> None:
    """Start the resumed attempt of an offline W&B run at the ``_step`` an uninterrupted run
    would log next: after the rows its earlier attempts logged below training step
    ``before_step`` (the checkpoint's). W&B alone restarts an offline attempt at step 0, so the
    attempts could not be read as one run, nor synced into one."""
    if not isinstance(logger, _LightningWandbLogger) or not wandb_init(logger).get("id"):
        return
    init = wandb_init(logger)
    if not (wandb_offline(logger) or init.get("mode") == "offline"):
        return  # online, W&B resumes the run at its own last step
    save_dir = logger.save_dir or init.get("dir") or "."
    if not offline_segments(save_dir, init["id"]):
        return
    rows = offline_history(save_dir, init["id"])
    kept = next(
        (i for i, r in enumerate(rows) if r.get("trainer/global_step", -1) >= before_step),
        len(rows),
    )
    if kept:
        logger.experiment.log({}, step=int(rows[kept - 1]["_step"]) + 1, commit=False)
