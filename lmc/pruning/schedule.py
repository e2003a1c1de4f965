"""Pruning strategies as a schedule of events (000 §4.3, A.3), independent of any trainer.

- ``only_prune``: train, then prune the trained model once (no further training).
- ``lottery_ticket``: train, prune, rewind the surviving weights to their initial values and
  retrain with the mask fixed (Frankle & Carbin, 2018); with ``rounds > 1`` the train-prune-rewind
  cycle repeats towards the target rate (iterative magnitude pruning).
- ``finetune_once``: train, prune to the target rate once, fine-tune with the mask fixed.
- ``iterative``: prune and fine-tune ``rounds`` times, reaching the target rate at the last round.

000 finds ``finetune_once`` gives the best connectivity after re-basin (§4.3) and keeps the
fine-tuning hyper-parameters equal to training (A.1.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Strategy = Literal["only_prune", "lottery_ticket", "finetune_once", "iterative"]
RateSchedule = Literal["geometric", "linear"]
STRATEGIES: tuple[str, ...] = ("only_prune", "lottery_ticket", "finetune_once", "iterative")


@dataclass(frozen=True)
class PruneEvent:
    """Prune to ``rate`` at the start of ``epoch`` (``None``: after the last epoch)."""

    epoch: int | None
    rate: float
    rewind: bool


def rate_schedule(rate: float, rounds: int, kind: RateSchedule = "geometric") -> list[float]:
    """Cumulative rates of ``rounds`` pruning rounds ending exactly at ``rate``.

    ``geometric`` keeps the same fraction of the surviving weights each round,
    r_k = 1 − (1 − r)^{k/R} (the usual iterative magnitude pruning schedule); ``linear`` uses
    r_k = r · k / R.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"target rate must lie in [0, 1), got {rate}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if kind == "geometric":
        rates = [1.0 - (1.0 - rate) ** (k / rounds) for k in range(1, rounds + 1)]
    elif kind == "linear":
        rates = [rate * k / rounds for k in range(1, rounds + 1)]
    else:
        raise ValueError(f"rate schedule must be 'geometric' or 'linear', got {kind!r}")
    rates[-1] = rate
    return rates


def pruning_events(
    strategy: Strategy,
    rate: float,
    prune_epoch: int = 0,
    rounds: int = 1,
    every_n_epochs: int = 1,
    schedule: RateSchedule = "geometric",
) -> list[PruneEvent]:
    """The events of ``strategy`` inside one training run.

    Args:
        strategy: one of :data:`STRATEGIES`.
        rate: the target rate, reached by the last event.
        prune_epoch: epoch at whose start the first pruning happens (dense training before it);
            ignored by ``only_prune``, which prunes after the last epoch.
        rounds: pruning rounds (``finetune_once`` and ``only_prune`` need 1, ``iterative`` >= 2).
        every_n_epochs: epochs of (re)training between rounds.
        schedule: how the rate grows over rounds (see :func:`rate_schedule`).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown pruning strategy {strategy!r}; use one of {STRATEGIES}")
    if strategy in ("only_prune", "finetune_once") and rounds != 1:
        raise ValueError(f"strategy {strategy!r} prunes once: set rounds=1 (got {rounds})")
    if strategy == "iterative" and rounds < 2:
        raise ValueError("strategy 'iterative' needs rounds >= 2; use 'finetune_once' for one")
    if prune_epoch < 0 or every_n_epochs < 1:
        raise ValueError(
            f"need prune_epoch >= 0, every_n_epochs >= 1; got {prune_epoch}, {every_n_epochs}"
        )
    if strategy == "only_prune":
        return [PruneEvent(None, rate_schedule(rate, 1)[0], rewind=False)]
    rewind = strategy == "lottery_ticket"
    return [
        PruneEvent(prune_epoch + k * every_n_epochs, r, rewind)
        for k, r in enumerate(rate_schedule(rate, rounds, schedule))
    ]
