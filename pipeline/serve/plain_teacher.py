"""The teacher for answering questions, without importing sentence-transformers when it need not.

Importing sentence-transformers costs seconds of CPU before the first answer (it pulls in
scikit-learn, scipy.stats and torch's compiler); the answer model needs only its encode. A
teacher directory in the plain layout (a BERT transformer, mean pooling of its token vectors, an
optional L2 normalisation, nothing else) is run here with transformers alone, the same way as
sentence-transformers' encode, so the vectors are the same (tests/test_plain_teacher.py compares
the two); any other is loaded by sentence-transformers as the embed stage loads it. PlainTeacher
has what pipeline/embed/teacher.py uses of a SentenceTransformer, so encode_texts embeds a
question the way the embed stage embedded the training texts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pipeline.core.config import teacher_path
from pipeline.core.paths import check_readable_inside
from pipeline.embed.teacher import BUNDLED, load_teacher, resolve_teacher

# modules.json entries of the plain layout, as sentence-transformers writes them.
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
# Model types whose sentence-transformers loading is AutoModel's (an encoder-decoder would be
# loaded as its encoder alone there) and whose equality with it is tested.
MODEL_TYPES = ("bert",)
TRANSFORMER_KEYS = {"max_seq_length", "do_lower_case"}
POOLING_MODE_KEYS = (
    "pooling_mode_cls_token",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
POOLING_KEYS = {"word_embedding_dimension", "embedding_dimension", "pooling_mode", "include_prompt"}
POOLING_KEYS |= {"pooling_mode_mean_tokens", *POOLING_MODE_KEYS}
# config_sentence_transformers.json keys that change what encode returns when set.
ENCODE_KEYS = ("prompts", "default_prompt_name", "truncate_dim")
CONFIG_MAX_BYTES = 1 << 20  # the layout's JSON files are a few hundred bytes


def _json(path: Path):
    if path.stat().st_size > CONFIG_MAX_BYTES:
        raise ValueError(f"over {CONFIG_MAX_BYTES} bytes")
    return json.loads(path.read_text(encoding="utf-8"))


def _mean_pooling_only(cfg: dict) -> bool:
    if "pooling_mode" in cfg:
        mode = cfg["pooling_mode"]
        return mode == "mean" or mode == ["mean"]
    return cfg.get("pooling_mode_mean_tokens", True) is True and not any(cfg.get(k) for k in POOLING_MODE_KEYS)


def plain_layout(path: Path) -> tuple[dict | None, str]:
    """(the settings of the plain layout in directory `path`: max_seq_length, normalize,
    hidden size; "") or (None, why it is not that layout)."""
    try:
        modules = _json(path / "modules.json")
        types = [m.get("type") for m in sorted(modules, key=lambda m: m.get("idx", 0))]
        if types not in ([TRANSFORMER, POOLING], [TRANSFORMER, POOLING, NORMALIZE]):
            return None, f"modules.json lists {types}, not Transformer, Pooling[, Normalize]"
        entry = {m["type"]: m for m in modules}
        if entry[TRANSFORMER].get("path", "") != "":
            return None, "its transformer is in a subdirectory"
        st = _json(path / "sentence_bert_config.json") if (path / "sentence_bert_config.json").is_file() else {}
        if not isinstance(st, dict) or set(st) - TRANSFORMER_KEYS or st.get("do_lower_case"):
            return None, f"sentence_bert_config.json sets {sorted(st)} (only max_seq_length is run here)"
        pooling = _json(path / entry[POOLING]["path"] / "config.json")
        if not isinstance(pooling, dict) or set(pooling) - POOLING_KEYS or not _mean_pooling_only(pooling):
            return None, "its pooling is not mean pooling of the token vectors alone"
        normalize = path / entry[NORMALIZE]["path"] if NORMALIZE in entry else None
        if normalize is not None and (normalize / "config.json").is_file():
            if _json(normalize / "config.json") not in ({}, {"module_input_name": "sentence_embedding"}):
                return None, "its Normalize has a config of its own"
        st_config = path / "config_sentence_transformers.json"
        encode = _json(st_config) if st_config.is_file() else {}
        if any(encode.get(k) for k in ENCODE_KEYS):
            return None, "config_sentence_transformers.json sets prompts or a truncation of the vectors"
        config = _json(path / "config.json")
        if config.get("model_type") not in MODEL_TYPES:
            return None, f"its model type {config.get('model_type')!r} is not one of {MODEL_TYPES}"
        width = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
        if width is not None and width != config.get("hidden_size"):
            return None, "its pooling width is not the transformer's"
        if (path / "adapter_config.json").exists():
            return None, "it is an adapter (PEFT) model"
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        return None, f"its layout cannot be read ({type(e).__name__}: {e})"
    return {"max_seq_length": st.get("max_seq_length"), "normalize": normalize is not None}, ""


class PlainTeacher:
    """A plain-layout teacher run with transformers (see the module's docstring)."""

    def __init__(self, path: Path, max_seq_length: int | None, normalize: bool):
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        self.path = path
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        if hasattr(config, "use_cache"):  # as sentence-transformers configures it
            config.use_cache = False
        tokenizer_kwargs = {"model_max_length": max_seq_length} if max_seq_length is not None else {}
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, **tokenizer_kwargs)
        if max_seq_length is None and getattr(config, "max_position_embeddings", -1) != -1:
            self.tokenizer.model_max_length = min(self.tokenizer.model_max_length, config.max_position_embeddings)
        self.model = AutoModel.from_pretrained(str(path), config=config, local_files_only=True).to("cpu")
        self.model.eval()
        self.normalize = normalize
        self.dim = int(config.hidden_size)
        self._torch = torch

    @property
    def max_seq_length(self) -> int:
        return int(self.tokenizer.model_max_length)

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def _batch(self, texts: list[str]):
        torch = self._torch
        features = self.tokenizer(texts, padding=True, truncation="longest_first", return_tensors="pt")
        tokens = self.model(**features, return_dict=True).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        counts = torch.clamp(mask.sum(dim=1), min=1e-9)
        vectors = (tokens * mask).sum(dim=1) / counts
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors

    def encode(
        self,
        texts: list[str],
        batch_size: int = 32,
        show_progress_bar: bool = False,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = False,
    ) -> np.ndarray:
        """float32 (len(texts), dim), as SentenceTransformer.encode(texts, batch_size) gives them:
        longest first (its sort, ties included) in batches of `batch_size`, each padded to its
        longest text, back in the given order."""
        if not convert_to_numpy or show_progress_bar:
            raise ValueError("PlainTeacher.encode returns numpy arrays, without a progress bar")
        torch = self._torch
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts])  # sentence-transformers' own call: the same ties
        sorted_texts = [texts[i] for i in order]
        out = []
        with torch.inference_mode():
            for start in range(0, len(sorted_texts), batch_size):
                vectors = self._batch(sorted_texts[start : start + batch_size])
                if normalize_embeddings:
                    vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
                out.append(vectors.float().numpy())
        stacked = np.concatenate(out)
        return stacked[np.argsort(order)]


def load_answering_teacher(name: str):
    """The teacher `name` (embed.teacher), as PlainTeacher when its directory is in the plain
    layout, else as the embed stage loads it (a SentenceTransformer). Nothing is fetched: the
    plain layout is read from a local directory only, with local_files_only."""
    given = teacher_path(name)
    if given is not None:
        check_readable_inside(given, "parameter 'embed.teacher'")
    path = Path(resolve_teacher(name))
    if name == BUNDLED or path.is_dir():
        settings, _ = plain_layout(path) if path.is_dir() else (None, "")
        if settings is not None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                return PlainTeacher(path, settings["max_seq_length"], settings["normalize"])
            except Exception:  # noqa: BLE001 - a damaged directory: sentence-transformers says what is wrong
                pass
    return load_teacher(name)
