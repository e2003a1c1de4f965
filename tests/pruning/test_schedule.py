"""Pruning strategies as events (000 §4.3, A.3) and rate schedules."""

from __future__ import annotations

import pytest

from lmc.pruning import STRATEGIES, PruneEvent, pruning_events, rate_schedule


def test_geometric_schedule_keeps_the_same_fraction_each_round():
    rates = rate_schedule(0.875, 3)
    assert rates == pytest.approx([0.5, 0.75, 0.875]) and rates[-1] == 0.875
    assert rate_schedule(0.6, 3, "linear") == pytest.approx([0.2, 0.4, 0.6])
    assert rate_schedule(0.3, 1) == [0.3]


def test_events_of_each_strategy():
    assert pruning_events("only_prune", 0.5) == [PruneEvent(None, 0.5, False)]
    assert pruning_events("finetune_once", 0.5, prune_epoch=3) == [PruneEvent(3, 0.5, False)]
    lt = pruning_events("lottery_ticket", 0.75, prune_epoch=2, rounds=2, every_n_epochs=3)
    assert [(e.epoch, e.rewind) for e in lt] == [(2, True), (5, True)]
    assert [e.rate for e in lt] == pytest.approx([0.5, 0.75])
    it = pruning_events("iterative", 0.6, prune_epoch=1, rounds=3, schedule="linear")
    assert [(e.epoch, e.rewind) for e in it] == [(1, False), (2, False), (3, False)]
    assert set(STRATEGIES) == {"only_prune", "lottery_ticket", "finetune_once", "iterative"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "magnitude", "rate": 0.5}, "unknown pruning strategy"),
        ({"strategy": "finetune_once", "rate": 0.5, "rounds": 2}, "rounds=1"),
        ({"strategy": "iterative", "rate": 0.5, "rounds": 1}, "rounds >= 2"),
        ({"strategy": "finetune_once", "rate": 1.0}, r"\[0, 1\)"),
        ({"strategy": "finetune_once", "rate": 0.5, "every_n_epochs": 0}, "every_n_epochs"),
    ],
)
def test_invalid_configurations_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pruning_events(**kwargs)
