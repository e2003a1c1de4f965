"""FedMA: federated matched averaging (Wang et al. 2020) with prune-before-matching (000 §5,
Tables 4-5); pure, no Lightning.

One communication round goes through the hidden layers (the permutation groups, in network
order): the clients' units of the layer (their incoming weights, bias and norm parameters) are
matched to global units by the MAP estimate of the Beta-Bernoulli process of PFNM/FedMA, solved
client by client with the Hungarian algorithm: a client unit joins the global unit ``i`` (``c_i``
members, sum ``S_i``) with gain ``||a_i + w/s||^2 / (p_i + 1/s) - ||a_i||^2 / p_i + 2 log(c_i / (J -
c_i))`` (``a_i = mu0/s0 + S_i/s``, ``p_i = 1/s0 + c_i/s``) or opens a new global unit with gain
``||mu0/s0 + w/s||^2 / (1/s0 + 1/s) - ||mu0||^2/s0 + 2 log(gamma / J)``, so the global width may
grow, up to ``max_width`` units. Variances ``s = sigma * v`` and ``s0 = sigma0 * v`` are relative to
the layer's per-entry variance ``v``. A global unit is the mean of its matched client units.
Every client then takes the global layer (frozen), its next layer's inputs placed at its units'
global positions, and retrains the layers above for ``epochs`` epochs on its own data. The output
layer is averaged with per-class weights proportional to the clients' class counts. Later rounds
start every client from the global model, train it ``epochs`` epochs, and match again.

Supported: sequential networks (MLP, VGG with or without BatchNorm); residual streams raise.
With ``pruning`` every client is magnitude-pruned (and fine-tuned) before each matching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from lmc.merging.otfusion import (
    FusionResult,
    Pruning,
    check_fusion_models,
    group_order,
    materialize,
    prune_models,
)
from lmc.permutation.spec import PermutationSpec, StateDict

Batches = Sequence[tuple[Tensor, Tensor]]


def local_train(
    model: nn.Module,
    batches: Batches,
    epochs: int = 1,
    lr: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    frozen: Sequence[str] = (),
    seed: int = 0,
) -> nn.Module:
    """Train ``model`` in place with SGD and cross-entropy for ``epochs`` passes over ``batches``
    (batch order shuffled per epoch, seeded); parameters named in ``frozen`` are not updated."""
    fixed = set(frozen)
    params = [p for n, p in model.named_parameters() if n not in fixed and p.requires_grad]
    if epochs <= 0 or not params or not batches:
        return model
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    model.train()
    with torch.inference_mode(False), torch.enable_grad():
        for _ in range(epochs):
            for b in torch.randperm(len(batches), generator=gen).tolist():
                x, y = batches[b]
                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return model


def match_layer(
    units: Sequence[np.ndarray],
    *,
    sigma: float = 1.0,
    sigma0: float = 1.0,
    gamma: float = 1.0,
    max_width: int | None = None,
    iters: int = 5,
    seed: int = 0,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Match the units of J clients (``units[j]``: ``(n_j, d)``) to global units (BBP-MAP).

    The global units start as client 0's; the other clients are assigned in a seeded order,
    then every client is re-assigned ``iters - 1`` more times with the others fixed.

    Returns:
        The global units ``(L, d)`` (means of their matched client units) and, per client, the
        global index of each of its units.

    Raises:
        ValueError: ``max_width`` below a client's width.
    """
    J = len(units)
    widths = [u.shape[0] for u in units]
    cap = max_width if max_width is not None else sum(widths)
    if cap < max(widths):
        raise ValueError(f"max_width={cap} is below a client's width {max(widths)}")
    allw = np.concatenate(units).astype(np.float64)
    mu0 = allw.mean(0)
    v = float(((allw - mu0) ** 2).mean()) or 1.0
    s, s0 = sigma * v, sigma0 * v
    prior = mu0 / s0
    sums = units[0].astype(np.float64).copy()
    counts = np.ones(widths[0])
    assign: list[np.ndarray | None] = [np.arange(widths[0])] + [None] * (J - 1)
    rng = np.random.default_rng(seed)
    order = [0] + list(1 + rng.permutation(J - 1))
    passes = [order[1:]] + [order] * max(iters - 1, 0)
    for clients in passes:
        for j in clients:
            w = units[j].astype(np.float64)
            prev = assign[j]
            if prev is not None:  # take client j out of the global units
                np.subtract.at(sums, prev, w)
                np.subtract.at(counts, prev, 1)
                keep = counts > 0
                remap = np.cumsum(keep) - 1
                sums, counts = sums[keep], counts[keep]
                for k in range(J):
                    if k != j and assign[k] is not None:
                        assign[k] = remap[assign[k]]
            L = len(counts)
            nat = prior + sums / s
            prec = 1.0 / s0 + counts / s
            nat_sq = (nat**2).sum(1)
            w_sq = (w**2).sum(1)
            quad = nat_sq[None] + 2 * (w @ nat.T) / s + w_sq[:, None] / s**2
            quad = quad / (prec + 1.0 / s)[None]
            pop = 2 * np.log(counts / np.maximum(J - counts, 1e-12))
            gain = quad - (nat_sq / prec)[None] + pop[None]
            new = min(widths[j], cap - L)
            if new > 0:
                g_new = ((prior + w / s) ** 2).sum(1) / (1 / s0 + 1 / s) - (prior**2).sum() * s0
                g_new = g_new + 2 * np.log(gamma / J)
                gain = np.concatenate([gain, np.repeat(g_new[:, None], new, 1)], 1)
            rows, cols = linear_sum_assignment(gain, maximize=True)
            a = np.empty(widths[j], dtype=np.int64)
            opened = 0
            for r, c in zip(rows, cols):
                if c < L:
                    a[r] = c
                else:
                    a[r] = L + opened
                    opened += 1
            if opened:
                sums = np.concatenate([sums, np.zeros((opened, sums.shape[1]))])
                counts = np.concatenate([counts, np.zeros(opened)])
            np.add.at(sums, a, w)
            np.add.at(counts, a, 1)
            assign[j] = a
    return sums / counts[:, None], [np.asarray(a) for a in assign]


