"""The kinds of claim test, in one place, as the study's stage and figure kinds are
(:data:`lmc.studies.spec.schema.EVALUATE_KINDS`, :data:`lmc.studies.reporting.figure_spec.FIGURE_KINDS`):
what each takes in a study file and how it is read, declared on it instead of tested by name.

A kind's two parts are functions registered on it by the modules that hold them: ``cells``
(its cells read from the claim's mapping, :mod:`lmc.studies.claims.cells`) and ``evaluate``
(its estimate, interval and verdict, :mod:`lmc.studies.claims.evaluators`); :meth:`ClaimTest.part`
imports that module on first use. A new test is one entry here and one function in each.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: part name -> the module that registers it for every kind
PART_MODULES = {
    "cells": "lmc.studies.claims.cells",
    "evaluate": "lmc.studies.claims.evaluators",
}


@dataclass(frozen=True)
class ClaimTest:
    """A kind of claim test.

    Attributes:
        name: the study file's ``test``.
        expects: the ``expect`` values it takes.
        metric_key: the claim's key naming the metric it reads (a fit's ``y``).
        replicated: its cells are compared replicate by replicate (a fit regresses over every
            job of its stage instead).
        pilot_only: its estimate is not a mean over replicates, so a ``replicates: auto`` study
            decides it on the pilot alone (no two-stage test).
        takes_margin: it takes a ``margin`` (an equivalence).
        takes_effect: it takes the paper's ``effect``.
        relative_effect: its effect may be relative to ``b`` (``effect: '-60%'``).
        relative_effect_on_log: on ``scale: log`` its effect must be relative (a fold change).
        ratio_on_log: on ``scale: log`` its estimate reads as a ratio ``a / b``.
        has_scale: it takes ``scale`` (a fit's model already says it).
        has_xscale: it takes ``xscale`` (a trend's axis).
        templated_x: a ``{x}`` in its metric is filled with each of its ``x_values``.
        reads_x_metric: its ``x`` is a metric its stage reports too (a fit's).
        bounded_effect: whether its paper effect is bounded by the metric's start (a fall
            larger than a nonnegative metric's value is out of reach).
        noun: how its claims are named in a sentence (default ``a {name} claim``).
    """

    name: str
    expects: tuple[str, ...]
    metric_key: str = "metric"
    replicated: bool = True
    pilot_only: bool = False
    takes_margin: bool = False
    takes_effect: bool = True
    relative_effect: bool = False
    relative_effect_on_log: bool = False
    ratio_on_log: bool = False
    has_scale: bool = True
    has_xscale: bool = False
    templated_x: bool = False
    reads_x_metric: bool = False
    bounded_effect: bool = False
    noun: str = ""
    parts: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False)

    @property
    def called(self) -> str:
        """How its claims are named in a sentence."""
        return self.noun or f"a {self.name} claim"

    def register(self, part: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` as this kind's ``part`` (``cells`` or ``evaluate``)."""

        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.parts[part] = fn
            return fn

        return add

    def part(self, part: str) -> Callable[..., Any]:
        """This kind's ``part`` (its module imported)."""
        if part not in self.parts:
            importlib.import_module(PART_MODULES[part])
        return self.parts[part]


#: test name -> :class:`ClaimTest`
CLAIM_TESTS: dict[str, ClaimTest] = {
    t.name: t
    for t in (
        ClaimTest(
            "difference",
            ("greater", "less"),
            relative_effect=True,
            relative_effect_on_log=True,
            ratio_on_log=True,
            bounded_effect=True,
        ),
        ClaimTest(
            "equivalent",
            ("equal",),
            pilot_only=True,
            takes_margin=True,
            takes_effect=False,
            ratio_on_log=True,
            noun="an equivalence claim",
        ),
        ClaimTest("ordering", ("descending", "ascending"), relative_effect_on_log=True),
        ClaimTest(
            "trend",
            ("increasing", "decreasing", "peaked", "valley"),
            has_xscale=True,
            templated_x=True,
        ),
        ClaimTest(
            "fit",
            ("increasing", "decreasing"),
            metric_key="y",
            replicated=False,
            pilot_only=True,
            has_scale=False,
            reads_x_metric=True,
            noun="a fit claim",
        ),
    )
}
