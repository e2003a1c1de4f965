"""Straight-through estimator for 2 models (004 §2.3) and for n models, STE-MM (004 §4.1, Alg. 1).

Given n trained models theta_1..theta_n and a reference theta_r (theta_n in Alg. 1; any model
by Theorem D.1), STE-MM looks for permutations pi_i minimising

    E_lambda L( sum_{i != r} lambda_i pi_i(theta_i) + lambda_r theta_r )          (004 eq. 5)

with lambda uniform on the simplex. Each non-reference model i has a continuous proxy
theta^_i, initialised at theta_r (Alg. 1 line 1). Every step:

1. pi_i <- WM(theta^_i, theta_i), warm-started with the previous permutation and, for
   ``method="accelerated"``, the previous LAP duals (004 §4.2, Alg. 3) (line 3);
2. lambda is sampled (lines 4-5);
3. the loss of the mixture is evaluated with the *straight-through* parameters
   ``pi_i(theta_i).detach() + (theta^_i - theta^_i.detach())``: the forward pass sees
   pi_i(theta_i), the gradient flows into the proxy (lines 6-8);
4. the caller's optimizer updates the proxies (line 9).

After training a final WM of every proxy gives the permutations (line 12). STE for two models
(Ainsworth et al. 2023) is the case n = 2 with the reference = model A, the midpoint (or a
sampled alpha) and, optionally, the permutation of the lowest batch loss kept.

BatchNorm uses batch statistics during the search (the template network runs in train mode;
its running-statistic buffers are mixed copies, never the models' own); evaluate a merge
after ``lmc.interpolation.reset_bn``.

:class:`STEMM` holds the proxies as parameters (so a LightningModule or a plain loop can
optimise them) and the models as non-persistent buffers; :func:`lmc.merging.ste_mm` and
:func:`lmc.merging.ste` (:mod:`lmc.merging.loop`) are plain training loops over it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmc.evaluation import LossName, batch_loss
from lmc.merging.baselines import check_models, parameter_keys
from lmc.merging.contract import Merged
from lmc.merging.search import MergeSearch, Progress
from lmc.permutation import (
    MatchingState,
    Permutation,
    PermutationSpec,
    apply_permutation,
    identity_permutation,
    spec_for,
    weight_matching,
)
from lmc.permutation.weight_matching import Method

Mixing = Literal["dirichlet", "uniform", "midpoint"]
StateDict = Mapping[str, Tensor]


def sample_mixing_weights(
    n: int, mixing: Mixing, generator: torch.Generator | None = None
) -> Tensor:
    """Mixing weights lambda (n,), positive and summing to 1.

    ``dirichlet``: Dirichlet(1, ..., 1), the uniform distribution on the simplex (004 eq. 5);
    ``uniform``: i.i.d. U(0, 1) normalised by their sum (004 Alg. 1 lines 4-5 as written and as
    the authors' code does; not uniform on the simplex for n > 2); ``midpoint``: all 1/n.
    """
    if n < 1:
        raise ValueError(f"need at least one weight, got n={n}")
    if mixing == "midpoint":
        return torch.full((n,), 1.0 / n)
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if mixing == "dirichlet":
        w = -torch.log1p(-u)  # Exp(1) draws; normalised they are Dirichlet(1)
    elif mixing == "uniform":
        w = u
    else:
        raise ValueError(f"mixing must be 'dirichlet', 'uniform' or 'midpoint', got {mixing!r}")
    w = w.clamp_min(1e-12)
    return (w / w.sum()).float()


def straight_through(proxy: Tensor, value: Tensor) -> Tensor:
    """``value`` in the forward pass, identity gradient into ``proxy`` in the backward pass."""
    return value.detach() + (proxy - proxy.detach())


def mix_states(states: Sequence[StateDict], weights: Sequence[float] | Tensor) -> dict[str, Tensor]:
    """``sum_i w_i state_i`` over floating-point entries, differentiable; integer entries (e.g.
    ``num_batches_tracked``) are cloned from the first state so nothing is modified in place."""
    if len(states) != len(weights):
        raise ValueError(f"got {len(states)} states but {len(weights)} weights")
    w = [float(x) for x in weights]
    out: dict[str, Tensor] = {}
    for key, value in states[0].items():
        if value.is_floating_point():
            acc = value * w[0]
            for wi, s in zip(w[1:], states[1:]):
                acc = acc + s[key] * wi
            out[key] = acc
        else:
            out[key] = value.clone()
    return out


class Template:
    """A private, frozen copy of a net, run functionally on a given state in train mode
    (BatchNorm on batch statistics). Not a module: its owner holds it without its parameters
    or a checkpoint entry."""

    def __init__(self, net: nn.Module) -> None:
        self.net = copy.deepcopy(net)
        for p in self.net.parameters():
            p.requires_grad_(False)

    def __call__(self, state: Mapping[str, Tensor], x: Tensor) -> Tensor:
        self.net.train()
        return functional_call(self.net, dict(state), (x,))


class TensorDict(nn.Module):
    """A state dict held as parameters (trainable) or non-persistent buffers (moved with the
    module, not written to checkpoints). Keys may contain dots."""

    def __init__(self, state: StateDict, trainable: bool) -> None:
        super().__init__()
        self.keys_ = list(state)
        for i, t in enumerate(state.values()):
            t = t.detach().clone()
            if trainable:
                self.register_parameter(f"t{i}", nn.Parameter(t))
            else:
                self.register_buffer(f"t{i}", t, persistent=False)

    def as_dict(self) -> dict[str, Tensor]:
        return {k: getattr(self, f"t{i}") for i, k in enumerate(self.keys_)}


class ModelBank(nn.Module):
    """Fixed models as non-persistent buffers: moved with their owner, never checkpointed.

    Several :class:`STEMM` searches over prefixes of the same models (a sweep over n) can
    share one bank instead of holding a copy each.
    """

    def __init__(self, states: Sequence[StateDict]) -> None:
        super().__init__()
        self.items = nn.ModuleList(TensorDict(s, trainable=False) for s in states)

    def __len__(self) -> int:
        return len(self.items)

    def state(self, i: int) -> dict[str, Tensor]:
        return cast(TensorDict, self.items[i]).as_dict()


class STEMM(MergeSearch):
    """Proxies, matching state and the straight-through forward of STE-MM (004 Alg. 1): the
    search of the ``stemm`` and ``ste`` merge methods (:class:`~lmc.merging.search.MergeSearch`).

    Args:
        net: the architecture; a private copy runs the functional forward passes.
        models: the n >= 2 models' full state dicts (checked by :func:`check_models`), or a
            shared :class:`ModelBank` (then not registered here: its owner registers and moves
            it) of which the first ``num_models`` are used.
        spec: their permutation spec (built-in if omitted).
        reference: index of the fixed model theta_r; the proxies start there.
        method: ``accelerated`` (dual warm start, 004 Alg. 3) or ``plain`` (Alg. 2, warm-started
            with the previous permutation only) weight matching every step.
        mixing: distribution of lambda (:func:`sample_mixing_weights`).
        keep_best: remember the permutations of the lowest batch loss (STE of Ainsworth et
            al. 2023) in :attr:`best_perms`.
        solver: LAP solver name passed to weight matching (default per method).
        seed: seed of lambda and of the matching's group order.
        names: how to call the models in error messages.
        num_models: with a bank, how many of its models to merge (default all).
        cache_source: accelerated matching keeps each model prepared for its cost matrices
            between steps (faster steps, about four times the models' memory); ``False`` saves it.

    Attributes:
        perms: current permutation of every model (identity for the reference).
        wm_seconds: wall time spent in weight matching so far.
        wm_stats: totals over all matching calls so far: ``calls``, ``solves`` (LAPs),
            ``sweeps``, ``solve_seconds`` (inside the LAP solver) and ``cost_seconds``
            (building cost matrices).
    """

    _template: Template

    def __init__(
        self,
        net: nn.Module,
        models: Sequence[StateDict] | ModelBank,
        spec: PermutationSpec | None = None,
        *,
        reference: int = 0,
        method: Method = "accelerated",
        mixing: Mixing = "dirichlet",
        keep_best: bool = False,
        solver: str | None = None,
        seed: int = 0,
        names: Sequence[str] | None = None,
        num_models: int | None = None,
        cache_source: bool = True,
    ) -> None:
        super().__init__()
        if method not in ("plain", "accelerated"):
            raise ValueError(f"method must be 'plain' or 'accelerated', got {method!r}")
        sample_mixing_weights(1, mixing)  # validates the name
        if isinstance(models, ModelBank):
            object.__setattr__(self, "_bank", models)  # shared: the owner registers it
            n = len(models) if num_models is None else num_models
            if not 0 <= n <= len(models):
                raise ValueError(f"num_models={n} but the bank holds {len(models)} models")
            states: list[StateDict] = [models.state(i) for i in range(n)]
        else:
            states = list(models)
            self.bank = ModelBank(states)
        self.spec = check_models(net, states, spec, names) or spec_for(net)
        self.n = len(states)
        if not -self.n <= reference < self.n:
            raise ValueError(f"reference={reference} is not an index into {self.n} models")
        self.reference = reference % self.n
        self.others = [i for i in range(self.n) if i != self.reference]
        self.method, self.mixing, self.keep_best, self.solver = method, mixing, keep_best, solver
        self.cache_source = cache_source
        self.param_keys = parameter_keys(net)
        self.match_spec = self.spec.restrict(self.param_keys)
        self._template = Template(net)
        ref = states[self.reference]
        self.proxies = nn.ModuleList(
            TensorDict({k: ref[k] for k in self.param_keys}, trainable=True) for _ in self.others
        )
        sizes = self.spec.sizes(ref)
        self.perms: list[Permutation] = [identity_permutation(sizes) for _ in range(self.n)]
        self.matching: list[MatchingState | None] = [None] * self.n
        self.best_perms: list[Permutation] | None = None
        self.best_loss = float("inf")
        self.wm_seconds = 0.0
        self.wm_stats = dict.fromkeys(
            ("calls", "solves", "sweeps", "solve_seconds", "cost_seconds"), 0.0
        )
        self.generator = torch.Generator().manual_seed(seed)
        self._rng = np.random.default_rng(seed)

    # --- checkpointing (so that a resumed run continues exactly where it stopped) ---------
    def get_extra_state(self) -> dict[str, Any]:
        """The search's non-parameter state: current and best permutations, each model's
        matching warm start (permutation and LAP duals), the lambda generator and the group-order
        RNG, and the matching totals. Tensors and plain Python values only, so checkpoints load
        with ``weights_only=True``; the kept source cache is rebuilt on the first call."""
        matching = [
            None
            if m is None
            else {
                "perm": dict(m.perm),
                "duals": {
                    g: (torch.from_numpy(u), torch.from_numpy(v)) for g, (u, v) in m.duals.items()
                },
            }
            for m in self.matching
        ]
        return {
            "perms": [dict(p) for p in self.perms],
            "matching": matching,
            "best_perms": None if self.best_perms is None else [dict(p) for p in self.best_perms],
            "best_loss": self.best_loss,
            "wm_seconds": self.wm_seconds,
            "wm_stats": dict(self.wm_stats),
            "generator": self.generator.get_state(),
            "rng": self._rng.bit_generator.state,
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_extra_state` saved."""
        if len(state["perms"]) != self.n:
            raise ValueError(
                f"the saved STE-MM search merged {len(state['perms'])} models, this one {self.n}"
            )
        self.perms = [dict(p) for p in state["perms"]]
        self.matching = [
            None
            if m is None
            else MatchingState(
                dict(m["perm"]),
                {g: (u.numpy().copy(), v.numpy().copy()) for g, (u, v) in m["duals"].items()},
            )
            for m in state["matching"]
        ]
        best = state["best_perms"]
        self.best_perms = None if best is None else [dict(p) for p in best]
        self.best_loss = float(state["best_loss"])
        self.wm_seconds = float(state["wm_seconds"])
        self.wm_stats = dict(state["wm_stats"])
        self.generator.set_state(state["generator"])
        self._rng.bit_generator.state = state["rng"]

    def _proxy(self, j: int) -> dict[str, Tensor]:
        """The j-th proxy's tensors (of the j-th model other than the reference)."""
        return cast(TensorDict, self.proxies[j]).as_dict()

    @property
    def _models(self) -> ModelBank:
        shared = self.__dict__.get("_bank")
        return shared if shared is not None else self.bank

    # --- matching -------------------------------------------------------------------------
    def match(self) -> list[float]:
        """Weight-match every model to its proxy (Alg. 1 line 3), warm-started; returns the
        seconds of each call."""
        seconds = []
        for j, i in enumerate(self.others):
            target = {k: t.detach() for k, t in self._proxy(j).items()}
            full = self._models.state(i)
            source = {k: full[k] for k in self.param_keys}
            prev = self.matching[i]
            init: Any = prev if self.method == "accelerated" else (prev.perm if prev else None)
            res = weight_matching(
                target,
                source,
                self.match_spec,
                method=self.method,
                solver=self.solver,
                init=init,
                cache_source=self.cache_source,
                seed=int(self._rng.integers(2**31)),
            )
            self.matching[i] = res.state
            self.perms[i] = res.perm
            seconds.append(res.seconds)
            for key, value in (
                ("calls", 1),
                ("solves", res.solves),
                ("sweeps", res.sweeps),
                ("solve_seconds", res.solve_seconds),
                ("cost_seconds", res.cost_seconds),
            ):
                self.wm_stats[key] += value
        # the reference's identity on the models' device, as the matched permutations are
        ref = self.perms[self.reference]
        device = next(iter(self._models.state(self.reference).values())).device
        self.perms[self.reference] = {g: p.to(device) for g, p in ref.items()}
        self.wm_seconds += sum(seconds)
        return seconds

    def finalize(self) -> list[Permutation]:
        """The final weight matching of every proxy (Alg. 1 line 12); returns the permutations
        (or :attr:`best_perms` when ``keep_best`` and a loss was observed)."""
        self.match()
        if self.keep_best and self.best_perms is not None:
            return [dict(p) for p in self.best_perms]
        return [dict(p) for p in self.perms]

    def permuted_states(self) -> list[dict[str, Tensor]]:
        """``[pi_i(theta_i)]`` with the current permutations (full states, detached)."""
        out = []
        for i in range(self.n):
            state = self._models.state(i)
            if i == self.reference:
                out.append(dict(state))
            else:
                out.append(apply_permutation(state, self.spec, self.perms[i], check=False))
        return out

    # --- the straight-through forward -----------------------------------------------------
    def sample_weights(self) -> Tensor:
        """lambda for the next step (drawn from this search's own generator)."""
        return sample_mixing_weights(self.n, self.mixing, self.generator)

    def mixed_state(self, weights: Sequence[float] | Tensor, ste: bool = True) -> dict[str, Tensor]:
        """``sum_i lambda_i pi_i(theta_i)`` over full states; with ``ste`` the parameters of
        every non-reference model are straight-through to its proxy."""
        states = self.permuted_states()
        if ste:
            for j, i in enumerate(self.others):
                proxy = self._proxy(j)
                for k in self.param_keys:
                    states[i][k] = straight_through(proxy[k], states[i][k])
        return mix_states(states, weights)

    def forward(self, x: Tensor, weights: Sequence[float] | Tensor, ste: bool = True) -> Tensor:
        """Output of the mixed model on ``x`` (train mode: BatchNorm uses batch statistics)."""
        return self._template(self.mixed_state(weights, ste), x)

    def loss(
        self,
        x: Tensor,
        y: Tensor,
        weights: Sequence[float] | Tensor,
        loss: LossName = "cross_entropy",
    ) -> Tensor:
        """Mean loss of the straight-through mixture on a batch (Alg. 1 line 6)."""
        return batch_loss(self(x, weights), y, loss) / y.shape[0]

    def step_loss(
        self,
        x: Tensor,
        y: Tensor,
        loss: LossName = "cross_entropy",
        progress: Progress | None = None,
    ) -> Tensor:
        """One STE-MM training step's loss (004 Alg. 1 lines 3-8): match every model to its
        proxy, sample the mixing weights, the straight-through loss of the mix, recorded for
        ``keep_best``. The caller back-propagates it and steps the optimizer."""
        self.match()
        value = self.loss(x, y, self.sample_weights().tolist(), loss)
        self.observe(float(value.detach()))
        return value

    def observe(self, loss: float) -> None:
        """Record a batch loss computed with :attr:`perms` (for ``keep_best``)."""
        if self.keep_best and loss < self.best_loss:
            self.best_loss = float(loss)
            self.best_perms = [dict(p) for p in self.perms]

    def proxy_parameters(self) -> Iterable[nn.Parameter]:
        return self.proxies.parameters()

    # --- the trained merge method's interface ---------------------------------------------
    def output(self, x: Tensor) -> Tensor:
        """The output of the current merge (uniform weights, no straight-through) on ``x``."""
        return self(x, [1.0 / self.n] * self.n, ste=False)

    def result(self) -> Merged:
        """The final matching (:meth:`finalize`) and the average of the permuted models."""
        perms = self.finalize()
        return Merged.from_perms([self._models.state(i) for i in range(self.n)], self.spec, perms)

    def timers(self) -> dict[str, float]:
        return {"wm_seconds": self.wm_seconds}
