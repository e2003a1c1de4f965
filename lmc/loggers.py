"""Logger defaults: W&B offline unless asked otherwise, so no run ever waits for a login."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger


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
