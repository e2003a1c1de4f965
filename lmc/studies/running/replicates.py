"""``replicates: auto``: a study sized by its claims, in two stages.

.. code-block:: yaml

    replicates:
      auto: true
      budget: 40             # values of the key in all, the pilot's included
      key: seed_everything   # default: seed_everything

The train grid's values of ``key`` are the pilot. A key zipped with others is a *trial* (e.g.
``data.init_args.seed`` zipped with ``seed_everything``: one data seed, several models): an
added trial copies the first trial's rows of the zip with a new value of ``key``, and the zip's
keys listed in ``fresh`` (its models' seeds) take values after the largest used, so that no
added model repeats one of the pilot's:

.. code-block:: yaml

    replicates: {auto: true, budget: 8, key: data.init_args.seed, fresh: [seed_everything]}

Once the pilot's jobs are done, ``lmc study run`` evaluates every claim on them and adds the
values the claims need for 80 % power at the pilot's mean and spread
(:func:`lmc.studies.claims.inference.stage_replicates`; the most any claim needs, within the budget),
written to ``replicates.json`` in the study folder, then runs their
jobs. A claim over both stages is decided by the inverse-normal combination of the two stages'
own t tests (:func:`lmc.studies.claims.inference.two_stage_verdict`; Lehmacher and Wassmer 1999), an
adaptive design whose error on null data stays at 5 % although the second stage's size depends
on the pilot (``benchmarks/calibration.py``: ``false_verdict_rate_auto``); a plain t test over
both stages would not. Claims whose estimate is not a mean over replicates (``fit``,
``equivalent``) cannot be sized this way: they are decided on the pilot alone (a study of only
such claims is refused).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lmc.studies.claims.verdicts import PILOT_ONLY
from lmc.studies.spec.schema import SEED_KEY, Replicates, Study, StudyError

STATE = "replicates.json"


def parse_replicates(value: Any, study: Study, pilot_grid: Mapping[str, Any]) -> Replicates:
    """The study file's ``replicates:``, checked against its grid and claims.

    Raises:
        StudyError: not ``auto: true``, no or a too small ``budget``, a key the train grid does
            not vary over integers, a zipped key, no claims, or a claim it cannot size.
    """
    if not isinstance(value, Mapping):
        raise StudyError(
            f"replicates must be a mapping such as {{auto: true, budget: 40}}, got {value!r}"
        )
    for key in value:
        if key not in ("auto", "budget", "key", "fresh"):
            raise StudyError(
                f"unknown key {key!r} in replicates; valid keys: auto, budget, key, fresh"
            )
    if value.get("auto") is not True:
        raise StudyError(
            "replicates: auto: true is its one mode (a pilot, then the replicates the claims "
            "need); for a fixed design list the seeds in the train grid and drop replicates:"
        )
    key = value.get("key", SEED_KEY)
    pilot = pilot_grid.get(key)
    if not isinstance(pilot, list) or not pilot:
        raise StudyError(
            f"replicates.key {key!r} is not a key of the train grid: the grid's values of it "
            f"are the pilot (its keys: {', '.join(pilot_grid) or 'none'})"
        )
    if not _integers(pilot):
        raise StudyError(
            f"replicates: auto adds values of {key!r} after its pilot's, so they must be "
            f"integers (seeds), got {pilot!r}"
        )
    zipped = next((tuple(g) for g in study.train.zip if key in g), ())
    fresh = _fresh(value.get("fresh", []), key, zipped, pilot_grid)
    pilot = list(dict.fromkeys(pilot))  # a trial's value once, in the grid's order
    budget = value.get("budget")
    if budget is None:
        raise StudyError(
            f"replicates: auto needs a budget: the most values of {key!r} the study may run in "
            f"all, the pilot's {len(pilot)} included (e.g. budget: {4 * len(pilot)})"
        )
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= len(pilot):
        raise StudyError(
            f"replicates.budget must be an integer above the pilot's {len(pilot)} values of "
            f"{key!r}, got {budget!r}"
        )
    if not study.claims:
        raise StudyError(
            "replicates: auto sizes a study by its claims, and this one declares none: add "
            "claims, or list the seeds in the train grid and drop replicates:"
        )
    if all(claim.test in PILOT_ONLY for claim in study.claims):
        raise StudyError(
            f"replicates: auto sizes a study by its claims' means over replicates, and this one's "
            f"claims are all {' or '.join(PILOT_ONLY)} claims, which it cannot size: list the "
            "seeds in the train grid and drop replicates:"
        )
    return Replicates(key=key, budget=budget, pilot=tuple(pilot), fresh=fresh, zipped=zipped)


def _integers(values: Any) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    )


def _fresh(
    value: Any, key: str, zipped: tuple[str, ...], grid: Mapping[str, Any]
) -> tuple[str, ...]:
    """``replicates.fresh``, checked: keys of ``key``'s zip with integer values; the zip's
    ``seed_everything`` must be among them (else an added trial would retrain the first's
    models)."""
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise StudyError(f"replicates.fresh must be a list of train grid keys, got {value!r}")
    if value and not zipped:
        raise StudyError(
            f"replicates.fresh names the keys an added trial renews, but replicates.key {key!r} "
            "is not zipped with any: drop fresh"
        )
    for name in value:
        if name == key or name not in zipped:
            raise StudyError(
                f"replicates.fresh {name!r} is not a key zipped with {key!r}; its zip: "
                f"{', '.join(k for k in zipped if k != key)}"
            )
        if not _integers(grid.get(name)):
            raise StudyError(
                f"replicates.fresh {name!r} takes new values after its largest, so its values "
                f"must be integers (seeds), got {grid.get(name)!r}"
            )
    if SEED_KEY in zipped and SEED_KEY != key and SEED_KEY not in value:
        raise StudyError(
            f"replicates.key {key!r} is zipped with {SEED_KEY}: an added trial would retrain the "
            f"first trial's models with their seeds; add fresh: [{SEED_KEY}]"
        )
    return tuple(value)


def read_state(root: str | Path) -> dict[str, Any] | None:
    """The study folder's ``replicates.json`` (``key``, ``pilot``, ``added``), or ``None``."""
    path = Path(root) / STATE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise StudyError(
            f"{path} is damaged ({err}): delete it and rerun `lmc study run`, which decides the "
            "second stage again from the pilot"
        ) from None
    return state


