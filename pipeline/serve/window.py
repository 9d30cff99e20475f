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
    tokenizer alone, far cheaper than the embedding; the texts are already within the length
    limit (pipeline.serve.request), so no text makes it slow."""
    if not texts:
        return np.zeros(0, dtype=bool)
    ids = teacher.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
    return np.fromiter((len(i) > window(teacher) for i in ids), dtype=bool, count=len(texts))
