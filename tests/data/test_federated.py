"""FedMA's clients as a data module (lmc.data.FederatedClients): a seeded Dirichlet split of the
wrapped module's training examples, one client's share as the training split, every client's
batches for the merge, the other splits whole; bad settings refused by name."""

from __future__ import annotations

import pytest
import torch

from lmc.data import FederatedClients, MNISTDataModule, write_fake_mnist


def _clients(root, **kwargs) -> FederatedClients:
    data = MNISTDataModule(data_dir=str(root), batch_size=16, val_size=20, alignment_size=20)
    return FederatedClients(data, **kwargs)


def test_clients_share_the_training_examples_and_keep_the_other_splits(tmp_path):
    write_fake_mnist(tmp_path, "MNIST", n_train=240, n_test=32)
    whole = _clients(tmp_path, clients=3, alpha=0.5, split_seed=1)
    whole.setup("fit")
    n = len(whole.train_dataset)
    parts = whole.parts()
    assert sorted(int(i) for p in parts for i in p) == list(range(n))  # disjoint, complete
    again = _clients(tmp_path, clients=3, alpha=0.5, split_seed=1)
    again.setup("fit")
    assert all((a == b).all() for a, b in zip(parts, again.parts()))  # seeded
    batches = whole.client_batches()
    assert [sum(len(y) for _, y in c) for c in batches] == [len(p) for p in parts]
    for j in range(3):
        one = _clients(tmp_path, clients=3, alpha=0.5, split_seed=1, client=j)
        one.setup("fit")
        assert len(one.train_dataset) == len(parts[j])
        labels = torch.cat([y for _, y in batches[j]])
        assert torch.equal(labels, one.train_dataset.labels[one.train_dataset.indices])
        assert len(one.val_dataset) == len(whole.val_dataset) == 20
        assert len(one.alignment_dataset) == 20 and one.num_classes == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clients": 1}, "data.init_args.clients must be >= 2"),
        ({"alpha": 0.0}, "data.init_args.alpha must be > 0"),
        ({"clients": 3, "client": 3}, r"data.init_args.client must be null .* in \[0, 3\)"),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _clients(tmp_path, **kwargs)
