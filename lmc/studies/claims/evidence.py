"""A study's evidence, kept beside its verdicts: the per-job results its claims read, as a
compact CSV, with a provenance record (the lmc commit, date, device, versions, the study file's
hash and the datasets' hashes), from which anyone recomputes every verdict.

``export_evidence(root, csv_path)`` writes ``<name>.csv`` and ``<name>.json`` from a study
folder; ``recompute(csv_path, study_file)`` reads them back, checks the table against the hash
its provenance records and the study file against the one that ran, and evaluates the study
file's claims on the table (:mod:`lmc.studies.claims.verdicts`): a verdict is never read back, it is
computed again. The table's columns: ``stage``, ``job``, the coordinate keys, ``endpoints``
(the models each value was measured on), ``metric``, ``value``; the rows: the jobs of every
stage a claim reads, the metrics it reads.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from lmc.studies.claims.declared import parse_study_claims
from lmc.studies.running.store import lmc_commit, run_commits
from lmc.studies.spec.schema import StudyError

SCHEMA = "lmc.evidence"
VERSION = 1
#: the parts of a study file that are analysis, not what runs: editing them keeps the results
ANALYSIS_KEYS = ("claims", "figures", "executor")


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def study_hash(text: str) -> str:
    """sha256 of what a study file runs: its parsed YAML without the analysis keys (claims,
    figures, executor), so that comments, layout and claims can change without a rerun."""
    data = yaml.safe_load(text) or {}
    run = {k: v for k, v in data.items() if k not in ANALYSIS_KEYS}
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()


def _device() -> str:
    import os

    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # the model and the vector instructions torch uses: CPU results differ in their last bits
    # across them (a model trained on AVX2 kernels is not the one trained on AVX-512 kernels)
    return f"cpu: {platform.machine()}, {_cpu_model()}, {cores} cores, {_cpu_capability()}"


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown model"


def _cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels dispatch to (``AVX512``, ``AVX2``, ...)."""
    import torch

    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return str(get()) if get is not None else "unknown"


