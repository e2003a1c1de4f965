"""The versioned results record of one run, written as strict JSON and read back (no Lightning).

Every task writes one :class:`RunRecord` to ``<run dir>/summary.json``: its scalars
(``summary``), its measured curves (``series``: metrics along one axis, the same shape for every
kind of run), tables, figure files, config, package versions and timings. Kind-specific data
(``details``) is written at the top level under its own names (``paths``, ``evaluations``,
``ts``, ...), which the top-level ``"details"`` list names, so files stay readable by code that
knows a kind's layout. A study aggregates records by reading only this file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from lmc.io import atomic_write

SCHEMA = "lmc.results"
VERSION = 1
RECORD_FILE = "summary.json"
# top-level names of the generic fields; a kind's details may use any other name
FIELDS = (
    "schema",
    "version",
    "kind",
    "summary",
    "series",
    "tables",
    "figures",
    "config",
    "versions",
    "timings",
    "nonfinite",
    "details",
)


class RecordError(ValueError):
    """A file that is not a results record this version of ``lmc`` can read."""


@dataclass
class Series:
    """Metrics measured along one axis: ``values[metric][i]`` was measured at ``x[i]``.

    An interpolation path has ``axis="alpha"``, a curve ``axis="t"``, a merge method
    ``axis="n"``; missing or non-finite values are ``None`` once written.
    """

    axis: str
    x: list[Any]
    values: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for metric, values in self.values.items():
            if len(values) != len(self.x):
                raise ValueError(
                    f"series metric {metric!r} has {len(values)} values for {len(self.x)} "
                    f"points of {self.axis!r}: give one value per point (None where missing)"
                )


@dataclass
class Table:
    """A table: column names and rows of plain values."""

    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


def environment_versions() -> dict[str, str]:
    """Versions of ``lmc``, ``torch``, ``lightning`` and Python, and the platform string."""
    out = {}
    for package in ("lmc", "torch", "lightning"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "unknown"
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    return out


@dataclass
class RunRecord:
    """Everything one run reports, in one versioned, machine-readable record.

    Attributes:
        kind: what produced it: ``"interpolation"``, ``"merge"``, ``"curve"``, ...
        summary: flat name -> scalar (number, bool, string or ``None``). A task's extra entries
            that are not scalars (PAM's ``pam_rounds``) are kept as given; a study reads
            :meth:`scalar_summary`.
        series: name -> :class:`Series` (one per interpolation path, merge method or curve).
        tables: name -> :class:`Table` that is not a view of ``series``.
        figures: name -> file name relative to the run directory.
        config: the run's config: ``file`` (the run directory's ``config.yaml`` name, or
            ``None``) and ``hparams`` (the module's hyper-parameters as plain data).
        versions: package and Python versions (see :func:`environment_versions`).
        timings: name -> seconds.
        details: kind-specific data, written at the top level under its own names.
        nonfinite: JSON Pointers (RFC 6901) of the values written as ``null`` because they were
            NaN or infinite; filled by :func:`write_record` and :func:`read_record`.
    """

    kind: str
    summary: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=environment_versions)
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    nonfinite: list[str] = field(default_factory=list)

    def scalar_summary(self) -> dict[str, float | int | bool | str | None]:
        """The ``summary`` entries whose values are scalars (what a study tabulates)."""
        return {
            k: v
            for k, v in self.summary.items()
            if v is None or isinstance(v, (bool, str, float, int))
        }

    def series_rows(self) -> list[list[Any]]:
        """Long format of every series: ``[series name, x, metric, value]`` rows."""
        return [
            [name, x, metric, value]
            for name, s in self.series.items()
            for metric, values in s.values.items()
            for x, value in zip(s.x, values)
        ]

    def series_table(self, label: str) -> Table:
        """:meth:`series_rows` as a table with columns ``label``, the axis, metric, value."""
        axis = next(iter(self.series.values())).axis if self.series else "x"
        return Table([label, axis, "metric", "value"], self.series_rows())


def json_pointer(parent: str, key: Any) -> str:
    """The JSON Pointer (RFC 6901) of ``key`` under ``parent``, as ``nonfinite`` lists them."""
    return f"{parent}/{str(key).replace('~', '~0').replace('/', '~1')}"


_pointer = json_pointer


def to_plain(value: Any, pointer: str = "", nonfinite: list[str] | None = None) -> Any:
    """``value`` as JSON data: numbers, strings, bools, ``None``, lists and string-keyed dicts.

    NaN and infinities become ``None`` and their JSON Pointers are appended to ``nonfinite``;
    numpy and torch numbers and arrays become Python numbers and lists, dataclasses dicts,
    tuples lists, anything else its ``str``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number
        if nonfinite is not None:
            nonfinite.append(pointer)
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v, _pointer(pointer, k), nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, _pointer(pointer, i), nonfinite) for i, v in enumerate(value)]
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return to_plain(value.tolist(), pointer, nonfinite)
    return str(value)


