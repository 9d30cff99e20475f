"""TextBridge: between texts and embeddings.

`decode_surface_batch` finds the nearest texts of a candidate bank for a whole batch with one
matrix product; the prototype looped per sample and re-ran the forward pass per text (O(B^2)).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def nearest(pred: torch.Tensor, bank: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (B, k) of the k bank rows with the highest cosine to each prediction."""
    sims = F.normalize(pred, dim=1) @ F.normalize(bank, dim=1).T  # (B, N): one product
    return sims.topk(min(k, bank.shape[0]), dim=1).indices


class TextBridge:
    def __init__(self, teacher=None, batch_size: int = 64):
        self.teacher, self.batch_size = teacher, batch_size

    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        from pipeline.embed.teacher import encode_texts

        if self.teacher is None:
            raise RuntimeError("TextBridge.encode_text needs a teacher model")
        return torch.from_numpy(encode_texts(self.teacher, list(texts), self.batch_size, progress=False))

    @staticmethod
    def decode_surface_batch(
        pred: torch.Tensor, bank: torch.Tensor, bank_texts: Sequence[str], k: int = 1
    ) -> list[list[str]]:
        """The k nearest bank texts for every prediction of the batch."""
        idx = nearest(pred, bank, k).cpu().numpy()
        texts = np.asarray(bank_texts, dtype=object)
        return [list(texts[row]) for row in idx]
