"""``lmc validate`` task for merging n checkpoints with any merge method that does not train
(SPEC C4, C7), and the loading, evaluation and report it shares with the task of the methods
that train (:mod:`lmc.tasks.trained_merge`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lmc.evaluation import has_batchnorm, reset_bn
from lmc.io import atomic_write, load_endpoints, save_net_checkpoint
from lmc.merging import (
    Merged,
    MergeInputs,
    MergeSweep,
    check_models,
    check_options,
    evaluate_sweep,
    merge_sweep,
    parameter_keys,
)
from lmc.merging.contract import check_methods
from lmc.options import as_options
from lmc.permutation import PermutationSpec
from lmc.permutation.weight_matching import Method
from lmc.tasks.base import (
    EvaluationTask,
    SpecSource,
    datamodule_of,
    default_loss,
    eval_and_align_batches,
    save_task_hparams,
    train_batches,
)
from lmc.tasks.merge_report import log_merge, merge_metric_names
from lmc.tasks.options import MergeEvaluationOptions, moved_into


def load_models(
    net: nn.Module,
    checkpoints: Sequence[str],
    num_models: Sequence[int] | None,
    reference: int,
    spec: SpecSource,
) -> tuple[list[str], list[dict[str, Tensor]], list[int]]:
    """Read the checkpoints (files or run folders, safely; the same model twice and non-finite
    weights refused), check them against ``net`` (and against the permutation spec when it is
    known without data) and validate the sweep.

    Returns the checkpoint files, the state dicts and the sorted numbers of models to merge.

    Raises:
        ValueError: fewer than 2 checkpoints, an n outside ``[2, len(checkpoints)]``, a
            reference outside the smallest merge, or checkpoints of another architecture.
    """
    if len(checkpoints) < 2:
        raise ValueError(
            f"merging needs at least 2 checkpoints, got {len(checkpoints)}: set "
            "model.init_args.checkpoints to a list of .ckpt paths of one architecture"
        )
    ns = sorted(set(num_models)) if num_models else [len(checkpoints)]
    bad = [n for n in ns if not 2 <= n <= len(checkpoints)]
    if bad:
        raise ValueError(
            f"num_models {bad} must lie in [2, {len(checkpoints)}] (the number of checkpoints); "
            "each n merges the first n checkpoints"
        )
    if not 0 <= reference < ns[0]:
        raise ValueError(
            f"reference={reference} must index one of the first {ns[0]} checkpoints (the "
            "smallest merge of the sweep)"
        )
    files, states = load_endpoints(checkpoints, None, "model.init_args.checkpoints")
    check_models(net, states, spec.known, names=files)
    return files, states, ns


class MergeReporter:
    """The evaluation and report shared by the merge tasks: ``options`` (a merge task's
    ``evaluation`` group) and the ``seed`` of the sharpness probes."""

    def __init__(self, options: MergeEvaluationOptions, seed: int) -> None:
        self.options, self.seed = options, seed
        self._batches: tuple[Any, tuple[dict[str, list], list]] | None = None

    def batches(self, module: L.LightningModule) -> tuple[dict[str, list], list]:
        """The cached evaluation splits and the alignment subset, on the module's device (read
        once per device)."""
        if self._batches is None or self._batches[0] != module.device:
            dm = datamodule_of(module.trainer)
            opts = self.options
            opts.check_labels(getattr(dm, "num_classes", None))  # before any merge
            batches = eval_and_align_batches(dm, opts.splits, opts.max_batches, module.device)
            self._batches = (module.device, batches)
        return self._batches[1]

    def inputs(
        self,
        module: L.LightningModule,
        net: nn.Module,
        states: Sequence[Mapping[str, Tensor]],
        spec: PermutationSpec,
        **settings: Any,
    ) -> MergeInputs:
        """What the merge methods get: the models, net and batches on the module's device, the
        parameters as matching keys, each model's own batches where the data module has
        clients (:class:`~lmc.data.FederatedClients`: the checkpoints in client order), and
        ``settings`` (reference, seed, wm_method)."""
        device = module.device
        dm = datamodule_of(module.trainer)
        clients = getattr(dm, "client_batches", None)
        return MergeInputs(
            [{k: v.to(device) for k, v in s.items()} for s in states],
            spec,
            net=copy.deepcopy(net).to(device),
            keys=parameter_keys(net),
            loss=default_loss(dm),
            align_batches=self.batches(module)[1],
            train_batches=train_batches(dm, device),
            client_batches=clients(device) if clients is not None else None,
            **settings,
        )

    def run(
        self,
        module: L.LightningModule,
        net: nn.Module,
        states: Sequence[Mapping[str, Tensor]],
        spec: PermutationSpec,
        merges: Mapping[str, Mapping[int, Merged]],
        extra: dict[str, Any] | None = None,
    ) -> tuple[MergeSweep, Path]:
        """Evaluate every method at every n on the data module's splits and log it all."""
        trainer = module.trainer
        dm = datamodule_of(trainer)
        device = module.device
        splits, align = self.batches(module)
        net = copy.deepcopy(net).to(device)
        sweep = evaluate_sweep(
            net,
            [{k: v.to(device) for k, v in s.items()} for s in states],
            spec,
            merges,
            splits,
            loss=default_loss(dm),
            align_batches=align,
            pairwise=self.options.pairwise,
            sharpness_batches=align[: self.options.sharpness_batches],
            sharpness_probes=self.options.sharpness_probes,
            tasks=self.options.tasks,
            seed=self.seed,
        )
        # a method's scalar diagnostics are logged beside its metrics, the rest kept as details
        details: dict[str, dict[str, dict[str, Any]]] = {}
        for ev in sweep.evaluations:
            for key, value in merges[ev.method][ev.n].diagnostics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    ev.metrics[key] = float(value)
                else:
                    details.setdefault(ev.method, {}).setdefault(f"n{ev.n}", {})[key] = value
        extra = {**(extra or {}), **({"diagnostics": details} if details else {})}
        split = self.options.splits[-1]
        out = log_merge(trainer, sweep, extra, split=split)
        if trainer.is_global_zero:
            # on the CPU, so that the file loads on any machine without a map_location
            table = {
                m: {
                    n: [{g: t.cpu() for g, t in pi.items()} for pi in r.perms]
                    for n, r in by_n.items()
                    if r.perms is not None
                }
                for m, by_n in merges.items()
            }
            atomic_write(out / "permutations.pt", lambda f: torch.save(table, f))
        lines = [
            f"{ev.method:>10} n={ev.n:<3} {split} acc {ev.metrics[f'{split}/acc']:.4f} "
            f"(originals {ev.metrics[f'{split}/originals_acc']:.4f}), loss gap "
            f"{ev.metrics[f'{split}/loss_gap']:+.4f}"
            for ev in sweep.evaluations
        ]
        # a merge that diverged (non-finite weights or outputs) is a result, said out loud
        lines += [
            f"note: {m} n={n}: the merged model has non-finite weights; its metrics are NaN"
            for m, by_n in merges.items()
            for n, merged in by_n.items()
            if not all(
                bool(torch.isfinite(t).all())
                for t in merged.state.values()
                if t.is_floating_point()
            )
        ]
        lines += [
            f"note: {ev.method} n={ev.n}: {split} loss is not finite"
            for ev in sweep.evaluations
            if not math.isfinite(ev.metrics.get(f"{split}/loss", 0.0))
        ]
        rank_zero_info("\nMerged models:\n" + "\n".join(lines) + f"\nFigure and summary: {out}\n")
        return sweep, out

    def save(
        self,
        module: L.LightningModule,
        net: nn.Module,
        merges: Mapping[str, Mapping[int, Merged]],
        out: Path,
    ) -> None:
        """Write every merged model as ``merged_{method}_n{n}.ckpt`` into ``out`` (BatchNorm
        re-estimated as evaluated), loadable with :func:`lmc.io.load_checkpoint`."""
        if not module.trainer.is_global_zero:
            return
        for method, by_n in merges.items():
            for n, merged in by_n.items():
                state = self.merged_state(module, net, merged)
                save_net_checkpoint(state, out / f"merged_{method}_n{n}.ckpt")

    def merged_state(self, module: L.LightningModule, net: nn.Module, merged: Merged) -> dict:
        """The merged model's state, BatchNorm statistics re-estimated on the alignment subset
        (as evaluated), on the CPU."""
        model = merged.model(net).to(module.device)
        if has_batchnorm(model):
            reset_bn(model, self.batches(module)[1])
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}