def record_to_json(record: RunRecord) -> dict[str, Any]:
    """The JSON object of ``record``: generic fields, then the details under their own names.

    Raises:
        ValueError: a detail's name is one of the generic fields.
    """
    clash = sorted(set(record.details) & set(FIELDS))
    if clash:
        raise ValueError(f"details {clash} of a {record.kind!r} record clash with {FIELDS}")
    raw = {
        "schema": SCHEMA,
        "version": VERSION,
        "kind": record.kind,
        "summary": record.summary,
        "series": record.series,
        "tables": record.tables,
        "figures": record.figures,
        "config": record.config,
        "versions": record.versions,
        "timings": record.timings,
        "details": list(record.details),
        **record.details,
    }
    nonfinite: list[str] = []
    payload = to_plain(raw, "", nonfinite)
    payload["nonfinite"] = nonfinite
    return payload


def write_record(run_dir: str | Path, record: RunRecord) -> Path:
    """Write ``record`` to ``<run_dir>/summary.json`` as strict JSON, atomically.

    Non-finite numbers are written as ``null`` and listed in ``nonfinite`` (also set on
    ``record``). A failure at any point leaves an earlier ``summary.json`` as it was.
    Returns the file's path.
    """
    path = Path(run_dir) / RECORD_FILE
    payload = record_to_json(record)
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda f: f.write(text), mode="w")
    record.nonfinite = payload["nonfinite"]
    return path


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def read_record(path: str | Path) -> RunRecord:
    """Read the record in ``path`` (a ``summary.json`` or the run directory holding one).

    Raises:
        RecordError: the file is not strict JSON, is no ``lmc.results`` record, or was written
            by a newer ``lmc`` (results version above :data:`VERSION`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    try:
        payload = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except ValueError as err:  # JSONDecodeError and NaN/Infinity
        raise RecordError(f"{path} is not strict JSON ({err}); rerun the run's report") from err
    schema = payload.get("schema") if isinstance(payload, dict) else None
    if schema != SCHEMA:
        raise RecordError(
            f"{path} is not an {SCHEMA} record (schema {schema!r}): it was written by another "
            "program or by lmc before results records existed; rerun the run (lmc validate "
            "with its config.yaml) to write one"
        )
    version = payload.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"{path} has no valid results version ({version!r}); rerun the run")
    if version > VERSION:
        raise RecordError(
            f"{path} was written by a newer lmc (results version {version}; this lmc reads up "
            f"to {VERSION}): upgrade lmc (pip install -U lmc) to read it"
        )
    try:
        return _from_json(payload)
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise RecordError(
            f"{path} is an incomplete {SCHEMA} record ({type(err).__name__}: {err}); rerun the run"
        ) from err


def _from_json(payload: dict[str, Any]) -> RunRecord:
    return RunRecord(
        kind=payload["kind"],
        summary=payload["summary"],
        series={n: Series(**s) for n, s in payload["series"].items()},
        tables={n: Table(**t) for n, t in payload["tables"].items()},
        figures=payload["figures"],
        config=payload["config"],
        versions=payload["versions"],
        timings=payload["timings"],
        details={k: payload[k] for k in payload["details"]},
        nonfinite=payload["nonfinite"],
    )
