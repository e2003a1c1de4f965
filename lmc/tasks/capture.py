"""The captured training step (issue 30): a whole training step — forward, loss, backward and the
optimizer step — recorded once as a CUDA graph and replayed for every batch of the same shape.

A small network's step on a GPU is bound by the CPU launching its ~100 kernels one by one, not by
the arithmetic; a replayed graph launches them all at once (the MNIST MLP's step on an H100: 1.7
ms eager, 0.36 ms replayed). The replay computes what the eager step computes, in the same
kernels; only the order of the first steps' allocations differs.

What a graph fixes at capture, and so what this step asks of a run (checked by
:func:`capture_problems` before training, each named with its fix): a CUDA device and one
process; 32-bit precision (no autocast or gradient scaler); no LR scheduler (the learning rate is
a constant of the recorded optimizer step); an optimizer whose state lives on the device
(``capturable`` where it has the flag: Adam, AdamW, ...; set here); parameters that stay the same
tensors (no pruning re-parametrisation). Batches of another shape (the epoch's last, smaller one)
run eagerly with the same weights and optimizer state. Callbacks' ``on_before_optimizer_step``
and backward hooks do not run for replayed steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lmc.engine.seam import counted_step

#: eager steps on a side stream before the capture (lazy state, cuBLAS workspaces, autotuning)
WARMUP_STEPS = 3


def capture_problems(task: Any, trainer: Any) -> list[str]:
    """What keeps ``task`` from replaying its training step under ``trainer``, one line each."""
    problems = []
    if trainer.strategy.root_device.type != "cuda":
        problems.append(
            f"capture_step needs a CUDA device (this run trains on "
            f"{trainer.strategy.root_device}): drop capture_step, or train on a GPU"
        )
    if trainer.world_size > 1:
        problems.append(
            f"capture_step records one process's step ({trainer.world_size} processes here): "
            "train on one device, or drop capture_step"
        )
    precision = str(trainer.precision)
    if precision not in ("32-true", "32", "64-true", "64"):
        problems.append(
            f"capture_step replays 32-bit steps (precision {precision!r}): drop the precision "
            "overlay or capture_step"
        )
    if task.lr_scheduler is not None:
        problems.append(
            "capture_step fixes the learning rate when it records the optimizer step, so an "
            "lr_scheduler would not act: drop lr_scheduler or capture_step"
        )
    if task.automatic_optimization:
        problems.append(
            "capture_step replays the task's own step, which Lightning's gradient clipping or "
            "accumulation replaces: drop trainer.gradient_clip_val / accumulate_grad_batches, or "
            "capture_step"
        )
    if any("ModelPruning" in type(c).__name__ for c in trainer.callbacks):
        problems.append(
            "capture_step needs parameters that stay the same tensors, and pruning "
            "re-parametrises them: drop the pruning callback or capture_step"
        )
    return problems


def planned_capture_problems(config: Any, cuda_here: bool | None) -> list[str]:
    """What keeps a run of the resolved ``config`` (``capture_step`` set) from capturing its
    step, known before it starts: no CUDA device where it runs (``cuda_here``: whether this
    machine has one and the run trains here; ``None``: it trains elsewhere, e.g. SLURM), a
    precision other than 32/64-bit, an lr_scheduler. A study checks these when it plans; the
    task checks all of :func:`capture_problems` when it starts."""
    init = (config.get("model") or {}).get("init_args") or {}
    if not init.get("capture_step"):
        return []
    trainer = config.get("trainer") or {}
    problems = []
    accelerator = str(trainer.get("accelerator") or "auto").lower()
    if accelerator == "cpu" or (cuda_here is False and accelerator in ("auto", "gpu", "cuda")):
        problems.append(
            f"capture_step needs a CUDA device (trainer.accelerator={accelerator}"
            f"{', and this machine, where the jobs run, has none' if cuda_here is False else ''}"
            "): drop the capture overlay, or run on a GPU (with --executor submitit the jobs' "
            "own machines decide)"
        )
    precision = str(trainer.get("precision") or "32-true")
    if precision not in ("32-true", "32", "64-true", "64"):
        problems.append(
            f"capture_step replays 32-bit steps (precision {precision!r}): drop the precision "
            "overlay or capture_step"
        )
    if init.get("lr_scheduler"):
        problems.append(
            "capture_step fixes the learning rate when it records the optimizer step, so an "
            "lr_scheduler would not act: drop lr_scheduler or capture_step"
        )
    return problems


class CapturedStep:
    """The training step of a :class:`~lmc.tasks.classification.TrainTask`, replayed.

    Call it with the task's ``LightningOptimizer`` and a batch ``(x, y)``; it returns the
    step's ``(output, loss)``, or ``None`` for a batch it does not take (another shape: the
    caller runs that step eagerly). The first :data:`WARMUP_STEPS` batches of the captured shape
    step eagerly on a side stream, the next one is recorded and replayed, every later one
    replayed. Lightning's step count advances as for an eager step.
    """

    def __init__(self, task: Any) -> None:
        self.task = task
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[Tensor, Tensor] | None = None
        self.result: tuple[Tensor, Tensor] | None = None
        self.warm = 0

    def takes(self, x: Tensor, y: Tensor) -> bool:
        if self.static is None:
            return True
        sx, sy = self.static
        return x.shape == sx.shape and y.shape == sy.shape and x.dtype == sx.dtype

    def __call__(self, optimizer: Any, batch: Any) -> tuple[Tensor, Tensor] | None:
        x, y = batch
        if not self.takes(x, y):
            return None
        if self.static is None:  # the first batch: its shape is the one recorded
            device_state(optimizer.optimizer, x.device)
            self.static = (x.clone(), y.clone())
        if self.warm < WARMUP_STEPS:  # the graph is recorded after these
            self.warm += 1
            return self._side_stream_step(optimizer, x, y)
        sx, sy = self.static
        sx.copy_(x)
        sy.copy_(y)
        if self.graph is None:
            self._record(optimizer, sx, sy)
        assert self.graph is not None and self.result is not None  # recorded above
        with counted_step(optimizer):  # Lightning's step count (the manual loop's hooks)
            self.graph.replay()
        out, loss = self.result
        return out, loss.clone()

    def _side_stream_step(self, optimizer: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        stream = torch.cuda.Stream(x.device)
        stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(stream):
            optimizer.zero_grad()
            out = self.task(x)
            loss = self.task.loss(out, y)
            loss.backward()
            optimizer.step()
        torch.cuda.current_stream(x.device).wait_stream(stream)
        return out.detach(), loss.detach()

    def _record(self, optimizer: Any, sx: Tensor, sy: Tensor) -> None:
        optimizer.zero_grad()  # the recorded backward writes the gradients, not adds to them
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.task(sx)
            loss = self.task.loss(out, sy)
            loss.backward()
            optimizer.optimizer.step()
        self.graph, self.result = graph, (out.detach(), loss.detach())


def device_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make ``optimizer`` step with its state on ``device``: ``capturable`` where it has the flag,
    and step counts loaded from a checkpoint moved there (as torch keeps them for capturable
    optimizers)."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)
