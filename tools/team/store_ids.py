"""What the copy of a store (tools/team/copy_store.py) marks its copies with, and which of MLflow's
own tags it cannot copy as they are. The comparison (tools/team/store_compare.py) reads the same
names, so that what the copy changes on purpose is never reported as a difference."""

from __future__ import annotations

# On every copied run and logged model: the id it was copied from. It is how a second copy finds
# what the first made (nothing is copied twice), how a run on the server is traced back, and how a
# checkout's runs/*.json, naming runs of the old store, find their copies (pipeline/tracking/store.py).
from pipeline.tracking.store import COPIED_FROM

# Set last, once everything of the run (its models, artifacts and end) is there: a run copied
# from without it is what an interrupted copy left, and the next copy replaces it.
COPY_COMPLETE = "energy_flow.copy_complete"
OURS = frozenset({COPIED_FROM, COPY_COMPLETE})

# MLflow's run tags that are not copied verbatim. The run name is given to create_run, which sets
# the tag itself; a parent run's id names a run of the source store and becomes its copy's id.
RUN_NAME = "mlflow.runName"
PARENT_RUN = "mlflow.parentRunId"
# A logged model's registered versions: the model registry is not copied, so on the copy the tag
# would list versions that do not exist there.
MODEL_VERSIONS = "mlflow.modelVersions"
MLMODEL = "MLmodel"


def id_swap(text: str, pairs: dict[str, str]) -> str:
    """`text` with every id of `pairs` replaced by its partner. The ids are 32 hex digits (runs)
    or `m-` and 32 hex digits (models): they occur in an MLmodel file as ids only."""
    for old, new in pairs.items():
        text = text.replace(old, new)
    return text
