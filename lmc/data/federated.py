"""Non-IID client splits for federated learning (FedMA, Wang et al. 2020; 000 §5): every class's
examples are shared among the clients by proportions drawn from a Dirichlet(alpha) distribution
(small alpha: each client sees few classes; large alpha: close to IID), seeded;
:class:`FederatedClients` is such a split of a data module's training examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lmc.data.base import BaseDataModule
from lmc.data.memory import InMemoryImageDataset, collate


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


class FederatedClients(BaseDataModule):
    """FedMA's clients (000 §5) as a data module: the training examples of ``data`` shared
    among ``clients`` by a Dirichlet(``alpha``) split of every class (:func:`dirichlet_split`,
    seeded ``split_seed``), e.g.::

        data:
          class_path: lmc.data.FederatedClients
          init_args:
            clients: 5
            alpha: 0.5
            client: 0          # this run trains client 0; null: all the training examples
            data:
              class_path: lmc.data.MNISTDataModule
              init_args: {batch_size: 20, val_size: 5000, alignment_size: 5000}

    With ``client: j`` the training split is client j's examples (a client trained by
    ``lmc fit``); with ``client: null`` it is the whole training split, and
    :meth:`client_batches` gives every client's batches, which the ``fedma`` merge method
    retrains the clients on (``lmc validate`` with :class:`~lmc.tasks.MergeTask`, the
    checkpoints in client order). Validation, the alignment subset and test are ``data``'s,
    whole, as are its loader settings.

    Args:
        data: an image-classification data module of ``lmc``.
        clients: the number of clients J (>= 2).
        alpha: the Dirichlet concentration (> 0; small: each client sees few classes).
        client: the client whose examples are the training split, or ``None`` for all.
        split_seed: seed of the split (the same for every client of one federation).

    Raises:
        ValueError: fewer than 2 clients, ``alpha <= 0``, a client outside ``[0, clients)``, or
            a data module that does not hold its training split in memory.
    """

    #: a client's model learns the federation's data, whichever client it is
    model_keys: ClassVar[tuple[str, ...]] = ("clients", "alpha", "split_seed")

    def __init__(
        self,
        data: BaseDataModule,
        clients: int = 5,
        alpha: float = 0.5,
        client: int | None = None,
        split_seed: int = 0,
    ) -> None:
        if clients < 2:
            raise ValueError(f"data.init_args.clients must be >= 2, got {clients}")
        if not alpha > 0:
            raise ValueError(f"data.init_args.alpha must be > 0, got {alpha}")
        if client is not None and not 0 <= client < clients:
            raise ValueError(
                f"data.init_args.client must be null (all clients) or in [0, {clients}), got "
                f"{client}"
            )
        super().__init__(data.batch_size, data.eval_batch_size, data.num_workers, data.on_device)
        self.data = data
        self.clients, self.alpha, self.client, self.split_seed = clients, alpha, client, split_seed
        self._parts: list[np.ndarray] | None = None

    def __getattr__(self, name: str) -> Any:
        # the wrapped module's attributes (num_classes, task, mean, std, data_dir, ...)
        if name in ("data", "clients", "alpha", "client", "split_seed") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.data, name)

    def prepare_data(self) -> None:
        self.data.prepare_data()

    def _whole_train(self) -> InMemoryImageDataset:
        train = self.data.train_dataset
        if not isinstance(train, InMemoryImageDataset):
            raise ValueError(
                "FederatedClients splits lmc's in-memory image datasets, got "
                f"{type(train).__name__}"
            )
        return train

    def parts(self) -> list[np.ndarray]:
        """Each client's positions in ``data``'s training split (sorted)."""
        if self._parts is None:
            train = self._whole_train()
            labels = train.labels[train.indices]
            self._parts = dirichlet_split(labels, self.clients, self.alpha, self.split_seed)
        return self._parts

    def _client(self, j: int) -> InMemoryImageDataset:
        return self._whole_train().subset(torch.as_tensor(self.parts()[j], dtype=torch.long))

    def _setup_fit(self) -> None:
        d = self.data
        d.setup("fit")
        self._train = d.train_dataset if self.client is None else self._client(self.client)
        self._val, self._alignment = d.val_dataset, d.alignment_dataset

    def _setup_test(self) -> None:
        self.data.setup("test")
        self._test = self.data.test_dataset

    def client_batches(self, device: Any = None) -> list[list[tuple[Tensor, Tensor]]]:
        """Every client's training examples as ``(x, y)`` batches of ``batch_size``, in a fixed
        order, on ``device`` (FedMA's retraining shuffles the batch order)."""
        out = []
        for j in range(self.clients):
            loader = DataLoader(self._client(j), batch_size=self.batch_size, collate_fn=collate)
            out.append([(x.to(device), y.to(device)) for x, y in loader])
        return out