def _datasets(root: Path, plan: list[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The sha256 of every file of the on-disk datasets the study's trainings read (by the
    ``dataset_name`` of each data class in their saved configs); ``{}`` for synthetic data."""
    import os

    from lmc.engine.moved import class_named
    from lmc.studies.running.store import StudyStore

    store = StudyStore(root)
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            path = node.get("class_path")
            cls = class_named(path) if isinstance(path, str) and "." in path else None
            dataset_name = getattr(cls, "dataset_name", None)
            if isinstance(dataset_name, str):
                names.add(dataset_name)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for job in plan:
        config = store.run_dir(job) / "config.yaml"
        if config.is_file():
            walk(yaml.safe_load(config.read_text()))
    data_dir = Path(os.environ.get("LMC_DATA_DIR", "data"))
    out: dict[str, dict[str, str]] = {}
    for name in sorted(names):
        folder = data_dir / name / "raw"
        files = sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
        # the distributed originals: a file decompressed from one beside it is derived
        files = [p for p in files if not p.with_name(p.name + ".gz").is_file()]
        out[name] = {p.name: sha256_file(p) for p in files}
    return out


def export_evidence(
    root: str | Path, csv_path: str | Path, study_file: str | Path, label: str | None = None
) -> Path:
    """Write the results the claims of the study folder ``root`` read to ``csv_path`` and its
    provenance to the same name with ``.json``; ``study_file`` is the file as committed, which
    the provenance names as ``label`` (default its path). Returns the provenance's path.

    Raises:
        StudyError: ``root`` is no study folder, its study file declares no claims, or it is
            not the study ``study_file`` describes (their run parts differ).
    """
    from lmc.studies.reporting.aggregate import job_table
    from lmc.studies.reporting.results import results
    from lmc.studies.running.replicates import read_state
    from lmc.studies.running.store import read_plan, read_study_copy, study_folder

    root = study_folder(root)
    text = read_study_copy(root)
    committed = Path(study_file).read_text()
    if study_hash(text) != study_hash(committed):
        raise StudyError(
            f"{root} ran another version of {study_file} (their train/evaluate parts differ): "
            "rerun the study from the committed file before exporting its results"
        )
    plan = read_plan(root)["jobs"]
    claims = parse_study_claims(committed, plan)
    if not claims:
        raise StudyError(f"{study_file} declares no claims: nothing to keep evidence for")
    reads: dict[str, set[str]] = {}
    for claim in claims:
        for stage, metrics in claim.metrics.items():
            reads.setdefault(stage, set()).update(metrics)
    tidy = results(root)
    keep = [
        stage in reads and metric in reads[stage]
        for stage, metric in zip(tidy["stage"], tidy["metric"])
    ]
    table = tidy.loc[keep]
    used = [c for c in table.columns if c in ("stage", "job", "endpoints", "metric", "value")]
    coords = [c for c in table.columns if c not in used and table[c].notna().any()]
    table = table[["stage", "job", *coords, "endpoints", "metric", "value"]]
    table = table.sort_values(["stage", "job", "metric"], kind="stable")
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv_path, index=False)
    jobs = job_table(root)
    claimed = jobs[jobs["stage"].isin(reads)]
    import lightning
    import numpy
    import scipy
    import torch

    provenance = {
        "schema": SCHEMA,
        "version": VERSION,
        "study": yaml.safe_load(committed).get("name"),
        "file": label or Path(study_file).as_posix(),
        "study_sha256": study_hash(committed),
        "results": csv_path.name,
        "results_sha256": sha256_file(csv_path),
        # the commit the results were exported at, with a marker when lmc/ had uncommitted
        # changes then; and the commits the study's runs started at (plan.json's runs)
        "lmc_commit": lmc_commit(),
        "lmc_commits_run": run_commits(root),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "device": _device(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "numpy": numpy.__version__,
            "scipy": scipy.__version__,
        },
        "datasets": _datasets(root, plan),
        "jobs": int(len(jobs)),
        "jobs_done": int((jobs.status == "done").sum()),
        "claimed_jobs": int(len(claimed)),
        "claimed_jobs_done": int((claimed.status == "done").sum()),
        # replicates: auto: the pilot and the values its second stage added (the claims take the
        # two-stage test), else null
        "replicates": read_state(root),
    }
    path = csv_path.with_suffix(".json")
    path.write_text(json.dumps(provenance, indent=1) + "\n")
    return path


def read_evidence(csv_path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The committed results table and its provenance, the table checked against its hash.

    Raises:
        StudyError: the provenance is missing or damaged, or the table is not the one it
            records (naming the study and the file).
    """
    csv_path = Path(csv_path)
    path = csv_path.with_suffix(".json")
    try:
        provenance = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise StudyError(f"{path}: no readable provenance record ({err})") from None
    if provenance.get("schema") != SCHEMA:
        raise StudyError(f"{path} is no {SCHEMA} record (schema {provenance.get('schema')!r})")
    if not csv_path.is_file() or sha256_file(csv_path) != provenance.get("results_sha256"):
        raise StudyError(
            f"study {provenance.get('study')!r}: {csv_path} does not match the hash its "
            f"provenance {path.name} records: it was edited or replaced after the study ran; "
            "restore it (git checkout) or rerun the study and export it again"
        )
    table = pd.read_csv(csv_path, keep_default_na=True)
    return table, provenance


def _plan_of(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Each job of the table with its coordinates (the columns between ``job`` and
    ``endpoints`` that the job has), as :func:`lmc.studies.claims.declared.plan_values` reads a plan."""
    columns = list(table.columns)
    coords = columns[columns.index("job") + 1 : columns.index("endpoints")]
    plan = []
    for (stage, job), rows in table.groupby(["stage", "job"], sort=False):
        first = rows.iloc[0]
        values = {k: _plain(first[k]) for k in coords if pd.notna(first[k])}
        plan.append({"stage": stage, "id": job, "coordinates": values})
    return plan


def _plain(value: Any) -> Any:
    """A CSV cell as the number it was written from (pandas reads ints of a column holding
    NaN as floats)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def recompute(csv_path: str | Path, study_file: str | Path) -> list[Any]:
    """Every claim of ``study_file`` evaluated again on the committed results ``csv_path``
    (:func:`read_evidence`).

    Raises:
        StudyError: the table does not match its provenance, or the study file's train/evaluate
            parts are not those that ran (naming the study and the file).
    """
    from lmc.studies.claims.verdicts import evaluate_claims

    table, provenance = read_evidence(csv_path)
    text = Path(study_file).read_text()
    if study_hash(text) != provenance.get("study_sha256"):
        raise StudyError(
            f"study {provenance.get('study')!r}: {study_file} is not the file whose results "
            f"{Path(csv_path).name} holds (its train/evaluate parts changed since "
            f"{provenance.get('date')}): rerun the study and export its results again"
        )
    plan = _plan_of(table)
    table = table.assign(**{c: table[c].map(_plain) for c in table.columns if c != "value"})
    state = provenance.get("replicates")
    pilot = state["pilot"] if state and state.get("added") else None
    return evaluate_claims(parse_study_claims(text, plan), table, pilot)
