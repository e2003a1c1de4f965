"""Populations: N seeds of one architecture trained as one vectorised program (``torch.func``).

``lmc fit -c cfg.yaml --population '[0, 1, ..., 15]'`` (see :mod:`lmc.population.fit`); the
algorithm (stacking, vectorised forward, training loop) is pure torch in
:mod:`lmc.population.vectorize` and :mod:`lmc.population.train`.
"""

from lmc.population.train import Population, train_population
from lmc.population.vectorize import (
    ELEMENTWISE_OPTIMIZERS,
    check_vectorizable,
    estimate_bytes,
    population_forward,
    stack_states,
)

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "Population",
    "check_vectorizable",
    "estimate_bytes",
    "population_forward",
    "stack_states",
    "train_population",
]
