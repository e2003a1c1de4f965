"""The merge contract (SPEC C4, C6, C7): one registry of merge methods, read by name.

A merge method is one function ``method(inputs, **options)``, its options the function's
keyword parameters (their only home: a config's ``method_options`` are checked against them):

* :class:`MergeInputs` carries the models (full state dicts, on the device to run on), their
  architecture and permutation spec, the matching settings every method may use (``reference``,
  ``keys``, ``seed``, ``wm_method``) and the data a method may need: the fixed alignment subset
  (activations, BatchNorm), the training split (methods that fine-tune) and each model's own
  batches (FedMA's clients). A method asks for what it needs with :meth:`MergeInputs.need`,
  which names the missing piece.
* :class:`Merged` is what a method returns: the merged model's full state (its widths may differ
  from the net's, as OTFusion's and FedMA's may; BatchNorm statistics are re-estimated by
  whoever evaluates it), one permutation per model where the method permutes, and its
  diagnostics.
* A method that *trains* (STE-MM, STE, Sinkhorn re-basin) is registered with ``trains=True``
  and returns a :class:`~lmc.merging.search.MergeSearch` instead, a module with a loss and a
  result: ``lmc fit`` trains it (:class:`lmc.tasks.TrainedMergeTask`), as does the one plain
  loop :func:`~lmc.merging.search.train_search`.
* :data:`MERGE_METHODS` holds them all, each as a :class:`MergeMethodEntry` (name, function,
  whether it trains, the inputs it needs, the paper it implements, its options read from the
  signature). A method that only finds permutations is registered through
  :func:`by_permutation`, which averages ``pi_i(theta_i)``.

Adding a method is one function and ``@MERGE_METHODS.register("name", paper=...)`` in a module
imported before the config is parsed (docs: "Add a merge method").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from lmc.evaluation import LossName
from lmc.interpolation.states import weighted_average
from lmc.permutation import Permutation, PermutationSpec, apply_permutation
from lmc.permutation.weight_matching import Method
from lmc.registry import Registry, declared

if TYPE_CHECKING:
    from lmc.merging.ste import ModelBank

StateDict = Mapping[str, Tensor]

#: what each optional input of :class:`MergeInputs` is, for the error of a method that needs it
_INPUTS = {
    "net": "the architecture",
    "align_batches": "the fixed alignment subset of the training data",
    "train_batches": "the training split's batches (the method trains)",
    "client_batches": "each model's own training batches (one list per model)",
}


@dataclass(frozen=True)
class MergeInputs:
    """What a merge method gets.

    Attributes:
        states: the n >= 2 models' full state dicts, on the device to run on.
        spec: their permutation spec.
        net: the architecture (a template: copy it before changing it).
        keys: the entries matching objectives use (the parameters; ``None``: every
            floating-point entry).
        reference: the model whose units the others are matched to (methods with one).
        seed: seed of any randomness (group orders, mixing weights, training).
        wm_method: weight-matching variant for methods that weight-match.
        loss: training/evaluation loss (``cross_entropy`` or ``mse``).
        align_batches: the fixed alignment subset (``(x, y)`` batches).
        train_batches: a re-iterable of the training split's batches.
        client_batches: each model's own training batches (FedMA's clients).
        bank: the models held as module buffers (a :class:`~lmc.merging.ste.ModelBank`), which
            the searches of a sweep over n share instead of holding a copy each.
    """

    states: Sequence[StateDict]
    spec: PermutationSpec
    net: nn.Module | None = None
    keys: Sequence[str] | None = None
    reference: int = 0
    seed: int = 0
    wm_method: Method = "accelerated"
    loss: LossName = "cross_entropy"
    align_batches: Sequence[Any] | None = None
    train_batches: Iterable[Any] | None = None
    client_batches: Sequence[Sequence[Any]] | None = None
    bank: ModelBank | None = None

    def first(self, n: int) -> MergeInputs:
        """The inputs of the first ``n`` models."""
        clients = self.client_batches[:n] if self.client_batches is not None else None
        return replace(self, states=list(self.states[:n]), client_batches=clients)

    def need(self, name: str, method: str) -> Any:
        """The optional input ``name``, or an error saying that ``method`` needs it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(
                f"merge method {method!r} needs {name} ({_INPUTS[name]}), which its caller did "
                "not give; run it from a task that has a data module (lmc.tasks.MergeTask or "
                "lmc.tasks.TrainedMergeTask)"
            )
        return value


