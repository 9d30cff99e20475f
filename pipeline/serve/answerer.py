"""The energy-flow model as a text-in, text-out MLflow pyfunc (models-from-code: MLflow executes
this file when the model is logged and again when it is loaded, so its top level holds only
imports and the class; `set_model` at the bottom names the model).

What it does is pipeline/serve/answering.py's Answerer (no MLflow there, so ./dev ask can load it
without MLflow); this class gives it MLflow's load_context and predict."""

from __future__ import annotations

import mlflow
import pandas as pd

from pipeline.serve.answering import Answerer


class EnergyFlowAnswerer(Answerer, mlflow.pyfunc.PythonModel):
    """Questions in, the answer bank's nearest texts out (pipeline/serve/answering.py)."""

    def load_context(self, context):
        self.load(context.model_config, context.artifacts)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        return self.answer(model_input, params)


mlflow.models.set_model(EnergyFlowAnswerer())
