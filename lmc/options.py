"""What every option group shares (the groups themselves: :mod:`lmc.curves.options` for the curve
tasks, :mod:`lmc.tasks.options` for the others): the evaluated splits, reading a group back from
a mapping, and the checks of a frozen dataclass's fields. Plain dataclasses, no Lightning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

#: the splits a task caches (``train`` is the alignment subset of the training split)
Split = Literal["train", "val", "test"]

T = TypeVar("T")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """A ``ValueError`` naming the option ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def set_field(obj: Any, name: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass (in its ``__post_init__``)."""
    object.__setattr__(obj, name, value)


def as_options(cls: type[T], value: T | Mapping[str, Any] | None, default: T | None = None) -> T:
    """``value`` as an instance of the option dataclass ``cls``.

    ``None`` gives ``default`` (else ``cls()``); a mapping of the fields (from a checkpoint's
    hyper-parameters, possibly as ``{class_path, init_args}``) is passed to ``cls``.
    """
    if value is None:
        return default if default is not None else cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        fields = value.get("init_args", {}) if "class_path" in value else value
        return cls(**dict(fields))
    raise TypeError(
        f"expected {cls.__name__}, a mapping of its fields or None, got {type(value).__name__}"
    )


@dataclass(frozen=True)
class EvaluationOptions:
    """Where a task evaluates its models (the ``evaluation`` group of every task extends it).

    Args:
        splits: the evaluated splits, ``train`` meaning the alignment subset of train; the last
            one is reported (``test`` by default).
        max_batches: cap on the cached batches per split (quick looks; ``None``: all).
    """

    splits: list[Split] = field(default_factory=lambda: ["train", "test"])
    max_batches: int | None = None

    def __post_init__(self) -> None:
        splits = list(self.splits) if self.splits else ["train", "test"]
        bad = [s for s in splits if s not in ("train", "val", "test")]
        if bad or len(set(splits)) != len(splits):
            raise ValueError(
                f"evaluation.splits must list distinct splits among train, val, test; got {splits}"
            )
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"evaluation.max_batches must be >= 1, got {self.max_batches}")
        set_field(self, "splits", splits)
