"""The lean step's direct path (issue 30): backward and the optimizer step called on torch
itself when every Lightning hook in between would do nothing.

In manual optimization Lightning runs ``manual_backward`` and ``LightningOptimizer.step``
through the strategy and the precision plugin, which dispatch ``on_before_backward``,
``on_after_backward`` and ``on_before_optimizer_step`` to every callback and the module, wrap the
step in two closures and count it. Where the strategy and the plugin are the base classes' (one
device; 32-, 64- or true half precision), the module keeps ``LightningModule.backward``, and
no callback or module overrides those hooks, all of that is ``loss.backward()``, the step count
and ``optimizer.step()``: the same arithmetic (tested bit for bit), without ~0.1-0.3 ms of
Python a step. Anything else (DDP, mixed precision's scaler, a callback logging gradient norms)
keeps Lightning's path.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor

from lmc.engine.seam import counted_step

#: the hooks Lightning dispatches between a manual step's loss and its parameter update
HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
_STRATEGY = ("backward", "pre_backward", "post_backward", "optimizer_step")
_PRECISION: tuple[str, ...] = ("pre_backward", "backward", "post_backward", "optimizer_step")
_PRECISION += ("_wrap_closure", "_after_closure")


def direct_step_allowed(task: L.LightningModule, trainer: L.Trainer) -> bool:
    """Whether Lightning's backward and optimizer step would do exactly ``loss.backward()``,
    count the step and ``optimizer.step()`` for ``task`` under ``trainer``."""
    strategy, precision = type(trainer.strategy), type(trainer.precision_plugin)
    if any(getattr(strategy, name) is not getattr(Strategy, name) for name in _STRATEGY):
        return False
    if any(getattr(precision, name) is not getattr(Precision, name) for name in _PRECISION):
        return False
    if getattr(task, "_fabric", None) is not None or is_overridden("backward", task):
        return False
    if any(is_overridden(hook, task) for hook in HOOKS):
        return False
    return not any(
        is_overridden(hook, cb, L.Callback)
        for cb in trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning, undeclared
        for hook in HOOKS
    )


def direct_step(optimizer: Any, loss: Tensor) -> None:
    """Backward through ``loss`` and step the torch optimizer inside ``optimizer`` (a
    ``LightningOptimizer``), counting the step as Lightning's manual loop does."""
    loss.backward()
    with counted_step(optimizer):  # the manual loop's step count (and profiler section)
        optimizer.optimizer.step()
