"""The k nearest distinct facts: of each group of bank texts (one fact in other words), only its
best-scoring text is an answer, so the top k answers are k facts, not one fact in k phrasings.

Computed for a whole block of questions with tensor operations, never a Python loop over the
bank or the rows: the top candidates are taken with one torch.topk, wide enough to hold k
groups even when every group's texts crowd the top, and a stable sort of their group numbers
finds each group's first (best) candidate."""

from __future__ import annotations

import torch

# The margin when the bank holds a single fact: no other fact scores, so the second best is the
# lowest cosine there is.
NO_SECOND = -1.0


def distinct_top(sims: torch.Tensor, group_ids: torch.Tensor, k: int, max_members: int):
    """(scores, positions), each (rows, min(k, groups)): per row of `sims` (questions x bank
    cosines), the best text of each of the k best-scoring groups, best first. `group_ids`: int64
    (bank,), each text's group number; `max_members`: the most texts any group holds."""
    n, size = sims.shape
    groups = int(group_ids.max()) + 1 if size else 0
    keep_k = min(k, groups)
    # k groups of at most max_members texts each: the k * max_members best texts hold k groups.
    width = min(size, k * max(1, max_members))
    values, positions = sims.topk(width, dim=1)  # best first
    candidate_groups = group_ids[positions]
    by_group, order = torch.sort(candidate_groups, dim=1, stable=True)  # within a group: best first
    first_sorted = torch.ones_like(by_group, dtype=torch.bool)
    first_sorted[:, 1:] = by_group[:, 1:] != by_group[:, :-1]
    first = torch.zeros_like(first_sorted).scatter(1, order, first_sorted)
    # The first keep_k candidates that are their group's best, in score order.
    rank = torch.arange(width).expand(n, width)
    chosen = torch.where(first, rank, rank + width).topk(keep_k, dim=1, largest=False).indices.sort(dim=1).values
    return values.gather(1, chosen), positions.gather(1, chosen)


def top_and_margin(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From distinct_top's scores (at least 1 column; 2 when the bank has two facts): the best
    fact's score and its margin over the second best fact's."""
    top = scores[:, 0]
    second = scores[:, 1] if scores.shape[1] > 1 else torch.full_like(top, NO_SECOND)
    return top, top - second


def group_sizes(group_ids: torch.Tensor) -> int:
    """The most texts any group holds (distinct_top's max_members)."""
    return int(torch.bincount(group_ids).max()) if len(group_ids) else 0
