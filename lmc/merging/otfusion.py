"""OTFusion (Singh & Jaggi 2020) with prune-before-align (000 §5, Table 2); pure, no Lightning.

Layer by layer, every model's units are transported onto a *target*: the base model resized to
the target width (zero units appended when wider; its units of largest incoming-weight norm kept
when narrower and ``allow_shrink``). For a permutation group ``g`` (a layer's units, a residual
stream: the groups of :class:`~lmc.permutation.PermutationSpec`), the ground metric is

* ``weight``: the Euclidean distance between a unit's incoming weights (every entry whose axis 0
  is ``g``: weight, bias, norm parameters), the inputs already transported by the plans of the
  earlier groups (``W T diag(1/nu)``, Singh & Jaggi eq. 2); a residual stream uses the entries
  whose other groups are solved when it is reached;
* ``activation``: the Euclidean distance between the units' activations on the same inputs, at
  the spec's activation points (summed over the points of a stream).

The plan ``T = ot.emd(mu, nu, C)`` (exact OT, POT) maps model unit ``a`` to target unit ``b``
with weight ``T[a, b] / nu[b]`` on every axis ``g`` acts on (outgoing weights of the next layer
too), so an equal-width plan of a permuted copy is the permutation. Marginals are uniform,
activation-derived (mass proportional to a unit's mean absolute activation) or given per group.
The fused state is the weighted average of the transported models; BatchNorm statistics are
transported like parameters and should be re-estimated after fusion (``lmc.evaluation.reset_bn``).

Pruning before alignment (000 §5): every layer of every model is magnitude-pruned before its
alignment with the strategies of 000 (``only_prune``, ``finetune_once``, ``iterative``) through
:mod:`lmc.pruning`; as magnitude pruning is local to a layer, pruning each layer right before its
alignment equals pruning the models before fusing them, which is what :func:`prune_models` does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import Tensor, nn

from lmc.permutation.spec import PermutationSpec, SpecError, StateDict
from lmc.pruning import make_permanent, prune_magnitude, rate_schedule

Metric = Literal["weight", "activation"]
Marginals = str | Mapping[str, Sequence[float]]
OTSolver = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
PruneStrategy = Literal["only_prune", "finetune_once", "iterative"]


@dataclass
class FusionResult:
    """Outcome of a fusion: the fused full state dict, its group widths and, per group, the
    plans (OTFusion: one ``(n_i, m)`` transport matrix per model) or assignments (FedMA)."""

    state: dict[str, Tensor]
    widths: dict[str, int]
    plans: dict[str, list[np.ndarray]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def check_fusion_models(
    states: Sequence[StateDict], spec: PermutationSpec, names: Sequence[str] | None = None
) -> list[dict[str, int]]:
    """Check N >= 2 models of one depth and kinds of layers (widths may differ) against ``spec``.

    Returns every model's group sizes.

    Raises:
        ValueError: fewer than 2 models, or a model whose layers differ from model 0's; the
            message names the first mismatching layer.
        SpecError: a model does not fit the permutation spec.
    """
    n = len(states)
    if n < 2:
        raise ValueError(f"fusion needs at least 2 models, got {n}; give two or more models")
    names = list(names) if names is not None else [f"model {i}" for i in range(n)]
    ref = list(states[0].items())
    for name, state in zip(names[1:], states[1:]):
        items = list(state.items())
        for i in range(max(len(ref), len(items))):
            if i >= len(ref) or i >= len(items):
                extra = (items if i < len(items) else ref)[i][0]
                raise ValueError(
                    f"{name} and {names[0]} differ in depth: the first unmatched layer is "
                    f"{extra.rpartition('.')[0] or extra!r}; fuse models of one architecture"
                )
            (ka, ta), (kb, tb) = ref[i], items[i]
            if ka != kb or ta.ndim != tb.ndim or ta.is_floating_point() != tb.is_floating_point():
                raise ValueError(
                    f"{name} differs from {names[0]} at layer {ka.rpartition('.')[0] or ka!r} "
                    f"({ka} {tuple(ta.shape)} vs {kb} {tuple(tb.shape)}): models of different "
                    "depth or kinds of layers cannot be fused"
                )
    sizes = []
    for name, state in zip(names, states):
        try:
            sizes.append(spec.sizes(state))
        except SpecError as err:
            raise SpecError(f"{name} does not fit the permutation spec: {err}") from None
    return sizes


def group_order(spec: PermutationSpec) -> list[str]:
    """Groups in the order they are aligned: a group comes once the groups on the other axes of
    its incoming entries (those where it is axis 0) are solved; a group on a cycle (a residual
    stream read and written by its blocks) once any incoming entry is ready."""
    incoming = {g: [k for k, a in spec.groups[g] if a == 0] for g in spec.groups}
    done: list[str] = []
    todo = list(spec.groups)

    def ready(g: str, key: str) -> bool:
        return all(h is None or h == g or h in done for h in spec.axes[key][1:])

    while todo:
        pick = next((g for g in todo if all(ready(g, k) for k in incoming[g])), None)
        if pick is None:
            pick = next((g for g in todo if any(ready(g, k) for k in incoming[g])), todo[0])
        done.append(pick)
        todo.remove(pick)
    return done


def materialize(net: nn.Module, state: StateDict) -> nn.Module:
    """A copy of ``net`` holding ``state``, whose widths may differ from ``net``'s (parameters
    and buffers replaced by tensors of the state's shapes; Linear/Conv/BatchNorm forward reads
    the shapes from the tensors)."""
    model = copy.deepcopy(net)
    params = dict(model.named_parameters())
    for key, value in state.items():
        prefix, _, name = key.rpartition(".")
        module = model.get_submodule(prefix) if prefix else model
        value = value.detach().clone()
        if key in params:
            setattr(module, name, nn.Parameter(value, requires_grad=params[key].requires_grad))
        else:
            module.register_buffer(name, value)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape
        elif isinstance(module, nn.Conv2d):
            module.out_channels, module.in_channels = module.weight.shape[:2]
        elif isinstance(module, nn.modules.batchnorm._BatchNorm) and module.weight is not None:
            module.num_features = module.weight.shape[0]
    return model


@dataclass(frozen=True)
class Pruning:
    """Prune-before-align settings (000 §5): local magnitude pruning of every layer to ``rate``.

    Args:
        rate: the fraction of each layer's weights pruned; 0 with a fine-tuning strategy
            fine-tunes the dense models (all-ones masks) for the same rounds.
        strategy: ``only_prune`` (simple pruning), ``finetune_once`` (prune, then ``finetune``)
            or ``iterative`` (``rounds`` times: prune a share of ``rate``, then ``finetune``).
        rounds: pruning rounds of ``iterative`` (the rate grows geometrically to ``rate``).
        finetune: ``finetune(model)`` trains a pruned model in place (masks fixed), e.g.
            ``functools.partial(lmc.merging.fedma.local_train, batches=..., epochs=...)``.
        layers: layer names to prune (default every Linear/Conv layer).
    """

    rate: float
    strategy: PruneStrategy = "only_prune"
    rounds: int = 1
    finetune: Callable[[nn.Module], Any] | None = None
    layers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.strategy not in ("only_prune", "finetune_once", "iterative"):
            raise ValueError(
                f"pruning strategy must be only_prune, finetune_once or iterative, got "
                f"{self.strategy!r}"
            )
        if self.strategy == "iterative" and self.rounds < 2:
            raise ValueError("strategy 'iterative' needs rounds >= 2; use 'finetune_once'")
        if self.strategy != "iterative" and self.rounds != 1:
            raise ValueError(f"strategy {self.strategy!r} prunes once: set rounds=1")
        if self.strategy != "only_prune" and self.finetune is None:
            raise ValueError(f"strategy {self.strategy!r} needs a finetune(model) callable")
        rate_schedule(self.rate, self.rounds)  # checks 0 <= rate < 1


def prune_models(
    net: nn.Module, states: Sequence[StateDict], pruning: Pruning
) -> list[dict[str, Tensor]]:
    """Every model pruned (and fine-tuned) by ``pruning`` with :mod:`lmc.pruning`, masks made
    permanent: dense state dicts with the pruned weights at zero."""
    out = []
    for state in states:
        model = materialize(net, state)
        for rate in rate_schedule(pruning.rate, pruning.rounds):
            prune_magnitude(model, rate, pruning.layers)
            if pruning.finetune is not None and pruning.strategy != "only_prune":
                pruning.finetune(model)
        make_permanent(model)
        out.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return out


def _resize_base(
    base: StateDict, spec: PermutationSpec, sizes: Mapping[str, int], target: Mapping[str, int]
) -> dict[str, Tensor]:
    """The base resized to the target widths: zero units appended, or the units of largest
    incoming-weight norm kept (in their order)."""
    keep: dict[str, Tensor] = {}
    for g, m in target.items():
        n = sizes[g]
        if m < n:
            norm = cast(  # at least one incoming weight per group: a tensor, never the 0 start
                Tensor,
                sum(
                    base[k].double().reshape(n, -1).pow(2).sum(1)
                    for k, a in spec.groups[g]
                    if a == 0
                ),
            )
            keep[g] = torch.sort(torch.topk(norm, m).indices).values
    out = {}
    for key, t in base.items():
        for axis, group in enumerate(spec.axes[key]):
            if group is None or target[group] == sizes[group]:
                continue
            if group in keep:
                t = t.index_select(axis, keep[group].to(t.device))
            else:
                pad = list(t.shape)
                pad[axis] = target[group] - sizes[group]
                t = torch.cat([t, t.new_zeros(pad)], axis)
        out[key] = t
    return out


def _transport(t: Tensor, axis: int, a: Tensor) -> Tensor:
    """Apply the (m, n) map ``a`` along ``axis`` of ``t``."""
    return torch.movedim(torch.tensordot(a.to(t.device, t.dtype), t, dims=([1], [axis])), 0, axis)


def _activations(
    net: nn.Module, state: StateDict, spec: PermutationSpec, batches: Iterable[Any]
) -> dict[str, Tensor]:
    """Group -> (samples, units) activations at its points (concatenated over a stream's
    points), on the same inputs for every model."""
    model = materialize(net, state).eval()
    points = {p: g for g, ps in spec.activations.items() for p in ps}
    feats: dict[str, list[Tensor]] = {p: [] for p in points}

    def hook(name: str):
        def fn(_m: nn.Module, _i: Any, out: Tensor) -> None:
            feats[name].append(out.movedim(1, -1).reshape(-1, out.shape[1]).double())

        return fn

    handles = [model.get_submodule(p).register_forward_hook(hook(p)) for p in points]
    try:
        with torch.inference_mode():
            for batch in batches:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                model(x.to(next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    out: dict[str, list[Tensor]] = {}
    for p, g in points.items():
        out.setdefault(g, []).append(torch.cat(feats[p]))
    return {g: torch.cat(v) for g, v in out.items()}


def _marginal(
    kind: Marginals, g: str, n: int, acts: Tensor | None, side: str, is_target: bool
) -> np.ndarray:
    if isinstance(kind, Mapping):
        if is_target and g in kind:
            nu = np.asarray(kind[g], dtype=np.float64)
            if nu.shape != (n,) or (nu < 0).any() or abs(nu.sum() - 1.0) > 1e-6:
                raise ValueError(
                    f"marginal of group {g!r} must be {n} non-negative numbers summing to one; "
                    f"got {nu.size} numbers summing to {nu.sum():.6g}"
                )
            return nu
        return np.full(n, 1.0 / n)
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    if kind == "activation":
        if acts is None:
            raise ValueError("marginals='activation' needs batches (activation statistics)")
        mass = acts.abs().mean(0).cpu().numpy()
        total = mass.sum()
        return mass / total if total > 0 else np.full(n, 1.0 / n)
    raise ValueError(
        f"marginals must be 'uniform', 'activation' or a mapping, got {kind!r} ({side})"
    )


def _exact_transport() -> OTSolver:
    """POT's exact optimal transport ``ot.emd``, or an ``ImportError`` saying how to install it
    (the ``ot`` extra) or how to do without it (a ``solver`` of one's own)."""
    try:
        import ot
    except ImportError:
        raise ImportError(
            "OTFusion's exact optimal transport needs POT, an optional dependency of lmc: "
            "pip install 'lmc[ot]' (or pip install 'pot>=0.9.6,<0.10'), or pass "
            "solver=(mu, nu, cost) -> plan"
        ) from None
    return ot.emd


def otfusion(
    states: Sequence[StateDict],
    spec: PermutationSpec,
    *,
    net: nn.Module | None = None,
    base: int = 0,
    weights: Sequence[float] | None = None,
    metric: Metric = "weight",
    batches: Sequence[Any] | None = None,
    marginals: Marginals = "uniform",
    target_width: int | Mapping[str, int] | None = None,
    allow_shrink: bool = False,
    pruning: Pruning | None = None,
    solver: OTSolver | None = None,
) -> FusionResult:
    """Fuse N >= 2 models by layer-wise optimal transport onto the (resized) base model.

    Args:
        states: the models' full state dicts (widths may differ).
        spec: their permutation spec (e.g. ``lmc.permutation.spec_for(net)``).
        net: the architecture; needed by ``metric="activation"``, activation marginals and
            ``pruning``.
        base: index of the model whose (resized) units are the target.
        weights: fusion weights (default uniform); they must sum to one.
        metric: ground metric, ``weight`` or ``activation`` (needs ``batches``).
        batches: inputs (or ``(x, y)`` pairs) for activations, e.g. the alignment subset.
        marginals: ``uniform``, ``activation`` or group -> target marginal (models uniform).
        target_width: fused width of every group (an int) or per group; default the base's.
        allow_shrink: allow a target narrower than the base.
        pruning: prune-before-align settings (000 §5); ``None`` fuses the dense models.
        solver: ``solver(mu, nu, cost) -> plan``; default exact OT ``ot.emd``.

    Raises:
        ValueError: fewer than 2 models, layers that differ, bad marginals or weights, or a
            target narrower than the base without ``allow_shrink``.
    """
    sizes = check_fusion_models(states, spec)
    n_models = len(states)
    if not 0 <= base < n_models:
        raise ValueError(f"base={base} is not an index into {n_models} models")
    w = np.full(n_models, 1.0 / n_models) if weights is None else np.asarray(weights, float)
    if w.shape != (n_models,) or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"fusion weights must be {n_models} numbers summing to one, got {w}")
    if metric not in ("weight", "activation"):
        raise ValueError(f"metric must be 'weight' or 'activation', got {metric!r}")
    needs_data = metric == "activation" or marginals == "activation"
    if needs_data and (batches is None or net is None):
        raise ValueError("activation metric or marginals need net and batches")
    if pruning is not None:
        if net is None:
            raise ValueError("pruning needs net (the architecture) to prune the models")
        states = prune_models(net, states, pruning)
    if solver is None:
        solver = _exact_transport()

    bsizes = sizes[base]
    if target_width is None:
        target = dict(bsizes)
    elif isinstance(target_width, int):
        target = {g: target_width for g in bsizes}
    else:
        target = {g: int(target_width.get(g, n)) for g, n in bsizes.items()}
    small = {g: (m, bsizes[g]) for g, m in target.items() if m < bsizes[g]}
    if small and not allow_shrink:
        g, (m, n) = next(iter(small.items()))
        raise ValueError(
            f"target width {m} of group {g!r} is smaller than the base model's {n}; set "
            "allow_shrink=True to fuse into a narrower model"
        )
    anchor = _resize_base(states[base], spec, bsizes, target)
    acts = anchor_acts = None
    if needs_data:
        assert net is not None and batches is not None  # checked above
        acts = [_activations(net, s, spec, batches) for s in states]
        anchor_acts = _activations(net, anchor, spec, batches)
    maps: list[dict[str, Tensor]] = [{} for _ in states]
    plans: dict[str, list[np.ndarray]] = {}
    for g in group_order(spec):
        m = target[g]
        incoming = [k for k, a in spec.groups[g] if a == 0 and anchor[k].is_floating_point()]
        ready = [
            k
            for k in incoming
            if all(h is None or h == g or h in maps[0] for h in spec.axes[k][1:])
        ]
        nu = _marginal(marginals, g, m, anchor_acts[g] if anchor_acts else None, "target", True)
        plans[g] = []
        for i, state in enumerate(states):
            n = sizes[i][g]
            a_rows, b_rows = [], []
            for k in ready:
                t = state[k].double()
                for axis, h in enumerate(spec.axes[k]):
                    if axis > 0 and h is not None and h != g:
                        t = _transport(t, axis, maps[i][h])
                a_rows.append(t.reshape(n, -1).cpu())
                b_rows.append(anchor[k].double().reshape(m, -1).cpu())
            cost = (
                torch.cdist(torch.cat(a_rows, 1), torch.cat(b_rows, 1)).numpy()
                if a_rows
                else np.zeros((n, m))
            )
            if metric == "activation":
                assert acts is not None and anchor_acts is not None  # needs_data: computed above
                act = torch.cdist(acts[i][g].T.cpu(), anchor_acts[g].T.cpu()).numpy()
                # units of equal activations (e.g. dead ones) are told apart by their weights
                cost = act + 1e-6 * max(act.max(), 1e-12) * cost / max(cost.max(), 1e-12)
            mu = _marginal(marginals, g, n, acts[i][g] if acts else None, "model", False)
            plan = np.asarray(solver(mu, nu, cost), dtype=np.float64)
            scale = np.divide(1.0, nu, out=np.zeros_like(nu), where=nu > 0)
            maps[i][g] = torch.from_numpy(plan.T * scale[:, None])
            plans[g].append(plan)
    fused: dict[str, Tensor] = {}
    for key, ref in anchor.items():
        if not ref.is_floating_point():
            fused[key] = ref.clone()
            continue
        total = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for i, state in enumerate(states):
            t = state[key].double()
            for axis, h in enumerate(spec.axes[key]):
                if h is not None:
                    t = _transport(t, axis, maps[i][h].to(t.device))
            total += w[i] * t
        fused[key] = total.to(ref.dtype)
    return FusionResult(fused, dict(target), plans, {"metric": metric, "base": base})
