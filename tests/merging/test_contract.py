"""The merge contract: every registered merge method (a new one is tested by registering it) takes
:class:`MergeInputs` and returns a :class:`Merged` that loads into the net (a method that trains:
a :class:`MergeSearch` whose result is one, trained by the one plain loop); copies of one model
merge back into that model's function; permutations, where a method returns them, are valid and
give the merged state; data a method needs and options it does not take are refused by name."""

from __future__ import annotations

import sys

import pytest
import torch

from lmc.merging import (
    MERGE_METHODS,
    Merged,
    MergeInputs,
    MergeSearch,
    by_permutation,
    check_options,
    materialize,
    merge_sweep,
    method_options,
    train_merge,
    wm_to_reference,
)
from lmc.models import MLP
from lmc.permutation import apply_permutation, identity_permutation, random_permutation, spec_for
from lmc.permutation.spec import check_permutation
from tests.permutation.helpers import build


def _inputs(states, model, data, **kwargs) -> MergeInputs:
    """The models with their net and data: labels are the first model's predictions."""
    with torch.no_grad():
        batches = [(x, model(x).argmax(1)) for x in data]
    return MergeInputs(
        states,
        spec_for(model),
        net=model,
        keys=[k for k, _ in model.named_parameters()],
        align_batches=batches,
        train_batches=batches,
        client_batches=[batches] * len(states),
        **kwargs,
    )


def _setup():
    model, data = build(lambda: MLP(20, 5, width=12, depth=2), (20,))
    spec = spec_for(model)
    state = model.state_dict()
    sizes = spec.sizes(state)
    copies = [state] + [
        apply_permutation(state, spec, random_permutation(sizes, s)) for s in (4, 5)
    ]
    return model, data, spec, state, copies


def _merge(name, inputs, **options) -> Merged:
    """Method ``name``'s merge of ``inputs``: called, or for a method that trains, its search
    trained for one epoch by the plain loop."""
    if MERGE_METHODS.entry(name).trains:
        return train_merge(inputs, name, options, epochs=1).merged
    return MERGE_METHODS.get(name)(inputs, **options)


def _outputs(net, state, data):
    with torch.no_grad():
        return materialize(net, state)(torch.cat(data))


@pytest.mark.parametrize("name", MERGE_METHODS.names())
def test_every_merge_method_keeps_the_contract(name):
    """Two copies of one model merge back into the model's function, with valid permutations
    (one per model) that give the merged state; three permuted copies give a finite merge of
    the net's keys. The matching baselines (all but ``naive``, which does not align) also merge
    the permuted copies back into the model's function. (Two copies, not three: ZipIt!'s alpha
    < 1 scales a merged feature's correlations, so a third copy's feature may lose to a
    same-model pair; that is the method, not a fault.)"""
    torch.manual_seed(0)
    model, data, spec, state, copies = _setup()
    sizes = spec.sizes(state)
    method = MERGE_METHODS.get(name)
    expected = _outputs(model, state, data)
    for states in ([state] * 2, copies):
        out = _merge(name, _inputs(states, model, data))
        assert isinstance(out, Merged)
        assert set(out.state) == set(state)
        assert all(torch.isfinite(v).all() for v in out.state.values() if v.is_floating_point())
        if out.perms is not None:
            assert len(out.perms) == len(states)
            for p in out.perms:
                check_permutation(p, sizes)
            again = Merged.from_perms(states, spec, out.perms).state
            for k in state:
                torch.testing.assert_close(out.state[k], again[k])
        recovers = states is not copies or (hasattr(method, "permutations") and name != "naive")
        if recovers:
            torch.testing.assert_close(
                _outputs(model, out.state, data), expected, atol=1e-4, rtol=1e-4
            )


