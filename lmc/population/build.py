"""Building a population's members after the first by calling their classes directly.

The CLI builds member k's task by ``seed_everything(s_k)`` and jsonargparse's
``instantiate_classes`` of the model's config; most of that time (~2.5 of 5.7 ms a member for
the MNIST MLP on a 2-core CPU, more on slower hosts, where 64 members took 1.9 s) is the
parser adapting type hints, which is the same for every member. :class:`DirectBuild` replays
the same construction for another seed without it: the networks in the config rebuilt from
their class and plain init args right after seeding (the same draws from the same generator),
the callables the parser made (an optimizer, a scheduler: stateless ``partial`` objects) shared
with the first member, and the task's class called inside the hyper-parameter context the CLI
gives it, so that it saves the same ``hparams``.

It is used only after :meth:`DirectBuild.matches` has held for a seed against the CLI's own
build: the same class, state dict, hyper-parameters and random-generator state after the
build (so no draw was added, left out or moved). A config it cannot replay (a nested object
that is neither a network with plain arguments nor a callable, ``dict_kwargs``) gets ``None``
from :meth:`DirectBuild.plan`.
"""

from __future__ import annotations

import copy
import importlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from jsonargparse import Namespace
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch import LightningModule
from torch import nn

from lmc.engine.seam import given_hyperparameters_context

_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


def _import(class_path: str) -> Any:
    """The class a config's ``class_path`` names, or ``None`` if it cannot be imported."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


class DirectBuild:
    """Member tasks of one model config, built as the CLI builds them but without its parser.

    Built by :meth:`plan` from the parsed ``model`` config and the first member's task (built
    by the CLI from it); called with a seed, it returns that member's task.
    """

    def __init__(self, first: LightningModule, steps: list[tuple[str, str, Any]]) -> None:
        self.cls = type(first)
        self.steps = steps  # (name, kind, value): how each init argument is made
        hparams = dict(first.hparams)
        self.instantiator = hparams.pop("_instantiator")  # plan() checked it is there
        self.hparams = hparams

    @classmethod
    def plan(cls, model_cfg: Namespace, first: LightningModule) -> DirectBuild | None:
        """The replay of ``model_cfg``'s construction, or ``None`` where it has a part this
        cannot rebuild exactly without the parser."""
        cfg = vars(model_cfg)
        if set(cfg) - {"class_path", "init_args"} or not isinstance(cfg.get("class_path"), str):
            return None
        if _import(cfg["class_path"]) is not type(first) or "_instantiator" not in first.hparams:
            return None
        steps = []
        for name, value in vars(cfg.get("init_args") or Namespace()).items():
            if isinstance(value, Namespace):
                sub = vars(value)
                args = sub.get("init_args")
                args = vars(args) if isinstance(args, Namespace) else (args or {})
                made = getattr(first, name, None)
                if set(sub) - {"class_path", "init_args"} or not isinstance(
                    sub.get("class_path"), str
                ):
                    return None
                factory = _import(sub["class_path"])
                # a network: its whole state is in the state dict that matches() compares
                if isinstance(made, nn.Module) and type(made) is factory and _plain(args):
                    steps.append((name, "build", (factory, dict(args))))
                elif callable(made) and not isinstance(made, nn.Module):
                    steps.append((name, "share", made))  # the parser's partial: no state
                else:
                    return None
            elif _plain(value):
                steps.append((name, "value", value))  # copied for each member
            elif callable(value) and not isinstance(value, nn.Module):
                steps.append((name, "share", value))  # a default callable, passed as is
            else:
                return None
        return cls(first, steps)

    def __call__(self, seed: int) -> LightningModule:
        """Member ``seed``'s task: seeded, its networks built, then the task itself."""
        seed_everything(seed, workers=True)
        kwargs: dict[str, Any] = {}
        for name, kind, value in self.steps:
            if kind == "build":
                factory, args = value
                kwargs[name] = factory(**copy.deepcopy(args))
            else:
                kwargs[name] = copy.deepcopy(value) if kind == "value" else value
        # a deep copy: each member owns its hyper-parameters, as each CLI build does
        with given_hyperparameters_context(copy.deepcopy(self.hparams), self.instantiator):
            return self.cls(**kwargs)

    def matches(
        self, seed: int, cli_build: Callable[[int], LightningModule]
    ) -> LightningModule | None:
        """The CLI's build of member ``seed`` if this build equals it (class, state dict,
        hyper-parameters and the random generator's state after building), else ``None``."""
        ours = self(seed)
        rng = _rng_states()
        theirs = cli_build(seed)
        if type(ours) is not type(theirs) or not _same_rng(rng, _rng_states()):
            return None
        if dict(ours.hparams) != dict(theirs.hparams):
            return None
        if dict(ours.hparams_initial) != dict(theirs.hparams_initial):
            return None
        return theirs if same_state(ours, theirs) else None


def same_state(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules hold equal state dicts (the same keys, equal tensors)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _rng_states() -> tuple[Any, ...]:
    """The generators ``seed_everything`` seeds: torch's (CPU), numpy's and Python's."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _same_rng(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    (ta, na, pa), (tb, nb, pb) = a, b
    same_numpy = na[0] == nb[0] and np.array_equal(na[1], nb[1]) and na[2:] == nb[2:]
    return torch.equal(ta, tb) and same_numpy and pa == pb
