"""The energy-flow model as a text-in, text-out MLflow pyfunc (models-from-code: MLflow executes
this file when the model is logged and again when it is loaded, so its top level holds only
imports and the class; `set_model` at the bottom names the model).

predict: a DataFrame with a `question` column -> a DataFrame with, per row, `answers` (the k
nearest bank texts, best first), `scores` (their cosines to the model's prediction) and
`truncated` (the teacher read only the question's first max_seq_length tokens). A request over
the limits (pipeline.serve.request.Limits, read from the environment at load time) is refused
before anything is embedded. A question
goes the way a row goes through the pipeline: embedded as the embed stage embeds texts
(encode_texts: the teacher's raw vectors, not normalised, in embed.batch_size batches, longest
first, then stored at the shards' dtype), mapped by the model in batches of train.batch_size as
the evaluate stage predicts (max_active_flows is a budget per batch, so the batch size changes the
flows per question and so the prediction), and scored against the evaluate stage's bank."""

from __future__ import annotations

import threading
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.embed.teacher import encode_texts, load_teacher, resolve_teacher, weights_digest
from pipeline.evaluate.retrieval import predict as model_predict
from pipeline.model.model_file import load_model
from pipeline.serve.bank import load_bank
from pipeline.serve.request import ANSWERS, SCORES, TRUNCATED, Limits, questions_of, top_k
from pipeline.serve.window import truncated, window


class EnergyFlowAnswerer(mlflow.pyfunc.PythonModel):
    """Questions in, the answer bank's nearest texts out (see the module's docstring)."""

    def load_context(self, context):
        cfg = context.model_config
        self.limits = Limits.from_env()  # a bad value stops the load, naming the variable
        # The scoring server answers each request in a thread of its own, and the teacher's
        # tokenizer is not safe to share between threads (each call sets its truncation): one
        # request at a time, each using every core through torch.
        self.lock = threading.Lock()
        self.train_batch_size = int(cfg["train_batch_size"])
        self.embed_batch_size = int(cfg["embed_batch_size"])
        self.embed_dtype = np.dtype(cfg["embed_dtype"])
        self.model, _ = load_model(context.artifacts["model"])  # torch.load(weights_only=True), eval mode
        bank = load_bank(context.artifacts["bank"], cfg["bank_sha256"])
        self.texts = np.asarray(bank.texts, dtype=object)
        # A torch tensor of unit rows: one matrix product and one torch.topk per request.
        self.bank_vectors = torch.from_numpy(bank.vectors)
        if not self.model.dim == bank.dim == int(cfg["dim"]):
            raise PipelineError(
                f"{context.artifacts['model']}: the model maps {self.model.dim}-d embeddings, the bank "
                f"{context.artifacts['bank']} holds {bank.dim}-d ones and the teacher was recorded as "
                f"{cfg['dim']}-d; expected one dim for all three"
            )
        self.teacher = self._load_teacher(cfg["teacher"], cfg.get("teacher_weights_sha256"))

    @staticmethod
    def _load_teacher(name: str, weights_sha256: str | None):
        """The teacher the shards were embedded with. One whose weights differ from the recorded
        ones would embed questions into another space: refused."""
        teacher = load_teacher(name)
        if weights_sha256:
            found = weights_digest(Path(resolve_teacher(name)))
            if found != weights_sha256:
                raise PipelineError(
                    f"teacher {name!r} ({resolve_teacher(name)}): its weights have sha256 {str(found)[:16]}..., "
                    f"but the model was trained on embeddings made with weights {weights_sha256[:16]}...; install "
                    "the teacher the model was trained with (the model's pip requirements pin the bundled one)"
                )
        return teacher

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        k = top_k(params, len(self.texts))
        questions = questions_of(model_input, self.limits, window(self.teacher))
        if not questions:
            return pd.DataFrame({ANSWERS: [], SCORES: [], TRUNCATED: pd.Series([], dtype=bool)})
        with self.lock:
            return self._answer(questions, k)

    @torch.inference_mode()
    def _answer(self, questions: list[str], k: int) -> pd.DataFrame:
        cut = truncated(self.teacher, questions)
        x = encode_texts(self.teacher, questions, self.embed_batch_size, progress=False)
        # The shards hold vectors at embed.dtype (float16 halves them): the model saw them so.
        x = x.astype(self.embed_dtype, copy=False).astype(np.float32, copy=False)  # no copy at float32
        pred = torch.from_numpy(model_predict(self.model, x, self.train_batch_size))
        scores, idx = torch.topk(F.normalize(pred, dim=1) @ self.bank_vectors.T, k, dim=1)
        answers = [list(row) for row in self.texts[idx.numpy()]]
        return pd.DataFrame({ANSWERS: answers, SCORES: scores.double().tolist(), TRUNCATED: cut})


mlflow.models.set_model(EnergyFlowAnswerer())