@pytest.mark.parametrize("name", MERGE_METHODS.names())
def test_every_merge_method_states_its_options(name):
    """Its options are keyword arguments with defaults (a config sets them by name), and an
    option it does not take is refused before any work, naming the ones it takes."""
    options = method_options(MERGE_METHODS.get(name))
    assert all(p.default is not p.empty for p in options.values()), options
    with pytest.raises(ValueError, match=f"merge method {name!r} takes"):
        check_options({name: {"no_such_option": 1}}, [name], "model.init_args.method_options")


@pytest.mark.parametrize("name", MERGE_METHODS.names())
def test_every_registry_entry_declares_itself(name):
    """An entry says which paper it implements and which inputs it needs (known ones, each
    refused by name when missing); one that trains builds a MergeSearch, and merge_sweep,
    which calls methods, refuses it naming lmc fit."""
    entry = MERGE_METHODS.entry(name)
    assert entry.name == name and entry.paper
    assert set(entry.needs) <= {"net", "align_batches", "train_batches", "client_batches"}
    assert entry.options == method_options(entry.fn)
    model, data, spec, state, copies = _setup()
    full = _inputs(copies, model, data)
    for missing in entry.needs:
        with pytest.raises(ValueError, match=f"merge method {name!r} needs {missing}"):
            _merge(name, MergeInputs(**{**full.__dict__, missing: None}))
    if entry.trains:
        assert isinstance(entry.fn(full), MergeSearch)
        with pytest.raises(ValueError, match=f"{name!r} trains: run it with lmc fit"):
            merge_sweep(full, name, [2])


def test_options_of_a_method_not_run_are_refused():
    with pytest.raises(ValueError, match="'stemm', which is not among the methods run"):
        check_options({"stemm": {"mixing": "uniform"}}, ["naive"], "model.init_args.method_options")
    opts = {"stemm": {"mixing": "uniform"}}
    assert check_options(opts, ["stemm"], "f") == opts


def _typed(inputs: MergeInputs, *, scale: float = 1.0, rounds: int = 2, tag: str | None = None):
    return Merged(dict(inputs.states[0]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": "big"}, r"f\.typed\.scale must be a number, got 'big'"),
        ({"scale": True}, "scale must be a number, got True"),
        ({"rounds": 2.5}, "rounds must be a whole number, got 2.5"),
        ({"tag": 3}, "tag must be a string or null, got 3"),
    ],
)
def test_an_option_of_the_wrong_type_is_refused_naming_it(monkeypatch, options, message):
    """Issue 46: a merge option of the wrong type failed inside the method (or not at all)."""
    monkeypatch.setitem(MERGE_METHODS._entries, "typed", _typed)
    with pytest.raises(ValueError, match=message):
        check_options({"typed": options}, ["typed"], "f")
    good = {"scale": 2, "rounds": 3, "tag": None}  # an int is a number
    assert check_options({"typed": good}, ["typed"], "f") == {"typed": good}


def test_fedma_needs_each_clients_batches_only_to_retrain():
    model, data, spec, state, copies = _setup()
    inputs = MergeInputs(copies, spec, net=model)  # no data at all: one matching pass
    out = MERGE_METHODS.get("fedma")(inputs)
    torch.testing.assert_close(
        _outputs(model, out.state, data), _outputs(model, state, data), atol=1e-4, rtol=1e-4
    )
    with pytest.raises(ValueError, match="needs client_batches"):
        MERGE_METHODS.get("fedma")(inputs, epochs=1)


