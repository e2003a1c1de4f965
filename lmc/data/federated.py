"""Non-IID client splits for federated learning (FedMA, Wang et al. 2020; 000 §5): every class's
examples are shared among the clients by proportions drawn from a Dirichlet(alpha) distribution
(small alpha: each client sees few classes; large alpha: close to IID). Pure NumPy, seeded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def dirichlet_split(
    labels: Sequence[int] | np.ndarray | Tensor,
    num_clients: int,
    alpha: float,
    seed: int = 0,
    min_size: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Indices of each client's examples: class ``c``'s examples split by ``p ~ Dir(alpha 1_J)``.

    Args:
        labels: the class of every example.
        num_clients: J >= 1 clients.
        alpha: concentration (> 0).
        seed: seed of the proportions and of the shuffling within each class.
        min_size: every client gets at least this many examples (the draw is repeated until it
            does, at most ``max_tries`` times).

    Raises:
        ValueError: ``alpha <= 0``, fewer than one client, more clients than the examples of
            some class, or no draw giving every client ``min_size`` examples.
    """
    if not alpha > 0:
        raise ValueError(f"Dirichlet alpha must be > 0, got {alpha}")
    if num_clients < 1:
        raise ValueError(f"need at least 1 client, got {num_clients}")
    y = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels).reshape(-1)
    classes, counts = np.unique(y, return_counts=True)
    if num_clients > counts.min():
        c = classes[counts.argmin()]
        raise ValueError(
            f"{num_clients} clients but class {c} has only {counts.min()} examples; use at most "
            f"{counts.min()} clients or more data"
        )
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for j, chunk in enumerate(np.split(idx, cuts)):
                parts[j].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(o) for o in out) >= min_size:
            return out
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) draw in {max_tries} gave all {num_clients} clients "
        f"{min_size} examples; raise alpha or lower min_size"
    )


def client_class_counts(
    labels: Sequence[int] | np.ndarray | Tensor, parts: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
    """``(clients, classes)`` example counts of a split (FedMA weights the output layer by them)."""
    y = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels).reshape(-1)
    return np.stack([np.bincount(y[p], minlength=num_classes) for p in parts])


def client_batches(
    x: Tensor, y: Tensor, parts: Sequence[np.ndarray], batch_size: int
) -> list[list[tuple[Tensor, Tensor]]]:
    """Each client's examples as a list of ``(x, y)`` batches (in index order; training
    shuffles the batch order)."""
    out = []
    for p in parts:
        idx = torch.as_tensor(p, dtype=torch.long)
        out.append([(x[b], y[b]) for b in idx.split(batch_size)])
    return out
