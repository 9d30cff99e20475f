"""Evaluation: cosine, MSE and retrieval top-k of the model and of two baselines on the same data.

Retrieval: the bank is the split's distinct target texts (each embedded once); a prediction is a
top-k hit when its own target text is among the k bank texts nearest by cosine. The whole split
is ranked with one matrix product per batch (TextBridge.nearest), never a per-sample loop.
Baselines, computed in the same stage so the comparison is like for like:
- identity: predict the input embedding itself;
- ridge: a linear map fitted on train in closed form, W = (X'X + alpha I)^-1 X'Y (with a bias);
- untrained: the same model at its initial weights (same config and seed), so "did training
  teach it anything" is a measured difference, not a guess.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .bridge import TextBridge, nearest
from .data.loader import BatchLoader


def text_bank(target_texts: Sequence[str], targets: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(distinct texts, their embeddings, index into the bank of each row's target)."""
    bank_index: dict[str, int] = {}
    row_to_bank = np.empty(len(target_texts), dtype=np.int64)
    first_rows = []
    for i, t in enumerate(target_texts):
        j = bank_index.get(t)
        if j is None:
            j = bank_index[t] = len(first_rows)
            first_rows.append(i)
        row_to_bank[i] = j
    return list(bank_index), np.asarray(targets[np.asarray(first_rows, dtype=np.int64)], dtype=np.float32), row_to_bank


def score(pred: np.ndarray, target: np.ndarray, bank: np.ndarray, row_to_bank: np.ndarray,
          ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    p, t, b = (torch.tensor(np.asarray(a), dtype=torch.float32) for a in (pred, target, bank))
    cos = torch.nn.functional.cosine_similarity(p, t, dim=1)
    top = nearest(p, b, max(ks))  # (N, kmax)
    hit = top == torch.from_numpy(row_to_bank).unsqueeze(1)
    out = {"cosine": float(cos.mean()), "mse": float(((p - t) ** 2).mean())}
    for k in ks:
        out[f"top{k}"] = float(hit[:, :k].any(dim=1).float().mean())
    return out


@torch.no_grad()
def predict(model, inputs: np.ndarray, batch_size: int, device: torch.device | str = "cpu") -> np.ndarray:
    model.eval()
    outs = []
    for x, _ in BatchLoader(inputs, inputs, batch_size, shuffle=False):
        outs.append(model(x.to(device)).pred.float().cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, model.dim), dtype=np.float32)


RIDGE_CHUNK = 65536  # rows per block of X'X: 65536 x 385 float64 = 190 MiB at most, whatever the split's size


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Closed-form ridge with an unpenalised bias: returns W of shape (dim + 1, out).

    X'X and X'Y are summed over blocks of rows, so a memory-mapped train split of any size is
    read once, block by block, and never held whole in memory."""
    n, dim = len(x), x.shape[1]
    xtx = np.zeros((dim + 1, dim + 1))
    xty = np.zeros((dim + 1, y.shape[1]))
    for start in range(0, n, RIDGE_CHUNK):
        xb = np.asarray(x[start:start + RIDGE_CHUNK], dtype=np.float64)
        xb = np.hstack([xb, np.ones((len(xb), 1))])
        xtx += xb.T @ xb
        xty += xb.T @ np.asarray(y[start:start + RIDGE_CHUNK], dtype=np.float64)
    reg = alpha * np.eye(dim + 1)
    reg[-1, -1] = 0.0
    return np.linalg.solve(xtx + reg, xty)


def ridge_predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (np.hstack([np.asarray(x, dtype=np.float64), np.ones((len(x), 1))]) @ w).astype(np.float32)


def evaluate_split(name: str, model_pred: np.ndarray, shard, ridge_w: np.ndarray,
                   untrained_pred: np.ndarray | None = None) -> dict[str, float]:
    """All metrics for one split, keys `split/metric` and `baseline/<name>/split/metric`."""
    _, bank, row_to_bank = text_bank(list(shard.target_texts), shard.targets)
    targets = np.asarray(shard.targets)
    inputs = np.asarray(shard.inputs)
    out = {}
    preds = [("", model_pred), ("baseline/identity/", inputs), ("baseline/ridge/", ridge_predict(ridge_w, inputs))]
    if untrained_pred is not None:
        preds.append(("baseline/untrained/", untrained_pred))
    for prefix, pred in preds:
        for k, v in score(pred, targets, bank, row_to_bank).items():
            out[f"{prefix}{name}/{k}"] = v
    return out


def sample_table(shard, pred: np.ndarray, n: int) -> list[dict]:
    """The first n rows of a split with the model's nearest bank text (for a quick read)."""
    texts, bank, _ = text_bank(list(shard.target_texts), shard.targets)
    n = min(n, len(pred))
    decoded = TextBridge.decode_surface_batch(torch.from_numpy(pred[:n]), torch.from_numpy(bank), texts, k=1)
    return [{"id": str(shard.ids[i]), "input": str(shard.input_texts[i]), "target": str(shard.target_texts[i]),
             "decoded": decoded[i][0], "correct": decoded[i][0] == str(shard.target_texts[i])} for i in range(n)]