def added_values(root: str | Path) -> dict[str, list[Any]] | None:
    """The values the second stage appends to the train grid's keys (``{key: [...]}``, and a
    trial's zipped keys beside it), or ``None``."""
    state = read_state(root)
    if not state:
        return None
    return state.get("append") or {state["key"]: list(state["added"])}


def _append(study: Study, added: list[int]) -> dict[str, list[Any]]:
    """The train grid's appended values for the ``added`` values of the replicate key: the
    key's alone, or for a trial the first trial's rows of its zip, each with the new value of
    the key and fresh values of ``fresh``."""
    spec = study.replicates
    assert spec is not None
    if not spec.zipped:
        return {spec.key: list(added)}
    grid = study.train.grid
    rows = [dict(zip(spec.zipped, r)) for r in zip(*(grid[k] for k in spec.zipped))]
    template = [r for r in rows if r[spec.key] == spec.pilot[0]]
    after = {k: max(grid[k]) + 1 for k in spec.fresh}
    append: dict[str, list[Any]] = {k: [] for k in spec.zipped}
    for value in added:
        for row in template:
            new = {**row, spec.key: value}
            for k in spec.fresh:
                new[k], after[k] = after[k], after[k] + 1
            for k in spec.zipped:
                append[k].append(new[k])
    return append


def pilot_replicates(root: str | Path) -> list[int] | None:
    """The pilot's values of the replicate key in a study whose second stage was decided (the
    claims then take the two-stage test), else ``None``."""
    state = read_state(root)
    return list(state["pilot"]) if state and state.get("added") else None


def second_stage(study: Study, root: str | Path, log: Callable[[str], None]) -> list[int]:
    """Decide the second stage of a ``replicates: auto`` study whose pilot ran in ``root``: the
    values of its key to add (possibly none), written to ``replicates.json``."""
    from lmc.studies.claims.declared import parse_study_claims
    from lmc.studies.claims.inference import stage_replicates
    from lmc.studies.claims.verdicts import evaluate_claims
    from lmc.studies.reporting.results import results
    from lmc.studies.running.store import read_plan

    spec = study.replicates
    assert spec is not None
    pilot = list(spec.pilot)
    tidy = results(root)
    plan = read_plan(root)["jobs"]
    claims = parse_study_claims(study.text, plan)
    pairs = any(  # pairs of the key's own values (not of models within a trial)
        s.pairs is not None and s.pairs.partners and s.pairs.vary == spec.key
        for s in study.evaluate
    )
    need, reasons = 0, []
    for claim, result in zip(claims, evaluate_claims(claims, tidy)):
        if claim.test in PILOT_ONLY:
            reasons.append(f"{claim.name}: decided on the pilot alone ({claim.test} test)")
            continue
        values = result.values
        if values is None or len(values) < 2:
            reasons.append(f"{claim.name}: no pilot values to size it on")
            continue
        per = len(pilot) / len(values)  # values of the key one replicate takes (2 for a pair)
        budget = int(spec.budget // per)
        extra = stage_replicates(values, budget)
        need = max(need, math.ceil(extra * per))
        reasons.append(f"{claim.name}: {len(values)} pilot replicates, {extra} more")
    room = spec.budget - len(pilot)
    if pairs:  # consecutive pairs take the values two by two
        need, room = need + need % 2, room - room % 2
    count = min(need, room)
    start = max(pilot) + 1
    added = list(range(start, start + count))
    state = {
        "key": spec.key,
        "pilot": pilot,
        "added": added,
        "budget": spec.budget,
        "append": _append(study, added),
    }
    (Path(root) / STATE).write_text(json.dumps(state, indent=1) + "\n")
    log(
        f"replicates: auto: the pilot's {len(pilot)} values of {spec.key} done; adding "
        f"{len(added)} ({'; '.join(reasons)})"
    )
    return added
