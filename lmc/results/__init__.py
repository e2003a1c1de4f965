"""One results layer: the versioned run record every task writes (``summary.json``), its
figures, and (in :mod:`lmc.results.logging`, the only part that imports Lightning) publishing
it to the run directory and the loggers."""

from lmc.results.record import (
    RECORD_FILE,
    SCHEMA,
    VERSION,
    RecordError,
    RunRecord,
    Series,
    Table,
    environment_versions,
    read_record,
    write_record,
)

__all__ = [
    "RECORD_FILE",
    "SCHEMA",
    "VERSION",
    "RecordError",
    "RunRecord",
    "Series",
    "Table",
    "environment_versions",
    "read_record",
    "write_record",
]