def _sequential(spec: PermutationSpec) -> list[str]:
    order = group_order(spec)
    for i, g in enumerate(order):
        for key, axis in spec.groups[g]:
            if axis != 0:
                continue
            for h in spec.axes[key][1:]:
                if h is not None and h not in order[:i]:
                    raise ValueError(
                        f"FedMA needs a sequential network, but layer {key!r} of group {g!r} "
                        f"reads group {h!r} which is not matched before it (a residual stream?); "
                        "use OTFusion for residual networks"
                    )
    return order


def fedma(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    net: nn.Module | None = None,
    client_batches: Sequence[Batches] | None = None,
    rounds: int = 1,
    epochs: int = 0,
    lr: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    class_counts: np.ndarray | None = None,
    sigma: float = 1.0,
    sigma0: float = 1.0,
    gamma: float = 1.0,
    max_width: float = 1.5,
    iters: int = 5,
    pruning: Pruning | None = None,
    seed: int = 0,
) -> FusionResult:
    """FedMA over J >= 2 client models: layer-wise matched averaging, ``rounds`` rounds.

    Args:
        states: the clients' locally trained full state dicts (one architecture and width).
        spec: their permutation spec (sequential networks).
        net: the architecture (needed to retrain, prune or for ``rounds > 1``).
        client_batches: each client's ``(x, y)`` batches (retraining and later rounds).
        rounds: communication rounds (each a full layer-wise pass).
        epochs: local epochs after each layer's matching and before each later round (000
            Table 4: 20); 0 retrains nothing.
        lr, momentum, weight_decay: the clients' SGD.
        class_counts: ``(J, classes)`` counts weighting the output layer (default uniform).
        sigma, sigma0, gamma: BBP-MAP client noise, prior variance (relative to the layer's
            weight variance) and new-unit rate.
        max_width: cap on a global layer's width, as a multiple of the clients' width.
        iters: matching passes over the clients per layer.
        pruning: prune-before-matching settings (000 §5); ``None`` matches dense models.
        seed: seed of the client order and of local training.

    Returns:
        The global model's state (its widths may exceed ``net``'s; load it with
        :func:`lmc.merging.otfusion.materialize`), widths and per-group client assignments.
    """
    sizes = check_fusion_models(states, spec)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    retrain = epochs > 0
    if (retrain or rounds > 1 or pruning is not None) and net is None:
        raise ValueError("retraining, pruning and rounds > 1 need net (the architecture)")
    if (retrain or rounds > 1) and (client_batches is None or len(client_batches) != len(states)):
        raise ValueError("retraining and rounds > 1 need one list of batches per client")
    order = _sequential(spec)
    cap = {
        g: max(int(max_width * max(s[g] for s in sizes)), max(s[g] for s in sizes)) for g in order
    }
    J = len(states)
    clients = [{k: v.detach().clone() for k, v in s.items()} for s in states]
    assignments: dict[str, list[np.ndarray]] = {}
    global_state: dict[str, Tensor] = {}

    def train_clients(clients: list, frozen: Sequence[str], seed0: int) -> list:
        """Each client's state after ``epochs`` of local training (``frozen`` keys fixed)."""
        assert net is not None and client_batches is not None  # checked above
        out = []
        for j, state in enumerate(clients):
            model = materialize(net, state)
            local_train(
                model,
                client_batches[j],
                epochs,
                lr,
                momentum,
                weight_decay,
                list(frozen),
                seed=seed0 + j,
            )
            out.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return out

    for rnd in range(rounds):
        if rnd > 0:
            clients = [dict(global_state) for _ in range(J)]
            clients = train_clients(clients, (), seed + 1000 * rnd)
        if pruning is not None:
            assert net is not None  # checked above: pruning needs net
            clients = prune_models(net, clients, pruning)
        done: set[str] = set()
        for g in order:
            incoming = [
                k for k, a in spec.groups[g] if a == 0 and clients[0][k].is_floating_point()
            ]
            n = [c[incoming[0]].shape[0] for c in clients]
            units = [
                torch.cat([c[k].double().reshape(n[j], -1) for k in incoming], 1).cpu().numpy()
                for j, c in enumerate(clients)
            ]
            glob, assign = match_layer(
                units,
                sigma=sigma,
                sigma0=sigma0,
                gamma=gamma,
                max_width=cap[g],
                iters=iters,
                seed=seed + rnd,
            )
            assignments[g] = assign
            L = glob.shape[0]
            splits = np.cumsum([int(np.prod(clients[0][k].shape[1:])) for k in incoming])[:-1]
            parts = np.split(glob, splits, axis=1)
            for j, c in enumerate(clients):
                for k, part in zip(incoming, parts):
                    shape = (L, *c[k].shape[1:])
                    c[k] = torch.as_tensor(
                        part.reshape(shape), dtype=c[k].dtype, device=c[k].device
                    )
                idx = torch.as_tensor(assign[j], device=c[incoming[0]].device)
                for k, axis in spec.groups[g]:
                    if axis == 0:
                        continue
                    t = c[k]
                    wider = list(t.shape)
                    wider[axis] = L
                    c[k] = t.new_zeros(wider).index_copy(axis, idx, t)
            done.add(g)
            if retrain:
                frozen = [k for g2 in done for k, a in spec.groups[g2] if a == 0]
                clients = train_clients(clients, frozen, seed + 1000 * rnd)
        global_state = _average_rest(clients, spec, class_counts)
    widths = spec.sizes(global_state)
    return FusionResult(global_state, widths, assignments, {"rounds": rounds, "epochs": epochs})


