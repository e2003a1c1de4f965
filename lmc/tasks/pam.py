"""``lmc fit`` task for PAM: curve and permutation optimised alternately (002 App. E)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, cast

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from lmc.curves.birkhoff import project_doubly_stochastic
from lmc.curves.evaluate import curve_objective, t_grid
from lmc.curves.options import AlignmentOptions, PAMOptions
from lmc.curves.pam import permutation_matrices, proximal_penalty, round_pam, soft_permute
from lmc.options import as_options
from lmc.permutation import apply_permutation, identity_permutation
from lmc.permutation.source import needs_example
from lmc.permutation.spec import PermutationSpec
from lmc.tasks.curves import CurveTask


class PAMTask(CurveTask):
    """Proximal Alternating Minimization of curve and permutation under ``lmc fit``.

    Training runs ``pam.outer_iterations`` cycles of ``pam.perm_epochs`` epochs of the
    permutation subproblem followed by ``pam.curve_epochs`` epochs of the curve subproblem (set
    ``trainer.max_epochs`` to ``outer_iterations * (perm_epochs + curve_epochs)``; later epochs
    keep training the curve). Manual optimization:

    * permutation epochs: projected SGD (``perm_lr``) on one doubly-stochastic matrix ``D_l`` per
      permutation group, starting at the current permutation, on the loss of the curve with
      second endpoint ``D theta_2`` plus ``prox_perm * |D - P^k|^2``; after each step every
      ``D_l`` is projected back with ``projection_iters`` alternating projections (E.2). At the
      end of the phase ``D`` is rounded (E.4): the previous permutation, the Hungarian projection
      and ``bvn_samples`` permutations sampled from greedy BvN decompositions truncated to
      ``bvn_terms`` terms are scored by the curve objective on ``select_batches`` batches of the
      alignment subset at ``select_ts`` interior values of t, and the best is kept.
    * curve epochs: ordinary curve training (the configured optimizer and scheduler) of the
      offset ``theta_c - (theta_1 + P theta_2) / 2`` (E.1), plus ``prox_curve * |offset -
      offset^k|^2``.

    ``alignment: {method: correlation}`` (the default) begins from correlation alignment
    ("PAM Aligned"), ``{method: none}`` from the identity ("PAM Unaligned"). ``summary.json``
    gets ``pam_objective_start`` and ``pam_objective_end`` (the objective on the fixed selection
    batches and ts) and the rounding history. A spec derived with ``torch.fx`` (``spec: derive``,
    or ``auto`` for a network without a hand-written spec) sizes the permutation matrices in
    :meth:`setup`, from the data module's inputs.

    Args:
        net: architecture of the checkpoints, as in :class:`CurveTask`.
        checkpoints: the two endpoint ``.ckpt`` files.
        pam: the PAM schedule, relaxation and rounding (:class:`~lmc.curves.PAMOptions`).
        alignment: the start: ``{method: correlation}`` (``None``, the default) or
            ``{method: none}``, and the batches it uses (:class:`~lmc.curves.AlignmentOptions`).
        **kwargs: the other arguments of :class:`CurveTask`, passed through unchanged: ``curve``,
            ``optimizer``, ``lr_scheduler`` (stepped once per curve epoch), ``evaluation``,
            ``batchnorm``, ``plane``, ``robust`` and ``spec``.
    """

    # buffers: whether PAM has set its start, and the curve offset of the last rounding
    pam_started: Tensor
    anchor: Tensor

    moved_keys: ClassVar[dict[str, str]] = {
        **CurveTask.moved_keys,
        "start": "alignment.method (start: aligned is method: correlation, unaligned is none)",
        **{f.name: f"pam.{f.name}" for f in fields(PAMOptions)},
    }

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        pam: PAMOptions | None = None,
        alignment: AlignmentOptions | None = None,
        **kwargs: Any,
    ) -> None:
        # The other groups go through **kwargs unchanged: jsonargparse reads their names and
        # types from CurveTask's signature (all but scheduler_interval, fixed here).
        super().__init__(
            net,
            checkpoints,
            alignment=as_options(AlignmentOptions, alignment, AlignmentOptions("correlation")),
            scheduler_interval="epoch",
            **kwargs,
        )
        self.automatic_optimization = False
        self.pam_opts = as_options(PAMOptions, pam)
        self.start = "aligned" if self.align_opts.method == "correlation" else "unaligned"
        self.groups: list[str] = []
        self.mats = nn.ParameterList()
        if not needs_example(self.spec.source, net):
            self._size_permutations(self._spec())
        self.register_buffer("pam_started", torch.tensor(False))
        self.register_buffer("anchor", torch.zeros_like(self.curve.offsets))
        self._pending_round = False
        self.rounds: list[dict[str, Any]] = []
        self.objective_start = float("nan")
        self.objective_end = float("nan")
        self._select: list | None = None

    def _size_permutations(self, spec: PermutationSpec | dict[str, int]) -> None:
        """One identity permutation buffer and one matrix ``D_l`` per group of ``spec`` (or of a
        ``group -> size`` mapping)."""
        sizes = spec if isinstance(spec, dict) else spec.sizes(self.states[1])
        self.groups = sorted(sizes)
        ident = identity_permutation({g: sizes[g] for g in self.groups})
        for m in permutation_matrices(ident).values():
            self.mats.append(nn.Parameter(m))
        for i, g in enumerate(self.groups):
            self.register_buffer(f"perm_{i}", ident[g].clone())

    def setup(self, stage: str) -> None:
        if not self.groups:  # a derived spec: now the data module can give an example input
            self._size_permutations(self._spec())

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["pam_groups"] = list(self.groups)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if not self.groups and "pam_groups" in checkpoint:  # derived spec, no data module yet
            state = checkpoint["state_dict"]
            names = checkpoint["pam_groups"]
            self._size_permutations({g: state[f"perm_{i}"].numel() for i, g in enumerate(names)})

    # state ---------------------------------------------------------------------------------
    def current_perm(self) -> dict[str, Tensor]:
        """The current permutation ``P^k`` of ``theta_2`` (group -> indices)."""
        return {g: getattr(self, f"perm_{i}") for i, g in enumerate(self.groups)}

    def _set_perm(self, perm: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for i, g in enumerate(self.groups):
                getattr(self, f"perm_{i}").copy_(perm[g])
            for d, m in zip(self.mats, permutation_matrices(perm).values()):
                d.copy_(m)
            self.curve.set_end_(apply_permutation(self.states[1], self._spec(), perm))

    def _phase(self, epoch: int) -> tuple[int, str]:
        o = self.pam_opts
        k, r = divmod(epoch, max(o.perm_epochs + o.curve_epochs, 1))
        if k >= o.outer_iterations:
            return o.outer_iterations, "curve"
        return k, "perm" if r < o.perm_epochs else "curve"

    def _selection(self) -> tuple[list, list[float]]:
        if self._select is None:
            self._select = self._train_subset(self.pam_opts.select_batches)
        ts = t_grid(self.pam_opts.select_ts + 2)[1:-1]
        return self._select, ts

    def objective(self, end: Tensor | None = None) -> float:
        """The curve objective on the fixed selection batches and ts (see ``curve_objective``)."""
        batches, ts = self._selection()
        return curve_objective(self.net, self.curve, batches, ts, end=end)

    # hooks ---------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        super().on_fit_start()
        if not bool(self.pam_started):
            groups = self.groups
            if self.start == "aligned" and hasattr(self, "align_perm"):
                perm = {g: self.align_perm[g].to(self.device) for g in groups}
            else:
                perm = {g: getattr(self, f"perm_{i}") for i, g in enumerate(groups)}
            self._set_perm({g: p.clone() for g, p in perm.items()})
            self.pam_started.fill_(True)
        self._theta2 = {k: self.states[1][k].to(self.device) for k in self.curve.names}
        with torch.inference_mode(False):
            self.objective_start = self.objective()
        rank_zero_info(f"PAM ({self.start} start): objective {self.objective_start:.4f}")

    def configure_optimizers(self) -> Any:
        perm_opt = torch.optim.SGD(list(self.mats), lr=self.pam_opts.perm_lr)
        curve_opt = self.optimizer(self.curve.parameters())
        if self.lr_scheduler is None:
            return [perm_opt, curve_opt]
        return [perm_opt, curve_opt], [self.lr_scheduler(curve_opt)]

    def _soft_end(self) -> Tensor:
        mats = dict(zip(self.groups, self.mats))
        permuted = soft_permute(self._theta2, self._spec(), mats, self.curve.names)
        return torch.cat([permuted[n].reshape(-1) for n in self.curve.names])

    def training_step(self, batch: Any, batch_idx: int) -> None:
        perm_opt, curve_opt = cast(list[LightningOptimizer], self.optimizers())  # the two
        o = self.pam_opts
        x, y = batch[0], batch[1]
        t = float(torch.rand(()))
        _, phase = self._phase(self.current_epoch)
        if phase == "perm":
            self._pending_round = True
            loss, penalty, out = self.curve_loss(
                x, y, t, end=self._soft_end(), offsets=self.curve.offsets.detach()
            )
            total = loss + penalty
            if o.prox_perm:
                prev = permutation_matrices(self.current_perm())
                total = total + o.prox_perm * proximal_penalty(
                    dict(zip(self.groups, self.mats)), prev
                )
            perm_opt.zero_grad()
            self.manual_backward(total)
            perm_opt.step()
            with torch.no_grad():
                for d in self.mats:
                    d.copy_(project_doubly_stochastic(d, o.projection_iters, o.projection))
        else:
            if self._pending_round:
                self.round_permutation()
            loss, penalty, out = self.curve_loss(x, y, t)
            total = loss + penalty
            if o.prox_curve:
                total = total + o.prox_curve * (self.curve.offsets - self.anchor).square().sum()
            curve_opt.zero_grad()
            self.manual_backward(total)
            curve_opt.step()
        self._log_train(loss, penalty, out, y)
        self.log("pam/phase_perm", float(phase == "perm"), on_step=True, on_epoch=False)

    def on_train_epoch_end(self) -> None:
        k, phase = self._phase(self.current_epoch)
        if phase == "perm" and self._phase(self.current_epoch + 1) != (k, "perm"):
            self.round_permutation()
        sched = cast(LRScheduler | None, self.lr_schedulers())  # one stepped per epoch, or none
        if phase == "curve" and sched is not None:
            sched.step()

    def on_train_end(self) -> None:
        if self._pending_round:
            self.round_permutation()
        with torch.inference_mode(False):
            self.objective_end = self.objective()
        rank_zero_info(
            f"PAM objective {self.objective_start:.4f} -> {self.objective_end:.4f} "
            f"after {len(self.rounds)} rounding(s)"
        )
        super().on_train_end()

    def round_permutation(self) -> None:
        """Round the relaxed permutation and move the curve's second endpoint (E.4)."""
        o = self.pam_opts
        spec = self._spec().restrict(self.curve.names)
        prev = {g: p.clone() for g, p in self.current_perm().items()}
        generator = torch.Generator().manual_seed(o.seed + len(self.rounds))

        def score(perm: dict[str, Tensor]) -> float:
            end = self.curve.flatten(apply_permutation(self._theta2, spec, perm))
            return self.objective(end)

        with torch.inference_mode(False), torch.no_grad():
            mats = {g: d.detach().cpu() for g, d in zip(self.groups, self.mats)}
            prev_cpu = {g: p.cpu() for g, p in prev.items()}
            result = round_pam(mats, prev_cpu, score, o.bvn_samples, o.bvn_terms, generator)
            perm = {g: p.to(self.device) for g, p in result.perm.items()}
            self._set_perm(perm)
            self.anchor.copy_(self.curve.offsets.detach())
        changed = sum(int((perm[g] != prev[g]).sum()) for g in self.groups)
        info = {
            "candidates": len(result.scores),
            "chosen": result.chosen,
            "objective_previous": result.scores[0],
            "objective_chosen": result.scores[result.chosen],
            "units_moved": changed,
        }
        self.rounds.append(info)
        self._pending_round = False
        rank_zero_info(f"PAM rounding {len(self.rounds)}: {info}")

    def summary_extra(self) -> dict[str, Any]:
        out = super().summary_extra()
        out.update(
            {
                "pam_objective_start": self.objective_start,
                "pam_objective_end": self.objective_end,
                "pam_rounds": self.rounds,
                # whether the permutation search moved at all (002 Table 1's PAM Aligned barely
                # moves the alignment): units re-assigned over all roundings
                "pam_units_moved": sum(r["units_moved"] for r in self.rounds),
            }
        )
        return out
