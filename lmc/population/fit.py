"""``lmc fit --population [s1, s2, ...]``: N seeds of one config trained as one vectorised run.

Member k is the run ``lmc fit --seed_everything s_k`` would be: its network is built as the
CLI's own ``instantiate_classes`` builds it right after ``seed_everything(s_k)`` (same initial
weights; the members after the second by their classes called directly, once that gave the
second exactly the CLI's build: :mod:`lmc.population.build`),
it sees the batches of ``EpochShuffle(n, s_k)`` (same data order, batch size, no drop_last),
and the config's optimizer and LR scheduler act elementwise on the stacked parameters (same
updates). Each member is written as an ordinary run folder ``<run>/members/seed=<s>/`` with
its ``config.yaml`` and ``checkpoints/last.ckpt``, which ``lmc validate`` / ``--spawn_from``
read like any other run. This is the CLI glue; the algorithm is in :mod:`lmc.population.train`.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from operator import methodcaller
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from lmc.data.base import epoch_order
from lmc.engine.seam import experiment_started
from lmc.io import atomic_write, config_to_save, load_state
from lmc.population.build import DirectBuild, same_state
from lmc.population.checks import (
    check_task,
    check_trainer,
    choose_device,
    population_seeds,
    train_tensors,
)
from lmc.population.members import (
    WRITERS,
    MemberTrainer,
    MetricSink,
    member_configs,
    member_logger,
    plain_values,
    write_member,
)
from lmc.population.pruning import PopulationPruning, is_pruning_callback
from lmc.population.train import Population, train_population
from lmc.population.vectorize import (
    ELEMENTWISE_OPTIMIZERS,
    available_memory,
    check_fits,
    check_vectorizable,
    estimate_bytes,
    member_optimizer_state,
    member_state,
    optimizer_slots,
    stack_states,
)
from lmc.tasks.rundir import logger_dir

MEMBERS_DIR = "members"


def member_orders(n: int, seeds: list[int], epoch: int) -> Tensor:
    """(N, n): row k is the order in which the sequential run with ``seeds[k]`` visits the ``n``
    training samples in ``epoch`` (:class:`lmc.data.base.EpochShuffle` seeded with
    ``data_order_seed()``, i.e. the run's seed modulo 2**32)."""
    return torch.stack([epoch_order(n, s % 2**32, epoch) for s in seeds])


def _loggers(trainer_init: Any, root: str) -> list[Logger]:
    logger = trainer_init.get("logger")
    if logger is False:
        return []
    if logger is None or logger is True:
        return [CSVLogger(root, name="lightning_logs")]
    return list(logger) if isinstance(logger, (list, tuple)) else [logger]


def _run_dir(loggers: list[Logger], root: str) -> Path:
    """:func:`lmc.tasks.rundir.run_dir` without a Trainer: the first logger's run folder."""
    # create the log folders before anything is written into them
    for logger in loggers:
        _ = logger.experiment  # type: ignore[attr-defined]  # not on Lightning's Logger base
    return logger_dir(loggers[0], root) if loggers else Path(root)


class PopulationFit:
    """The members of ``--population`` built from the CLI's parsed config, trained together.

    Args:
        cli: the ``LMCCLI`` after parsing and seeding, before it instantiates classes.
    """

    def __init__(self, cli: Any) -> None:
        self.cli, self.sub = cli, cli.subcommand  # None when built with run=False
        self.cfg = cli.config[self.sub] if self.sub else cli.config
        self.seeds = population_seeds(self.cfg.population)
        check_trainer(self.cfg.trainer, self.cfg)
        self._check_parameters_fit()  # before any member takes memory
        first = self._instantiate(self.seeds[0])
        self.init, self.tasks = first, [first.model]
        check_task(self.tasks[0])
        self.datamodule = first.data
        self.history: list[tuple[int, dict[str, float]]] = []  # what was logged, to replay
        self.device = choose_device(self.cfg.trainer.get("accelerator"))
        x, y = self._check_first()  # data, vmap and memory: before the other members exist
        # the other members need their task alone: built from the model's config when that
        # gives member 0 its task's exact weights (nothing instantiated before the model draws
        # from the seeded generators), else from the whole config as the CLI would
        alone = len(self.seeds) > 1 and same_state(first.model, self._task(self.seeds[0]))
        build: Callable[[int], Any] = (
            self._task if alone else (lambda seed: self._instantiate(seed).model)
        )
        self.built_from = "model" if alone else "config"
        rest = self.seeds[1:]
        # faster still: the classes called directly (no parser), once that gave the second
        # member exactly the CLI's build (lmc.population.build)
        direct = DirectBuild.plan(self.cfg.model, first.model) if alone and len(rest) > 1 else None
        twin = direct.matches(rest[0], self._task) if direct is not None else None
        if twin is not None:
            assert direct is not None  # twin is its build
            self.tasks.append(twin)
            build, rest, self.built_from = direct, rest[1:], "direct"
        self.tasks += [build(seed) for seed in rest]
        self._setup(x, y)  # every check before any folder is made

    def _instantiate(self, seed: int) -> Any:
        """The whole config instantiated for member ``seed``, exactly as the CLI would."""
        config = copy.deepcopy(self.cli.config)
        (config[self.sub] if self.sub else config).seed_everything = seed
        seed_everything(seed, workers=True)
        init = self.cli.parser.instantiate_classes(config)
        return init[self.sub] if self.sub else init

    def _task(self, seed: int) -> Any:
        """Member ``seed``'s task alone, instantiated from the model's config after seeding
        (half the time of the whole config's: 6 of 12 ms a member for the MNIST MLP)."""
        config = Namespace(model=copy.deepcopy(self.cfg.model))
        if self.sub:
            config = Namespace(**{self.sub: config})
        seed_everything(seed, workers=True)
        init = self.cli.parser.instantiate_classes(config)
        return (init[self.sub] if self.sub else init).model

    def _check_parameters_fit(self) -> None:
        """Refuse at once a population whose parameters, gradients and optimizer state alone
        (a lower bound of its memory, activations left out) exceed the free memory: the
        network is built on PyTorch's ``meta`` device, which holds no data. A config that
        cannot be built there is left to the full estimate after the first member."""
        device = choose_device(self.cfg.trainer.get("accelerator"))
        try:
            with torch.device("meta"):
                probe = self._instantiate(self.seeds[0]).model
            slots = optimizer_slots(probe.optimizer([torch.zeros(1, requires_grad=True)]))
            params = sum(p.numel() for p in probe.net.parameters())
        except Exception:  # noqa: BLE001 - only an early refusal; the full check follows
            return
        limit, n = available_memory(device), len(self.seeds)
        check_fits(4 * params * (3 + slots), limit, n, device, with_activations=False)

    # --- setup -------------------------------------------------------------------------------
    def _check_first(self) -> tuple[Tensor, Tensor]:
        """On the first member alone: the network vectorises, the data is in memory, and the
        whole population's memory (estimated from this member) fits the device; returns the
        training tensors."""
        task, dm = self.tasks[0], self.datamodule
        net = task.net
        dm.prepare_data()
        dm.setup("fit")
        x, y = train_tensors(dm)
        check_vectorizable(net, x[:2])  # any layer vmap cannot run, named
        probe = task.optimizer([torch.zeros(1, requires_grad=True)])  # its kind and slots
        if not isinstance(probe, ELEMENTWISE_OPTIMIZERS):
            raise ValueError(
                f"--population needs an elementwise optimizer (member k's update of the stacked "
                f"parameters must be its own); {type(probe).__name__} is not among "
                f"{', '.join(o.__name__ for o in ELEMENTWISE_OPTIMIZERS)}"
            )
        per_member = estimate_bytes(net, 1, optimizer_slots(probe), x[:1], dm.batch_size)
        check_fits(per_member, available_memory(self.device), len(self.seeds), self.device)
        return x, y

    def _setup(self, x: Tensor, y: Tensor) -> None:
        net = self.tasks[0].net
        nets = [t.net for t in self.tasks]
        self.params, self.buffers = stack_states(nets)
        self.params = {
            k: v.to(self.device).detach().requires_grad_(v.requires_grad)
            for k, v in self.params.items()
        }
        self.buffers = {k: v.to(self.device) for k, v in self.buffers.items()}
        self.optimizer = self.tasks[0].optimizer(list(self.params.values()))
        sched = self.tasks[0].lr_scheduler
        self.scheduler = sched(self.optimizer) if sched is not None else None
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError(
                "--population: ReduceLROnPlateau follows one monitored metric, but each member "
                "has its own; use a fixed schedule or train the members as separate runs"
            )
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.net = net.to(self.device)
        for t in self.tasks:
            t.to(self.device)
        pruners = [cb for cb in self._callbacks() if is_pruning_callback(cb)]
        if len(pruners) > 1:
            raise ValueError(
                f"--population: {len(pruners)} MagnitudePruning callbacks; a run prunes with one "
                "(its strategy and schedule say when)"
            )
        self.pruning = (
            PopulationPruning(pruners[0], net, self.params, self.buffers) if pruners else None
        )
        self.population = Population(
            self.net, self.params, self.buffers, self.tasks[0].loss, self.pruning
        )
        n = len(self.x)
        self.orders = lambda epoch: member_orders(n, self.seeds, epoch)

    # --- run ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Train, evaluate and write every member; log per-member and mean metrics."""
        trainer = self.cfg.trainer
        root = trainer.get("default_root_dir") or "runs"
        self.loggers = _loggers(self.init.trainer, root)
        self.run_dir = _run_dir(self.loggers, root)
        self._write_config(self.run_dir / "config.yaml", self.cfg)
        for logger in self.loggers:
            logger.log_hyperparams(yaml.safe_load(self._dump(self.cfg)))
        epochs = trainer.get("max_epochs")
        epochs = 1000 if epochs is None else int(epochs)
        every = trainer.get("check_val_every_n_epoch") or 0
        limit_val = trainer.get("limit_val_batches")
        self.epochs = epochs
        start = time.perf_counter()

        self._measure("on_fit_start", 0, 0)
        pruning = self.pruning
        if pruning is not None:
            late = [e.epoch for e in pruning.events if e.epoch is not None and e.epoch >= epochs]
            if late:
                rank_zero_warn(
                    f"MagnitudePruning: pruning epochs {late} >= max_epochs={epochs} never run; "
                    "raise trainer.max_epochs or lower prune_epoch"
                )

        def on_epoch_start(epoch: int) -> None:
            if pruning is None:
                return
            for event in pruning.due(epoch):
                pruning.prune(event, self.params, self.buffers, self.optimizer)

        def on_epoch_end(epoch: int, step: int, train_loss: Tensor) -> None:
            if pruning is not None and epoch == epochs - 1 and pruning.pending_final():
                # only_prune: after the last step, before the final validation and checkpoint
                pruning.prune(pruning.events[-1], self.params, self.buffers, self.optimizer)
            metrics = self._per_member("train/loss", train_loss.tolist())
            if every and limit_val != 0 and (epoch + 1) % every == 0:
                metrics |= self._evaluate("val", self.datamodule.val_dataloader())
            self._log({**metrics, "epoch": epoch}, step)
            self._measure("on_train_epoch_end", epoch, step)
            if epoch == epochs - 1:
                self._write_members(epoch, step)

        self.steps = train_population(
            self.population,
            self.optimizer,
            self.scheduler,
            self.tasks[0].scheduler_interval,
            self.x,
            self.y,
            self.orders,
            epochs,
            self.datamodule.batch_size,
            on_epoch_end,
            on_epoch_start,
        )
        seconds = time.perf_counter() - start
        if self.cfg.get("test_after_fit"):
            self.datamodule.setup("test")
            self._log(self._evaluate("test", self.datamodule.test_dataloader()), self.steps)
        for logger in self.loggers:
            logger.save()
            logger.finalize("success")
        self._log_members()
        rank_zero_info(
            f"population of {len(self.seeds)} members trained {epochs} epochs in {seconds:.1f} s; "
            f"members written to {self.run_dir / MEMBERS_DIR}"
        )

    def _measure(self, hook: str, epoch: int, step: int) -> None:
        """Run the measurement callbacks' ``hook`` on every member's network, as its sequential
        run's Trainer would at ``epoch`` and ``step``, and log what they log per member."""
        # the pruning callback's pruning is the population's own (lmc.population.pruning):
        # of its hooks only the per-epoch log runs, on each member
        callbacks = [
            cb
            for cb in self._callbacks()
            if not is_pruning_callback(cb) or hook == "on_train_epoch_end"
        ]
        if not callbacks:
            return
        values: dict[str, list[float]] = {}
        computing = self.population.computing()  # once for all members: masks applied
        for k, task in enumerate(self.tasks):
            load_state(task.net, member_state(computing, self.buffers, k))
            sink = MetricSink()
            trainer = MemberTrainer(epoch, step, self.epochs, [sink])
            for cb in callbacks:
                getattr(cb, hook)(trainer, task)
            for name, value in sink.metrics.items():
                values.setdefault(name, [float("nan")] * len(self.tasks))[k] = value
        metrics: dict[str, float] = {}
        for name, vals in values.items():
            metrics |= self._per_member(name, vals)
        if metrics:
            self._log({**metrics, "epoch": epoch}, step)

    def _callbacks(self) -> list[Any]:
        return list(self.init.trainer.get("callbacks") or [])

    def _per_member(self, name: str, values: list[float]) -> dict[str, float]:
        out = {f"member/{k}/{name}": v for k, v in enumerate(values)}
        out[name] = sum(values) / len(values)
        return out

    def _evaluate(self, stage: str, loader: Any) -> dict[str, float]:
        """Each member's ``stage`` loss and metrics with its task's own metric objects."""
        losses = [t.losses[f"{stage}_"] for t in self.tasks]
        metrics = [t.metrics[f"{stage}_"] for t in self.tasks]

        def update(out: Tensor, y: Tensor) -> None:
            for k, task in enumerate(self.tasks):
                losses[k].update(task.loss(out[k], y), y.shape[0])
                metrics[k].update(out[k], y)

        self.population.evaluate(loader, self.device, update)
        results: dict[str, list[float]] = {f"{stage}/loss": [float(m.compute()) for m in losses]}
        for k, m in enumerate(metrics):
            for key, value in m.compute().items():
                results.setdefault(key, [0.0] * len(self.tasks))[k] = float(value)
        for m in (*losses, *metrics):
            m.reset()
        out: dict[str, float] = {}
        for name, values in results.items():
            out |= self._per_member(name, values)
        return out

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append((step, metrics))
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def member_metrics(self, k: int) -> list[tuple[int, dict[str, float]]]:
        """Member ``k``'s logged history under the names its sequential run logs
        (``member/<k>/val/loss`` -> ``val/loss``), step by step."""
        prefix = f"member/{k}/"
        out = []
        for step, metrics in self.history:
            mine = {n[len(prefix) :]: v for n, v in metrics.items() if n.startswith(prefix)}
            if mine:
                out.append(
                    (step, {**mine, **({"epoch": metrics["epoch"]} if "epoch" in metrics else {})})
                )
        return out

    def _log_members(self) -> None:
        with warnings.catch_warnings():
            self._replay_members()

    def _replay_members(self) -> None:
        """Each member's metrics to its own run of every logger kind the population used: a
        CSV ``metrics.csv`` and a W&B run (grouped with the population's) in its folder, as
        its sequential twin would have them. Written once the population's own runs are
        closed (W&B keeps one active run per process)."""
        for logger in self.loggers:
            if isinstance(logger, WandbLogger) and experiment_started(logger):
                logger.experiment.finish()
        # the member folders already hold their checkpoints and config: not an old run's logs
        warnings.filterwarnings("ignore", "Experiment logs directory .* exists and is not empty")
        csv_text: Callable[[int], str] | None = None
        for k, seed in enumerate(self.seeds):
            folder = self.member_dir(seed)
            cfg = {**self._member_cfg, "seed_everything": seed}  # its config.yaml, parsed
            for main in self.loggers:
                member = member_logger(main, folder, seed)
                if member is None:
                    continue
                csv = isinstance(member, CSVLogger)
                if isinstance(member, CSVLogger):
                    path = Path(member.experiment.log_dir) / member.experiment.NAME_HPARAMS_FILE
                if csv and csv_text is not None:
                    # the first member's hparams.yaml with this one's seed: one YAML dump for
                    # all (Lightning dumps the whole dict twice a call, key by key first)
                    text = csv_text(seed)
                    atomic_write(path, methodcaller("write", text), mode="w")
                else:  # the CLI's config: all a run logs (lmc.engine.seam.log_config_only)
                    member.log_hyperparams(cfg)
                    if csv:
                        csv_text = member_configs(path.read_text())
                for step, metrics in self.member_metrics(k):
                    member.log_metrics(metrics, step=step)
                member.save()
                member.finalize("success")
                if isinstance(member, WandbLogger):
                    member.experiment.finish()

    # --- output ------------------------------------------------------------------------------
    def _dump(self, cfg: Any) -> str:
        return config_to_save(self.cli.subcommand_parser(self.sub).dump(cfg, skip_none=False))

    def _write_config(self, path: Path, cfg: Any) -> None:
        text = self._dump(cfg)
        atomic_write(path, lambda f: f.write(text), mode="w")

    def member_dir(self, seed: int) -> Path:
        """The run folder of the member trained with ``seed``."""
        return self.run_dir / MEMBERS_DIR / f"seed={seed}"

    def _write_members(self, epoch: int, step: int) -> None:
        """Each member as the run its sequential twin would leave: config + checkpoints."""
        opt_state = self.optimizer.state_dict()
        params = list(self.params.values())
        scheds = [self.scheduler.state_dict()] if self.scheduler is not None else []
        cfg = copy.deepcopy(self.cfg)
        cfg.seed_everything, cfg.population = self.seeds[0], None
        first = self._dump(cfg)  # one dump (~0.2 s); the members' configs differ in the seed
        config_of = member_configs(first)
        self._member_cfg = yaml.safe_load(first)
        names = (f"epoch={epoch}-step={step}.ckpt", "last.ckpt")
        # the members' files are written WRITERS at a time in threads (serialising, writing and
        # flushing them to disk is most of the time: 2.5 s of a 7.6 s run of 64 MNIST MLPs on
        # an H100 host, one member after the other), WRITERS members' checkpoints in memory
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="lmc-members") as pool:
            pending: list[Future[None]] = []
            # as the twins' checkpoints hold them: pruned weights folded (orig * mask), once
            computing = self.population.computing()
            for k, (seed, task) in enumerate(zip(self.seeds, self.tasks)):
                load_state(task.net, member_state(computing, self.buffers, k))
                ckpt = {
                    "epoch": epoch,
                    "global_step": step,
                    "pytorch-lightning_version": L.__version__,
                    "state_dict": {n: v.detach().cpu() for n, v in task.state_dict().items()},
                    "optimizer_states": [
                        move_data_to_device(member_optimizer_state(opt_state, params, k), "cpu")
                    ],
                    "lr_schedulers": scheds,
                    "hparams_name": "kwargs",
                    "hyper_parameters": plain_values(dict(task.hparams)),
                    "population": {"seeds": list(self.seeds), "member": k},
                }
                if self.pruning is not None:  # its masks, for a resume, as the twin keeps them
                    key = self.pruning.callback.state_key
                    ckpt["callbacks"] = {key: self.pruning.member_state(k)}
                if len(pending) == WRITERS:
                    pending.pop(0).result()
                pending.append(
                    pool.submit(write_member, self.member_dir(seed), config_of(seed), ckpt, names)
                )
            for job in pending:
                job.result()
