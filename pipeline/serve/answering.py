"""The answer model itself, with no MLflow in it: the teacher embeds each question, the
energy-flow model maps it, the answer bank's nearest texts are the answers.

answerer.py wraps it as the MLflow pyfunc that is logged and served; ./dev ask loads it straight
from a logged model's local directory (pipeline/serve/local_model.py) when that model's code is
this checkout's, which spares it importing MLflow and opening the tracking store.

answer: a DataFrame with a `question` column -> per row `answers` (the k nearest distinct facts,
best first, pipeline/answer/ranking.py), `scores`, `confident` (pipeline/answer/confidence.py) and
`truncated` (docs/serving.md, the signature). A request over the limits (pipeline.serve.request.Limits,
read from the environment at load time) is refused before anything is embedded. A question goes
the way a row goes through the pipeline: embedded as the embed stage embeds texts (encode_texts:
raw vectors in embed.batch_size batches, longest first, stored at the shards' dtype), mapped in
batches of train.batch_size as the evaluate stage predicts (max_active_flows is a budget per
batch, so the batch size changes the prediction), and scored against the evaluate stage's bank."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipeline.answer.bank import load_bank
from pipeline.answer.confidence import ARTIFACT, read_rule
from pipeline.answer.prediction import predict as model_predict
from pipeline.answer.ranking import distinct_top, group_sizes, top_and_margin
from pipeline.core.errors import PipelineError
from pipeline.embed.teacher import encode_texts, resolve_teacher, truncated
from pipeline.model.model_file import load_model
from pipeline.serve.plain_teacher import load_answering_teacher
from pipeline.serve.request import ANSWERS, CONFIDENT, SCORES, TRUNCATED, Limits, questions_of, top_k
from pipeline.serve.teacher_digest import teacher_weights_digest


class Answerer:
    """Questions in, the answer bank's nearest texts out (see the module's docstring)."""

    def load(self, config: dict, artifacts: dict[str, str], digest_cache: Path | None = None) -> None:
        """`config`: the model_config the model was logged with; `artifacts`: local paths of its
        `model` and `bank`; `digest_cache`: a file that keeps the teacher's weights digest between
        loads (pipeline/serve/teacher_digest.py), or None to hash the weights on every load."""
        self.limits = Limits.from_env()  # a bad value stops the load, naming the variable
        # The scoring server answers each request in a thread of its own, and the teacher's
        # tokenizer is not safe to share between threads (each call sets its truncation): one
        # request at a time, each using every core through torch.
        self.lock = threading.Lock()
        self.train_batch_size = int(config["train_batch_size"])
        self.embed_batch_size = int(config["embed_batch_size"])
        self.embed_dtype = np.dtype(config["embed_dtype"])
        self.model, _ = load_model(artifacts["model"])  # torch.load(weights_only=True), eval mode
        bank = load_bank(artifacts["bank"], config["bank_sha256"])
        self.texts = np.asarray(bank.texts, dtype=object)
        # A torch tensor of unit rows: one matrix product and one torch.topk per request.
        self.bank_vectors = torch.from_numpy(bank.vectors)
        self.group_ids = torch.from_numpy(bank.group_ids())
        self.groups = int(self.group_ids.max()) + 1 if len(self.group_ids) else 0
        self.max_members = group_sizes(self.group_ids)
        try:
            self.confidence = read_rule(artifacts.get(ARTIFACT))  # None: logged before answers had one
        except PipelineError as e:
            raise PipelineError(f"{artifacts['model']}: {e}") from None
        if not self.model.dim == bank.dim == int(config["dim"]):
            raise PipelineError(
                f"{artifacts['model']}: the model maps {self.model.dim}-d embeddings, the bank "
                f"{artifacts['bank']} holds {bank.dim}-d ones and the teacher was recorded as "
                f"{config['dim']}-d; expected one dim for all three"
            )
        self.teacher = self._load_teacher(config["teacher"], config.get("teacher_weights_sha256"), digest_cache)

    @staticmethod
    def _load_teacher(name: str, weights_sha256: str | None, digest_cache: Path | None = None):
        """The teacher the shards were embedded with. One whose weights differ from the recorded
        ones would embed questions into another space: refused. A plain-layout teacher is run
        without sentence-transformers (pipeline/serve/plain_teacher.py), with the same vectors."""
        teacher = load_answering_teacher(name)
        if weights_sha256:
            found = teacher_weights_digest(Path(resolve_teacher(name)), digest_cache)
            if found != weights_sha256:
                raise PipelineError(
                    f"teacher {name!r} ({resolve_teacher(name)}): its weights have sha256 {str(found)[:16]}..., "
                    f"but the model was trained on embeddings made with weights {weights_sha256[:16]}...; install "
                    "the teacher the model was trained with (the model's pip requirements pin the bundled one)"
                )
        return teacher

    def answer(self, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        k = top_k(params, self.groups)
        questions = questions_of(model_input, self.limits, int(self.teacher.max_seq_length))
        if not questions:
            return pd.DataFrame(
                {ANSWERS: [], SCORES: [], CONFIDENT: pd.Series([], dtype=bool), TRUNCATED: pd.Series([], dtype=bool)}
            )
        with self.lock:
            return self._answer(questions, k)

    @torch.inference_mode()
    def _answer(self, questions: list[str], k: int) -> pd.DataFrame:
        cut = truncated(self.teacher, questions)
        x = encode_texts(self.teacher, questions, self.embed_batch_size, progress=False)
        # The shards hold vectors at embed.dtype (float16 halves them): the model saw them so.
        x = x.astype(self.embed_dtype, copy=False).astype(np.float32, copy=False)  # no copy at float32
        pred = torch.from_numpy(model_predict(self.model, x, self.train_batch_size))
        sims = F.normalize(pred, dim=1) @ self.bank_vectors.T
        # Two facts at least, for the margin of the best over the second best.
        scores, idx = distinct_top(sims, self.group_ids, max(k, 2), self.max_members)
        if self.confidence is None:
            confident = [None] * len(questions)
        else:
            top, margin = top_and_margin(scores)
            confident = self.confidence.confident(top.numpy(), margin.numpy()).tolist()
        answers = [list(row) for row in self.texts[idx[:, :k].numpy()]]
        return pd.DataFrame(
            {ANSWERS: answers, SCORES: scores[:, :k].double().tolist(), CONFIDENT: confident, TRUNCATED: cut}
        )
