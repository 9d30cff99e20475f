"""Which questions the teacher reads only in part: a sentence-transformers model embeds the first
max_seq_length tokens of a text (special tokens included) and drops the rest without a word, so
the answer model reports it per question (the `truncated` column) rather than answer a question
it did not read to the end as if it had."""

from __future__ import annotations

import numpy as np


def window(teacher) -> int:
    """The teacher's window: tokens it reads of a text, special tokens included."""
    return int(teacher.max_seq_length)


def truncated(teacher, texts: list[str]) -> np.ndarray:
    """bool (len(texts),): True where the text has more tokens than the teacher's window. The
    tokenizer alone, far cheaper than the embedding, and cut one token past the window: that
    token is all it takes to know (and the tokenizer then has nothing to warn about)."""
    if not texts:
        return np.zeros(0, dtype=bool)
    w = window(teacher)
    ids = teacher.tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=w + 1)["input_ids"]
    return np.fromiter((len(i) > w for i in ids), dtype=bool, count=len(texts))