class MergeArgs:
    """The arguments both merge tasks take (:class:`MergeTask`,
    :class:`~lmc.tasks.TrainedMergeTask`), checked and set by :meth:`read_merge_args`."""

    #: how many of ``methods`` train (the study pre-check reads it)
    trained_methods: ClassVar[int] = 0
    methods: list[str]
    method_options: dict[str, dict[str, Any]]
    num_models: list[int]
    checkpoints: list[str]
    spec_source: SpecSource
    reference: int
    wm_method: Method
    seed: int
    reporter: MergeReporter
    _net: nn.Module  # a template, not a submodule (set with object.__setattr__)

    def read_merge_args(
        self,
        net: nn.Module,
        checkpoints: Sequence[str],
        methods: Sequence[str],
        method_options: Mapping[str, Mapping[str, Any]] | None,
        num_models: Sequence[int] | None,
        reference: int,
        evaluation: MergeEvaluationOptions | None,
        wm_method: Method,
        seed: int,
        source: SpecSource,
    ) -> list[dict[str, Tensor]]:
        """Check the arguments before any work and set them: ``methods`` (as many that train
        as :attr:`trained_methods`), ``method_options`` (against each method's signature and
        the network's groups when known now), the checkpoints (:func:`load_models`), the spec
        ``source``, ``reference``, ``wm_method``, ``seed`` and the ``reporter``. Returns the
        models' states."""
        check_methods(methods, "model.init_args.methods", self.trained_methods)
        self.methods = list(methods)
        self.spec_source = source
        self.method_options = check_options(
            method_options, self.methods, "model.init_args.method_options", source.known
        )
        files, states, self.num_models = load_models(
            net, checkpoints, num_models, reference, source
        )
        object.__setattr__(self, "_net", net)
        self.checkpoints = files
        self.reference, self.wm_method, self.seed = reference, wm_method, seed
        self.reporter = MergeReporter(as_options(MergeEvaluationOptions, evaluation), seed)
        return states


