"""Studies (issue #14): one YAML file plans a grid of ``lmc fit`` trainings and evaluation
stages over them (barriers between models selected by grid coordinates), runs them resumably
in a study folder, and collects their results into one table.

Pieces: :mod:`~lmc.studies.schema` (the study file), :mod:`~lmc.studies.check` (grid keys
against the base configs, via the CLI parser), :mod:`~lmc.studies.plan` (grid -> jobs),
:mod:`~lmc.studies.store` (folder, job records, lock), :mod:`~lmc.studies.run` (runner),
:mod:`~lmc.studies.results` (tidy table; imports pandas, so import it directly).
"""

from lmc.studies.load import load_study
from lmc.studies.plan import Job, grid_points, plan
from lmc.studies.run import RunSummary, load_and_plan, run_study
from lmc.studies.schema import Study, StudyError
from lmc.studies.store import StudyStore, status

__all__ = [
    "Job",
    "RunSummary",
    "Study",
    "StudyError",
    "StudyStore",
    "grid_points",
    "load_and_plan",
    "load_study",
    "plan",
    "run_study",
    "status",
]