@dataclass
class Merged:
    """What a merge method returns.

    Attributes:
        state: the merged model's full state dict (widths may differ from the net's).
        perms: one permutation per model (``pi_i``, the merge is ``1/n sum_i pi_i(theta_i)``),
            or ``None`` for a method that does not permute (OTFusion's transport, FedMA).
        diagnostics: the method's own numbers (widths, timings, losses), logged with it.
        heads: 0 when ``state`` is a state of the net; n when it is the state of a
            :class:`~lmc.models.MultiHead` of n members (a partial merge: shared trunk, one head
            per model, their outputs averaged).
    """

    state: dict[str, Tensor]
    perms: list[Permutation] | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    heads: int = 0

    def model(self, net: nn.Module) -> nn.Module:
        """A copy of ``net`` (or a MultiHead of it) holding the merged state (widths may
        differ from ``net``'s)."""
        from lmc.merging.otfusion import materialize
        from lmc.models.multihead import MultiHead

        return materialize(MultiHead(net, self.heads) if self.heads else net, self.state)

    @classmethod
    def from_perms(
        cls,
        states: Sequence[StateDict],
        spec: PermutationSpec,
        perms: Sequence[Permutation],
        diagnostics: dict[str, Any] | None = None,
    ) -> Merged:
        """The average of the permuted models ``1/n sum_i pi_i(theta_i)``."""
        if len(perms) != len(states):
            raise ValueError(f"got {len(states)} models but {len(perms)} permutations")
        aligned = [apply_permutation(s, spec, p) for s, p in zip(states, perms)]
        return cls(weighted_average(aligned), list(perms), diagnostics or {})


#: a registered merge method: ``(inputs, **options) -> Merged``, or for one that trains
#: ``(inputs, **options) -> MergeSearch``
MergeMethod = Callable[..., Any]


@dataclass(frozen=True)
class MergeMethodEntry:
    """One registered merge method.

    Attributes:
        name: the name configs use.
        fn: the function (``(inputs, **options) -> Merged``; with ``trains``, ``-> MergeSearch``).
        trains: whether it returns a search to train (``lmc fit``) rather than the merge.
        needs: the optional :class:`MergeInputs` it always needs (e.g. ``align_batches``).
        paper: the paper it implements (a short reference; docs: References).
    """

    name: str
    fn: MergeMethod
    trains: bool = False
    needs: tuple[str, ...] = ()
    paper: str = ""

    @property
    def options(self) -> dict[str, inspect.Parameter]:
        """Its keyword options and their defaults, read from the signature."""
        return method_options(self.fn)


class MergeRegistry(Registry[MergeMethod]):
    """The merge methods: a :class:`~lmc.registry.Registry` whose entries also say whether they
    train, what they need and which paper they implement (:class:`MergeMethodEntry`)."""

    def __init__(self) -> None:
        super().__init__(
            "merge method",
            "method(inputs: MergeInputs, **options) -> Merged (or -> MergeSearch, trains=True)",
        )
        self._info: dict[str, MergeMethodEntry] = {}

    def register(
        self,
        name: str,
        *,
        trains: bool = False,
        needs: Sequence[str] = (),
        paper: str = "",
    ) -> Callable[[MergeMethod], MergeMethod]:
        """Decorator registering a merge method under ``name``; ``trains``, ``needs`` and
        ``paper`` as in :class:`MergeMethodEntry`."""
        unknown = [n for n in needs if n not in _INPUTS]
        if unknown:
            raise ValueError(f"needs: unknown inputs {unknown}; choose from {list(_INPUTS)}")
        add = super().register(name)

        def wrap(fn: MergeMethod) -> MergeMethod:
            add(fn)
            self._info[name] = MergeMethodEntry(name, fn, trains, tuple(needs), paper)
            return fn

        return wrap

    def entry(self, name: str) -> MergeMethodEntry:
        """The entry of ``name`` (an unknown name: the registry's error listing the known)."""
        fn = self.get(name)
        info = self._info.get(name)
        return info if info is not None and info.fn is fn else MergeMethodEntry(name, fn)

    def trained(self) -> list[str]:
        """The names of the methods that train."""
        return [n for n in self.names() if self.entry(n).trains]


MERGE_METHODS = MergeRegistry()

#: the arguments :func:`by_permutation` passes from :class:`MergeInputs` (not options)
_MATCHING_ARGS = ("states", "spec", "keys", "reference", "method", "seed")