def test_a_new_method_is_one_registration_and_sweeps_by_name(monkeypatch):
    """A method registered in user code (here the test module) is run by name; a nested
    permuting method (wm_ref) serves every n of a sweep from one call."""
    model, data, spec, state, copies = _setup()
    seen = []

    def first_only(inputs: MergeInputs, *, scale: float = 1.0) -> Merged:
        seen.append(len(inputs.states))
        return Merged({k: v * scale for k, v in inputs.states[0].items()})

    monkeypatch.setitem(MERGE_METHODS._entries, "first_only", first_only)
    sweep = merge_sweep(_inputs(copies, model, data), "first_only", [2, 3], {"scale": 1.0})
    assert sorted(seen) == [2, 3] and sweep[3].perms is None
    assert "scale" in method_options(first_only)

    calls = []

    def counted_wm_ref(states, spec, **kwargs):
        calls.append(len(states))
        return wm_to_reference(states, spec, **kwargs)

    monkeypatch.setitem(
        MERGE_METHODS._entries, "counted", by_permutation(counted_wm_ref, nested=True)
    )
    sweep = merge_sweep(MergeInputs(copies, spec), "counted", [2, 3])
    perms = {n: merged.perms for n, merged in sweep.items()}
    assert calls == [3] and len(perms[2]) == 2 and len(perms[3]) == 3
    assert all(torch.equal(perms[2][1][g], perms[3][1][g]) for g in perms[3][1])


def test_unknown_method_lists_the_registered_names():
    model, data, spec, state, copies = _setup()
    with pytest.raises(ValueError, match="registered: naive, wm_ref, mergemany, ccmm"):
        merge_sweep(_inputs(copies, model, data), "no_such_method", [2])
    ident = identity_permutation(spec.sizes(state))
    with pytest.raises(ValueError, match="got 3 models but 2 permutations"):
        Merged.from_perms(copies, spec, [ident, ident])


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("mergemany", {"max_rounds": 0}, r"mergemany\.max_rounds must be >= 1, got 0"),
        ("sinkhorn", {"tau_end": 0}, r"sinkhorn\.tau_end must be > 0, got 0"),
        ("ccmm", {"max_iter": -1}, r"ccmm\.max_iter must be >= 1, got -1"),
        ("otfusion", {"prune_rate": 1.0}, r"prune_rate must lie in \[0, 1\), got 1\.0"),
        ("fedma", {"lr": 0.0}, r"fedma\.lr must be > 0, got 0\.0"),
        ("zip", {"beta": 2}, r"zip\.beta must lie in \[0, 1\], got 2"),
    ],
)
def test_an_option_out_of_its_range_is_refused(name, options, message):
    """Issue 46: MergeMany with max_rounds 0 ran as the plain average, exiting 0."""
    with pytest.raises(ValueError, match=message):
        check_options({name: options}, [name], "f")


def test_every_range_names_an_option_its_method_takes():
    from lmc.merging.contract import OPTION_RANGES

    for name, rules in OPTION_RANGES.items():
        assert set(rules) <= set(method_options(MERGE_METHODS.get(name))), name


def test_the_docs_trained_method_learns_to_weigh_the_better_model(monkeypatch):
    """Known answer for the docs' example of a method that trains: of a model and a copy ruined
    by noise, the learned average puts almost all its weight on the model, and its merge
    computes the model's function; the docs page shows the example file as it is."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    monkeypatch.syspath_prepend(str(root / "docs" / "how-to"))
    monkeypatch.delitem(sys.modules, "learned_average", raising=False)  # registers on import
    monkeypatch.setattr("lmc.registry._loaded", set())
    monkeypatch.setattr(MERGE_METHODS, "_entries", dict(MERGE_METHODS._entries))
    import learned_average  # registers it

    torch.manual_seed(0)
    model, data, spec, state, copies = _setup()
    ruined = {k: v + 3 * torch.randn_like(v) for k, v in state.items()}
    inputs = _inputs([state, ruined], model, data)
    run = train_merge(inputs, "learned_average", {"temperature": 0.1}, epochs=30)
    assert run.merged.diagnostics["weight_max"] > 0.99
    torch.testing.assert_close(
        _outputs(model, run.merged.state, data), _outputs(model, state, data), atol=0.05, rtol=0
    )
    assert run.losses[-1] < run.losses[0]
    page = (root / "docs" / "how-to" / "merge.md").read_text()
    code = Path(learned_average.__file__).read_text()
    assert code.split('"""', 2)[2].strip() in page