class MergeTask(MergeArgs, EvaluationTask):
    """Merge the first n checkpoints for every n in ``num_models`` with every method named and
    report the merge metrics (004 §3, §5, §6). Run with ``lmc validate``.

    Methods: any entry of :data:`lmc.merging.MERGE_METHODS` that does not train, e.g. ``naive``
    (plain average, no permutation), ``wm_ref`` (each model weight-matched to the reference
    checkpoint, 004 §3.1), ``mergemany`` (Ainsworth et al. 2023, App. A.10), ``ccmm``,
    ``otfusion``, ``fedma``, ``zip`` or one registered in user code; a method that trains
    (``stemm``, ``ste``, ``sinkhorn``) runs with ``lmc fit`` and
    :class:`~lmc.tasks.TrainedMergeTask`. Matching uses the parameters; BatchNorm statistics
    follow the permutation and are reset on the alignment subset for every merged model
    evaluated.

    Args:
        net: the architecture of the checkpoints (class_path/init_args).
        checkpoints: 2 or more ``.ckpt`` files or run folders (their final checkpoint) of that
            architecture.
        num_models: the numbers of models n to merge (each the first n checkpoints); default
            all of them.
        methods: merge methods to run (names registered in ``MERGE_METHODS``).
        method_options: per method, its keyword options (e.g. ``{mergemany: {max_rounds: 50}}``), checked
            against the method's signature before any work.
        reference: index of the reference checkpoint (``wm_ref``'s target, OTFusion's base).
        evaluation: the splits (``train`` = the alignment subset; the last one is reported and
            used for the pairwise merges), ``max_batches``, ``pairwise`` merges (004 Fig. 4) and
            sharpness (004 §6.2) (:class:`~lmc.tasks.options.MergeEvaluationOptions`).
        wm_method: weight-matching variant of the methods that weight-match (same optimum up to
            ties).
        save_merged: also write every merged model as ``merged_{method}_n{n}.ckpt`` into the
            run directory (BatchNorm re-estimated as evaluated; a partial zip as the state of a
            :class:`~lmc.models.MultiHead`), loadable with :func:`lmc.io.load_checkpoint`.
        seed: seed of the matching's group order and of the sharpness probes.
        spec: the permutation spec source: ``auto``, ``builtin``, ``derive`` or
            ``package.module:function`` (:mod:`lmc.permutation.source`).
    """

    moved_keys: ClassVar[dict[str, str]] = moved_into("evaluation", MergeEvaluationOptions)
    spec: PermutationSpec

    def __init__(
        self,
        net: nn.Module,
        checkpoints: list[str],
        num_models: list[int] | None = None,
        methods: list[str] | None = None,
        method_options: dict[str, dict[str, Any]] | None = None,
        reference: int = 0,
        evaluation: MergeEvaluationOptions | None = None,
        wm_method: Method = "accelerated",
        save_merged: bool = False,
        seed: int = 0,
        spec: str = "auto",
    ) -> None:
        super().__init__()
        save_task_hparams(self, ["net"])
        self.save_merged = save_merged
        given = methods if methods is not None else ["naive", "wm_ref", "mergemany"]
        self.states = self.read_merge_args(
            net, checkpoints, given, method_options, num_models, reference, evaluation,
            wm_method, seed, SpecSource(spec, net),
        )  # fmt: skip
        self.sweep: MergeSweep | None = None

    @classmethod
    def produces(cls, init_args: dict[str, Any], n_models: int | None = None) -> set[str]:
        """The summary keys a run with ``init_args`` reports, as ``fnmatch`` patterns
        (:func:`lmc.tasks.merge_report.merge_metric_names`), known before it runs; ``n_models``:
        the checkpoints it will be given (a study job's inputs), the ``num_models`` default."""
        given = init_args.get("methods")
        methods = list(given) if given is not None else ["naive", "wm_ref", "mergemany"]
        ns = init_args.get("num_models") or ([n_models] if n_models else None)
        return merge_metric_names(methods, ns, dict(init_args.get("evaluation") or {}))

    def evaluate(self) -> None:
        # the validation loop runs under inference mode; the sharpness estimate needs
        # autograd, so the report builds its models and batches outside of it
        with torch.inference_mode(False):
            self._merge()

    def _merge(self) -> None:
        dm = datamodule_of(self.trainer)
        self.spec = self.spec_source.resolve(dm, self.device)
        check_models(self._net, self.states, self.spec, self.checkpoints)
        inputs = self.reporter.inputs(
            self,
            self._net,
            self.states,
            self.spec,
            reference=self.reference,
            seed=self.seed,
            wm_method=self.wm_method,
        )
        merges = {
            m: merge_sweep(inputs, m, self.num_models, self.method_options.get(m))
            for m in self.methods
        }
        self.sweep, out = self.reporter.run(
            self, self._net, self.states, self.spec, merges, {"checkpoints": self.checkpoints}
        )
        if self.save_merged:
            self.reporter.save(self, self._net, merges, out)
