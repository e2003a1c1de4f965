"""Fusion on real MNIST MLPs (issue 17; 000 §5): OTFusion and FedMA, each with prune-before-align,
against the plain average; CCMM / MergeMany and Sinkhorn re-basin / weight matching when
``lmc.merging.ccmm`` / ``lmc.merging.sinkhorn`` are present (else ``nan``).

* Endpoints: MLPs 784-512-512-512-10 trained here with SGD (lr 0.05, momentum 0.9, batch 128)
  for ``--epochs`` epochs on the first ``--train-size`` images of the (shuffled) training split
  (seeds 0..models-1; a subset keeps the whole run to a few minutes on 2 cores).
* OTFusion: weight-based ground metric, uniform marginals, base = model 0 (Singh & Jaggi 2020);
  ``otfusion_pruned``: every layer pruned by magnitude to ``--rate`` and fine-tuned once for one
  epoch before alignment (000 §5, ``finetune_once``). No fine-tuning after fusion.
* FedMA: ``--clients`` clients on a Dirichlet(``--alpha``) label split of the training split,
  each trained ``--epochs`` epochs from one shared init, then one round of layer-wise matched
  averaging with one local epoch after each layer (the method's own retraining);
  ``fedma_pruned``: the clients pruned to ``--rate`` (``only_prune``) before matching.
* Every accuracy is on the test split; nothing is selected on it (no tuning happens here).

Run ``LMC_DATA_DIR=<writable copy of the datasets> python benchmarks/fusion.py``; the last line is
``otfusion_acc=... otfusion_pruned_acc=... fedma_acc=... fedma_pruned_acc=... ccmm_acc=...
mergemany_acc=... sinkhorn_barrier=... wm_barrier=... vanilla_avg_acc=...``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._endpoints import require_data  # noqa: E402
from lmc.data import MNISTDataModule  # noqa: E402
from lmc.data.federated import client_batches, client_class_counts, dirichlet_split  # noqa: E402
from lmc.evaluation import cache_batches, evaluate  # noqa: E402
from lmc.interpolation.states import weighted_average  # noqa: E402
from lmc.merging.fedma import fedma, local_train  # noqa: E402
from lmc.merging.otfusion import Pruning, materialize, otfusion  # noqa: E402
from lmc.models import MLP  # noqa: E402
from lmc.permutation import spec_for  # noqa: E402

NAN = float("nan")


def _acc(net: torch.nn.Module, state: dict, test: list) -> float:
    return evaluate(materialize(net, state), test).acc


def _train(net: torch.nn.Module, batches: list, epochs: int, seed: int) -> dict:
    model = materialize(net, net.state_dict())
    local_train(model, batches, epochs, lr=0.05, momentum=0.9, seed=seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _others(net, states, spec, test) -> dict[str, float]:
    """CCMM / MergeMany and Sinkhorn / WM barriers from the other engineer's functions."""
    out = dict(ccmm_acc=NAN, mergemany_acc=NAN, sinkhorn_barrier=NAN, wm_barrier=NAN)
    try:
        importlib.import_module("lmc.merging.ccmm")
        from lmc.merging import ccmm_merge, merge_many_perms, parameter_keys
        from lmc.merging.baselines import align_states

        keys = parameter_keys(net)
        out["ccmm_acc"] = _acc(net, ccmm_merge(states, spec, keys=keys), test)
        perms = merge_many_perms(states, spec, keys=keys)
        out["mergemany_acc"] = _acc(net, weighted_average(align_states(states, spec, perms)), test)
    except (ImportError, AttributeError) as err:
        print(f"CCMM not available ({err}); ccmm_acc/mergemany_acc = nan")
    try:
        importlib.import_module("lmc.merging.sinkhorn")
        from lmc.interpolation.barrier import alpha_grid, barrier
        from lmc.interpolation.states import lerp_state
        from lmc.merging import sinkhorn_rebasin
        from lmc.permutation import apply_permutation, weight_matching

        def path_barrier(a: dict, b: dict) -> float:
            alphas = alpha_grid(25)
            losses = [evaluate(materialize(net, lerp_state(a, b, t)), test).loss for t in alphas]
            return barrier(alphas, losses).loss

        a, b = states[0], states[1]
        # ~200 optimiser steps (the standalone measurement's budget), over the alignment batches
        epochs = max(1, -(-200 // len(_ALIGN)))
        _, aligned, _ = sinkhorn_rebasin(net, a, b, _ALIGN, spec=spec, seed=0, epochs=epochs)
        out["sinkhorn_barrier"] = path_barrier(a, aligned)
        wm = weight_matching(a, b, spec).perm
        out["wm_barrier"] = path_barrier(a, apply_permutation(b, spec, wm))
    except (ImportError, AttributeError) as err:
        print(f"Sinkhorn re-basin not available ({err}); sinkhorn/wm_barrier = nan")
    return out


_ALIGN: list = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=12000, help="training images used")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    require_data("MNIST", "benchmarks/fusion.py")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    torch.manual_seed(0)  # the training loader's shuffle
    dm = MNISTDataModule(batch_size=128, eval_batch_size=2000, val_size=5000, alignment_size=5000)
    dm.setup("fit")
    dm.setup("test")
    train = cache_batches(dm.train_dataloader())[: -(-args.train_size // 128)]
    test = cache_batches(dm.test_dataloader())
    _ALIGN[:] = cache_batches(dm.alignment_dataloader())
    net = MLP(784, 10, width=512, depth=3)
    spec = spec_for(net)

    states = []
    for seed in range(args.models):
        torch.manual_seed(seed)
        states.append(_train(MLP(784, 10, width=512, depth=3), train, args.epochs, seed))
    ends = [_acc(net, s, test) for s in states]
    print(
        f"{args.models} MLPs ({args.epochs} epochs): test acc {ends} [{time.perf_counter() - t0:.0f} s]"
    )
    vanilla = _acc(net, weighted_average(states), test)
    fused = otfusion(states, spec)
    ot_acc = _acc(net, fused.state, test)
    finetune = functools.partial(local_train, batches=train, epochs=1, lr=0.01, momentum=0.9)
    pruning = Pruning(args.rate, "finetune_once", finetune=finetune)
    ot_pruned = _acc(net, otfusion(states, spec, net=net, pruning=pruning).state, test)
    print(f"OTFusion {ot_acc:.4f}, pruned {ot_pruned:.4f} [{time.perf_counter() - t0:.0f} s]")

    x = torch.cat([b[0] for b in train])
    y = torch.cat([b[1] for b in train])
    parts = dirichlet_split(y, args.clients, args.alpha, seed=0)
    counts = client_class_counts(y, parts, 10)
    batches = client_batches(x, y, parts, 128)
    torch.manual_seed(100)
    init = MLP(784, 10, width=512, depth=3)
    clients = [_train(init, b, args.epochs, 100 + j) for j, b in enumerate(batches)]
    print(
        f"{args.clients} clients, Dirichlet({args.alpha}) sizes {[len(p) for p in parts]}; "
        f"client test acc {[round(_acc(net, c, test), 4) for c in clients]}"
    )
    opts = dict(net=net, client_batches=batches, epochs=1, lr=0.01, class_counts=counts)
    fm = fedma(clients, spec, **opts)
    fm_acc = _acc(net, fm.state, test)
    fm_pruned = fedma(clients, spec, pruning=Pruning(args.rate), **opts)
    fm_pruned_acc = _acc(net, fm_pruned.state, test)
    print(
        f"FedMA {fm_acc:.4f} (widths {fm.widths}), pruned {fm_pruned_acc:.4f} "
        f"[{time.perf_counter() - t0:.0f} s]"
    )
    others = _others(net, states, spec, test)
    values = dict(
        otfusion_acc=ot_acc,
        otfusion_pruned_acc=ot_pruned,
        fedma_acc=fm_acc,
        fedma_pruned_acc=fm_pruned_acc,
        ccmm_acc=others["ccmm_acc"],
        mergemany_acc=others["mergemany_acc"],
        sinkhorn_barrier=others["sinkhorn_barrier"],
        wm_barrier=others["wm_barrier"],
        vanilla_avg_acc=vanilla,
    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(" ".join(f"{k}={v:.4f}" for k, v in values.items()))


if __name__ == "__main__":
    main()