def _average_rest(
    clients: Sequence[dict[str, Tensor]], spec: PermutationSpec, class_counts: Any
) -> dict[str, Tensor]:
    """The global state: matched entries (equal on every client) kept, the output layer (axis 0
    without a group) averaged with per-class weights from ``class_counts``."""
    J = len(clients)
    out = {}
    cw = None
    if class_counts is not None:
        cc = torch.as_tensor(np.asarray(class_counts), dtype=torch.float64)
        if cc.shape[0] != J:
            raise ValueError(f"class_counts has {cc.shape[0]} rows for {J} clients")
        cw = cc / cc.sum(0, keepdim=True).clamp_min(1e-12)
        cw[:, cc.sum(0) == 0] = 1.0 / J
    for key, ref in clients[0].items():
        ax = spec.axes[key]
        if not ref.is_floating_point() or (ax and ax[0] is not None):
            out[key] = ref
            continue
        stack = torch.stack([c[key].double() for c in clients])
        if cw is not None and ax and ref.shape[0] == cw.shape[1]:
            wts = cw.reshape(J, -1, *([1] * (ref.ndim - 1)))
        else:
            wts = torch.full((J,) + (1,) * ref.ndim, 1.0 / J, dtype=torch.float64)
        out[key] = (stack * wts.to(stack.device)).sum(0).to(ref.dtype)
    return out
