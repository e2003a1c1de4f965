"""Studies (issue #14): one YAML file plans a grid of ``lmc fit`` trainings and evaluation
stages over them (barriers between models selected by grid coordinates), runs them resumably
in a study folder, and collects their results into one table, figures, a report and the
verdicts of the paper's claims.

Split by concern (issue 49): :mod:`~lmc.studies.spec` (the study file and its checks),
:mod:`~lmc.studies.running` (planning and running), :mod:`~lmc.studies.reporting` (results
and report), :mod:`~lmc.studies.claims` (claims and verdicts).
"""

from lmc.studies.running.plan import Job, grid_points, plan
from lmc.studies.running.run import RunSummary, load_and_plan, run_study
from lmc.studies.running.store import StudyStore, status
from lmc.studies.spec.load import load_study
from lmc.studies.spec.schema import Study, StudyError

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