class _PermutationMethod:
    """The merge method :func:`by_permutation` makes: ``method(inputs, **options) -> Merged``,
    named and documented as ``permutations``, the function it wraps; ``nested`` as there."""

    def __init__(self, perms_fn: Callable[..., list[Permutation]], nested: bool) -> None:
        self.permutations = perms_fn
        self.nested = nested
        self.__name__ = self.__qualname__ = perms_fn.__name__
        self.__doc__ = perms_fn.__doc__

    def __call__(self, inputs: MergeInputs, **options: Any) -> Merged:
        settings = declared(
            self.permutations,
            keys=inputs.keys,
            reference=inputs.reference,
            method=inputs.wm_method,
            seed=inputs.seed,
        )
        perms = self.permutations(inputs.states, inputs.spec, **settings, **options)
        return Merged.from_perms(inputs.states, inputs.spec, perms)


def by_permutation(
    perms_fn: Callable[..., list[Permutation]], *, nested: bool = False
) -> MergeMethod:
    """A merge method from a function that finds one permutation per model.

    ``perms_fn(states, spec, *, <matching settings it uses>, **options) -> perms``: of
    ``keys``, ``reference``, ``method`` (the weight-matching variant) and ``seed`` it is given
    those it declares, from :class:`MergeInputs`; the merge is the average of the permuted
    models. ``nested``: the first n models' permutations are the first n of all models' (each
    model matched on its own), so one call serves every n of a sweep.
    """
    return _PermutationMethod(perms_fn, nested)


def _signature_of(fn: MergeMethod) -> inspect.Signature:
    return inspect.signature(getattr(fn, "permutations", fn))


