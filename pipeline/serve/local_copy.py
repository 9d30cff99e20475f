"""A logged model as a local directory for as long as it is used, and not a byte longer.

mlflow.pyfunc.load_model (and Model.load) download a runs:/ or models:/ URI into a fresh
directory under the system temp directory and never remove it: every load leaves a copy of the
model behind. model_dir downloads into a TemporaryDirectory that goes when the block ends, on an
error or Ctrl-C too; a local directory is used where it is, with no copy."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import PipelineError

TEMP_PREFIX = "energy-flow-model-"


def _local_dir(uri: str) -> Path | None:
    """`uri` as an existing local directory (a path or a file: URI), else None."""
    from mlflow.utils.file_utils import local_file_uri_to_path
    from mlflow.utils.uri import is_local_uri

    if uri.startswith(("runs:/", "models:/")) or not is_local_uri(uri, is_tracking_or_registry_uri=False):
        return None
    path = Path(local_file_uri_to_path(uri))
    return path if path.is_dir() else None


@contextlib.contextmanager
def model_dir(uri: str) -> Iterator[Path]:
    """The MLflow model at `uri` (runs:/, models:/, any artifact URI, or a local directory) as a
    local directory holding its MLmodel. Raises PipelineError naming `uri` when there is none."""
    from mlflow.exceptions import MlflowException

    local = _local_dir(uri)
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
        import mlflow

        try:
            path = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp))
        except (MlflowException, OSError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PipelineError(
                f"no MLflow model at {uri} ({first}); expected the answer model the pipeline logs as `model` "
                "(run ./dev repro), or a --model URI that holds one"
            ) from None
        yield path
