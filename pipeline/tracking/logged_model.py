"""The trained model as an MLflow model (`mlflow.pytorch.log_model`), so a run in the UI carries
something anyone can load and call: `mlflow.pytorch.load_model(f"runs:/{run_id}/model")` gives a
module mapping a float32 (n, dim) batch of sentence embeddings to (n, dim) predictions, and
`mlflow.pyfunc.load_model(...)` the same for numpy arrays.

Pickled, not torch.export'ed ("pt2", MLflow's default): the flow loop stops adaptively on
data-dependent conditions, which export cannot trace. The pickle refers to our classes, so the
`pipeline` package travels with the model (code_paths) and loads without this repository."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.model import EnergyFlowModel

ARTIFACT = "model"  # the logged model's name: runs:/<run_id>/model loads it
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # pipeline/, the whole library


class EmbeddingPredictor(nn.Module):
    """The model as a plain tensor -> tensor module (its forward returns a FlowOutput, whose
    `pred` is the prediction); what the MLflow pytorch flavour and pyfunc expect."""

    def __init__(self, model: EnergyFlowModel):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).pred


def signature(dim: int):
    """Input and output: float32 tensors of shape (-1, dim)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    spec = Schema([TensorSpec(np.dtype(np.float32), (-1, dim))])
    return ModelSignature(inputs=spec, outputs=spec)


def requirements() -> list[str]:
    """Pinned from this environment, so MLflow need not infer them (inference starts a
    subprocess that loads the model to see what it imports)."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("torch", "mlflow", "numpy", "omegaconf")]


def log_trained_model(model: EnergyFlowModel):
    """Log the model (on CPU, in eval mode) to the active run; returns MLflow's ModelInfo (None with
    tracking off)."""
    from pipeline.tracking import store as tracking

    if not tracking.enabled():
        return None
    import mlflow.pytorch

    predictor = EmbeddingPredictor(model).to("cpu").eval()
    pytorch_log = logging.getLogger("mlflow.pytorch")
    level = pytorch_log.level
    pytorch_log.setLevel(logging.ERROR)  # its warning that pickle is unsafe: a choice made above
    try:
        return mlflow.pytorch.log_model(
            predictor,
            name=ARTIFACT,
            signature=signature(model.dim),
            serialization_format="pickle",
            code_paths=[str(PACKAGE_DIR)],
            pip_requirements=requirements(),
        )
    finally:
        pytorch_log.setLevel(level)