def method_options(fn: MergeMethod) -> dict[str, inspect.Parameter]:
    """The keyword options of a merge method (what ``method_options`` may set) and defaults."""
    params = list(_signature_of(fn).parameters.values())
    if not hasattr(fn, "permutations"):
        params = params[1:]  # the inputs
    skip = _MATCHING_ARGS if hasattr(fn, "permutations") else ()
    return {
        p.name: p
        for p in params
        if p.name not in skip and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


#: the ranges of the built-in methods' numeric options (``>=a``, ``>a``, ``[a,b]``, ``[a,b)``;
#: ``None`` is always allowed where the option takes it): a count of 0 or an lr of -1 ran,
#: and quietly turned a method into another (MergeMany with no rounds is the plain average)
OPTION_RANGES: dict[str, dict[str, str]] = {
    "mergemany": {"max_rounds": ">=1"},
    "ccmm": {"max_iter": ">=1"},
    "sinkhorn": {"tau_start": ">0", "tau_end": ">0", "sinkhorn_iters": ">=1", "init_scale": ">=0"},
    "otfusion": {
        "prune_rate": "[0,1)",
        "prune_rounds": ">=1",
        "finetune_epochs": ">=0",
        "finetune_lr": ">0",
    },
    "fedma": {
        "rounds": ">=1",
        "epochs": ">=0",
        "lr": ">0",
        "momentum": "[0,1]",
        "weight_decay": ">=0",
        "sigma": ">0",
        "sigma0": ">0",
        "gamma": ">0",
        "max_width": ">0",
        "prune_rate": "[0,1)",
    },
    "zip": {"alpha": "[0,1]", "beta": "[0,1]"},
}


def _out_of_range(value: Any, rule: str) -> bool:
    """Whether the number ``value`` breaks ``rule`` (see :data:`OPTION_RANGES`)."""
    if rule.startswith(">="):
        return value < float(rule[2:])
    if rule.startswith(">"):
        return value <= float(rule[1:])
    low, high = (float(x) for x in rule[1:-1].split(","))
    return value < low or value > high or (rule.endswith(")") and value == high)


def check_methods(methods: Sequence[str] | None, field: str, trained: int | None = None) -> None:
    """Merge method names as given in a config: registered ones, and not an empty list (which
    ran the default methods while the saved config said ``[]``); with ``trained``, exactly that
    many of them train (0: ``lmc validate``'s :class:`~lmc.tasks.MergeTask`; 1: ``lmc fit``'s
    :class:`~lmc.tasks.TrainedMergeTask`).

    Raises:
        ValueError: an empty list, an unknown name (listing the registered ones), or a method
            that trains where none may (naming ``lmc fit`` and the config to use) or not exactly
            one where one must.
    """
    if methods is not None and len(methods) == 0:
        raise ValueError(
            f"{field} is empty: name at least one merge method, or leave it out for the "
            "default naive, wm_ref and mergemany"
        )
    for m in methods or []:
        MERGE_METHODS.check(m, field)
    training = [m for m in methods or [] if MERGE_METHODS.entry(m).trains]
    if trained == 0 and training:
        raise ValueError(
            f"{field}: {', '.join(map(repr, training))} trains, and lmc validate does not train; "
            f"run it with lmc fit and model.class_path lmc.tasks.TrainedMergeTask, {field} "
            "listing the trained method and the methods to compare with it (e.g. "
            "configs/merge/mnist_mlp_stemm.yaml)"
        )
    if trained == 1 and len(training) != 1:
        raise ValueError(
            f"{field} must name exactly one merge method that trains (one of "
            f"{', '.join(MERGE_METHODS.trained())}), beside the methods compared with it; "
            f"got {list(methods or [])}"
        )


def _type_error(value: Any, annotation: Any) -> str | None:
    """Why ``value`` is not of the plain ``annotation`` (``float``, ``int``, ``bool``, ``str``,
    ``None`` and unions of them; other annotations are not checked), or ``None``."""
    import types
    import typing

    if annotation is inspect.Parameter.empty or annotation is Any:
        return None
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = typing.get_args(annotation) if union else (annotation,)
    plain = {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}
    if not all(k in plain or k is type(None) for k in kinds):
        return None  # a list, a literal, a class: left to the method

    def fits(kind: Any) -> bool:
        if kind is type(None):
            return value is None
        if isinstance(value, bool):
            return kind is bool
        if kind is float:
            return isinstance(value, (int, float))
        return isinstance(value, kind)

    if any(fits(k) for k in kinds):
        return None
    wanted = " or ".join("null" if k is type(None) else plain[k] for k in kinds)
    return f"must be {wanted}, got {value!r}"


def check_options(
    options: Mapping[str, Mapping[str, Any]] | None,
    methods: Sequence[str],
    field: str,
    spec: PermutationSpec | None = None,
) -> dict[str, dict[str, Any]]:
    """``method -> options`` for the ``methods`` run, each checked against its signature (the
    names it takes, values of the plain types it declares, the built-in methods' ranges in
    :data:`OPTION_RANGES`), then by the method's own
    ``check_options(options, spec, field)`` where it has one (ranges; with ``spec``, the
    network's groups).

    Raises:
        ValueError: options of a method not run or not registered, an option the method
            does not take (the message lists the ones it takes), or a value it refuses (naming
            the option).
    """
    import typing

    out: dict[str, dict[str, Any]] = {}
    for name, opts in (options or {}).items():
        if name not in methods:
            raise ValueError(
                f"{field} sets options of {name!r}, which is not among the methods run "
                f"({', '.join(methods)}); add it to the methods or drop its options"
            )
        fn = MERGE_METHODS.get(name)
        known = method_options(fn)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in _signature_of(fn).parameters.values())
        bad = [k for k in opts if k not in known]
        if bad and not takes_any:
            raise ValueError(
                f"{field}.{name}: unknown option(s) {', '.join(map(repr, bad))}; merge method "
                f"{name!r} takes {', '.join(known) or 'no options'}"
            )
        try:
            hints = typing.get_type_hints(getattr(fn, "permutations", fn))
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: not checked
            hints = {}
        rules = OPTION_RANGES.get(name, {})
        for key, value in opts.items():
            why = _type_error(value, hints.get(key, inspect.Parameter.empty))
            if why:
                raise ValueError(f"{field}.{name}.{key} {why}")
            rule = rules.get(key)
            if rule and isinstance(value, (int, float)) and _out_of_range(value, rule):
                op = ">=" if rule.startswith(">=") else ">"
                where = (
                    f"lie in {rule.replace(',', ', ')}"
                    if rule[0] == "["
                    else f"be {op} {rule[len(op) :]}"
                )
                raise ValueError(f"{field}.{name}.{key} must {where}, got {value!r}")
        own = getattr(fn, "check_options", None)
        if own is not None:
            own(dict(opts), spec, f"{field}.{name}")
        out[name] = dict(opts)
    return out


def merge_sweep(
    inputs: MergeInputs,
    name: str,
    num_models: Sequence[int],
    options: Mapping[str, Any] | None = None,
) -> dict[int, Merged]:
    """The merge of the first n models by method ``name`` for every n in ``num_models``.

    Raises:
        ValueError: ``name`` trains (it is trained by ``lmc fit`` or
            :func:`~lmc.merging.search.train_merge`, not called).
    """
    entry = MERGE_METHODS.entry(name)
    if entry.trains:
        raise ValueError(
            f"merge method {name!r} trains: run it with lmc fit and lmc.tasks.TrainedMergeTask "
            "(configs/merge/mnist_mlp_stemm.yaml), or lmc.merging.train_merge in Python"
        )
    fn = entry.fn
    opts = dict(options or {})
    if getattr(fn, "nested", False):
        top = fn(inputs.first(max(num_models)), **opts)
        assert top.perms is not None
        return {
            n: Merged.from_perms(inputs.states[:n], inputs.spec, top.perms[:n]) for n in num_models
        }
    return {n: fn(inputs.first(n), **opts) for n in num_models}
